"""The verifiers adapter with the real verifiers library (classic API) and a small verifiers
environment written here: check_env passes, episodes are exactly verifiers' own rollouts (messages,
rubric reward and metrics), tools run through verifiers' ToolEnv, parked rollouts are cancelled, errors
are one clear line, and it trains 2 steps through the CLI on the tiny model."""

from __future__ import annotations

import asyncio
import gc
import json
import re
import sys
import threading
import types
from pathlib import Path
from typing import Any

import pytest
from cli_in_process import agentrl_in_process

from agentrl import ConfigError, EnvError
from agentrl.testing import check_env

vf = pytest.importorskip("verifiers")
if not hasattr(vf, "load_environment"):
    pytest.skip(
        f"verifiers {vf.__version__} has no classic API (pip install 'agentrl[verifiers]')", allow_module_level=True
    )

import agentrl_verifiers  # noqa: E402
from agentrl_verifiers import INSTALL_HINT, VerifiersEnv  # noqa: E402

MODULE = "agentrl_vf_arith"
ENV_MODULE = '''
"""A tiny verifiers environment for agentrl's tests: single-digit sums, scored by a Rubric."""

import datasets
import verifiers as vf


def rows(first, count):
    pairs = [(a, b) for a in range(10) for b in range(10)][first:first + count]
    return datasets.Dataset.from_list([{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in pairs])


def correct(completion, answer) -> float:
    """1 when the last reply is exactly the answer."""
    return 1.0 if str(completion[-1]["content"]).strip() == answer else 0.0


def brief(completion) -> float:
    """A metric (weight 0): 1 when the last reply has at most 3 characters."""
    return float(len(str(completion[-1]["content"]).strip()) <= 3)


def agree(completions, answers) -> list[float]:
    """A group-level reward function."""
    return [1.0] * len(completions)


class RetryEnv(vf.MultiTurnEnv):
    """Says which turn was wrong after a wrong answer; ends when the answer is right or turns run out."""

    async def env_response(self, messages, state, **kwargs):
        return [vf.UserMessage(content=f"Wrong (turn {len(state['trajectory'])}), try again.")]

    @vf.stop
    async def answered(self, state) -> bool:
        steps = state["trajectory"]
        return bool(steps) and str(steps[-1]["completion"][-1].content).strip() == state["answer"]


class BrokenEnv(RetryEnv):
    async def env_response(self, messages, state, **kwargs):
        raise ZeroDivisionError("the env's own bug")


class RewriteEnv(RetryEnv):
    async def get_prompt_messages(self, state):
        messages = await super().get_prompt_messages(state)
        return messages[1:] if state["trajectory"] else messages  # drops the system message later on


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


def load_environment(kind: str = "single", size: int = 20, eval_size: int = 0, max_turns: int = 3):
    funcs, weights = [correct, brief], [1.0, 0.0]
    if kind == "group":
        funcs, weights = funcs + [agree], weights + [1.0]
    common = dict(dataset=rows(0, size), system_prompt="Reply with the number only.",
                  rubric=vf.Rubric(funcs=funcs, weights=weights))
    if eval_size:
        common["eval_dataset"] = rows(size, eval_size)
    if kind in ("single", "group"):
        return vf.SingleTurnEnv(**common)
    if kind == "tools":
        return vf.ToolEnv(tools=[add], max_turns=max_turns, **common)
    if kind == "fail":
        raise ValueError("no such difficulty")
    return {"retry": RetryEnv, "broken": BrokenEnv, "rewrite": RewriteEnv}[kind](max_turns=max_turns, **common)
'''


@pytest.fixture(scope="module")
def env_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the test environment module, on sys.path for this module's tests."""
    folder = tmp_path_factory.mktemp("vf-envs")
    (folder / f"{MODULE}.py").write_text(ENV_MODULE)
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))


def make(kind: str = "single", **kwargs: Any) -> VerifiersEnv:
    env_kwargs = {"kind": kind, **kwargs.pop("env_kwargs", {})}
    return VerifiersEnv(MODULE, env_kwargs=env_kwargs, **{"num_eval": 4, **kwargs})


