"""The built-in calculator, python and guess envs: gymnasium contract, task splits, and scripted
episodes that play them right."""

from __future__ import annotations

import json
import re

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import agentrl_guess
import agentrl_tool_envs
from agentrl import Env, EnvError, Trajectory, testing
from agentrl.plugins import PluginManager
from agentrl_guess import GuessEnv, parse_guess
from agentrl_tool_envs import AnswerToolEnv, CalculatorEnv, PythonEnv, answer_matches, extract_answer

ENVS = {"agentrl/Calculator-v0": CalculatorEnv, "agentrl/Python-v0": PythonEnv, "agentrl/Guess-v0": GuessEnv}


def tool_call(name: str, **arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.mark.parametrize("cls", ENVS.values(), ids=lambda c: c.__name__)
def test_passes_the_gymnasium_checker(cls: type[Env]) -> None:
    check_env(cls(), skip_render_check=True)


@pytest.mark.parametrize("cls", [CalculatorEnv, PythonEnv], ids=lambda c: c.__name__)
def test_passes_the_agentrl_env_contract(cls: type[Env]) -> None:
    testing.check_env(cls)


def test_guess_passes_the_agentrl_env_contract_except_question_disjointness() -> None:
    # Every guess task asks the same question (only the secret differs), so the splits are
    # disjoint by id, not by question; test_task_splits_are_seeded_and_disjoint checks the ids.
    env = GuessEnv()
    for check in (
        testing.check_reset_messages,
        testing.check_reset_uses_task,
        testing.check_step_types,
        testing.check_gold_answer,
    ):
        check(env)


@pytest.mark.parametrize("env_id", ENVS)
def test_gymnasium_make(env_id: str) -> None:
    env = gymnasium.make(env_id)
    assert isinstance(env.unwrapped, ENVS[env_id])
    messages, info = env.reset(seed=3)
    assert messages[-1] == {"role": "user", "content": info["task"]["question"]}
    assert env.observation_space.contains(messages)
    obs, reward, terminated, truncated, _ = env.step("I don't know.")
    assert env.observation_space.contains(obs) and isinstance(reward, float)
    env.close()


def test_plugins_register_their_envs() -> None:
    manager = PluginManager()
    manager.register_plugin(agentrl_tool_envs, name="tool_envs")
    manager.register_plugin(agentrl_guess, name="guess_env")
    assert manager.registry.names("env") == ["calculator", "guess", "python"]
    assert manager.registry.get("env", "guess").factory is GuessEnv


@pytest.mark.parametrize("cls", [CalculatorEnv, PythonEnv, GuessEnv], ids=lambda c: c.__name__)
def test_task_splits_are_seeded_and_disjoint(cls: type[Env]) -> None:
    env, same, other = cls(), cls(), cls(task_seed=1)
    train, held_out = env.train_tasks(), env.eval_tasks()
    assert train[5] == same.train_tasks()[5] and train[:3] != other.train_tasks()[:3]
    assert held_out[:] == same.eval_tasks()[:] == other.eval_tasks()[:]
    assert {t["id"] for t in train[:300]}.isdisjoint(t["id"] for t in held_out)
    if cls is not GuessEnv:  # guess secrets necessarily repeat; its splits differ by id
        assert {t["question"] for t in train[:300]}.isdisjoint(t["question"] for t in held_out)
    with pytest.raises(IndexError):
        held_out[len(held_out)]


def test_calculator_tasks_need_several_multi_digit_operations() -> None:
    for task in CalculatorEnv().train_tasks()[:50]:
        numbers = re.findall(r"\d+", task["expression"])
        assert len(numbers) >= 3 and any(len(n) >= 2 for n in numbers)
        assert str(agentrl_tool_envs.evaluate_arithmetic(task["expression"])) == task["answer"]


def test_calculator_episode_with_tool_calls_earns_reward_one() -> None:
    env = CalculatorEnv()
    messages, info = env.reset(seed=0, options={"task": env.eval_tasks()[0]})
    task = info["task"]
    assert "calculator" in messages[0]["content"] and messages[-1]["content"] == task["question"]
    # turn 1: the innermost parenthesised part, turn 2: the whole expression, turn 3: the answer
    inner = re.search(r"\(([^()]*)\)", task["expression"])
    obs, reward, terminated, _, info = env.step(tool_call("calculator", expression=inner.group(1)))
    assert obs[0]["role"] == "tool" and (reward, terminated, info["tool_errors"]) == (0.0, False, 0)
    obs, _, _, _, _ = env.step(tool_call("calculator", expression=task["expression"]))
    value = obs[0]["content"]
    obs, reward, terminated, truncated, info = env.step(f"The answer is \\boxed{{{value}}}.")
    assert (obs, reward, terminated, truncated) == ([], 1.0, True, False)
    env.reset(seed=0, options={"task": task})
    assert env.step(f"\\boxed{{{int(value) + 1}}}")[1] == 0.0


@pytest.mark.parametrize("cls", [CalculatorEnv, PythonEnv])
def test_demonstrations_are_true(cls: type[AnswerToolEnv]) -> None:
    """Each worked example's tool call, run through the env, returns the result it shows, and
    its boxed answer scores 1.0 against that result."""
    env = cls()
    assert len(env.demonstrations) == 2
    for user, call, result, answer in env.demonstrations:
        env.reset(seed=0, options={"task": {"question": user["content"], "answer": result["content"]}})
        obs, reward, terminated, _, info = env.step(call["content"])
        assert obs == [{"role": "tool", "name": result["name"], "content": result["content"]}]
        assert info == {"tool_calls": 1, "tool_errors": 0}
        assert env.step(answer["content"])[1:3] == (1.0, True)
    messages, _ = env.reset(seed=0)
    assert [m["role"] for m in messages] == ["system"] + ["user", "assistant", "tool", "assistant"] * 2 + ["user"]


def test_calculator_tool_errors_are_reported_not_raised() -> None:
    env = CalculatorEnv()
    env.reset(seed=0)
    obs, _, terminated, _, info = env.step(
        tool_call("calculator", expression="__import__('os')") + tool_call("calculator", expression="1/0")
    )
    assert [m["content"] for m in obs] == [
        "Error: ValueError: Call is not allowed; use only numbers, + - * / // % **, parentheses and unary minus",
        "Error: ZeroDivisionError: division by zero",
    ]
    assert info == {"tool_calls": 2, "tool_errors": 2} and not terminated


def test_python_episode_runs_code_in_the_sandbox() -> None:
    env = PythonEnv()
    task = {"question": "What is the sum of the digits of 2**50?", "answer": "76"}
    env.reset(seed=0, options={"task": task})
    obs, reward, terminated, _, info = env.step(
        "Let me compute it.\n" + tool_call("run_python", code="print(sum(map(int, str(2**50))))")
    )
    assert obs == [{"role": "tool", "content": "76", "name": "run_python"}]
    assert info == {"tool_calls": 1, "tool_errors": 0}
    obs, reward, terminated, truncated, _ = env.step("So the answer is \\boxed{76}.")
    assert (reward, terminated) == (1.0, True)


def test_python_tool_failures_are_tool_errors() -> None:
    env = PythonEnv(timeout_s=1.0)
    env.reset(seed=0)
    obs, _, _, _, info = env.step(
        tool_call("run_python", code="print('partial')\n1/0") + tool_call("run_python", code="while True: pass")
    )
    first, second = (m["content"] for m in obs)
    assert first.startswith("Error: the script failed (exit code 1)\npartial\nstderr:\nTraceback")
    assert first.endswith("ZeroDivisionError: division by zero")
    assert second == "Error: the script failed (timed out after 1 s; the process group was killed)"
    assert info == {"tool_calls": 2, "tool_errors": 2}


def test_python_code_that_is_not_text_is_a_tool_error_for_the_model() -> None:
    env = PythonEnv()
    env.reset(seed=0)
    obs, _, terminated, _, info = env.step(tool_call("run_python", code="print('\ud800')"))
    assert obs == [
        {
            "role": "tool",
            "name": "run_python",
            "content": "Error: run_python: the code is not valid text: character 7 is a lone "
            "surrogate ('\\ud800'), which UTF-8 cannot encode",
        }
    ]
    assert info == {"tool_calls": 1, "tool_errors": 1} and not terminated


@pytest.mark.parametrize(
    "text, value",
    [
        ("\\boxed{1,078}", "1078"),
        ("It is 12, no, 13.", "13"),
        ("\\boxed{x = -5}", "-5"),
        ("\\boxed{7} because 3 + 4", "7"),
        ("\\boxed{2.50}", "2.50"),
        ("no idea", None),
    ],
)
def test_answers_are_read_leniently(text: str, value: str | None) -> None:
    assert extract_answer(text) == value


def test_big_integer_answers_are_compared_exactly() -> None:
    gold = "354224848179261915075"  # F(100): as floats, its neighbours would match too
    assert answer_matches(f"\\boxed{{{gold}}}", gold)
    assert not answer_matches(f"\\boxed{{{int(gold) + 1}}}", gold)
    assert answer_matches("\\boxed{2.50}", "2.5") and not answer_matches("3", "2.5")


def play_binary_search(env: GuessEnv, task: dict) -> tuple[float, int, bool]:
    """Play ``task`` by bisection: (final reward, turns, terminated)."""
    messages, _ = env.reset(options={"task": task})
    low, high = 1, task["n"]
    for turn in range(1, env.max_turns + 1):
        guess = (low + high) // 2
        obs, reward, terminated, truncated, info = env.step(f"{guess}")
        if terminated or truncated:
            return reward, turn, terminated
        if obs[0]["content"] == "Higher.":
            low = guess + 1
        else:
            assert obs[0]["content"] == "Lower."
            high = guess - 1
    raise AssertionError("episode did not end within max_turns")


def test_guess_binary_search_always_wins() -> None:
    env = GuessEnv()
    for task in env.eval_tasks()[:16]:
        reward, turns, terminated = play_binary_search(env, task)
        assert terminated and turns <= 5
        assert reward == pytest.approx(1.0 - 0.1 * (turns - 1))
    assert sorted(t["secret"] for t in env.eval_tasks()[:16]) == list(range(1, 17))


def test_guess_invalid_answers_and_running_out_of_turns() -> None:
    env = GuessEnv(max_turns=3)
    env.reset(options={"task": {"secret": 16, "n": 16, "question": "Guess."}})
    obs, reward, terminated, truncated, info = env.step("Hmm, maybe eight?")
    assert obs == [{"role": "user", "content": "Please answer with just a number between 1 and 16."}]
    assert (reward, terminated, truncated, info["feedback"]) == (0.0, False, False, "invalid")
    assert env.step("1")[0] == [{"role": "user", "content": "Higher."}]
    _, reward, terminated, truncated, _ = env.step("2")
    assert (reward, terminated, truncated) == (0.0, False, True)
    env.reset(options={"task": {"secret": 16, "n": 16, "question": "Guess."}})
    env.step("8")
    assert env.step("My guess: 16")[1:3] == (pytest.approx(0.9), True)
    assert parse_guess("between 3 and 5, say 4") == 4


def test_guess_metrics_measure_use_of_the_feedback() -> None:
    env = GuessEnv(max_turns=5)
    task = {"secret": 11, "n": 16, "question": "Guess."}
    env.reset(options={"task": task})
    info = env.step("8")[4]  # Higher: 9..16 stay open
    assert info["metrics"] == {"valid_frac": 1.0, "solved": 0.0}
    info = env.step("3")[4]  # ignores the feedback
    assert info["metrics"] == {"valid_frac": 1.0, "solved": 0.0, "consistent_frac": 0.0}
    info = env.step("40")[4]  # out of range: invalid, asked again
    assert info["feedback"] == "invalid" and info["metrics"]["valid_frac"] == pytest.approx(2 / 3)
    info = env.step("12")[4]  # Lower: 9..11 open
    assert info["metrics"]["consistent_frac"] == pytest.approx(1 / 2)
    _, reward, terminated, _, info = env.step("11")
    assert (reward, terminated) == (pytest.approx(0.6), True)
    assert info["metrics"] == {
        "valid_frac": pytest.approx(4 / 5),
        "solved": 1.0,
        "consistent_frac": pytest.approx(2 / 3),
    }
    for secret in range(1, 17):  # bisection only ever guesses inside the open range
        env.reset(options={"task": {**task, "secret": secret}})
        low, high, info = 1, 16, {}
        while not info.get("metrics", {}).get("solved"):
            guess = (low + high) // 2
            obs, _, _, _, info = env.step(str(guess))
            low, high = (guess + 1, high) if obs and obs[0]["content"] == "Higher." else (low, guess - 1)
        assert info["metrics"].get("consistent_frac", 1.0) == 1.0 and info["metrics"]["valid_frac"] == 1.0


def test_env_metrics_are_averaged_over_the_episodes_reporting_them() -> None:
    from agentrl.rundir.metrics import env_metrics
    from agentrl.testing import make_trajectory

    def episode(metrics: object) -> Trajectory:
        return make_trajectory(
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
            {},
            info={"metrics": metrics} if metrics is not None else {},
        )

    out = env_metrics(
        [episode({"solved": 1.0, "consistent_frac": 0.5}), episode({"solved": 0.0}), episode(None)], prefix="env/"
    )
    assert out == {"env/consistent_frac": 0.5, "env/solved": 0.5}
    with pytest.raises(EnvError, match=re.escape("info[\"metrics\"]['solved'] must be a number, got 'yes'")):
        env_metrics([episode({"solved": "yes"})], prefix="env/")


@pytest.mark.parametrize("n", [2, 3, 16, 100])
def test_guess_demonstration_is_a_true_game_and_can_be_turned_off(n: int) -> None:
    env = GuessEnv(n=n, max_turns=10)
    task = env.eval_tasks()[0]
    messages, _ = env.reset(options={"task": task})
    shown, question = messages[:-1], messages[-1]
    assert question == {"role": "user", "content": task["question"]} and shown[0] == question
    env.reset(options={"task": {**task, "secret": int(shown[-1]["content"])}})
    for reply, feedback in zip(shown[1::2], shown[2::2] + [None]):
        obs, reward, terminated, _, info = env.step(reply["content"])
        assert (obs[0] if obs else None) == feedback and terminated == (feedback is None)
    assert info["metrics"] == {"valid_frac": 1.0, "solved": 1.0, **({"consistent_frac": 1.0} if len(shown) > 2 else {})}
    assert GuessEnv(n=n, demonstration=False).reset(options={"task": task})[0] == [question]


def test_guess_rejects_bad_settings() -> None:
    with pytest.raises(EnvError, match=re.escape("GuessEnv: n must be an integer >= 2, got 1")):
        GuessEnv(n=1)
    with pytest.raises(EnvError, match=re.escape("turn_cost must be in [0, 1], got 2")):
        GuessEnv(turn_cost=2)
    with pytest.raises(EnvError, match="task needs a 'secret' key"):
        GuessEnv().reset(options={"task": {"question": "Guess."}})


def test_guess_consistency_bonus_is_paid_on_the_turn_that_earns_it() -> None:
    env = GuessEnv(max_turns=5, consistency_bonus=0.1)
    env.reset(options={"task": {"secret": 11, "n": 16, "question": "Guess."}})
    rewards = [env.step(guess)[1] for guess in ("8", "3", "12", "10")]  # 3 ignores "Higher."
    # first guess: nothing to be consistent with; 3: outside 9..16; 12 and 10 inside the open range
    assert rewards == [0.0, 0.0, pytest.approx(0.1), pytest.approx(0.1)]
    _, reward, terminated, _, info = env.step("11")
    assert terminated and reward == pytest.approx(0.6)  # the win is paid as before; no bonus on it
    assert info["success"] is True
    # A lost game that earned bonuses has a positive return but is not a success in evaluation.
    from agentrl.testing import make_trajectory
    from agentrl.training.evaluate import episode_success

    env.reset(options={"task": {"secret": 16, "n": 16, "question": "Guess."}})
    infos = [env.step(guess)[4] for guess in ("8", "12", "14", "15", "1")]
    assert [i["success"] for i in infos] == [False] * 5
    lost = make_trajectory(
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "1"}], {}, info=infos[-1]
    )
    assert not episode_success(lost)
    assert GuessEnv().consistency_bonus == 0.0
    with pytest.raises(EnvError, match=re.escape("consistency_bonus must be a number in [0, 1], got -0.1")):
        GuessEnv(consistency_bonus=-0.1)
