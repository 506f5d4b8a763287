"""The ``agentrl.Env`` contract: fresh data per reset, ``gold_reply``, and one-line errors naming the
env, the method, what it returned and the shape expected when ``start``/``respond``/``train_tasks``
break it (checked by ``reset``/``step`` themselves, and seen through the CLI). In a run, a step
result out of contract (the wrong number of values, a reward that is NaN or beyond ±1e9) fails even
under ``on_call_error: skip``, and an env that breaks it at start-up (an empty or generator task
source, ``max_turns`` 0, a ``start`` or ``reset`` that fails) is named before the model loads."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from cli_in_process import agentrl_in_process
from faulty_plugin import run_config, unclipped_run_config

from agentrl import Env, EnvError
from agentrl.env import PrivateGlobalRandom, boxed_reply
from agentrl.plugins import load_plugins
from agentrl.testing import GoldUncheckedWarning, check_env, check_gold_answer, gold_text
from agentrl.training.trainer import Trainer

CACHED_TASKS = [
    {"id": f"t{i}", "question": f"Say {i}.", "answer": str(i), "metadata": {"digits": [i]}} for i in range(8)
]


class CachedTasksEnv(Env):
    """A correct env whose task source is one cached list of tasks with nested metadata."""

    def train_tasks(self) -> list[dict[str, Any]]:
        return CACHED_TASKS[:6]

    def eval_tasks(self) -> list[dict[str, Any]]:
        return CACHED_TASKS[6:]

    def start(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"role": "user", "content": task["question"]}]

    def respond(self, text: str) -> tuple[list[dict[str, Any]], float, bool, dict[str, Any]]:
        assert self.task is not None
        return [], float(self.task["answer"] in text), True, {}


def test_check_env_passes_an_env_that_hands_out_cached_tasks() -> None:
    check_env(CachedTasksEnv)


def test_reset_info_never_shares_an_object_with_the_env_or_the_task_source() -> None:
    env = CachedTasksEnv()
    _, first = env.reset(seed=1)
    _, second = env.reset(seed=1)
    assert first["task"] == second["task"] == env.task
    first["task"]["metadata"]["digits"].append(99)
    assert env.task["metadata"] == second["task"]["metadata"]
    assert all(99 not in task["metadata"]["digits"] for task in CACHED_TASKS)


class TaggedAnswerEnv(CachedTasksEnv):
    """Pays only for ``<answer>X</answer>``: its gold reply is not ``\\boxed{X}``."""

    def respond(self, text: str) -> tuple[list[dict[str, Any]], float, bool, dict[str, Any]]:
        assert self.task is not None
        return [], float(f"<answer>{self.task['answer']}</answer>" in text), True, {}

    def gold_reply(self, task: dict[str, Any]) -> str | None:
        return f"<answer>{task['answer']}</answer>"


def test_check_env_uses_the_envs_own_gold_reply() -> None:
    check_env(TaggedAnswerEnv)
    assert gold_text(CACHED_TASKS[0], TaggedAnswerEnv()) == "<answer>0</answer>"


class WrongGoldEnv(TaggedAnswerEnv):
    def gold_reply(self, task: dict[str, Any]) -> str | None:
        return f"<answer>{task['answer']}!</answer>"


class NoGoldEnv(TaggedAnswerEnv):
    def gold_reply(self, task: dict[str, Any]) -> str | None:
        return None


def test_gold_reply_default_and_opt_out() -> None:
    assert CachedTasksEnv().gold_reply({"answer": 7}) == boxed_reply({"answer": 7}) == "\\boxed{7}"
    assert CachedTasksEnv().gold_reply({"question": "open-ended"}) is None
    assert gold_text({"answer": 7}) == "\\boxed{7}"
    with pytest.warns(GoldUncheckedWarning, match="NoGoldEnv.gold_reply is None for 4 of the 4 tasks tried"):
        assert check_gold_answer(NoGoldEnv()) == 0  # nothing played: said, not skipped silently
    with pytest.raises(
        EnvError,
        match=re.escape("WrongGoldEnv: the gold reply '<answer>0!</answer>' earned 0.0, expected the max reward 1.0"),
    ):
        check_gold_answer(WrongGoldEnv())


def broken(**methods: Any) -> type[Env]:
    """A CachedTasksEnv subclass named Broken whose methods are replaced by ``methods``."""
    return type("Broken", (CachedTasksEnv,), methods)


def respond_with(value: Any) -> Any:
    return lambda self, text: value


OK_MESSAGES = [{"role": "user", "content": "Higher."}]


@pytest.mark.parametrize(
    ("methods", "message"),
    [
        (
            {"start": lambda self, task: "What is 2 + 2?"},
            "Broken.start must return its messages as a list of {'role': 'system'|'user'|'assistant'|'tool', "
            "'content': str} dicts; got a str 'What is 2 + 2?'",
        ),
        ({"start": lambda self, task: []}, "Broken.start must return at least one message"),
        (
            {"start": lambda self, task: [{"role": "user"}]},
            "Broken.start: message 0 has no 'content' (a str): {'role': 'user'}",
        ),
        (
            {"start": lambda self, task: [{"role": "user", "content": 4}]},
            "Broken.start: message 0 has content an int 4; it must be a str",
        ),
        (
            {"start": lambda self, task: [{"role": "system", "content": "x"}, {"role": "human", "content": "hi"}]},
            "Broken.start: message 1 has role 'human'; allowed: system, user, assistant, tool",
        ),
        ({"start": lambda self, task: ["hi"]}, "Broken.start: message 0 is a str 'hi', not a dict"),
        (
            {"train_tasks": lambda self: []},
            "Broken.train_tasks returned an empty sequence; it must hold at least one task dict",
        ),
        (
            {"train_tasks": lambda self: (t for t in CACHED_TASKS)},
            "Broken.train_tasks must return an indexable sequence of task dicts (a list or agentrl.LazyTasks); "
            "got a generator",
        ),
    ],
    ids=[
        "start-str",
        "start-empty",
        "no-content",
        "int-content",
        "bad-role",
        "str-message",
        "no-tasks",
        "generator-tasks",
    ],
)
def test_reset_names_the_broken_method_and_the_expected_shape(methods: dict[str, Any], message: str) -> None:
    with pytest.raises(EnvError, match=re.escape(message)):
        broken(**methods)().reset(seed=0)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            (OK_MESSAGES, 1.0, True),
            "Broken.respond must return (messages, reward, terminated, info); got a tuple of 3 values",
        ),
        ("Lower.", "Broken.respond must return (messages, reward, terminated, info); got a str 'Lower.'"),
        (
            [OK_MESSAGES, 1.0, True, {}],
            "Broken.respond must return (messages, reward, terminated, info); got a list [[{'content': 'Higher.', ",
        ),
        (
            ("Higher.", 0.0, False, {}),
            "Broken.respond must return its messages as a list of {'role': 'system'|'user'|'assistant'|'tool', "
            "'content': str} dicts; got a str 'Higher.'",
        ),
        (
            ([{"role": "user", "text": "Higher."}], 0.0, False, {}),
            "Broken.respond: message 0 has no 'content' (a str): {'role': 'user', 'text': 'Higher.'}",
        ),
        (([], None, True, {}), "Broken.respond must return a finite number as its reward (2nd value); got None"),
        (
            ([], "1.0", True, {}),
            "Broken.respond must return a finite number as its reward (2nd value); got a str '1.0'",
        ),
        (
            ([], float("nan"), True, {}),
            "Broken.respond must return a finite number as its reward (2nd value); got a float nan",
        ),
        (([], 1.0, None, {}), "Broken.respond must return a bool as terminated (3rd value); got None"),
        (([], 1.0, True, None), "Broken.respond must return a dict as info (4th value); got None"),
    ],
    ids=[
        "three-values",
        "str",
        "list",
        "str-messages",
        "no-content",
        "none-reward",
        "str-reward",
        "nan-reward",
        "none-terminated",
        "none-info",
    ],
)
def test_step_names_the_broken_method_and_the_expected_shape(value: Any, message: str) -> None:
    env = broken(respond=respond_with(value))()
    env.reset(seed=0)
    with pytest.raises(EnvError, match=re.escape(message)):
        env.step("4")


def test_step_accepts_numpy_and_bool_values() -> None:
    import numpy as np

    env = broken(respond=respond_with((OK_MESSAGES, np.float32(0.5), np.bool_(False), {})))()
    env.reset(seed=0)
    messages, reward, terminated, truncated, _ = env.step("4")
    assert (messages, reward, terminated, truncated) == (OK_MESSAGES, 0.5, False, True)
    assert type(reward) is float and type(terminated) is bool


def test_private_global_random_isolates_interleaved_streams() -> None:
    import random

    import numpy as np

    def draws(rng: PrivateGlobalRandom, other: PrivateGlobalRandom | None) -> list[float]:
        out = []
        for _ in range(3):
            with rng.active():
                out.append(random.random() + float(np.random.random()))
            if other is not None:
                with other.active():
                    random.random(), np.random.random()
        return out

    random.seed(123)
    outside = random.getstate()
    assert draws(PrivateGlobalRandom(5), None) == draws(PrivateGlobalRandom(5), PrivateGlobalRandom(6))
    assert random.getstate() == outside  # the process-wide stream was not touched


BROKEN_ENV_FILE = '''
from agentrl import Env


class ThreeValues(Env):
    """Its respond forgets the info dict."""

    def train_tasks(self):
        return [{"question": f"Say {n}.", "answer": str(n)} for n in range(10, 50)]

    def eval_tasks(self):
        return [{"question": f"Say {n}.", "answer": str(n)} for n in range(2, 10)]

    def start(self, task):
        return [{"role": "user", "content": task["question"]}]

    def respond(self, text):
        return [], float(self.task["answer"] in text), True


class StartsWithText(ThreeValues):
    """Its start returns the question itself instead of a message list."""

    def start(self, task):
        return task["question"]
'''


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        (
            "ThreeValues",
            "ThreeValues.respond must return (messages, reward, terminated, info); got a tuple of 3 values",
        ),
        ("StartsWithText", "StartsWithText.start must return its messages as a list of"),
    ],
)
def test_cli_reports_a_broken_env_in_one_line(tiny_model_dir, tmp_path, cls: str, message: str) -> None:
    path = tmp_path / "broken_env.py"
    path.write_text(BROKEN_ENV_FILE)
    result = agentrl_in_process(
        "train",
        "--env",
        f"{path}:{cls}",
        "--model",
        str(tiny_model_dir),
        "--max-steps",
        "1",
        "--num-generations",
        "2",
        "--prompts-per-step",
        "2",
        "--output-dir",
        str(tmp_path / "run"),
        "--set",
        "eval_tasks=0",
        "--set",
        "max_new_tokens=4",
    )
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert message in " ".join(result.stderr.split()), output
    assert "Traceback" not in output


# -- property-based: whatever a custom env returns, the outcome is its value or an EnvError ----------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from agentrl.errors import AgentRLError  # noqa: E402

_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8), st.binary(max_size=4))
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.tuples(inner, inner), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)
_messages = st.lists(
    st.one_of(
        _values,
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "assistant", "tool", "system", "human", ""]), "content": _values}
        ),
    ),
    max_size=3,
)
_respond_results = st.one_of(
    _values,
    st.tuples(_messages, _values, _values, _values),
    st.tuples(_messages, st.floats(), st.booleans(), st.dictionaries(st.text(max_size=4), _values, max_size=2)),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(result=_respond_results)
def test_any_respond_result_is_accepted_or_an_env_error(result: Any) -> None:
    env = broken(respond=respond_with(result))()
    env.reset(options={"task": CACHED_TASKS[0]})
    try:
        messages, reward, terminated, truncated, info = env.step("4")
    except AgentRLError:
        return
    assert isinstance(messages, list) and isinstance(info, dict)
    assert isinstance(reward, float) and math.isfinite(reward)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(result=st.one_of(_values, _messages))
def test_any_start_result_is_accepted_or_an_env_error(result: Any) -> None:
    env = broken(start=lambda self, task: result)()
    try:
        messages, info = env.reset(options={"task": CACHED_TASKS[0]})
    except AgentRLError:
        return
    assert messages and all(isinstance(m, dict) and isinstance(m["content"], str) for m in messages)


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        (
            "StepFourValues",
            "StepFourValues.step must return (messages, reward, terminated, truncated, info); got a tuple of 4 values",
        ),
        ("StepNanReward", "StepNanReward.step must return a finite number as its reward (2nd value); got a float nan"),
    ],
)
def test_a_broken_step_contract_always_fails_even_with_skip(tiny_model_dir, tmp_path, faults, cls, message):
    trainer = Trainer(
        unclipped_run_config(tiny_model_dir, tmp_path, env=f"{faults}:{cls}", on_call_error="skip"), load_plugins()
    )
    with pytest.raises(EnvError, match=re.escape(message)):
        trainer.rollout_step(1)


def test_an_env_reward_beyond_the_bound_is_a_contract_error(tiny_model_dir, tmp_path, faults):
    trainer = Trainer(
        run_config(tiny_model_dir, tmp_path, env=f"{faults}:HugeReturn", on_call_error="skip"), load_plugins()
    )
    with pytest.raises(
        EnvError,
        match=re.escape("HugeReturn.respond returned reward 1e+308 (2nd value): rewards must be within ±1e+09"),
    ):
        trainer.rollout_step(1)


@pytest.mark.parametrize(
    ("cls", "overrides", "message"),
    [
        ("EmptyTasks", {}, "EmptyTasks.train_tasks returned an empty sequence; it must hold at least one task dict"),
        (
            "GeneratorTasks",
            {},
            "GeneratorTasks.train_tasks must return an indexable sequence of task dicts (a list or "
            "agentrl.LazyTasks); got a generator: an iterator can be read only once",
        ),
        (
            "NoEvalTasks",
            {"eval_tasks": 4},
            "NoEvalTasks.eval_tasks returned an empty sequence; it must hold at least "
            "one task dict to evaluate on (or set eval_tasks: 0)",
        ),
        ("ZeroTurns", {}, "ZeroTurns.max_turns is 0; it must be an integer >= 1"),
        ("StartsWithText", {}, "StartsWithText.start must return its messages as a list of"),
        (
            "ResetRaises",
            {},
            "ResetRaises.reset raised on the first training task (task 'good': 'Say 1.'): KeyError: 'no such level'",
        ),
    ],
    ids=["empty-tasks", "generator", "empty-eval", "zero-turns", "start-text", "reset-raises"],
)
def test_env_contract_violations_are_named_before_the_model_loads(
    tiny_model_dir, tmp_path, faults, monkeypatch, cls, overrides, message
):
    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the env was checked")

    monkeypatch.setattr("agentrl.training.build.load_model", no_model)
    config = unclipped_run_config(tiny_model_dir, tmp_path, env=f"{faults}:{cls}", **overrides)
    with pytest.raises(EnvError, match=re.escape(message)):
        Trainer(config, load_plugins())
