"""The ``openai_agent`` rollout: an OpenAI-client agent program against the real endpoint, token-exact."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from cli_in_process import agentrl_in_process

from agentrl import Engine, Generation, SamplingParams
from agentrl.config.train import TrainConfig
from agentrl.plugins import load_plugins
from agentrl.sampling.chat import ChatTokenizer
from agentrl.testing import build_tiny_model
from agentrl.trajectory import with_segments

ROOT = Path(__file__).resolve().parents[2]


class RecordingEngine(Engine):
    """The real hf engine, keeping every (prompt, generation) it produced."""

    def __init__(self, inner: Engine) -> None:
        self.inner, self.log = inner, []

    def generate(self, prompts, sampling):
        generations = self.inner.generate(prompts, sampling)
        self.log += list(zip(prompts, generations))
        return generations


class ScriptedEngine(Engine):
    """Samples a fixed reply per call number of each prompt's conversation (a model that calls a
    tool and then answers), stop token included; logprob -0.5 per token."""

    def __init__(self, tokenizer, replies):
        self.tokenizer, self.replies, self.log = tokenizer, replies, []

    def generate(self, prompts, sampling):
        out = []
        for prompt in prompts:
            text = self.tokenizer.decode(prompt)
            reply = self.replies[min(text.count("<|im_start|>assistant") - 1, len(self.replies) - 1)]
            ids = self.tokenizer(reply, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            out.append(Generation(ids, "stop", [-0.5] * len(ids)))
            self.log.append((prompt, out[-1]))
        return out


def _rollout(engine, tokenizer, agent: str, **overrides):
    config = TrainConfig(**{"max_new_tokens": 10, "plugins": {"openai_agent": {"agent": agent}}, **overrides})
    return (
        load_plugins()
        .registry.get("rollout", "openai_agent")
        .factory(engine=engine, tokenizer=tokenizer, config=config)
    )


def _hf(tokenizer):
    model = build_tiny_model(len(tokenizer))
    factory = load_plugins().registry.get("engine", "hf").factory
    return factory(model=model, tokenizer=tokenizer, config=TrainConfig(engine_args={"dtype": "float32"}))


def _agent_file(tmp_path, body: str) -> str:
    path = tmp_path / "agent.py"
    path.write_text("import openai\n\n" + body)
    return f"{path}:solve"


LOOP = """
def solve(task, client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": task["question"]}]
    for _ in range(3):
        reply = client.chat.completions.create(model="m", messages=messages)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        messages.append({"role": "user", "content": "Go on."})
    return messages[:-1]
"""


def test_calls_merge_into_one_token_exact_trajectory(tokenizer, tmp_path):
    engine = RecordingEngine(_hf(tokenizer))
    agent = _agent_file(tmp_path, LOOP)
    # a long wait bound: the first batch starts when all four agents have called, however slow the machine
    rollout = _rollout(engine, tokenizer, agent, plugins={"openai_agent": {"agent": agent, "batch_wait_s": 30.0}})
    tasks = [{"question": f"What is {i} + 1?"} for i in range(4)]
    trajectories = rollout.run(
        [None] * 4, tasks, [0, 0, 1, 1], SamplingParams(max_new_tokens=10, seed=3), seeds=[11, 12, 13, 14]
    )
    chat = ChatTokenizer(tokenizer)
    sampled = {tuple(prompt): generation for prompt, generation in engine.log}
    assert len(engine.log) == 12
    for trajectory in trajectories:
        assert not trajectory.segments and trajectory.info["agent_calls"] == 3 and len(trajectory.turns) == 3
        for turn in trajectory.turns:  # each sampled span is exactly what the engine sampled for that prompt
            generation = sampled[tuple(trajectory.token_ids[: turn.start])]
            assert trajectory.token_ids[turn.start : turn.end] == generation.token_ids
            assert trajectory.sampler_logprobs[turn.start : turn.end] == pytest.approx(generation.logprobs)
        mask = [0] * len(trajectory.token_ids)
        for turn in trajectory.turns:
            mask[turn.start : turn.end] = [1] * (turn.end - turn.start)
        assert trajectory.loss_mask == mask
        # The rest is the rendered conversation (user turns, headers) encoded on its own, masked.
        first = chat.prompt_ids(trajectory.messages[:2])
        assert trajectory.token_ids[: len(first)] == first
        rendered = chat.render(trajectory.messages, add_generation_prompt=False)
        decoded = chat.decode(trajectory.token_ids)
        assert rendered.startswith(decoded) and rendered[len(decoded) :] in ("\n", "<|im_end|>\n")
    assert rollout.batches[0] == 4  # the four episodes' first calls were sampled together


SOME_CALL = """
import time

def solve(task, client):
    if task["calls"] == 0:
        return 0.0  # answers without the model: no call will come from this episode
    time.sleep(task["think_s"])
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": task["question"]}])
    return 1.0
"""


def test_a_batch_starts_once_every_running_agent_has_called_not_after_the_whole_wait(tokenizer, tmp_path):
    """With a 30 s wait bound, two agents that finish without calling and two that call after 0.5 s of
    their own work: one batch of two, started as soon as the second call is in (not after 30 s)."""
    agent = _agent_file(tmp_path, SOME_CALL)
    rollout = _rollout(
        _hf(tokenizer), tokenizer, agent, plugins={"openai_agent": {"agent": agent, "batch_wait_s": 30.0}}
    )
    tasks = [{"question": f"{i} + 1?", "calls": i % 2, "think_s": 0.5} for i in range(4)]
    start = time.monotonic()
    trajectories = rollout.run(
        [None] * 4, tasks, [0, 0, 1, 1], SamplingParams(max_new_tokens=4, seed=3), seeds=[1, 2, 3, 4]
    )
    elapsed = time.monotonic() - start
    assert rollout.batches == [2]
    assert elapsed < 25, elapsed  # the 30 s bound was not waited out (margin for a loaded machine)
    assert [t.info["agent_calls"] for t in trajectories] == [0, 1, 0, 1]


def test_episodes_sample_the_same_tokens_whatever_runs_beside_them(tokenizer, tmp_path):
    """Each call samples from its episode's seed and call number: one agent at a time (batches of
    one) or all together (batched) gives the same tokens."""
    agent = _agent_file(tmp_path, LOOP)
    runs = []
    for options in ({"max_concurrency": 1}, {"max_concurrency": 0, "batch_wait_s": 30.0}):
        config = {"agent": agent, **options}
        rollout = _rollout(_hf(tokenizer), tokenizer, agent, plugins={"openai_agent": config})
        tasks = [{"question": f"{i} + 1?"} for i in range(4)]
        runs.append(
            rollout.run(
                [None] * 4, tasks, [0, 0, 1, 1], SamplingParams(max_new_tokens=10, seed=3), seeds=[21, 22, 23, 24]
            )
        )
        assert max(rollout.batches) == (1 if options["max_concurrency"] == 1 else 4)
    assert [t.token_ids for t in runs[0]] == [t.token_ids for t in runs[1]]
    assert [x for t in runs[0] for x in t.sampler_logprobs] == pytest.approx(
        [x for t in runs[1] for x in t.sampler_logprobs], abs=1e-4
    )


def _docs_agent(tmp_path, name: str = "calc_agent.py") -> str:
    """An agent of docs/guides/agents.md, written out as its ``# file:`` block says."""
    text = (ROOT / "docs" / "guides" / "agents.md").read_text()
    code = text.split(f"# file: {name}\n", 1)[1].split("```", 1)[0]
    (tmp_path / name).write_text(code)
    return f"{tmp_path / name}:solve"