@pytest.mark.parametrize(
    "kind, env_kwargs", [("single", {}), ("single", {"eval_size": 5}), ("retry", {}), ("tools", {})]
)
def test_check_env_passes(env_dir: Path, kind: str, env_kwargs: dict[str, Any]) -> None:
    check_env(lambda: make(kind, env_kwargs=env_kwargs))


def test_single_turn_reward_and_metrics_come_from_the_rubric(env_dir: Path) -> None:
    env = make("single")
    task = env.train_tasks()[0]
    messages, _ = env.reset(options={"task": task})
    assert messages == [
        {"role": "system", "content": "Reply with the number only."},
        {"role": "user", "content": task["question"]},
    ]
    assert env.step(f" {task['answer']} ") == (
        [],
        1.0,
        True,
        False,
        {
            "success": True,
            "metrics": {"correct": 1.0, "brief": 1.0, "num_turns": 1.0},
            "stop_condition": "max_turns_reached",
        },
    )
    env.reset(options={"task": task})
    _, reward, terminated, _, info = env.step("I think it is 99.")
    assert (reward, terminated, info["success"], info["metrics"]["brief"]) == (0.0, True, False, 0.0)
    assert env.gold_reply(task) is None and env.max_turns == 1


class ScriptedClient(vf.Client):
    """A verifiers client that replies from a script: verifiers' own rollout, without agentrl."""

    def __init__(self, replies: list[str]) -> None:
        super().__init__(None)
        self.replies = list(replies)

    def setup_client(self, config: Any) -> Any:
        return None

    async def to_native_tool(self, tool: Any) -> Any:
        return tool

    async def to_native_prompt(self, messages: Any) -> tuple[Any, dict]:
        return messages, {}

    async def get_native_response(
        self, prompt: Any, model: str, sampling_args: Any, tools: Any = None, **kwargs: Any
    ) -> str:
        return self.replies.pop(0)

    async def raise_from_native_response(self, response: Any) -> None:
        return None

    async def from_native_response(self, response: str) -> Any:
        message = vf.types.ResponseMessage(content=response, finish_reason="stop", is_truncated=False)
        return vf.types.Response(id="scripted", created=0, model="scripted", message=message)

    async def close(self) -> None:
        return None


@pytest.mark.parametrize(
    "replies", [["no", "nope", "none"], ["no", "ANSWER"], ["ANSWER"]], ids=["out-of-turns", "second-try", "first-try"]
)
def test_multi_turn_episode_is_exactly_verifiers_own_rollout(env_dir: Path, replies: list[str]) -> None:
    env = make("retry")
    task = env.train_tasks()[5]
    replies = [task["answer"] if r == "ANSWER" else r for r in replies]
    conversation, info = env.reset(options={"task": task})
    reward, terminated, steps = 0.0, False, 0
    while not terminated:
        assistant = {"role": "assistant", "content": replies[steps]}
        messages, reward, terminated, truncated, info = env.step(replies[steps])
        conversation += [assistant] + messages
        steps += 1
    assert steps == len(replies) and not truncated

    own = asyncio.run(env.vf_env.run_rollout(dict(task), ScriptedClient(replies), "scripted", {}))
    expected = [{"role": m["role"], "content": m["content"]} for m in [*own["prompt"], *own["completion"]]]
    assert conversation == expected
    assert [m["content"] for m in conversation if m["role"] == "user"][1:] == [
        f"Wrong (turn {turn}), try again." for turn in range(1, len(replies))
    ]
    assert reward == own["reward"] == float(replies[-1] == task["answer"])
    assert info["metrics"] == own["metrics"] and info["metrics"]["num_turns"] == len(replies)
    assert info["stop_condition"] == own["stop_condition"]


