"""Reward functions written for TRL work unchanged; reward specs from files and modules; fast errors."""

from __future__ import annotations

import json
import re
import textwrap

import numpy as np
import pytest
from cli_in_process import agentrl_in_process

from agentrl.answers import answers_match, extract_boxed
from agentrl.config.train import TrainConfig
from agentrl.errors import ConfigError, RewardError
from agentrl.plugins import load_plugins
from agentrl.rewards.scoring import score
from agentrl.rewards.specs import TRLReward, load_reward, resolve_rewards
from agentrl.testing import make_trajectory

SYSTEM = {"role": "system", "content": "Be brief."}


def single_turn(question: str, reply: str, **task) -> object:
    return make_trajectory(
        [SYSTEM, {"role": "user", "content": question}, {"role": "assistant", "content": reply}],
        {"question": question, **task},
    )


def judge_text(text):  # neither signature: refused with both named
    return [1.0]


# The GRPOTrainer quickstart's reward (plain completions), as TRL's docs write it.
def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


def test_conversational_completions_prompts_columns_and_ids_are_what_trl_passes():
    seen = {}

    def spy(prompts, completions, completion_ids, answer, **kwargs):
        seen.update(prompts=prompts, completions=completions, ids=completion_ids, answer=answer, kwargs=kwargs)
        return [1.0] * len(completions)

    t = single_turn("2+2?", "4", answer="4", level="easy")
    assert TRLReward(spy, "spy")([t]) == [1.0]
    assert seen["prompts"] == [[SYSTEM, {"role": "user", "content": "2+2?"}]]
    assert seen["completions"] == [[{"role": "assistant", "content": "4"}]]
    assert seen["ids"] == [[t.token_ids[t.turns[0].start]]]
    assert seen["answer"] == ["4"] and seen["kwargs"] == {"question": ["2+2?"], "level": ["easy"]}


def test_plain_format_gives_the_final_reply_and_the_last_user_message():
    seen = {}

    def spy(prompts, completions, **kwargs):
        seen.update(prompts=prompts, completions=completions)
        return [0.0]

    TRLReward(spy, "spy", "plain")([single_turn("2+2?", "four")])
    assert seen == {"prompts": ["2+2?"], "completions": ["four"]}
    assert TRLReward(reward_len, "len", "plain")([single_turn("q", "x" * 15)]) == [-5]


def test_multi_turn_completion_is_everything_after_the_prompt_and_few_shot_stays_in_the_prompt():
    shot = [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]
    later = [
        {"role": "assistant", "content": "call"},
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "5"},
    ]
    t = make_trajectory([SYSTEM, {"role": "user", "content": "2+3?"}, *later], {"question": "2+3?"})
    t.messages[1:1] = shot  # a worked example in the prompt: not a turn the model sampled
    seen = {}

    def spy(prompts, completions, **kwargs):
        seen.update(prompts=prompts, completions=completions)
        return [None]

    TRLReward(spy, "spy")([t])
    assert seen["completions"] == [later]
    assert seen["prompts"] == [[SYSTEM, *shot, {"role": "user", "content": "2+3?"}]]


def test_async_reward_and_none_for_unscored_samples():
    async def judge(completions, **kwargs):
        return [None if c[0]["content"] == "skip" else 0.5 for c in completions]

    trajectories = [single_turn("q", "skip"), single_turn("q", "ok")]
    fn = TRLReward(judge, "judge")
    totals, components = score(trajectories, {"judge": (fn, 2.0)}, env_weight=0.0)
    assert np.isnan(components["judge"][0]) and components["judge"][1] == 0.5
    assert np.isnan(totals[0]) and totals[1] == 1.0  # the env return weighted 0 scores nothing


def test_a_function_without_kwargs_gets_only_what_it_names():
    def exact(completions, answer):
        return [float(c[0]["content"] == a) for c, a in zip(completions, answer)]

    out = TRLReward(exact, "exact")([single_turn("q", "7", answer="7", extra="x"), single_turn("q", "8", answer="7")])
    assert out == [1.0, 0.0]


def test_trl_library_rewards_unchanged_match_an_independent_check():
    trl_rewards = pytest.importorskip("trl.rewards")
    manager = load_plugins()
    fn = load_reward("trl.rewards:accuracy_reward", manager.registry, ["question", "solution"])
    replies = ["so \\boxed{12}", "\\boxed{13}", "twelve", "\\boxed{12.0}"]
    trajectories = [single_turn("7+5?", r, solution="12") for r in replies]
    expected = [float(answers_match(extract_boxed(r), "12")) for r in replies]
    assert fn(trajectories) == expected == [1.0, 0.0, 0.0, 1.0]
    think = load_reward("trl.rewards:think_format_reward", manager.registry, ["question"])
    assert think([single_turn("q", "<think>\nhm\n</think>\n12"), single_turn("q", "12")]) == [1.0, 0.0]
    assert trl_rewards.think_format_reward is not None