def test_the_agents_sdk_agent_runs_its_tool_through_the_endpoint(tokenizer, tmp_path):
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>'
    engine = ScriptedEngine(tokenizer, [call, "\\boxed{5}"])
    rollout = _rollout(engine, tokenizer, _docs_agent(tmp_path, "sdk_agent.py"), on_call_error="fail")
    [trajectory] = rollout.run([None], [{"question": "2+3?"}], [0], SamplingParams(seed=0))
    assert trajectory.completion_text == "\\boxed{5}" and trajectory.info["agent_calls"] == 2
    (prompt1, gen1), (prompt2, gen2) = engine.log  # the SDK's second call extends its first: one row
    assert not trajectory.segments and trajectory.token_ids == prompt2 + gen2.token_ids
    assert prompt2[: len(prompt1) + len(gen1.token_ids)] == prompt1 + gen1.token_ids
    assert "<|im_start|>tool\n5<|im_end|>" in ChatTokenizer(tokenizer).decode(prompt2[len(prompt1) :])


def test_tool_calls_come_back_parsed_and_tool_tokens_are_masked(tokenizer, tmp_path):
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>'
    engine = ScriptedEngine(tokenizer, [f"Let me compute.\n{call}", "\\boxed{5}"])
    rollout = _rollout(engine, tokenizer, _docs_agent(tmp_path))
    [trajectory] = rollout.run([None], [{"question": "2+3?", "answer": "5"}], [0], SamplingParams(seed=0))
    assert trajectory.info["agent_calls"] == 2 and not trajectory.segments
    returned = trajectory.messages[-3]  # the agent's final messages: assistant call, tool result, answer
    assert returned["tool_calls"][0]["function"] == {"name": "calculator", "arguments": '{"expression": "2+3"}'}
    assert returned["content"] == "Let me compute." and trajectory.messages[-2]["content"] == "5"
    assert trajectory.completion_text == "\\boxed{5}"
    chat = ChatTokenizer(tokenizer)
    (prompt1, gen1), (prompt2, gen2) = engine.log
    assert (
        trajectory.token_ids == prompt2 + gen2.token_ids
        and prompt2[: len(prompt1) + len(gen1.token_ids)] == prompt1 + gen1.token_ids
    )  # one trajectory: call 2's prompt extends call 1's prompt + sample
    delta = prompt2[len(prompt1) + len(gen1.token_ids) :]
    assert "calculator" not in chat.decode(prompt1[-3:]) and "<|im_start|>tool\n5<|im_end|>" in chat.decode(delta)
    assert trajectory.loss_mask == [0] * len(prompt1) + [1] * len(gen1.token_ids) + [0] * len(delta) + [1] * len(
        gen2.token_ids
    )
    assert "You have these tools:" in chat.decode(prompt1)  # SmolLM2's template ignores tools=
    assert trajectory.sampler_logprobs[len(prompt1)] == -0.5


