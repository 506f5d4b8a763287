"""Both implementations of the run's batches on their own (no Trainer): the config picks one;
the synchronous batches rewind an interrupted step and put each update's weights into the engine;
the asynchronous ones sample every step from the version its staleness bound allows, take each
handed-over version into the engine, and keep and restore the batches collected ahead."""

from __future__ import annotations

import pytest
import torch
from training_parts import engine_holds, tiny_run

from agentrl.sampling.versioned_engine import VersionedEngine
from agentrl.training.async_rollouts import version_for
from agentrl.training.batches import AsyncBatches, SyncBatches, make_batches
from agentrl.training.interrupts import InterruptGuard
from agentrl.training.learner import Learner
from agentrl.training.rollout_phase import RolloutPhase


@pytest.mark.parametrize("async_steps", [0, 1])
def test_the_config_picks_the_batches(tiny_model_dir, tmp_path, async_steps):
    run = tiny_run(tiny_model_dir, tmp_path, async_steps=async_steps)
    batches = make_batches(run, RolloutPhase(run), Learner(run))
    assert type(batches) is (AsyncBatches if async_steps else SyncBatches)
    assert isinstance(run.engine, VersionedEngine) == bool(async_steps)


def test_synchronous_batches_rewind_a_step_interrupted_before_its_update(tiny_model_dir, tmp_path, monkeypatch):
    run = tiny_run(tiny_model_dir, tmp_path)
    phase = RolloutPhase(run)
    batches = make_batches(run, phase, Learner(run))
    guard = InterruptGuard()
    guard.requested = True  # a signal arrived during the collection (seen at its end)
    with pytest.raises(KeyboardInterrupt):
        batches.take(1, guard)
    assert phase.cursor.position == 0

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # a signal in the middle of the episodes

    guard.requested = False
    with monkeypatch.context() as patch:
        patch.setattr(run.rollout, "run", interrupted)
        with pytest.raises(KeyboardInterrupt):
            batches.take(1, guard)
    assert phase.cursor.position == 0  # the tasks it took are taken again
    taken = batches.take(1, guard)
    assert taken.batch.num_rows == 4 and phase.cursor.position == run.config.prompts_per_step
    assert batches.state(1) == {}  # nothing is collected ahead


def test_synchronous_batches_put_an_update_s_weights_into_the_engine(tiny_model_dir, tmp_path):
    run = tiny_run(tiny_model_dir, tmp_path, engine_args={"dtype": "bfloat16"})  # the engine's own copy
    learner = Learner(run)
    batches = make_batches(run, RolloutPhase(run), learner)
    taken = batches.take(1, InterruptGuard())
    assert learner.update(taken.batch, taken.metrics, step=1)
    assert not engine_holds(run.engine.model, run.model)
    batches.hand_over(1, changed=False, hold=False, evaluate=False)  # the policy did not train: nothing to do
    assert not engine_holds(run.engine.model, run.model)
    batches.hand_over(1, changed=True, hold=False, evaluate=False)
    assert engine_holds(run.engine.model, run.model)


def test_asynchronous_batches_keep_the_staleness_bound_and_take_each_version_handed_over(
    tiny_model_dir, tmp_path, capsys
):
    """async_steps=1: step t is sampled by version max(0, t - 2); each hand-over publishes the
    step's weights (here: scaled, as an update would change them) and, held for an evaluation,
    loads them into the engine; a checkpoint holds the next step's batch, which a resume takes
    over unchanged and a synchronous resume drops, saying so."""
    run = tiny_run(tiny_model_dir, tmp_path, async_steps=1, engine_args={"dtype": "bfloat16"})
    phase, model = RolloutPhase(run), run.model
    batches = AsyncBatches(run, phase, lambda: model)
    guard, taken, ahead = InterruptGuard(), {}, {}
    batches.start(0)
    try:
        for step in range(1, run.config.max_steps + 1):
            taken[step] = batches.take(step, guard)
            version = version_for(step, async_steps=1, floor=0)
            assert taken[step].metrics["async/sampling_version"] == version == max(0, step - 2)
            assert taken[step].metrics["async/staleness_max"] == step - 1 - version <= 1
            batch = taken[step].batch
            assert set(batch.extras["policy_versions"][batch.loss_mask > 0].tolist()) == {version}
            with torch.no_grad():  # the update
                for p in model.parameters():
                    p.mul_(0.9)
            batches.hand_over(step, changed=True, hold=True, evaluate=True)
            assert engine_holds(run.engine.engine.model, model)  # an evaluation samples the new version
            ahead[step] = batches.state(step)["async"]
            assert [c["step"] for c in ahead[step]["ready"]] == list(range(step + 1, min(step + 1, 4) + 1))
            batches.release()
    finally:
        batches.close()
    assert batches.thread is None and engine_holds(run.engine.engine.model, model)

    resumed = AsyncBatches(run, phase, lambda: model)
    resumed.restore({"step": 1, "async": ahead[1]})
    resumed.start(1)
    try:
        again = resumed.take(2, guard)
    finally:
        resumed.close()
    assert torch.equal(again.batch.input_ids, taken[2].batch.input_ids)
    assert again.metrics["async/sampling_version"] == 0.0 and again.metrics["async/dropped_episodes"] == 0.0

    SyncBatches(phase, run.engine, lambda: model).restore({"step": 1, "async": ahead[1]})
    note = "note: 4 episodes the asynchronous run collected ahead are not trained on (async_steps=0)"
    assert note in capsys.readouterr().out
