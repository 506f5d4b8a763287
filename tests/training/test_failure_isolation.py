"""Failure isolation: a reward function or env that raises or hangs is data, not a crash (skip) or
one named error (fail); env contract violations are named at start-up; engine failures are named."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from agentrl.config.train import TrainConfig
from agentrl.env import CallGuard
from agentrl.errors import EngineError, EnvError, RewardError
from agentrl.plugins import load_plugins
from agentrl.rewards.scoring import score
from agentrl.testing import GradientRecorder
from agentrl.training.trainer import Trainer
from agentrl.trajectory import collate
from agentrl_grpo import group_advantages

FAULTS = '''
import math, time
from pathlib import Path
from agentrl import Env


def hang(seconds=30.0):
    """Sleep like a hung call, but end as soon as the test writes ``release`` (no thread outlives it)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end and not Path(__file__).with_name("release").exists():
        time.sleep(0.05)

TASKS = [{"id": "good", "question": "Say 1.", "answer": "1"}, {"id": "bad", "question": "Say 2.", "answer": "2"}]


class Tasks(Env):
    """Two training tasks, 'good' and 'bad'; the subclasses below break on 'bad' or at start-up."""

    def train_tasks(self):
        return list(TASKS)

    def eval_tasks(self):
        return [{"id": "held", "question": "Say 3.", "answer": "3"}]

    def start(self, task):
        return [{"role": "user", "content": task["question"]}]

    def respond(self, text):
        return [], 0.0, True, {}


class StepRaises(Tasks):
    def respond(self, text):
        if self.task["id"] == "bad":
            raise ValueError("env bug on the bad task")
        return super().respond(text)


class LibraryStepFails(Tasks):
    """An adapter whose wrapped library raises on the 'bad' task (agentrl.env.library_call names it)."""

    def respond(self, text):
        from agentrl.env import library_call

        with library_call("somelib", "Game-v0", "step"):
            if self.task["id"] == "bad":
                float("Invalid action format")
        return super().respond(text)


class StepHangs(Tasks):
    def respond(self, text):
        if self.task["id"] == "bad":
            hang()
        return super().respond(text)


class EmptyTasks(Tasks):
    def train_tasks(self):
        return []


class GeneratorTasks(Tasks):
    def train_tasks(self):
        return (t for t in TASKS)


class NoEvalTasks(Tasks):
    def eval_tasks(self):
        return []


class ZeroTurns(Tasks):
    max_turns = 0


class StartsWithText(Tasks):
    def start(self, task):
        return task["question"]


class ResetRaises(Tasks):
    def start(self, task):
        raise KeyError("no such level")


class StepFourValues(Tasks):
    def step(self, action):
        return [], 0.0, True, {}


class StepNanReward(Tasks):
    def step(self, action):
        return [], math.nan, True, False, {}


def fragile(trajectories):
    if any(t.task["id"] == "bad" for t in trajectories):
        raise ValueError("cannot score the bad task")
    return [1.0 for _ in trajectories]


def slow(trajectories):
    hang()
    return [1.0 for _ in trajectories]