def test_tool_calls_in_the_text_run_through_verifiers_tool_env(env_dir: Path) -> None:
    env = make("tools")
    assert [s["function"]["name"] for s in env.tool_schemas()] == ["add"]
    task = env.train_tasks()[0]
    messages, _ = env.reset(options={"task": task})
    assert "add(a: integer, b: integer)" in messages[0]["content"] and "<tool_call>" in messages[0]["content"]
    messages, _ = env.reset(options={"task": task, "template_renders_tools": True})
    assert messages[0] == {"role": "system", "content": "Reply with the number only."}
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    assert env.step(f"Let me add. {call}") == ([{"role": "tool", "content": "5"}], 0.0, False, False, {})
    _, reward, terminated, _, info = env.step(task["answer"])
    assert (reward, terminated, info["stop_condition"]) == (1.0, True, "no_tools_called")
    assert info["metrics"]["add_calls"] == info["metrics"]["total_tool_calls"] == 1.0


@pytest.mark.parametrize(
    "name, example, call",
    [
        ("llama3_json", '{"name": "add", "parameters": {"a": ', '{"name": "add", "parameters": {"a": 2, "b": 3}}'),
        # qwen3_coder values are text: typed by the tool's schema, 2 + 3 is 5 (untyped it would be "23")
        (
            "qwen3_coder",
            "<function=add>",
            "<tool_call>\n<function=add>\n<parameter=a>\n2\n</parameter>\n"
            "<parameter=b>\n3\n</parameter>\n</function>\n</tool_call>",
        ),
    ],
)
def test_the_tool_parser_env_args_names_reads_the_calls(env_dir: Path, name: str, example: str, call: str) -> None:
    from agentrl.config.train import TrainConfig
    from agentrl.plugins import load_plugins
    from agentrl.training.build import make_env

    config = TrainConfig(
        env="verifiers",
        env_args={"env_id": MODULE, "env_kwargs": {"kind": "tools"}, "num_eval": 4, "tool_parser": name},
    )
    env = make_env(load_plugins(), config)
    assert env.tool_parser is load_plugins().registry.get("tool_parser", name).factory
    task = env.train_tasks()[0]
    messages, _ = env.reset(options={"task": task})
    assert example in messages[0]["content"] and "<tool_call>{" not in messages[0]["content"]
    assert env.step(f"Let me add. {call}") == ([{"role": "tool", "content": "5"}], 0.0, False, False, {})
    _, reward, terminated, _, info = env.step(task["answer"])
    assert (reward, terminated, info["metrics"]["add_calls"]) == (1.0, True, 1.0)


def test_splits_are_disjoint_seeded_and_prefer_the_eval_dataset(env_dir: Path) -> None:
    env = make("single", num_eval=8)
    train, held_out = list(env.train_tasks()), list(env.eval_tasks())
    assert (len(train), len(held_out)) == (12, 8)
    assert {t["example_id"] for t in train}.isdisjoint(t["example_id"] for t in held_out)
    assert held_out == list(make("single", num_eval=8).eval_tasks())
    assert len(make("single", num_eval=64).eval_tasks()) == 10  # at most half the dataset
    env = make("single", env_kwargs={"eval_size": 5}, num_eval=3)
    assert len(env.train_tasks()) == 20
    assert [t["question"] for t in env.eval_tasks()] == ["What is 2 + 0?", "What is 2 + 1?", "What is 2 + 2?"]


def _parked() -> int:
    loop = agentrl_verifiers._loop
    return 0 if loop is None or loop.is_closed() else len(asyncio.all_tasks(loop))


def test_abandoned_episodes_are_cancelled_and_leak_no_threads(env_dir: Path) -> None:
    gc.collect()  # episodes earlier tests dropped: collected now, cancelled by the loop's next run below
    env = make("retry")
    task = env.train_tasks()[0]
    env.reset(options={"task": task})
    env.step(task["answer"])
    baseline_threads, baseline = set(threading.enumerate()), _parked()
    for _ in range(10):
        env.reset(options={"task": task})
        env.step("wrong")  # mid-episode: the next reset cancels it
        dropped = make("retry")
        dropped.reset(options={"task": task})
        del dropped  # garbage-collected mid-episode: cancelled the next time the loop runs
    assert _parked() <= baseline + 2
    env.close()
    assert _parked() == baseline
    started = set(threading.enumerate()) - baseline_threads  # verifiers' to_thread may add a pool thread, never more
    assert all(thread.name.startswith("agentrl_verifiers") for thread in started), started
    pool = [thread for thread in threading.enumerate() if thread.name.startswith("agentrl_verifiers")]
    assert pool  # verifiers' to_thread ran on the named pool (its size is bounded by construction)
    with pytest.raises(EnvError, match=re.escape("respond() called before reset() or after the episode ended")):
        env.step("5")


