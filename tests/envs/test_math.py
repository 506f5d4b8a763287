"""The ``math`` env: answer parsing, task sources and splits, JSONL loading, the env contract."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

import gymnasium
import pytest

import agentrl
from agentrl import ConfigError, Env, EnvError
from agentrl.answers import answers_match, extract_answer, extract_boxed, is_correct
from agentrl.env import GYMNASIUM_IDS
from agentrl.testing import check_env, check_gold_answer, check_tasks_disjoint
from agentrl_math import DEMONSTRATION, LEVELS, MathEnv


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is \\boxed{12}.", "12"),
        ("\\boxed{3}, no wait: \\boxed{4}", "4"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{ -7 }", "-7"),
        ("\\boxed{12} and later 13", "12"),
        ("7 + 5 = 12", "12"),
        ("It is -3.", "-3"),
        ("9-3=6", "6"),
        ("9-3", "3"),
        ("(2)-3", "3"),
        ("The result is 12.0", "12.0"),
        ("So we get 12.", "12"),
        ("Put it in \\boxed{}: 5", "5"),
        ("\\boxed{12", "12"),
        ("no number here", None),
        ("", None),
    ],
)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


def test_extract_boxed_ignores_unboxed_numbers() -> None:
    assert extract_boxed("7 + 5 = 12") is None
    assert extract_boxed("\\boxed{}") is None
    assert extract_boxed("\\boxed{{a}{b}} x") == "{a}{b}"


@pytest.mark.parametrize(
    ("text", "answer", "expected"),
    [
        ("\\boxed{12}", "12", True),
        ("12.0", "12", True),
        ("\\boxed{12.0}", "12", True),
        ("\\boxed{12.5}", "12", False),
        ("11", "12", False),
        ("", "12", False),
        ("The answer is -3", "-3", True),
        ("The answer is 3", "-3", False),
        ("\\boxed{1/2}", "0.5", True),
        ("\\boxed{\\frac{1}{2}}", "0.5", True),
        ("12 apples, 3 left over", "12", False),
        ("\\boxed{twelve}", "12", False),
        # an unevaluated expression is not an answer (a trained model boxed the question for full marks)
        ("\\boxed{7 - 8}", "-1", False),
        ("\\boxed{6 + 5}", "11", False),
        ("\\boxed{3 \\times 4}", "12", False),
        ("\\boxed{24/2}", "12", False),
        ("\\boxed{\\frac{24}{2}}", "12", False),
        ("\\boxed{8 + 8 = 16}", "16", True),  # the value after the last "="
        ("\\boxed{8 + 8 = 15}", "16", False),
        ("7 - 8 = -1.", "-1", True),
        ("\\boxed{-1}.", "-1", True),
    ],
)
def test_is_correct(text: str, answer: str, expected: bool) -> None:
    assert is_correct(text, answer) is expected


def test_answers_match_off_the_main_thread() -> None:
    results: list[bool] = []
    thread = threading.Thread(target=lambda: results.append(answers_match("\\frac{1}{2}", "0.5")))
    thread.start()
    thread.join()
    assert results == [True]


# -- generated tasks -----------------------------------------------------------------------------
@pytest.mark.parametrize("difficulty", sorted(LEVELS))
def test_levels_generate_correct_problems(difficulty: str) -> None:
    level = LEVELS[difficulty]
    env = MathEnv(difficulty=difficulty)
    tasks = list(env.train_tasks()[:300]) + list(env.eval_tasks())
    for task in tasks:
        assert task["a"] in level.a and task["b"] in level.b and task["op"] in level.ops
        value = {"+": task["a"] + task["b"], "-": task["a"] - task["b"], "*": task["a"] * task["b"]}
        assert task["answer"] == str(value[task["op"]])
        assert task["question"] == (
            f"What is {task['a']} {task['op']} {task['b']}? Put the final answer in \\boxed{{}}."
        )
    assert {t["op"] for t in tasks} == set(level.ops)


def test_single_digit_split_is_disjoint_and_covers_all_problems() -> None:
    env = MathEnv()
    eval_questions = {t["question"] for t in env.eval_tasks()}
    train_questions = {env.train_tasks()[i]["question"] for i in range(3000)}
    assert len(eval_questions) == len(env.eval_tasks()) == 66  # a third of 200, num_eval capped
    assert not eval_questions & train_questions
    assert len(eval_questions | train_questions) == 200


def test_eval_split_is_fixed_across_seeds_and_nested_across_sizes() -> None:
    big = MathEnv(difficulty="two_digit", num_eval=200, seed=1).eval_tasks()
    small = MathEnv(difficulty="two_digit", num_eval=50, seed=2).eval_tasks()
    assert list(small) == list(big[:50])
    train = MathEnv(difficulty="two_digit", num_eval=50).train_tasks()
    assert not {t["question"] for t in big} & {train[i]["question"] for i in range(2000)}


def test_train_tasks_are_deterministic_by_seed() -> None:
    first, again, other = (MathEnv(seed=s).train_tasks() for s in (3, 3, 4))
    assert len(first) == 100_000
    assert first[:50] == again[:50]
    assert first[:50] != other[:50]
    assert first[-1] == first[len(first) - 1]
    with pytest.raises(IndexError):
        first[len(first)]
    env = MathEnv()
    assert env.reset(seed=5) == env.reset(seed=5)


# -- the episode ---------------------------------------------------------------------------------
def test_episode_messages_reward_and_info() -> None:
    env = MathEnv()
    task = {"question": "What is 7 + 5? Put the final answer in \\boxed{}.", "answer": "12"}
    messages, info = env.reset(options={"task": task})
    assert messages == [{"role": "user", "content": task["question"]}]
    assert info["task"] == task
    assert env.step("7 + 5 = 12") == (
        [],
        1.0,
        True,
        False,
        {"correct": True, "parsed": "12", "boxed": False, "metrics": {"boxed": 0.0}},
    )
    env.reset(options={"task": task})
    assert env.step("\\boxed{13}") == (
        [],
        0.0,
        True,
        False,
        {"correct": False, "parsed": "13", "boxed": True, "metrics": {"boxed": 1.0}},
    )
    env.reset(options={"task": task})
    assert env.step("I don't know")[1:3] == (0.0, True)


def test_system_prompt_and_instruction_appended_once() -> None:
    env = MathEnv(system_prompt="Be brief.")
    messages, _ = env.reset(options={"task": {"question": "What is 2 + 2?", "answer": "4"}})
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 2? Put the final answer in \\boxed{}."},
    ]


def test_the_demonstration_is_never_a_generated_task() -> None:
    env = MathEnv(system_prompt="Be brief.", demonstration=True)
    messages, _ = env.reset(options={"task": {"question": "What is 2 + 2?", "answer": "4"}})
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert extract_boxed(DEMONSTRATION[1]["content"]) == "107"
    questions = {level.problem(i)["question"] for level in LEVELS.values() for i in range(level.size)}
    assert DEMONSTRATION[0]["content"] not in questions
    with pytest.raises(ConfigError, match="demonstration must be true or false, got 'yes'"):
        MathEnv(demonstration="yes")


def test_task_without_answer_is_refused() -> None:
    with pytest.raises(EnvError, match=re.escape("a task needs a string 'question' and an 'answer'")):
        MathEnv().reset(options={"task": {"question": "What is 2 + 2?"}})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"difficulty": "hard"}, "math env: difficulty 'hard' is not one of single_digit, two_digit, mixed"),
        ({"num_eval": 0}, "math env: num_eval must be an int >= 1, got 0"),
        ({"seed": "1"}, "math env: seed must be an int, got '1'"),
        ({"system_prompt": 3}, "math env: system_prompt must be a string or None, got 3"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        MathEnv(**kwargs)


# -- JSONL data ----------------------------------------------------------------------------------
def write_jsonl(path: Path, rows: list[Any]) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_jsonl_split(tmp_path: Path) -> None:
    rows = [{"question": f"What is {i} + 1?", "answer": i + 1, "source": "mine"} for i in range(20)]
    rows.append({"question": "What is 0 + 1?", "answer": "1"})  # duplicate question
    env = MathEnv(data_file=write_jsonl(tmp_path / "d.jsonl", rows))
    train, held_out = env.train_tasks(), env.eval_tasks()
    assert len({t["question"] for t in held_out}) == 2 and len(train) + len(held_out) == 21
    assert not {t["question"] for t in train} & {t["question"] for t in held_out}
    assert all(isinstance(t["answer"], str) and t.get("source") in ("mine", None) for t in train)
    again = MathEnv(data_file=str(tmp_path / "d.jsonl"), seed=7)
    assert list(again.eval_tasks()) == list(held_out)
    check_env(env)


def test_jsonl_keeps_boxed_instruction_from_file(tmp_path: Path) -> None:
    rows = [{"question": f"Compute {i}*2. Answer in \\boxed{{}}.", "answer": 2 * i} for i in range(5)]
    env = MathEnv(data_file=write_jsonl(tmp_path / "d.jsonl", rows))
    messages, _ = env.reset(seed=0)
    assert messages[0]["content"].count("\\boxed") == 1


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"question": "a", "answer": 1}, "{not json"], "d.jsonl, line 2: not valid JSON"),
        ([{"question": "a", "answer": 1}, "", "[1, 2]"], "d.jsonl, line 3: expected a JSON object, got list"),
        ([{"question": "a"}], "d.jsonl, line 1: 'answer' must be a non-empty string or number, got None"),
        ([{"question": "", "answer": 1}], "d.jsonl, line 1: 'question' must be a non-empty string, got ''"),
        (
            [{"question": "a", "answer": 1}] * 3,
            "d.jsonl: needs at least 2 distinct questions (one to train on, one to hold out), found 1",
        ),
    ],
)
def test_jsonl_errors_name_file_and_line(tmp_path: Path, rows: list[Any], message: str) -> None:
    with pytest.raises(EnvError, match=re.escape(message)):
        MathEnv(data_file=write_jsonl(tmp_path / "d.jsonl", rows))


def test_jsonl_missing_or_unreadable_file(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.jsonl")
    with pytest.raises(EnvError, match=re.escape(f"math data_file {missing!r} does not exist")):
        MathEnv(data_file=missing)
    binary = tmp_path / "d.jsonl"
    binary.write_bytes(b"\xff\xfe{}")
    with pytest.raises(EnvError, match=re.escape(f"math data_file {str(binary)!r} could not be read as UTF-8")):
        MathEnv(data_file=str(binary))


# -- the contract, through the real entry points -------------------------------------------------
NEEDS_ARGS = {
    "verifiers": "needs env_args.env_id naming an installed verifiers env: tests/envs/test_verifiers.py",
    "dataset": "takes its tasks from a dataset: tests/env/test_datasets.py checks it on rows",
}


def _env_names() -> list:
    return [
        pytest.param(name, marks=pytest.mark.skip(reason=NEEDS_ARGS[name])) if name in NEEDS_ARGS else name
        for name in agentrl.load_plugins().registry.names("env")
    ]


def _gymnasium_id(factory: type) -> str | None:
    spec = f"{factory.__module__}:{factory.__qualname__}"
    return next((i for i, entry in GYMNASIUM_IDS.items() if entry == spec), None)


@pytest.mark.parametrize("name", _env_names(), ids=lambda name: name)
def test_registered_env_passes_check_env(name: str) -> None:
    factory = agentrl.load_plugins().registry.get("env", name).factory
    check_env(factory)
    env_id = _gymnasium_id(factory)
    if env_id is not None:
        check_env(gymnasium.make(env_id))


def test_math_is_registered_and_made_by_gymnasium() -> None:
    assert "math" in _env_names()
    env = gymnasium.make("agentrl/Math-v0", difficulty="two_digit", num_eval=10)
    assert isinstance(env.unwrapped, MathEnv) and len(env.unwrapped.eval_tasks()) == 10


class LeakyEnv(Env):
    """Evaluates on its training tasks and never pays: check_env must say so."""

    tasks = [{"question": "q1", "answer": "1"}, {"question": "q2", "answer": "2"}]

    def train_tasks(self) -> list[dict[str, Any]]:
        return self.tasks

    def eval_tasks(self) -> list[dict[str, Any]]:
        return self.tasks[1:]

    def start(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"role": "user", "content": task["question"]}]

    def respond(self, text: str) -> tuple[list[dict[str, Any]], float, bool, dict[str, Any]]:
        return [], 0.0, True, {}


def test_check_env_names_broken_rules() -> None:
    with pytest.raises(EnvError, match=re.escape("LeakyEnv: 1 eval task(s) also appear in train_tasks, e.g. 'q2'")):
        check_tasks_disjoint(LeakyEnv())
    with pytest.raises(
        EnvError, match=re.escape("LeakyEnv: the gold reply '\\\\boxed{1}' earned 0.0, expected the max reward 1.0")
    ):
        check_gold_answer(LeakyEnv())
    with pytest.raises(EnvError, match=re.escape("check_env: the factory returned dict, not a gymnasium.Env")):
        check_env(dict)


@pytest.mark.parametrize(
    ("reply", "total"),
    [
        ("7 + 5 = \\boxed{12}", 3.0),  # correct and boxed: env 1 + format 1 + accuracy 1
        ("The answer is \\boxed{12.0}.", 3.0),  # math-verify: 12.0 is 12
        ("7 + 5 = 12", 1.0),  # correct, not boxed: env 1 only
        ("7 + 5 = \\boxed{13}", 1.0),  # boxed but wrong: format 1 only, no more than any correct answer
        ("7 + 5 = 13", 0.0),
        ("\\boxed{13}, I mean 12", 1.0),  # the boxed answer is the answer, for the env too
        ("\\boxed{}", 0.0),  # an empty box is not an answer: no format bonus
        ("\\boxed{twelve}", 0.0),
        ("\\boxed{7 + 5}", 0.0),  # the question boxed is not an answer (math-verify alone would say 12)
    ],
)
def test_default_rewards_pay_a_correct_boxed_answer_most_and_a_wrong_one_no_more_than_any_correct(
    reply: str, total: float
) -> None:
    """Hand-derived totals of the default run's rewards (env x1 + format x1 + accuracy x1) on "7 + 5"."""
    from agentrl.config.train import TrainConfig
    from agentrl.plugins import load_plugins
    from agentrl.rewards.scoring import score
    from agentrl.rewards.specs import resolve_rewards
    from agentrl.testing import make_trajectory

    env = MathEnv()
    task = {"question": "What is 7 + 5? Put the final answer in \\boxed{}.", "answer": "12"}
    env.reset(options={"task": task})
    _, env_reward, _, _, _ = env.step(reply)
    trajectory = make_trajectory(
        [{"role": "user", "content": task["question"]}, {"role": "assistant", "content": reply}], task
    )
    trajectory.turns[0].reward = env_reward
    reward_fns = resolve_rewards(TrainConfig(), load_plugins().registry, env)
    assert {name: weight for name, (_, weight) in reward_fns.items()} == {"format": 1.0, "accuracy": 1.0}
    totals, _ = score([trajectory], reward_fns, env_weight=1.0)
    assert totals == [total]
