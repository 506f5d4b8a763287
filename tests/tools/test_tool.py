"""agentrl.tools.tool: schemas from typed functions, argument validation, call parsing, ToolEnv steps,
and the calculator's safe evaluator."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Literal

import pytest

import agentrl
import agentrl_tool_envs
from agentrl import EnvError, PluginError
from agentrl.plugins import PluginManager
from agentrl.tools.tool import (
    Tool,
    ToolCall,
    ToolEnv,
    ToolError,
    ToolParser,
    format_tool_call,
    parse_xml_json,
    render_tools_system_prompt,
    resolve_tool_parser,
    tool,
)
from agentrl_tool_envs import calculator, evaluate_arithmetic


@tool
def add(a: int, b: int = 0) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b (int): The second number,
            zero if left out.

    Returns:
        The sum.
    """
    return a + b


def test_schema_from_signature_and_docstring() -> None:
    assert add.schema == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "description": "The first number."},
                    "b": {"type": "integer", "description": "The second number, zero if left out."},
                },
                "required": ["a"],
            },
        },
    }


def test_schema_of_containers_unions_and_literals() -> None:
    def f(
        xs: list[float], mode: Literal["fast", "slow"], tag: str | None = None, extra: dict[str, int] | None = None
    ) -> str:
        """Do f."""
        return ""

    props = Tool(f).schema["function"]["parameters"]["properties"]
    assert props["xs"] == {"type": "array", "items": {"type": "number"}}
    assert props["mode"] == {"enum": ["fast", "slow"]}
    assert props["tag"] == {"type": ["string", "null"]}
    assert props["extra"]["anyOf"][0] == {"type": "object", "additionalProperties": {"type": "integer"}}


def test_bad_tool_definitions_are_refused() -> None:
    def untyped(a):  # type: ignore[no-untyped-def]
        return a

    def star(*args: int) -> int:
        return 0

    def weird(a: set[int]) -> int:
        return 0

    with pytest.raises(ToolError, match=re.escape("parameter 'a' has no type hint")):
        Tool(untyped)
    with pytest.raises(ToolError, match="named parameters only"):
        Tool(star)
    with pytest.raises(ToolError, match="has no JSON schema"):
        Tool(weird)


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({}, "add: missing argument(s) a"),
        ({"a": 1, "c": 2}, "unexpected argument(s) c (allowed: a, b)"),
        ({"a": "1"}, "argument 'a' must be integer, got '1'"),
        ({"a": True}, "argument 'a' must be integer, got True"),
        ({"a": 1.5}, "argument 'a' must be integer, got 1.5"),
    ],
)
def test_argument_validation_names_the_problem(arguments: dict, message: str) -> None:
    with pytest.raises(ToolError, match=re.escape(message)):
        add(**arguments)


def test_valid_arguments_call_the_function() -> None:
    assert add(a=2, b=3) == 5
    assert add(a=2) == 2

    def scale(x: float) -> float:
        """Scale."""
        return x * 2

    assert Tool(scale)(x=3) == 6  # an int is a valid JSON number


def test_parse_single_and_multiple_calls() -> None:
    text = (
        'Let me compute. <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>\n'
        '<tool_call>\n{"name": "add", "arguments": {"a": 5}}\n</tool_call>'
    )
    calls = parse_xml_json(text)
    assert [(c.name, c.arguments, c.error) for c in calls] == [("add", {"a": 1, "b": 2}, None), ("add", {"a": 5}, None)]
    assert parse_xml_json("The answer is 3.") == []


@pytest.mark.parametrize(
    "body, error",
    [
        ("{not json}", "tool call is not valid JSON"),
        ('["add"]', 'a JSON object with a string "name"'),
        ('{"arguments": {}}', 'a JSON object with a string "name"'),
        ('{"name": "add", "arguments": [1, 2]}', '"arguments" must be a JSON object'),
    ],
)
def test_malformed_calls_carry_an_error(body: str, error: str) -> None:
    (call,) = parse_xml_json(f"<tool_call>{body}</tool_call>")
    assert call.arguments is None and error in (call.error or "")
    assert call.raw == body


