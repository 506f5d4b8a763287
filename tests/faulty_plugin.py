"""A plugin file that fails on purpose, and the one-step runs on the tiny model that the tests of
failure handling train with (agentrl.faults, agentrl.env.calls, agentrl.rewards.scoring, the Env
contract, the rollouts).

``FAULTS`` is written to ``faults.py`` in the test's folder by the ``faults`` fixture
(tests/conftest.py): its envs break on the task 'bad' or at start-up (``f"{faults}:StepRaises"``) and
its reward functions raise, hang, exit or return values out of bounds (``f"{faults}:fragile"``). A hung
call ends once the fixture writes ``release`` beside the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentrl.config.train import TrainConfig

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


class StepExits(Tasks):
    def respond(self, text):
        if self.task["id"] == "bad":
            raise SystemExit(3)
        return super().respond(text)


class TasksExit(Tasks):
    def train_tasks(self):
        raise SystemExit(4)


class HugeReturn(Tasks):
    def respond(self, text):
        return [], 1e308, True, {}


class InitRaises(Tasks):
    def __init__(self, level="castle"):
        super().__init__()
        raise ValueError(f"no level file for {level!r}")


def exits(trajectories):
    if any(t.task["id"] == "bad" for t in trajectories):
        raise SystemExit(0)
    return [1.0 for _ in trajectories]


def interrupts(trajectories):
    raise KeyboardInterrupt


def huge(trajectories):
    return [-1e308 if i % 2 else 1e308 for i, _ in enumerate(trajectories)]


def hangs(trajectories):
    while not Path(__file__).with_name("release").exists():
        time.sleep(0.05)
    return [1.0 for _ in trajectories]
'''


def run_config(model_dir: Path, tmp_path: Path, **overrides: Any) -> TrainConfig:
    """One step of 2 prompts x 2 generations of 4 tokens on ``model_dir`` in fp32, into ``tmp_path/run``:
    no eval, no completions logged, no checkpoint, no exported model; ``overrides`` on top."""
    base = dict(
        model=str(model_dir),
        max_steps=1,
        prompts_per_step=2,
        num_generations=2,
        max_new_tokens=4,
        eval_tasks=0,
        output_dir=str(tmp_path / "run"),
        log_completions_every=0,
        save_model=False,
        precision="fp32",
        engine_args={"dtype": "float32"},
        checkpoint_every=0,
    )
    base.update(overrides)
    return TrainConfig(**base)


def unclipped_run_config(model_dir: Path, tmp_path: Path, **overrides: Any) -> TrainConfig:
    """:func:`run_config` with 6 new tokens per turn and no gradient clipping (``max_grad_norm`` None:
    gradients compare as computed); ``overrides`` on top."""
    return run_config(model_dir, tmp_path, **{"max_new_tokens": 6, "max_grad_norm": None, **overrides})


def run_metrics(tmp_path: Path) -> list[dict]:
    """The lines of ``tmp_path/run/metrics.jsonl``, parsed."""
    return [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