def test_signature_errors_name_the_accepted_signatures_and_the_missing_column():
    registry = load_plugins().registry

    with pytest.raises(RewardError, match=r"accepted: fn\(trajectories\).*fn\(completions, \*\*kwargs\)"):
        load_reward(f"{__name__}:judge_text", registry, ["question"])
    with pytest.raises(RewardError, match=r"needs an argument 'solution'.*available: answer, completion_ids"):
        load_reward("trl.rewards:accuracy_reward", registry, ["answer", "question"])
    with pytest.raises(ConfigError, match=r"has no 'nope'; it defines: .*reward_len"):
        load_reward(f"{__name__}:nope", registry, [])


def test_resolve_labels_file_rewards_by_function_name(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text("def brevity(completions, **kwargs):\n    return [1.0 for _ in completions]\n")
    config = TrainConfig(rewards={f"{path}:brevity": 0.5, "format": 1.0})
    from agentrl_math import MathEnv

    resolved = resolve_rewards(config, load_plugins().registry, MathEnv())
    assert list(resolved) == ["brevity", "format"] and resolved["brevity"][1] == 0.5


TINY = (
    "--max-steps",
    "2",
    "--num-generations",
    "2",
    "--prompts-per-step",
    "2",
    "--set",
    "eval_tasks=2",
    "--set",
    "max_new_tokens=8",
)


def test_cli_trains_with_a_trl_reward_file_relative_to_the_cwd(tiny_model_dir, tmp_path):
    (tmp_path / "rewards.py").write_text(
        textwrap.dedent("""
        def reward_len(completions, **kwargs):
            return [-abs(20 - len(completion)) for completion in completions]
    """)
    )
    out = tmp_path / "run"
    result = agentrl_in_process(
        "train",
        "--model",
        str(tiny_model_dir),
        "--reward",
        "rewards.py:reward_len:0.1",
        "--set",
        "reward_completion_format=plain",
        "--output-dir",
        str(out),
        *TINY,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        "rewards: env return x1 + reward_len x0.1 (--reward replaces the env's defaults; add "
        "--reward format:1 --reward accuracy:1 to keep them)" in result.stdout
    )
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(line["reward/reward_len_mean"] <= 0 for line in lines[:2])
    saved = (out / "config.yaml").read_text()
    assert f"{tmp_path / 'rewards.py'}:reward_len: 0.1" in saved  # absolute: works from anywhere


def test_cli_wrong_reward_signature_fails_before_loading_anything(tiny_model_dir, tmp_path):
    (tmp_path / "bad.py").write_text("def score(text):\n    return [1.0]\n")
    out = tmp_path / "run"
    result = agentrl_in_process(
        "train",
        "--model",
        str(tiny_model_dir),
        "--reward",
        f"{tmp_path / 'bad.py'}:score",
        "--output-dir",
        str(out),
        *TINY,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert re.search(
        r"error: reward '.*bad.py:score' has signature score\(text\); accepted: fn\(trajectories\)",
        result.stderr.replace("\n", ""),
    ), result.stderr
    assert "Traceback" not in result.stderr and not out.exists()


def test_an_episode_with_no_reply_gets_an_empty_assistant_message_as_trl_would():
    def last_content(completions, **kwargs):
        return [float(len(completion[-1]["content"])) for completion in completions]

    no_reply = make_trajectory([SYSTEM, {"role": "user", "content": "long prompt"}], {"question": "q"})
    assert TRLReward(last_content, "last")([no_reply, single_turn("q", "abc")]) == [0.0, 3.0]


def test_an_async_reward_awaited_under_a_running_loop_runs_in_a_daemon_thread():
    """A reward coroutine awaited while a loop runs goes to a daemon thread (one that never
    finishes cannot hold the interpreter's exit); its value and its error come back."""
    import asyncio

    from agentrl.rewards.specs import _await

    async def daemon_flag():
        import threading

        return threading.current_thread().daemon

    async def fails():
        raise ValueError("bad reward")

    async def under_a_loop():
        flag = _await(daemon_flag())
        with pytest.raises(ValueError, match="bad reward"):
            _await(fails())
        return flag

    assert asyncio.run(under_a_loop()) is True