def test_parser_leniencies() -> None:
    body = '{"name": "add", "arguments": {"a": 1}}'
    (fenced,) = parse_xml_json(f"<tool_call>```json\n{body}\n```</tool_call>")
    (stringy,) = parse_xml_json('<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>')
    (unclosed,) = parse_xml_json('<tool_call>{"name": "add", "arguments": {"a": 1}}')
    (no_args,) = parse_xml_json('<tool_call>{"name": "add"}</tool_call>')
    assert fenced.arguments == stringy.arguments == unclosed.arguments == {"a": 1}
    assert no_args.arguments == {}


def test_system_prompt_fallback_lists_schemas_and_call_format() -> None:
    text = render_tools_system_prompt([add])
    assert "- add(a: integer, b: integer): Add two integers.\n" in text
    assert "    a: The first number.\n    b (optional): The second number, zero if left out.\n" in text
    example = text.split("<tool_call>\n")[1].split("\n</tool_call>")[0]
    assert json.loads(example) == {"name": "add", "arguments": {"a": "..."}}
    (parsed,) = parse_xml_json(f"<tool_call>\n{example}\n</tool_call>")
    assert parsed.name == "add" and parsed.error is None
    assert render_tools_system_prompt([add.schema]) == text
    with pytest.raises(ToolError, match="at least one tool"):
        render_tools_system_prompt([])


def test_format_tool_call_is_what_the_default_parser_reads() -> None:
    (parsed,) = parse_xml_json(format_tool_call("add", a=1, b=2))
    assert (parsed.name, parsed.arguments, parsed.error) == ("add", {"a": 1, "b": 2}, None)


class AddEnv(ToolEnv):
    """A tiny tool env: answer the sum of two numbers using ``add``."""

    tools = (add,)
    instructions = "Add the numbers."
    max_tool_output_chars = 100

    def train_tasks(self) -> list[dict]:
        return [{"question": "What is 2 + 3?", "answer": "5"}]

    def eval_tasks(self) -> list[dict]:
        return self.train_tasks()

    def score_answer(self, text: str) -> float:
        return float(text.strip() == "5")


