"""agentrl.env.calls: a run calls env methods under its guard (``call_timeout_s``, ``on_call_error``).
An env step that raises, a wrapped library's failure (``agentrl.env.library_call``) or a step past the
time limit ends that episode unscored and counted in ``errors/env`` (``skip``; the env whose call was
abandoned is replaced by a fresh one) or stops the run with one error naming the env method, the
sample and the exception (``fail``)."""

from __future__ import annotations

import math
import re
import time

import pytest
from faulty_plugin import unclipped_run_config

from agentrl.errors import EnvError
from agentrl.plugins import load_plugins
from agentrl.training.trainer import Trainer


def test_a_raising_env_step_ends_that_episode_unscored(tiny_model_dir, tmp_path, faults):
    config = unclipped_run_config(tiny_model_dir, tmp_path, env=f"{faults}:StepRaises", on_call_error="skip")
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
        unclipped_run_config(tiny_model_dir, tmp_path, env=f"{faults}:StepRaises", on_call_error="fail"), load_plugins()
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
    config = unclipped_run_config(tiny_model_dir, tmp_path, env=f"{faults}:LibraryStepFails", on_call_error="skip")
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
        unclipped_run_config(tiny_model_dir, tmp_path, env=f"{faults}:LibraryStepFails", on_call_error="fail"),
        load_plugins(),
    )
    with pytest.raises(
        EnvError,
        match=r"^LibraryStepFails\.step raised on sample \d \(task 'bad': 'Say 2\.'\): "
        + re.escape(f"{LIBRARY_FAILED} (on_call_error=fail"),
    ):
        trainer.rollout_step(1)


def test_a_hanging_env_step_times_out_and_its_env_is_replaced(tiny_model_dir, tmp_path, faults):
    config = unclipped_run_config(
        tiny_model_dir, tmp_path, env=f"{faults}:StepHangs", call_timeout_s=1.0, on_call_error="skip"
    )
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