REWRITE = """
def solve(task, client):
    messages = [{"role": "user", "content": "Hello"}]
    first = client.chat.completions.create(model="m", messages=messages).choices[0].message.content
    summary = [{"role": "user", "content": "Summary of before: " + first[:3]}]
    client.chat.completions.create(model="m", messages=summary)
    return 0.5
"""


def test_a_history_rewrite_starts_a_second_segment_sharing_reward_and_group(tokenizer, tmp_path):
    engine = RecordingEngine(_hf(tokenizer))
    rollout = _rollout(engine, tokenizer, _agent_file(tmp_path, REWRITE))
    trajectories = rollout.run([None] * 2, [{}, {}], [4, 4], SamplingParams(seed=1), seeds=[5, 6])
    chat = ChatTokenizer(tokenizer)
    for trajectory in trajectories:
        [earlier] = trajectory.segments
        assert trajectory.info["agent_segments"] == 2 and trajectory.env_return == 0.5
        assert earlier.token_ids[: earlier.turns[0].start] == chat.prompt_ids([{"role": "user", "content": "Hello"}])
        assert chat.decode(trajectory.token_ids[: trajectory.turns[0].start]).count("Summary of before") == 1
        assert sum(earlier.loss_mask) and sum(trajectory.loss_mask)
    rows, totals, shares = with_segments(trajectories, [0.5, -1.0])
    assert len(rows) == 4 and totals == [0.5, 0.5, -1.0, -1.0] and [r.group for r in rows] == [4, 4, 4, 4]
    assert shares == [0.5] * 4  # each episode counts once in its group's statistics


BAD_FIELD = """
def solve(task, client):
    try:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], reasoning_effort="low")
    except openai.BadRequestError as exc:
        return [{"role": "assistant", "content": str(exc)}]
    return None
"""


def test_an_unsupported_field_is_a_400_naming_it(tokenizer, tmp_path):
    rollout = _rollout(_hf(tokenizer), tokenizer, _agent_file(tmp_path, BAD_FIELD))
    [trajectory] = rollout.run([None], [{}], [0], SamplingParams(seed=0))
    assert "Error code: 400" in trajectory.completion_text or "400" in trajectory.messages[-1]["content"]
    assert "unsupported field 'reasoning_effort'" in trajectory.messages[-1]["content"]
    assert trajectory.info["agent_calls"] == 0 and not trajectory.turns


