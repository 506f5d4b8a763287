"""Native tool-call formats (Llama 3 JSON, Mistral, Qwen3-Coder XML, gpt-oss harmony): each parser on
hand-written model outputs, what a ToolEnv does with it, and episodes with each format chosen by name."""

from __future__ import annotations

import re

import pytest

from agentrl import (
    HARMONY,
    LLAMA3_JSON,
    MISTRAL,
    QWEN3_CODER,
    PluginError,
    SamplingParams,
    ToolCallFormat,
    ToolEnv,
    tool,
    type_arguments,
)
from agentrl.config.train import TrainConfig
from agentrl.plugins import load_plugins
from agentrl.sampling.chat import ChatTokenizer
from agentrl.sampling.engine import Engine, Generation
from agentrl.testing import build_tiny_model
from agentrl.tools.tool import ToolCall, format_tool_call, parse_xml_json, render_tools_system_prompt

FORMATS = {"llama3_json": LLAMA3_JSON, "mistral": MISTRAL, "qwen3_coder": QWEN3_CODER, "harmony": HARMONY}


def calls(parser: ToolCallFormat, text: str) -> list[tuple[str, dict | None, bool]]:
    """(name, arguments, has error) of every call ``parser`` reads in ``text``."""
    return [(c.name, c.arguments, c.error is not None) for c in parser(text)]


# Hand-written outputs, as each model family writes them: (format, text, expected calls).
CASES = [
    # Llama 3.1-3.3: bare JSON, after <|python_tag|>, several with ";", Llama 3.2's "type" key
    ("llama3_json", '{"name": "add", "parameters": {"a": 1, "b": 2}}', [("add", {"a": 1, "b": 2}, False)]),
    ("llama3_json", '<|python_tag|>{"name": "add", "parameters": {"a": 1}}', [("add", {"a": 1}, False)]),
    (
        "llama3_json",
        '<|python_tag|>{"name": "add", "parameters": {"a": 1}}; {"name": "neg", "parameters": {"x": 4}}',
        [("add", {"a": 1}, False), ("neg", {"x": 4}, False)],
    ),
    (
        "llama3_json",
        'I will add them.\n\n{"type": "function", "name": "add", "parameters": {"a": 1}}',
        [("add", {"a": 1}, False)],
    ),
    ("llama3_json", '{"name": "add", "arguments": {"a": 1}}', [("add", {"a": 1}, False)]),
    ("llama3_json", "The sum is {a + b} = 3.", []),
    # Mistral: v11+ tokenizers (one [TOOL_CALLS] per call, optional [CALL_ID]) and earlier (a JSON array)
    ("mistral", '[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}', [("add", {"a": 1, "b": 2}, False)]),
    (
        "mistral",
        '[TOOL_CALLS]add[ARGS]{"a": 1}[TOOL_CALLS]neg[CALL_ID]a1B2c3D4e[ARGS]{"x": 4}',
        [("add", {"a": 1}, False), ("neg", {"x": 4}, False)],
    ),
    (
        "mistral",
        'Let me add.[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}, {"name": "neg", "arguments": {"x": 4}}]',
        [("add", {"a": 1}, False), ("neg", {"x": 4}, False)],
    ),
    ("mistral", "The sum is 3.", []),
    # Qwen3-Coder: XML, values are text (typed later by the schema)
    (
        "qwen3_coder",
        "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2\n</parameter>\n"
        "</function>\n</tool_call>",
        [("add", {"a": "1", "b": "2"}, False)],
    ),
    (
        "qwen3_coder",
        "Adding.\n<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=neg>\n<parameter=x>\n4\n</parameter>\n</function>\n</tool_call>",
        [("add", {"a": "1"}, False), ("neg", {"x": "4"}, False)],
    ),
    (
        "qwen3_coder",
        "<tool_call>\n<function=echo>\n<parameter=text>\nline one\nline two\n</parameter>\n</function>",
        [("echo", {"text": "line one\nline two"}, False)],
    ),
    ("qwen3_coder", "The sum is 3.", []),
    # gpt-oss harmony: the recipient in the channel part or in the role part of the header
    (
        "harmony",
        "<|channel|>analysis<|message|>Need to add.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.add <|constrain|>json<|message|>{"a": 1, "b": 2}<|call|>',
        [("add", {"a": 1, "b": 2}, False)],
    ),
    (
        "harmony",
        '<|start|>assistant to=functions.neg<|channel|>commentary json<|message|>{"x": 4}<|call|>',
        [("neg", {"x": 4}, False)],
    ),
    (
        "harmony",
        "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>3<|return|>",
        [],
    ),
]