def call(name: str, **arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_tool_env_runs_calls_then_scores_the_answer() -> None:
    env = AddEnv()
    messages, info = env.reset(seed=0)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"] == "Add the numbers.\n\n" + render_tools_system_prompt([add])
    obs, reward, terminated, truncated, info = env.step(call("add", a=2, b=3))
    assert obs == [{"role": "tool", "content": "5", "name": "add"}]
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info == {"tool_calls": 1, "tool_errors": 0}
    obs, reward, terminated, truncated, info = env.step("5")
    assert (obs, reward, terminated, info) == ([], 1.0, True, {"tool_calls": 0, "tool_errors": 0})


def test_demonstrations_go_between_system_and_question_and_native_tools_drop_the_fallback() -> None:
    example = [
        {"role": "user", "content": "1 + 1?"},
        {"role": "assistant", "content": call("add", a=1, b=1)},
        {"role": "tool", "content": "2"},
        {"role": "assistant", "content": "2"},
    ]

    class ShownEnv(AddEnv):
        demonstrations = (example,)

    env = ShownEnv()
    messages, _ = env.reset(seed=0)
    assert messages[1:5] == example and messages[5]["role"] == "user" and len(messages) == 6
    assert "<tool_call>" in messages[0]["content"]
    messages, _ = env.reset(seed=0, options={"template_renders_tools": True})
    assert messages[0] == {"role": "system", "content": "Add the numbers."}
    assert env.tool_schemas() == [add.schema]
    messages, _ = env.reset(seed=0)  # the option lasts one episode
    assert "<tool_call>" in messages[0]["content"]


def test_bad_calls_come_back_as_error_messages() -> None:
    def boom(x: int) -> str:
        """Fail."""
        raise RuntimeError(f"boom {x}")

    def long(n: int) -> str:
        """Long output."""
        return "x" * n

    env = AddEnv(tools=[add, Tool(boom), Tool(long)])
    env.reset(seed=0)
    text = " ".join([call("nope"), call("add", a="two"), "<tool_call>{oops</tool_call>", call("boom", x=1)])
    obs, reward, terminated, truncated, info = env.step(text)
    contents = [m["content"] for m in obs]
    assert contents[0] == "Error: unknown tool 'nope'; available: add, boom, long"
    assert contents[1].startswith("Error: add: argument 'a' must be integer")
    assert contents[2].startswith("Error: tool call is not valid JSON")
    assert contents[3] == "Error: RuntimeError: boom 1"
    assert info == {"tool_calls": 4, "tool_errors": 4} and not terminated and reward == 0.0
    obs, *_ = env.step(call("long", n=500))
    assert obs[0]["content"] == "x" * 100 + "\n[truncated 400 characters]"
    obs, _, _, truncated, info = env.step(" ".join([call("add", a=1)] * 6))
    assert info == {"tool_calls": 6, "tool_errors": 2} and not truncated  # 4 calls allowed
    assert obs[-1]["content"].startswith("Error: too many tool calls in one message")
    assert env.step(call("add", a=1))[3]  # the 4th turn still calling tools: truncated


def test_an_agentrl_error_in_a_tool_stops_the_run_instead_of_reaching_the_model() -> None:
    def sandboxed(code: str) -> str:
        """Fail the way a sandbox limit set wrong in the config does."""
        raise EnvError("run_python: timeout_s must be a number of seconds from 0.01 to 3600, got inf")

    def picky(code: str) -> str:
        """Refuse the model's argument."""
        raise ToolError("picky: code must not be empty")

    env = AddEnv(tools=[Tool(sandboxed), Tool(picky)])
    env.reset(seed=0)
    obs, *_ = env.step(call("picky", code=""))
    assert obs[0]["content"] == "Error: picky: code must not be empty"  # the model's fault
    with pytest.raises(EnvError, match=re.escape("timeout_s must be a number of seconds from 0.01 to 3600, got inf")):
        env.step(call("sandboxed", code="print(1)"))  # the config's fault


def test_tool_env_rejects_bad_settings() -> None:
    with pytest.raises(EnvError, match="max_turns must be a positive integer, got 0"):
        AddEnv(max_turns=0)
    with pytest.raises(EnvError, match="tools must be Tool objects"):
        AddEnv(tools=[add.fn])


def test_tool_parser_is_selected_by_registered_name() -> None:
    manager = PluginManager()
    manager.register_plugin(agentrl_tool_envs, name="tool_envs")
    assert manager.registry.names("tool_parser") == ["harmony", "llama3_json", "mistral", "qwen3_coder", "xml_json"]
    assert manager.registry.names("env") == ["calculator", "python"]

    def lookup(name: str) -> ToolParser:  # what the caller holding the plugin manager passes in
        return manager.registry.get("tool_parser", name).factory

    assert AddEnv(**resolve_tool_parser({"tool_parser": "xml_json"}, lookup)).tool_parser is parse_xml_json
    with pytest.raises(PluginError, match="unknown tool_parser 'xml_jsn'; did you mean 'xml_json'?"):
        AddEnv(**resolve_tool_parser({"tool_parser": "xml_jsn"}, lookup))


def test_resolve_tool_parser_touches_only_a_name() -> None:
    def lookup(name: str) -> ToolParser:
        raise AssertionError(f"looked up {name!r}")

    args = {"tool_parser": parse_xml_json, "max_turns": 2}
    assert resolve_tool_parser(args, lookup) == args and resolve_tool_parser({}, lookup) == {}
    assert resolve_tool_parser({"tool_parser": ["x"]}, lookup) == {"tool_parser": ["x"]}  # the env refuses it


def test_a_parser_name_given_to_the_env_itself_is_refused() -> None:
    with pytest.raises(
        EnvError,
        match=re.escape(
            "AddEnv: tool_parser 'xml_json' is a registered parser's name; "
            "pass the parser function itself, or resolve env_args with "
            "agentrl.tools.tool.resolve_tool_parser"
        ),
    ):
        AddEnv(tool_parser="xml_json")  # type: ignore[arg-type]


def _agentrl_imports(module: str) -> set[str]:
    """The agentrl modules ``module``'s source imports, at module level or inside functions."""
    root = Path(agentrl.__file__).parent

    def source(name: str) -> Path:
        path = root / name.removeprefix("agentrl.").replace(".", "/")
        return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")

    found = set()
    for node in ast.walk(ast.parse(source(module).read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found |= {n for n in names if n.startswith("agentrl.") and source(n).is_file()}
    return found


def test_the_tool_contract_imports_nothing_from_the_plugin_manager() -> None:
    """tools.py is a contract every tool env uses: parsers come in from the caller that holds the
    plugin manager, so neither it nor anything it imports (the package ``__init__`` aside) reaches
    ``agentrl.plugins``."""
    seen, todo = set(), ["agentrl.tools.tool"]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += sorted(_agentrl_imports(module))
    assert {"agentrl.tools.tool", "agentrl.tools.calls", "agentrl.env"} <= seen
    assert "agentrl.plugins" not in seen, sorted(seen)


def test_custom_parser_callable() -> None:
    env = AddEnv(tool_parser=lambda text: [ToolCall("add", {"a": 7}, None, text)] if "!" in text else [])
    env.reset(seed=0)
    assert env.step("go!")[0][0]["content"] == "7"


@pytest.mark.parametrize(
    "expression, value",
    [
        ("(23 * 7) - 48", 113),
        ("-3 + +4", 1),
        ("7 / 2", 3.5),
        ("7 // 2", 3),
        ("7 % 4", 3),
        ("2 ** 10", 1024),
        ("2 ** -1", 0.5),
        ("1.5 * 4", 6.0),
        ("((1 + 2) * (3 + 4))", 21),
    ],
)
def test_calculator_evaluates_arithmetic(expression: str, value: float) -> None:
    assert evaluate_arithmetic(expression) == value


@pytest.mark.parametrize(
    "expression, error",
    [
        ("__import__('os').system('echo hi')", "Call is not allowed"),
        ("os.getcwd", "Attribute is not allowed"),
        ("x + 1", "Name is not allowed"),
        ("(lambda: 1)()", "Call is not allowed"),
        ("[1, 2]", "List is not allowed"),
        ("'a' * 3", "Constant is not allowed"),
        ("True + 1", "Constant is not allowed"),
        ("9 ** 9 ** 9", "is too large"),
        ("10 ** 100000", "is too large"),
        ("2.5 ** 10000", "is too large"),
        ("1 +", "not an arithmetic expression"),
        ("1" + " + 1" * 200, "at most 300"),
    ],
)
def test_calculator_refuses_everything_else(expression: str, error: str) -> None:
    with pytest.raises(ValueError, match=re.escape(error)):
        evaluate_arithmetic(expression)


def test_calculator_tool_output_and_errors() -> None:
    assert calculator("1 / 3") == "0.333333333333"
    assert calculator("(23 * 7) - 48") == "113"
    with pytest.raises(ZeroDivisionError):
        calculator("1 / 0")


def test_a_raising_parser_is_named() -> None:
    def broken(text: str) -> list[ToolCall]:
        raise KeyError("oops")

    env = AddEnv(tool_parser=broken)
    env.reset(seed=0)
    with pytest.raises(EnvError, match="AddEnv: tool parser .*broken.* raised KeyError"):
        env.step("hi")