def test_grpo_trains_the_agent_through_the_cli(tiny_model_dir, tmp_path):
    # Two calls that merge, then one on a rewritten history (a second segment: a second row); a
    # reward the random tiny model earns about half the time, so GRPO groups have a spread.
    agent = _agent_file(
        tmp_path,
        LOOP.replace("range(3)", "range(2)").replace(
            "    return messages[:-1]",
            """\
    last = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Again?"}])
    return float(len(last.choices[0].message.content) % 2)""",
        ),
    )
    probe = tmp_path / "rows_probe.py"  # logs how many rows (and groups) each step trains on
    probe.write_text(
        "from agentrl import hookimpl\n\n\n@hookimpl\n"
        "def agentrl_adjust_loss_mask(batch, config, settings, metrics):\n"
        "    metrics['probe/rows'] = float(batch.num_rows)\n"
        "    metrics['probe/groups'] = float(len(set(batch.groups.tolist())))\n"
    )
    out = tmp_path / "run"
    result = agentrl_in_process(
        "train",
        "--env",
        "math",
        "--model",
        str(tiny_model_dir),
        "--max-steps",
        "3",
        "--num-generations",
        "2",
        "--prompts-per-step",
        "2",
        "--output-dir",
        str(out),
        "--plugin",
        str(probe),
        "--set",
        "rollout=openai_agent",
        "--set",
        f"plugins.openai_agent.agent={agent}",
        "--set",
        "eval_tasks=2",
        "--set",
        "max_new_tokens=8",
        "--set",
        "save_model=false",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if "loss/total" in line] == [1, 2, 3]
    lines = [line for line in lines if "loss/total" in line]
    assert all(line["rollout/turns_mean"] == 3.0 for line in lines)  # every segment's: three calls
    assert all(line["agent/calls_mean"] == 3.0 and line["agent/segments_mean"] == 2.0 for line in lines)
    episodes = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert [[c["cut"] for c in e["calls"]] for e in episodes] == [
        ["first call", None, "history rewritten: message 0 differs from the previous call's"]
    ] * 12
    assert all(line["probe/rows"] == 8 and line["probe/groups"] == 2 for line in lines)  # 4 episodes x 2 segments
    assert any(line["train/grad_norm"] > 0 for line in lines)  # the agent's rewards moved the policy
    # The trainer's logprobs of the recorded tokens match the sampler's: the rows are what was sampled.
    assert all(abs(line["policy/sampler_logprob_gap"]) < 0.05 for line in lines)


ASYNC_AND_URL = """
async def solve(task, client):
    reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}])
    return float(isinstance(client, openai.AsyncOpenAI) and reply.choices[0].finish_reason in ("stop", "length"))


def solve_url(task, base_url):
    client = openai.OpenAI(base_url=base_url, api_key="anything")
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
    return 1.0
"""


@pytest.mark.parametrize("function", ["solve", "solve_url"])
def test_async_agents_and_base_url_agents(tokenizer, tmp_path, function):
    agent = _agent_file(tmp_path, ASYNC_AND_URL).replace(":solve", f":{function}")
    rollout = _rollout(_hf(tokenizer), tokenizer, agent)
    trajectories = rollout.run(
        [None] * 3, [{}] * 3, [0] * 3, SamplingParams(max_new_tokens=10, seed=0), seeds=[1, 2, 3]
    )
    for trajectory in trajectories:
        assert trajectory.env_return == 1.0 and trajectory.info["agent_calls"] == 1
        assert trajectory.num_sampled_tokens <= (3 if function == "solve_url" else 10)


class BrokenEngine(Engine):
    def generate(self, prompts, sampling):
        raise RuntimeError("device lost")


def test_an_engine_failure_stops_the_rollout_naming_it(tokenizer, tmp_path):
    from agentrl import EngineError

    for on_call_error in ("skip", "fail"):
        rollout = _rollout(BrokenEngine(), tokenizer, _agent_file(tmp_path, LOOP), on_call_error=on_call_error)
        with pytest.raises(EngineError, match="BrokenEngine failed on an agent call: RuntimeError: device lost"):
            rollout.run([None], [{"question": "q"}], [0], SamplingParams(seed=0))


def test_an_agent_that_raises_is_skipped_or_fails_the_run(tokenizer, tmp_path):
    from agentrl import EnvError

    agent = _agent_file(tmp_path, "def solve(task, client):\n    raise ValueError('no luck')\n")
    with pytest.warns(RuntimeWarning, match="ValueError: no luck; the episode ends unscored"):
        [skipped] = _rollout(_hf(tokenizer), tokenizer, agent).run([None], [{"question": "q"}], [0], SamplingParams())
    assert skipped.info["error"]["exception"] == "ValueError: no luck" and not skipped.turns
    with pytest.raises(EnvError, match="no luck"):
        _rollout(_hf(tokenizer), tokenizer, agent, on_call_error="fail").run([None], [{}], [0], SamplingParams())