def test_reset_and_step_work_inside_a_running_event_loop(env_dir: Path) -> None:
    env = make("single")
    task = env.train_tasks()[0]

    async def episode() -> float:
        env.reset(options={"task": task})
        return env.step(task["answer"])[1]

    assert asyncio.run(episode()) == 1.0


@pytest.mark.parametrize(
    "build, error, message",
    [
        (
            lambda: VerifiersEnv("agentrl_vf_no_such_env"),
            ConfigError,
            "verifiers: env_id 'agentrl_vf_no_such_env' names no importable module 'agentrl_vf_no_such_env'",
        ),
        (
            lambda: VerifiersEnv(),
            ConfigError,
            "verifiers: env_args.env_id must name an installed verifiers environment",
        ),
        (lambda: make("single", num_eval=0), ConfigError, "verifiers: num_eval must be an int >= 1, got 0"),
        (
            lambda: VerifiersEnv(MODULE, env_kwargs=["single"]),
            ConfigError,
            "verifiers: env_kwargs must be a mapping of keyword arguments, got ['single']",
        ),
        (lambda: make("fail"), EnvError, f"verifiers env {MODULE!r} failed to load: ValueError: no such difficulty"),
        (
            lambda: make("single", env_kwargs={"colour": 1}),
            EnvError,
            f"verifiers env {MODULE!r} failed to load: TypeError",
        ),
        (
            lambda: make("group"),
            EnvError,
            f"verifiers env {MODULE!r}: its rubric has group-level reward functions (agree)",
        ),
    ],
)
def test_bad_settings_are_one_clear_line(env_dir: Path, build: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        build()


@pytest.mark.parametrize(
    "kind, message",
    [
        ("broken", f"verifiers env {MODULE!r} raised during its rollout: ZeroDivisionError: the env's own bug"),
        ("rewrite", f"verifiers env {MODULE!r} rewrote the conversation between turns (message 0 changed)"),
    ],
)
def test_errors_inside_verifiers_surface_as_env_error(env_dir: Path, kind: str, message: str) -> None:
    env = make(kind)
    env.reset(options={"task": env.train_tasks()[0]})
    parked = _parked()
    with pytest.raises(EnvError, match=re.escape(message)):
        env.step("wrong")
    assert _parked() == parked - 1  # the failed rollout is not left parked


def test_missing_library_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "verifiers", None)
    with pytest.raises(EnvError, match=re.escape(INSTALL_HINT)):
        VerifiersEnv(MODULE)
    assert "pip install 'agentrl[verifiers]'" in INSTALL_HINT
    v1_only = types.ModuleType("verifiers")  # what verifiers 0.4 looks like: no classic API
    v1_only.__version__ = "0.4.0"
    monkeypatch.setitem(sys.modules, "verifiers", v1_only)
    with pytest.raises(EnvError, match=re.escape("verifiers 0.4.0 has no classic API")):
        VerifiersEnv(MODULE)


def test_trains_two_steps_through_the_cli(env_dir: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = agentrl_in_process(  # env_dir has put MODULE's folder on sys.path
        "train",
        "--env",
        "verifiers",
        "--set",
        f"env_args.env_id={MODULE}",
        "--set",
        "env_args.env_kwargs.kind=retry",
        "--set",
        "env_args.max_turns=2",
        "--set",
        "env_args.num_eval=4",
        "--model",
        str(tiny_model_dir),
        "--max-steps",
        "2",
        "--num-generations",
        "2",
        "--prompts-per-step",
        "2",
        "--output-dir",
        str(out),
        "--set",
        "eval_tasks=4",
        "--set",
        "max_new_tokens=8",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines][:2] == [1, 2]
    assert any("env/num_turns" in line for line in lines), lines[0].keys()
    assert MODULE in (out / "config.yaml").read_text()