'''


@pytest.fixture
def faults(tmp_path) -> Iterator[Path]:
    path = tmp_path / "faults.py"
    path.write_text(FAULTS)
    yield path
    (tmp_path / "release").write_text("")  # abandoned hung calls end now, not during later tests
    time.sleep(0.2)


def _config(model_dir: Path, tmp_path: Path, **overrides) -> TrainConfig:
    base = dict(
        model=str(model_dir),
        max_steps=1,
        prompts_per_step=2,
        num_generations=2,
        max_new_tokens=6,
        eval_tasks=0,
        output_dir=str(tmp_path / "run"),
        log_completions_every=0,
        save_model=False,
        precision="fp32",
        engine_args={"dtype": "float32"},
        checkpoint_every=0,
        max_grad_norm=None,
    )
    base.update(overrides)
    return TrainConfig(**base)


def _metrics(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


# -- reward functions ------------------------------------------------------------------------------
@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_a_failed_reward_leaves_its_episode_out_of_the_gradient(tiny_model_dir, tmp_path, loss_type):
    config = _config(
        tiny_model_dir,
        tmp_path,
        prompts_per_step=2,
        num_generations=3,
        algorithm={"loss_type": loss_type, "beta": 0.05},
    )
    trainer = Trainer(config, load_plugins())
    _, trajectories, _ = trainer.rollout_step(1)
    bad = trajectories[1]

    def first_token(trajectories):  # distinct values, so every group has signal
        if any(t is bad for t in trajectories):
            raise ValueError("cannot score this one")
        return [t.token_ids[t.prompt_length] % 97 / 97 for t in trajectories]

    errors: dict[str, int] = {}
    with pytest.warns(RuntimeWarning, match=re.escape("reward function 'first_token' raised on sample 1 (task ")):
        totals, components = score(
            trajectories,
            {"first_token": (first_token, 1.0)},
            env_weight=0.0,
            guard=CallGuard(timeout_s=5, on_error="skip"),
            errors=errors,
        )
    assert errors == {"first_token": 1}
    assert math.isnan(totals[1]) and all(math.isfinite(x) for i, x in enumerate(totals) if i != 1)
    batch = collate(trajectories, totals, trainer.tokenizer.pad_token_id)
    assert batch.loss_mask[1].sum() == 0  # out of the loss, its KL term and the denominators
    advantages, _ = group_advantages(batch.rewards, batch.groups)
    scored = torch.tensor([totals[0], totals[2]], dtype=torch.float64)  # group 0 without the bad one
    expected = (scored - scored.mean()) / scored.std(unbiased=False)
    assert advantages[1] == 0
    torch.testing.assert_close(advantages[[0, 2]].double(), expected, rtol=1e-5, atol=1e-6)

    keep = [0, 2, 3, 4, 5]
    grads = []
    for rows in (list(range(6)), keep):  # the batch with the unscored episode, and without it
        trainer.run.trained["policy"].optimizer = GradientRecorder(trainer.model.parameters())
        trainer.update(batch.select(rows), {})
        grads.append(trainer.run.trained["policy"].optimizer.steps[0])
    assert any(g.abs().sum() > 0 for g in grads[0])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-8)


def test_a_raising_reward_with_skip_is_counted_and_the_run_finishes(tiny_model_dir, tmp_path, faults):
    config = _config(
        tiny_model_dir,
        tmp_path,
        env=f"{faults}:Tasks",
        rewards={f"{faults}:fragile": 1.0},
        max_steps=2,
        on_call_error="skip",
    )
    with pytest.warns(RuntimeWarning, match="reward function 'fragile' raised on sample") as record:
        Trainer(config, load_plugins()).train()
    assert sum("reward function 'fragile'" in str(w.message) for w in record) == 1  # warned once per run
    rows = _metrics(tmp_path)
    assert [r["errors/reward/fragile"] for r in rows] == [2.0, 2.0]  # both samples of the 'bad' task
    assert [r["reward/scored_frac"] for r in rows] == [0.5, 0.5]
    assert [r["errors/env"] for r in rows] == [0.0, 0.0]


def test_a_raising_reward_with_fail_names_the_function_the_sample_and_the_exception(tiny_model_dir, tmp_path, faults):
    config = _config(
        tiny_model_dir, tmp_path, env=f"{faults}:Tasks", rewards={f"{faults}:fragile": 1.0}, on_call_error="fail"
    )
    trainer = Trainer(config, load_plugins())
    with pytest.raises(RewardError) as caught:
        trainer.rollout_step(1)
    message = str(caught.value)
    assert re.search(
        r"^reward function 'fragile' raised on sample \d \(task 'bad': 'Say 2\.'\): "
        r"ValueError: cannot score the bad task \(on_call_error=fail",
        message,
    ), message


def test_a_raising_reward_with_fail_in_the_rollout_thread_stops_an_async_run_with_the_same_error(
    tiny_model_dir, tmp_path, faults
):
    import threading

    config = _config(
        tiny_model_dir,
        tmp_path,
        env=f"{faults}:Tasks",
        rewards={f"{faults}:fragile": 1.0},
        on_call_error="fail",
        async_steps=1,
        max_steps=3,
    )
    with pytest.raises(RewardError, match=r"^reward function 'fragile' raised on sample \d \(task 'bad'"):
        Trainer(config, load_plugins()).train()
    assert not [t for t in threading.enumerate() if t.name == "agentrl-async-rollouts"]  # the thread ended


def test_a_hanging_reward_times_out_and_the_step_finishes(tiny_model_dir, tmp_path, faults):
    config = _config(
        tiny_model_dir,
        tmp_path,
        env=f"{faults}:Tasks",
        rewards={f"{faults}:slow": 1.0},
        env_reward_weight=0.0,
        call_timeout_s=1.0,
        on_call_error="skip",
    )
    trainer = Trainer(config, load_plugins())
    start = time.perf_counter()
    with pytest.warns(RuntimeWarning, match="reward function 'slow' timed out on the batch of 4 samples"):
        trainer.train()
    assert time.perf_counter() - start < 20  # the hang lasts 30 s; a loaded 2-core CI machine needs the margin
    (row,) = _metrics(tmp_path)
    assert row["errors/reward/slow"] == 4.0 and row["reward/scored_frac"] == 0.0
    assert row["train/skipped_unscored_batch"] == 1.0  # every episode unscored: the trainer skips the update


# -- env methods -------------------------------------------------------------------------------------
def test_a_raising_env_step_ends_that_episode_unscored(tiny_model_dir, tmp_path, faults):
    config = _config(tiny_model_dir, tmp_path, env=f"{faults}:StepRaises", on_call_error="skip")
    trainer = Trainer(config, load_plugins())
    with pytest.warns(RuntimeWarning, match=re.escape("StepRaises.step raised on sample")):
        batch, trajectories, metrics = trainer.rollout_step(1)
    errors = [t.info.get("error") for t in trajectories]
    bad = [i for i, t in enumerate(trajectories) if t.task["id"] == "bad"]
    assert [i for i, e in enumerate(errors) if e] == bad and len(bad) == 2
    assert errors[bad[0]] == {
        "method": "StepRaises.step",
        "exception": "ValueError: env bug on the bad task",
        "timed_out": False,
    }
    assert metrics["errors/env"] == 2.0
    assert all(math.isnan(batch.rewards[i]) and batch.loss_mask[i].sum() == 0 for i in bad)
    assert all(math.isfinite(batch.rewards[i]) for i in range(4) if i not in bad)


def test_a_raising_env_step_with_fail_names_the_env_the_sample_and_the_exception(tiny_model_dir, tmp_path, faults):
    trainer = Trainer(
        _config(tiny_model_dir, tmp_path, env=f"{faults}:StepRaises", on_call_error="fail"), load_plugins()
    )
    with pytest.raises(
        EnvError,
        match=r"^StepRaises\.step raised on sample \d \(task 'bad': 'Say 2\.'\): "
        r"ValueError: env bug on the bad task \(on_call_error=fail",
    ):
        trainer.rollout_step(1)


LIBRARY_FAILED = (
    "somelib env 'Game-v0' failed in step: ValueError: could not convert string to float: 'Invalid action format'"
)


def test_a_wrapped_library_failure_is_skipped_and_counted_not_a_contract_error(tiny_model_dir, tmp_path, faults):
    config = _config(tiny_model_dir, tmp_path, env=f"{faults}:LibraryStepFails", on_call_error="skip")
    trainer = Trainer(config, load_plugins())
    with pytest.warns(RuntimeWarning, match=re.escape("LibraryStepFails.step raised on sample")):
        _, trajectories, metrics = trainer.rollout_step(1)
    errors = [t.info["error"] for t in trajectories if t.task["id"] == "bad"]
    assert errors == [{"method": "LibraryStepFails.step", "exception": LIBRARY_FAILED, "timed_out": False}] * 2
    assert metrics["errors/env"] == 2.0


def test_a_wrapped_library_failure_with_fail_names_the_library_the_env_id_and_the_call(
    tiny_model_dir, tmp_path, faults
):
    trainer = Trainer(
        _config(tiny_model_dir, tmp_path, env=f"{faults}:LibraryStepFails", on_call_error="fail"), load_plugins()
    )
    with pytest.raises(
        EnvError,
        match=r"^LibraryStepFails\.step raised on sample \d \(task 'bad': 'Say 2\.'\): "
        + re.escape(f"{LIBRARY_FAILED} (on_call_error=fail"),
    ):
        trainer.rollout_step(1)


def test_a_hanging_env_step_times_out_and_its_env_is_replaced(tiny_model_dir, tmp_path, faults):
    config = _config(tiny_model_dir, tmp_path, env=f"{faults}:StepHangs", call_timeout_s=1.0, on_call_error="skip")
    trainer = Trainer(config, load_plugins())
    before = list(trainer.envs)
    start = time.perf_counter()
    with pytest.warns(RuntimeWarning, match=re.escape("StepHangs.step timed out on sample")):
        _, trajectories, metrics = trainer.rollout_step(1)
    assert time.perf_counter() - start < 20  # the hang lasts 30 s; a loaded 2-core CI machine needs the margin
    hung = [i for i, t in enumerate(trajectories) if t.info.get("error")]
    assert hung == [i for i, t in enumerate(trajectories) if t.task["id"] == "bad"]
    assert all(trajectories[i].info["error"]["timed_out"] for i in hung) and metrics["errors/env"] == 2.0
    assert all((trainer.envs[i] is before[i]) == (i not in hung) for i in range(4))


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
    trainer = Trainer(_config(tiny_model_dir, tmp_path, env=f"{faults}:{cls}", on_call_error="skip"), load_plugins())
    with pytest.raises(EnvError, match=re.escape(message)):
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
    config = _config(tiny_model_dir, tmp_path, env=f"{faults}:{cls}", **overrides)
    with pytest.raises(EnvError, match=re.escape(message)):
        Trainer(config, load_plugins())


# -- engines -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("async_steps", [0, 1])
def test_an_engine_failure_names_the_engine_and_the_batch(tiny_model_dir, tmp_path, faults, monkeypatch, async_steps):
    """The message names the engine the user chose, also in an asynchronous run (whose engine is a
    VersionedEngine wrapping it)."""
    trainer = Trainer(_config(tiny_model_dir, tmp_path, env=f"{faults}:Tasks", async_steps=async_steps), load_plugins())
    assert type(trainer.engine).__name__ == ("VersionedEngine" if async_steps else "HFEngine")

    def broken_generate(prompts, sampling):
        raise RuntimeError("CUDA error: out of memory\nCompile with TORCH_USE_CUDA_DSA")

    monkeypatch.setattr(trainer.engine, "generate", broken_generate)
    with pytest.raises(
        EngineError,
        match=r"^engine 'hf' \(HFEngine\) failed at turn 1 on 4 prompts of \d+-\d+ "
        r"tokens \(max_new_tokens=6, temperature=1\.0\): RuntimeError: CUDA error: "
        r"out of memory Compile with TORCH_USE_CUDA_DSA$",
    ):
        trainer.rollout_step(1)
    monkeypatch.setattr(trainer.engine, "generate", lambda prompts, sampling: [])
    with pytest.raises(EngineError, match=re.escape("on 4 prompts of") + ".*: returned 0 generations for 4 prompts"):
        trainer.rollout_step(2)