def test_a_missing_agent_is_a_config_error(tokenizer):
    from agentrl import ConfigError

    with pytest.raises(ConfigError, match="plugins.openai_agent.agent"):
        _rollout(_hf(tokenizer), tokenizer, "")
    with pytest.raises(ConfigError, match="cannot be loaded"):
        _rollout(_hf(tokenizer), tokenizer, "no_such_file.py:solve")


OPTIONS = """
import json

TOOLS = [%s]


def solve(task, client):
    messages = [{"role": "user", "content": "Add 2 and 3."}]
    plain = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, tool_choice="none")
    cut = client.chat.completions.create(model="m", messages=messages, stop=["compute"])
    try:
        client.chat.completions.create(model="m", messages=messages, tools=TOOLS,
                                       tool_choice={"type": "function", "function": {"name": "abacus"}})
    except openai.BadRequestError as exc:
        refused = str(exc)
    return [{"role": "assistant", "content": json.dumps([plain.choices[0].message.model_dump(),
                                                         plain.choices[0].finish_reason,
                                                         cut.choices[0].message.content, cut.choices[0].finish_reason,
                                                         refused])}]
"""


def test_tool_choice_none_stop_strings_and_refused_choices(tokenizer, tmp_path):
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>'
    tool = {
        "type": "function",
        "function": {
            "name": "calculator",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
    engine = ScriptedEngine(tokenizer, [f"Let me compute.\n{call}"])
    rollout = _rollout(engine, tokenizer, _agent_file(tmp_path, OPTIONS % json.dumps(tool)))
    [trajectory] = rollout.run([None], [{}], [0], SamplingParams(seed=0))
    message, reason, cut, cut_reason, refused = json.loads(trajectory.completion_text)
    assert message["content"] == f"Let me compute.\n{call}" and not message["tool_calls"] and reason == "stop"
    assert cut == "Let me " and cut_reason == "stop"
    assert "'tool_choice' names function 'abacus', which is not among the tools given: calculator" in refused
    # The cut call kept the sampled ids up to the one that completed "compute", and no more.
    [earlier] = trajectory.segments
    kept = trajectory.token_ids[trajectory.turns[0].start :]
    assert "compute" in ChatTokenizer(tokenizer).decode(kept) and "compute" not in ChatTokenizer(tokenizer).decode(
        kept[:-1]
    )
    assert kept == engine.log[1][1].token_ids[: len(kept)] and len(earlier.turns) == 1


def test_an_agent_past_its_timeout_is_unscored(tokenizer, tmp_path):
    agent = _agent_file(tmp_path, "import time\n\n\ndef solve(task, client):\n    time.sleep(3)\n    return 1.0\n")
    rollout = _rollout(_hf(tokenizer), tokenizer, agent, plugins={"openai_agent": {"agent": agent, "timeout_s": 0.5}})
    with pytest.warns(RuntimeWarning, match="timed out"):
        [trajectory] = rollout.run([None], [{"question": "q"}], [0], SamplingParams())
    assert trajectory.info["error"]["timed_out"] is True and trajectory.env_return == 0.0


# -- the tool parser chosen from the model, tool_choice, streaming -------------------------------------------


def _variant(tokenizer, template: str | None = None, special: list[str] | None = None):
    """A copy of the real tokenizer with another chat template or more special tokens."""
    import copy

    variant = copy.deepcopy(tokenizer)
    if template is not None:
        variant.chat_template = template
    if special:
        variant.add_special_tokens({"additional_special_tokens": special})
    return variant


@pytest.mark.parametrize(
    ("template", "special", "expected", "why"),
    [
        (None, None, "xml_json", "no native call syntax"),  # SmolLM2: the default model
        ("{{ '<tool_call>' }}{{ messages }}", None, "xml_json", "the chat template writes <tool_call>"),
        ("{{ '<tool_call>\\n<function=' }}{{ messages }}", None, "qwen3_coder", "the chat template writes <function="),
        ("{{ '<|python_tag|>' }}{{ messages }}", None, "llama3_json", "the chat template writes <|python_tag|>"),
        ("{{ '<|start_header_id|>' }}{{ messages }}", None, "llama3_json", "writes <|start_header_id|>"),
        (None, ["[TOOL_CALLS]"], "mistral", "the tokenizer has the special token [TOOL_CALLS]"),
        (None, ["<|call|>"], "harmony", "the tokenizer has the special token <|call|>"),
    ],
)
def test_the_tool_parser_is_chosen_from_the_model(tokenizer, template, special, expected, why):
    from agentrl_openai_agent.tools import detect_tool_parser

    name, reason = detect_tool_parser(_variant(tokenizer, template, special))
    assert name == expected and why in reason


def test_auto_is_the_default_and_resolves_to_xml_json_for_smollm2(tokenizer, tmp_path, capsys):
    from agentrl import parse_xml_json
    from agentrl_openai_agent import tools as agent_tools

    agent_tools._announced.clear()
    rollout = _rollout(_hf(tokenizer), tokenizer, _agent_file(tmp_path, LOOP))
    assert rollout.options.tool_parser == "auto" and rollout.parser is parse_xml_json
    _rollout(_hf(tokenizer), tokenizer, _agent_file(tmp_path, LOOP))  # said once, not per rollout
    assert capsys.readouterr().err.count("openai_agent: tool_parser auto -> xml_json (no native call syntax") == 1
    with pytest.raises(Exception, match="unknown tool_parser 'xml_jsn'; did you mean 'xml_json'"):
        _rollout(
            _hf(tokenizer),
            tokenizer,
            "",
            plugins={"openai_agent": {"agent": _agent_file(tmp_path, LOOP), "tool_parser": "xml_jsn"}},
        )


@pytest.mark.parametrize("where", ["env_args.tool_parser", "plugins.openai_agent.tool_parser"])
def test_print_config_refuses_a_tool_parser_as_train_does(where, tiny_model_dir, tmp_path):
    agent = _agent_file(tmp_path, LOOP)
    common = [
        "--env",
        "calculator",
        "--set",
        f"{where}=xml_jsn",
        "--set",
        "rollout=openai_agent",
        "--set",
        f"plugins.openai_agent.agent={agent}",
    ]
    printed = agentrl_in_process("train", *common, "--print-config")
    trained = agentrl_in_process(
        "train",
        *common,
        "--model",
        str(tiny_model_dir),
        "--max-steps",
        "1",
        "--set",
        "eval_tasks=0",
        "--output-dir",
        str(tmp_path / "r"),
    )
    for result in (printed, trained):
        assert result.returncode == 2 and "unknown tool_parser 'xml_jsn'; did you mean 'xml_json'?" in result.stderr, (
            result.stdout + result.stderr
        )
    assert printed.stderr.splitlines()[-1] == trained.stderr.splitlines()[-1]


TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}
CHOICES = """
import json

TOOLS = [%s, {"type": "function", "function": {"name": "clock", "parameters": {"type": "object"}}}]


def solve(task, client):
    messages = [{"role": "user", "content": "Add 2 and 3."}]
    reply = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, tool_choice=task["choice"])
    message = reply.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    for call in message.tool_calls or []:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "5"})
    client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    return [{"role": "assistant", "content": json.dumps([message.model_dump(), reply.choices[0].finish_reason])}]
""" % json.dumps(TOOL)


@pytest.mark.parametrize(
    ("choice", "opener", "sampled"),
    [
        ("required", "<tool_call>\n", '{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>'),
        (
            {"type": "function", "function": {"name": "calculator"}},
            '<tool_call>\n{"name": "calculator", "arguments": ',
            '{"expression": "2+3"}}\n</tool_call>',
        ),
    ],
)
def test_tool_choice_required_and_named_prefill_the_call_opening_masked(tokenizer, tmp_path, choice, opener, sampled):
    engine = ScriptedEngine(tokenizer, [sampled, "\\boxed{5}"])
    rollout = _rollout(engine, tokenizer, _agent_file(tmp_path, CHOICES), on_call_error="fail")
    [trajectory] = rollout.run([None], [{"choice": choice}], [0], SamplingParams(seed=0))
    message, reason = json.loads(trajectory.completion_text)
    assert reason == "tool_calls" and message["content"] is None
    assert [c["function"] for c in message["tool_calls"]] == [
        {"name": "calculator", "arguments": '{"expression": "2+3"}'}
    ]
    chat = ChatTokenizer(tokenizer)
    (prompt1, gen1), (prompt2, gen2) = engine.log
    assert chat.decode(prompt1).endswith("<|im_start|>assistant\n" + opener)  # prefilled: part of the prompt
    # One token-exact row: the opener masked with the prompt, only the sampled ids trained.
    assert not trajectory.segments and trajectory.token_ids == prompt2 + gen2.token_ids
    assert prompt2[: len(prompt1) + len(gen1.token_ids)] == prompt1 + gen1.token_ids
    assert trajectory.loss_mask[: len(prompt1) + len(gen1.token_ids)] == [0] * len(prompt1) + [1] * len(gen1.token_ids)
    assert chat.decode(prompt2).count(opener + sampled) == 1  # the call re-rendered as sampled, opener included


def test_tool_choice_required_with_a_call_the_parser_cannot_read_answers_the_text(tokenizer, tmp_path):
    engine = ScriptedEngine(tokenizer, ["not json at all", "ok"])
    rollout = _rollout(engine, tokenizer, _agent_file(tmp_path, CHOICES), on_call_error="fail")
    [trajectory] = rollout.run([None], [{"choice": "required"}], [0], SamplingParams(seed=0))
    message, reason = json.loads(trajectory.completion_text)
    assert reason == "stop" and message["content"] == "<tool_call>\nnot json at all" and not message["tool_calls"]


REFUSED_CHOICES = """
def solve(task, client):
    refused = []
    for tools, choice in task["cases"]:
        try:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], tools=tools,
                                           tool_choice=choice)
        except openai.BadRequestError as exc:
            refused.append(exc.body["message"])
    return [{"role": "assistant", "content": "\\n".join(refused)}]
"""


def test_tool_choice_mistakes_are_400s_naming_them(tokenizer, tmp_path):
    cases = [[[TOOL], {"type": "function", "function": {"name": "clock"}}], [None, "required"], [[TOOL], "any"]]
    rollout = _rollout(_hf(tokenizer), tokenizer, _agent_file(tmp_path, REFUSED_CHOICES))
    [trajectory] = rollout.run([None], [{"cases": cases}], [0], SamplingParams(seed=0))
    assert trajectory.messages[-1]["content"].splitlines() == [  # no call reached the model: no completion
        "'tool_choice' names function 'clock', which is not among the tools given: calculator",
        "'tool_choice' 'required' needs 'tools'; none were given",
        "tool_choice: must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': NAME}} "
        "(got 'any')",
    ]
    assert trajectory.info["agent_calls"] == 0


STREAM = """
import json


def solve(task, client):
    messages = [{"role": "user", "content": "Add 2 and 3."}]
    kept = {}
    for options in ({}, {"stream_options": {"include_usage": True}}):
        chunks = list(client.chat.completions.create(model="m", messages=messages, tools=[%s], stream=True,
                                                     **options))
        plain = client.chat.completions.create(model="m", messages=messages, tools=[%s])
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        calls = [t.model_dump() for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
        kept[str(bool(options))] = {
            "content": content, "calls": calls, "plain": plain.choices[0].message.model_dump(),
            "finish": [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason],
            "usage": [c.usage.model_dump() for c in chunks if c.usage], "plain_usage": plain.usage.model_dump()}
    return [{"role": "assistant", "content": json.dumps(kept)}]
""" % (json.dumps(TOOL), json.dumps(TOOL))


def test_stream_true_sends_the_completion_as_openai_chunks(tokenizer, tmp_path):
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>'
    engine = ScriptedEngine(tokenizer, [f"Let me compute.\n{call}"])
    rollout = _rollout(engine, tokenizer, _agent_file(tmp_path, STREAM), on_call_error="fail")
    [trajectory] = rollout.run([None], [{}], [0], SamplingParams(seed=0))
    for with_usage, got in json.loads(trajectory.completion_text).items():
        assert got["content"] == got["plain"]["content"] == "Let me compute."
        [streamed] = got["calls"]  # the tool call arrives whole, with its index
        [plain] = got["plain"]["tool_calls"]
        assert (
            streamed["index"] == 0
            and streamed["function"]
            == plain["function"]
            == {"name": "calculator", "arguments": '{"expression": "2+3"}'}
            and streamed["id"].startswith("call_")
        )
        assert got["finish"] == ["tool_calls"]
        assert got["usage"] == ([got["plain_usage"]] if with_usage == "True" else [])
    assert trajectory.info["agent_calls"] == 4 and len(engine.log) == 4


N_CHOICES = """
import json


def solve(task, client):
    messages = [{"role": "user", "content": "Hello"}]
    if task.get("stream"):
        chunks = list(client.chat.completions.create(model="m", messages=messages, n=task["n"], stream=True))
        texts = ["".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
                 for i in range(task["n"])]
    else:
        reply = client.chat.completions.create(model="m", messages=messages, n=task["n"])
        texts = [choice.message.content for choice in reply.choices]
    if task["continue_with"] is not None:
        messages += [{"role": "assistant", "content": texts[task["continue_with"]]}, {"role": "user", "content": "More."}]
        client.chat.completions.create(model="m", messages=messages)
    return [{"role": "assistant", "content": json.dumps(texts)}]
"""


def test_n_choices_the_continued_one_is_merged_the_others_are_segments_of_their_own(tokenizer, tmp_path):
    engine = RecordingEngine(_hf(tokenizer))
    rollout = _rollout(engine, tokenizer, _agent_file(tmp_path, N_CHOICES), on_call_error="fail")
    tasks = [
        {"n": 3, "continue_with": 2},
        {"n": 3, "continue_with": None, "stream": True},
        {"n": 1, "continue_with": 0},
    ]
    # Episodes 0 and 2 share a seed: choice 0 of an n=3 call samples what the same call with n=1 samples.
    chosen, unchosen, single = rollout.run(
        [None] * 3, tasks, [0, 0, 1], SamplingParams(max_new_tokens=10, seed=3), seeds=[7, 8, 7]
    )
    chat = ChatTokenizer(tokenizer)
    prompt = chat.prompt_ids([{"role": "user", "content": "Hello"}])
    sampled = {tuple(g.token_ids) for p, g in engine.log if p == prompt}
    for trajectory in (chosen, unchosen):
        assert trajectory.info["agent_calls"] == (2 if trajectory is chosen else 1) and len(trajectory.segments) == 2
        for alone in trajectory.segments:  # a separate segment: the whole prompt masked, then its sampled ids
            [turn] = alone.turns
            assert (
                alone.token_ids[: turn.start] == prompt
                and alone.loss_mask == [0] * turn.start + [1] * (len(alone.token_ids) - turn.start)
                and alone.sampler_logprobs[: turn.start] == [0.0] * turn.start
            )
        first = trajectory.turns[0]
        spans = [tuple(s.token_ids[s.turns[0].start :]) for s in trajectory.segments] + [
            tuple(trajectory.token_ids[first.start : first.end])
        ]
        assert len(set(spans)) == 3 and set(spans) <= sampled  # three different samples, each what was sampled
    # The continued choice (2) is merged with the next call: one token-exact row of two turns.
    assert len(chosen.turns) == 2 and chosen.token_ids[: chosen.turns[0].start] == prompt
    texts = json.loads(chosen.messages[-1]["content"])
    assert chat.decode(chosen.token_ids[chosen.turns[0].start : chosen.turns[0].end]).startswith(texts[2])
    assert chosen.segments[0].token_ids == single.token_ids[: single.turns[0].end]  # choice 0, as with n=1
    assert chosen.segments[0].sampler_logprobs[len(prompt) :] == pytest.approx(
        single.sampler_logprobs[len(prompt) : single.turns[0].end], abs=1e-4
    )
    # Not continued: choice 0 stays the trajectory, the streamed texts are the three choices'.
    streamed = json.loads(unchosen.messages[-1]["content"])
    rows = [*unchosen.segments, unchosen]
    order = [rows[2], rows[0], rows[1]]  # choice 0 is the trajectory; choices 1 and 2 its segments
    assert streamed == [
        chat.assistant_text(r.token_ids[r.turns[0].start : r.turns[0].end], r.turns[0].finish_reason == "stop")
        for r in order
    ]
    rows, totals, shares = with_segments([chosen, unchosen, single], [1.0, 0.0, 0.5])
    assert len(rows) == 7 and totals == [1.0] * 3 + [0.0] * 3 + [0.5] and shares == [1 / 3] * 6 + [1.0]


def test_n_out_of_range_is_a_400(tokenizer, tmp_path):
    agent = _agent_file(tmp_path, BAD_FIELD.replace('reasoning_effort="low"', "n=17"))
    [trajectory] = _rollout(_hf(tokenizer), tokenizer, agent).run([None], [{}], [0], SamplingParams(seed=0))
    assert "n: Input should be less than or equal to 16 (got 17)" in trajectory.messages[-1]["content"]