@pytest.mark.parametrize("name, text, expected", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_format_reads_its_calls(name: str, text: str, expected: list) -> None:
    assert calls(FORMATS[name], text) == expected


MALFORMED = [
    ("llama3_json", '{"name": "add", "parameters": {"a": 1,}}', "tool call is not valid JSON"),
    ("llama3_json", '<|python_tag|>brave_search.call(query="x")', "expected a JSON object after <|python_tag|>"),
    ("llama3_json", '{"name": "add", "parameters": [1, 2]}', '"parameters" must be a JSON object'),
    ("mistral", '[TOOL_CALLS]add[ARGS]{"a": 1', "tool call is not valid JSON"),
    ("mistral", '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}', "tool call is not valid JSON"),
    ("mistral", "[TOOL_CALLS][ARGS]{}", "expected a tool name after [TOOL_CALLS]"),
    ("mistral", "[TOOL_CALLS]add", "expected [TOOL_CALLS]NAME[ARGS]{...}"),
    ("qwen3_coder", "<tool_call>\n<function=add\n<parameter=a>1</parameter>", "expected <function=NAME>"),
    (
        "qwen3_coder",
        "<tool_call><function=add><parameter=a 1</parameter></function></tool_call>",
        "expected <parameter=NAME>",
    ),
    (
        "harmony",
        "<|channel|>commentary to=functions.add <|constrain|>json<|message|>{a: 1}<|call|>",
        "tool call is not valid JSON",
    ),
    ("harmony", "<|channel|>commentary to=functions.add <|constrain|>json", "call header has no <|message|>"),
]


@pytest.mark.parametrize("name, text, error", MALFORMED, ids=[f"{m[0]}-{i}" for i, m in enumerate(MALFORMED)])
def test_a_malformed_call_carries_a_one_line_error(name: str, text: str, error: str) -> None:
    (call,) = FORMATS[name](text)
    assert call.arguments is None and error in (call.error or "") and "\n" not in (call.error or "")


@pytest.mark.parametrize("name", FORMATS)
def test_format_calls_writes_what_the_parser_reads(name: str) -> None:
    written = FORMATS[name].format_calls([("add", {"a": 1, "b": 2}), ("echo", {"text": "two\nlines"})])
    parsed = FORMATS[name](written)
    typed = [
        type_arguments(
            c.arguments or {},
            {"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "text": {"type": "string"}}},
        )
        if c.text_values
        else c.arguments
        for c in parsed
    ]
    assert [c.name for c in parsed] == ["add", "echo"] and all(c.error is None for c in parsed)
    assert typed == [{"a": 1, "b": 2}, {"text": "two\nlines"}]
    assert parse_xml_json(written) == [] or name == "qwen3_coder"  # only Qwen3-Coder shares <tool_call>


def test_type_arguments_follows_the_schema() -> None:
    parameters = {
        "properties": {
            "n": {"type": "integer"},
            "x": {"type": "number"},
            "flag": {"type": "boolean"},
            "ids": {"type": "array"},
            "opts": {"type": "object"},
            "code": {"type": "string"},
            "maybe": {"type": ["integer", "null"]},
            "mode": {"enum": ["1", 2]},
            "any": {},
        }
    }
    text = {
        "n": "42",
        "x": "2.5",
        "flag": "True",
        "ids": "[1, 2]",
        "opts": '{"k": "v"}',
        "code": "42",
        "maybe": "null",
        "mode": "1",
        "any": "7",
        "extra": "3",
    }
    assert type_arguments(text, parameters) == {
        "n": 42,
        "x": 2.5,
        "flag": True,
        "ids": [1, 2],
        "opts": {"k": "v"},
        "code": "42",
        "maybe": None,
        "mode": "1",
        "any": "7",
        "extra": "3",
    }
    # What does not decode to an allowed type stays text, for the tool's validation to name.
    assert type_arguments({"n": "4 apples", "ids": "[1, 2", "x": '"3"'}, parameters) == {
        "n": "4 apples",
        "ids": "[1, 2",
        "x": '"3"',
    }
    assert type_arguments({"n": 5}, parameters) == {"n": 5}  # already typed values pass through


@tool
def add(a: int, b: int = 0) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


@tool
def shout(text: str, times: int = 1) -> str:
    """Repeat a text in capitals.

    Args:
        text: What to shout.
        times: How many times.
    """
    return " ".join([text.upper()] * times)


class AddEnv(ToolEnv):
    """Answer a sum with the ``add`` tool; a worked example shows one call."""

    tools = (add, shout)
    instructions = "Add the numbers."
    demonstrations = (
        [
            {"role": "user", "content": "1 + 1?"},
            {"role": "assistant", "content": "Adding. " + format_tool_call("add", a=1, b=1)},
            {"role": "tool", "name": "add", "content": "2"},
            {"role": "assistant", "content": "2"},
        ],
    )

    def train_tasks(self) -> list[dict]:
        return [{"question": "What is 2 + 3?", "answer": "5"}]

    eval_tasks = train_tasks

    def score_answer(self, text: str) -> float:
        return float(text.strip().endswith("5"))


@pytest.mark.parametrize("name", FORMATS)
def test_a_tool_env_runs_each_format_and_reports_bad_calls_to_the_model(name: str) -> None:
    fmt = FORMATS[name]
    env = AddEnv(tool_parser=fmt)
    env.reset(seed=0)
    obs, reward, terminated, _, info = env.step(
        fmt.format_calls([("add", {"a": 2, "b": 3}), ("shout", {"text": "42"})])
    )
    assert obs == [{"role": "tool", "name": "add", "content": "5"}, {"role": "tool", "name": "shout", "content": "42"}]
    assert (reward, terminated, info) == (0.0, False, {"tool_calls": 2, "tool_errors": 0})
    obs, *_ = env.step(fmt.format_calls([("mul", {"a": 2})]))
    assert obs == [{"role": "tool", "name": "mul", "content": "Error: unknown tool 'mul'; available: add, shout"}]
    obs, *_ = env.step(fmt.format_calls([("add", {"a": "two"})]))
    assert obs[0]["content"] == "Error: add: argument 'a' must be integer, got 'two'"
    env.reset(seed=0)
    malformed = {
        "llama3_json": '{"name": "add", "parameters": {"a": 2,}}',
        "mistral": '[TOOL_CALLS]add[ARGS]{"a": 2,}',
        "qwen3_coder": "<function=add\n",
        "harmony": "<|channel|>commentary to=functions.add<|message|>{a}",
    }
    obs, _, terminated, _, info = env.step(malformed[name])
    assert obs[0]["content"].startswith("Error: ") and "\n" not in obs[0]["content"]
    assert not terminated and info == {"tool_calls": 1, "tool_errors": 1}
    assert env.step("So it is 5")[1:3] == (1.0, True)


@pytest.mark.parametrize("name", FORMATS)
def test_the_prompt_shows_the_model_the_format_its_parser_reads(name: str) -> None:
    fmt = FORMATS[name]
    messages, _ = AddEnv(tool_parser=fmt).reset(seed=0)
    example = fmt.format_calls([("add", {"a": "..."})])
    assert messages[0]["content"] == "Add the numbers.\n\n" + render_tools_system_prompt(AddEnv.tools, fmt)
    assert f"To call a tool, write exactly:\n{example}\n" in messages[0]["content"]
    assert messages[2] == {"role": "assistant", "content": "Adding. " + fmt.format_calls([("add", {"a": 1, "b": 1})])}
    assert [c.name for c in fmt(messages[2]["content"])] == ["add"]
    assert messages[1] == AddEnv.demonstrations[0][0] and messages[3:5] == AddEnv.demonstrations[0][2:]
    native, _ = AddEnv(tool_parser=fmt).reset(seed=0, options={"template_renders_tools": True})
    assert native[0] == {"role": "system", "content": "Add the numbers."} and native[2] == messages[2]


def test_the_default_parser_keeps_the_default_prompt() -> None:
    default, _ = AddEnv().reset(seed=0)
    plain, _ = AddEnv(tool_parser=lambda text: []).reset(seed=0)  # a plain parser function: no formatter
    assert default == plain and default[2] == AddEnv.demonstrations[0][1]
    assert default[0]["content"] == "Add the numbers.\n\n" + render_tools_system_prompt(AddEnv.tools)
    assert (
        render_tools_system_prompt(AddEnv.tools).count(
            '<tool_call>\n{"name": "add", "arguments": {"a": "..."}}\n</tool_call>\n'
        )
        == 1
    )


def test_registered_by_the_tool_envs_plugin_and_chosen_by_name() -> None:
    from agentrl.training.build import make_env

    manager = load_plugins()
    assert manager.registry.names("tool_parser") == sorted(["xml_json", *FORMATS])
    for name, fmt in FORMATS.items():
        assert manager.registry.get("tool_parser", name).factory is fmt and fmt.name == name
        env = make_env(manager, TrainConfig(env="calculator", env_args={"tool_parser": name}))
        assert env.tool_parser is fmt and env.call_format is fmt
    message = (
        "unknown tool_parser 'llama3'; did you mean 'llama3_json'? Installed: harmony, llama3_json, mistral, "
        "qwen3_coder, xml_json."
    )
    with pytest.raises(PluginError, match=re.escape(message)):
        make_env(manager, TrainConfig(env="calculator", env_args={"tool_parser": "llama3"}))


def _rollout(engine: Engine, tokenizer, max_new_tokens: int):
    manager = load_plugins()
    config = TrainConfig(max_new_tokens=max_new_tokens)
    return manager.registry.get("rollout", "multi_turn").factory(engine=engine, tokenizer=tokenizer, config=config)


def _assert_token_exact(trajectory, tokenizer) -> str:
    """The trajectory's ids decode to the template's rendering of its messages; returns the text."""
    chat = ChatTokenizer(tokenizer)
    trajectory.validate()
    decoded = chat.decode(trajectory.token_ids)
    rendered = chat.render(trajectory.messages, add_generation_prompt=False, tools=trajectory.tools)
    assert rendered.startswith(decoded) and rendered[len(decoded) :] in ("\n", "<|im_end|>\n")
    return decoded


@pytest.mark.parametrize("name", FORMATS)
def test_a_calculator_episode_on_the_tiny_model_with_each_format(name: str, tokenizer) -> None:
    from agentrl.training.build import make_env

    manager = load_plugins()
    env = make_env(manager, TrainConfig(env="calculator", env_args={"tool_parser": name, "max_turns": 2}))
    engine = manager.registry.get("engine", "hf").factory(
        model=build_tiny_model(len(tokenizer)),
        tokenizer=tokenizer,
        config=TrainConfig(engine_args={"dtype": "float32"}),
    )
    task = env.eval_tasks()[0]
    [trajectory] = _rollout(engine, tokenizer, 8).run([env], [task], [0], SamplingParams(max_new_tokens=8, seed=0))
    decoded = _assert_token_exact(trajectory, tokenizer)
    demo = FORMATS[name].format_calls([("calculator", {"expression": "12 * 34 + 5"})])
    assert demo in decoded and format_tool_call("calculator", expression="12 * 34 + 5") not in decoded
    assert trajectory.turns and trajectory.messages[-1]["role"] == "assistant"


class WritesCalls(Engine):
    """Stands in for a model tuned to a format (none runs here): turn k samples ``texts[k]``'s ids
    and the stop token, with logprob 0. The rollout, the template and the env are the real ones."""

    def __init__(self, tokenizer, texts: list[str]) -> None:
        self.tokenizer, self.texts, self.turn = tokenizer, texts, 0

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Generation]:
        ids = self.tokenizer(self.texts[self.turn], add_special_tokens=False)["input_ids"] + [
            self.tokenizer.eos_token_id
        ]
        self.turn += 1
        return [Generation(token_ids=ids, finish_reason="stop", logprobs=[0.0] * len(ids)) for _ in prompts]


@pytest.mark.parametrize("name", FORMATS)
def test_an_episode_with_native_calls_stays_token_exact(name: str, tokenizer) -> None:
    fmt = FORMATS[name]
    bad = fmt.format_calls([("add", {"a": 2, "b": 3})]).replace("2", "{2", 1)  # JSON broken; XML: text "{2"
    texts = [bad, fmt.format_calls([("add", {"a": 2, "b": 3})]), "It is 5"]
    [trajectory] = _rollout(WritesCalls(tokenizer, texts), tokenizer, 64).run(
        [AddEnv(tool_parser=fmt)], [AddEnv().train_tasks()[0]], [0], SamplingParams(max_new_tokens=64, seed=0)
    )
    _assert_token_exact(trajectory, tokenizer)
    error = trajectory.messages[-4]["content"]
    assert error.startswith("Error: ") and "\n" not in error, error
    assert [m["content"] for m in trajectory.messages[-3:]] == [texts[1], "5", texts[2]]
    assert [(t.tool_calls, t.tool_errors) for t in trajectory.turns] == [(1, 1), (1, 0), (0, 0)]
    assert trajectory.terminated and trajectory.env_return == 1.0


def test_only_the_xml_format_leaves_values_as_text() -> None:
    assert ToolCall("add", {"a": 1}, None, "raw").text_values is False
    written = {name: fmt.format_calls([("add", {"a": 1})]) for name, fmt in FORMATS.items()}
    assert {name: FORMATS[name](text)[0].text_values for name, text in written.items()} == {
        "llama3_json": False,
        "mistral": False,
        "qwen3_coder": True,
        "harmony": False,
    }
    assert parse_xml_json(format_tool_call("add", a=1))[0].text_values is False


# ChatML that renders ``tools=`` into the system message and tool results as one user turn of
# ``<tool_response>`` blocks, the way Qwen3-Coder's template does (written here, not copied).
TOOL_RESPONSE_TEMPLATE = (
    "{%- if messages[0].role == 'system' or tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}{% endif %}"
    "{% if tools %}\n\n# Tools\n<tools>{% for t in tools %}\n<function><name>{{ t.function.name }}</name></function>"
    "{% endfor %}\n</tools>{% endif %}<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}{% if not (loop.first and m.role == 'system') %}"
    "{% if m.role == 'tool' %}{% if loop.previtem.role != 'tool' %}<|im_start|>user\n{% endif %}"
    "<tool_response>\n{{ m.content }}\n</tool_response>\n"
    "{% if loop.last or loop.nextitem.role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endif %}{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_template_that_renders_tools_and_tool_responses_stays_token_exact(tokenizer) -> None:
    import copy

    native = copy.deepcopy(tokenizer)
    native.chat_template = TOOL_RESPONSE_TEMPLATE
    assert ChatTokenizer(native).renders_tools
    texts = [
        "I will add.\n" + QWEN3_CODER.format_calls([("add", {"a": 2, "b": 3}), ("shout", {"text": "hi"})]),
        "It is 5",
    ]
    [trajectory] = _rollout(WritesCalls(tokenizer, texts), native, 128).run(
        [AddEnv(tool_parser=QWEN3_CODER)], [AddEnv().train_tasks()[0]], [0], SamplingParams(max_new_tokens=128, seed=0)
    )
    decoded = _assert_token_exact(trajectory, native)
    assert trajectory.tools == [add.schema, shout.schema] and trajectory.messages[0]["content"] == "Add the numbers."
    assert (
        "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\nHI\n</tool_response>\n<|im_end|>"
        in decoded
    )
    assert [(t.tool_calls, t.tool_errors) for t in trajectory.turns] == [
        (2, 0),
        (0, 0),
    ] and trajectory.env_return == 1.0


def test_a_demonstration_already_in_another_syntax_is_kept() -> None:
    # Qwen3-Coder's syntax holds a <tool_call> that is not xml_json's: it is not rewritten either.
    for native in (LLAMA3_JSON.format_calls([("add", {"a": 1})]), QWEN3_CODER.format_calls([("add", {"a": 1})])):

        class NativeDemoEnv(AddEnv):
            demonstrations = (
                [
                    {"role": "user", "content": "1 + 1?"},
                    {"role": "assistant", "content": native},
                    {"role": "tool", "name": "add", "content": "1"},
                    {"role": "assistant", "content": "1"},
                ],
            )

        for parser in (LLAMA3_JSON, MISTRAL, QWEN3_CODER):
            messages, _ = NativeDemoEnv(tool_parser=parser).reset(seed=0)
            assert messages[1:5] == list(NativeDemoEnv.demonstrations[0])
