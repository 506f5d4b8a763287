"""The training loop: collect -> score -> advantages -> update -> sync -> evaluate -> checkpoint.

One step (see the hook order in agentrl.hookspecs):
  1. sample ``prompts_per_step`` tasks, each run ``num_generations`` times (a group);
  2. the rollout drives the envs through the engine -> trajectories;
  3. reward functions score them (plus the env's own return);
  4. the algorithm turns rewards into per-token advantages;
  5. for each of the algorithm's ``num_iterations`` epochs and each of its ``num_mini_batches``
     mini-batches (one optimizer step each): loss denominators are counted over the mini-batch
     first, then every micro-batch's loss is backpropagated (accumulated), then every trained
     module (the policy and the algorithm's own, e.g. a critic) takes one clipped optimizer step
     (accelerate); a step whose loss or gradients are not finite is skipped and counted;
  6. the engine receives the new weights.

The pieces: :func:`agentrl.training.build.build_run` makes the parts,
:class:`agentrl.training.rollout_phase.RolloutPhase` does 1-3, :class:`agentrl.training.learner.Learner` 4-5,
:class:`agentrl.training.batches.Batches` gives each step its batch (collected now, or ahead by a rollout
thread) and does 6, :class:`agentrl.training.saving.RunCheckpoints` keeps the state on disk,
:mod:`agentrl.training.interrupts` turns signals into a clean stop, :mod:`agentrl.rundir.directory` decides
where a run writes. This module runs them in order.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agentrl.config.train import TrainConfig
from agentrl.errors import TrainingError
from agentrl.faults import plugin_exit
from agentrl.model import distributed
from agentrl.plugins import PluginManager
from agentrl.rewards.schemes import with_absolute_paths
from agentrl.rundir import checkpoints as ckpt
from agentrl.rundir import links
from agentrl.rundir.directory import read_history, refuse_existing_run, run_dir_for
from agentrl.rundir.metrics import MetricsWriter, NoWriter
from agentrl.rundir.paths import check_output_dir
from agentrl.training.batches import make_batches
from agentrl.training.best_model import BestModel
from agentrl.training.build import Run, build_run
from agentrl.training.episode_log import EpisodeLog
from agentrl.training.interrupts import InterruptGuard, interruption
from agentrl.training.learner import Learner
from agentrl.training.memory import peak_rss_gb, rss_gb
from agentrl.training.rollout_phase import RolloutPhase, StepBatch
from agentrl.training.saving import RunCheckpoints
from agentrl.trajectory import TrainBatch


@dataclass
class TrainResult:
    """What a finished run reports."""

    run_dir: Path
    eval_before: dict[str, float]
    eval_after: dict[str, float]
    history: list[dict[str, float]]
    best: dict[str, Any] | None = None
    """With ``keep_best``: the best evaluation (``BestModel.summary``) and ``saved_as_model``
    (whether ``model/`` holds it rather than the last policy); None without it."""


class Trainer:
    """Builds a run from a TrainConfig and a loaded PluginManager (``resume``: the checkpoint to
    continue from), then trains it: :meth:`train`."""

    def __init__(
        self, config: TrainConfig, manager: PluginManager, console: Any = None, resume: Path | None = None
    ) -> None:
        self.console = console
        self.run_dir = run_dir_for(config)
        if resume is None:
            check_output_dir(self.run_dir)
            refuse_existing_run(self.run_dir)
            config = with_absolute_paths(config, manager.registry)  # config.yaml works from any directory
        self.run: Run = build_run(config, manager)
        self.rollouts = RolloutPhase(self.run)
        self.learner = Learner(self.run)
        self.batches = make_batches(self.run, self.rollouts, self.learner)
        self.checkpoints = RunCheckpoints(self.run, self.run_dir)
        self.episodes = EpisodeLog(self.run, self.run_dir)
        self.completed_step = 0
        self.eval_before: dict[str, float] = {}
        self.best_record: dict[str, Any] | None = None  # what eval.json says about the best policy
        self.best = (
            BestModel(self.run_dir, metric="eval/reward_mean")
            if (config.keep_best and config.eval_tasks and config.save_model)
            else None
        )
        self.resumed: dict[str, Any] | None = self.load_checkpoint(resume) if resume is not None else None

    # The parts most callers reach for, by their usual names.
    config = property(lambda self: self.run.config, lambda self, value: setattr(self.run, "config", value))
    model = property(lambda self: self.run.model)
    tokenizer = property(lambda self: self.run.tokenizer)
    engine = property(lambda self: self.run.engine)
    envs = property(lambda self: self.run.envs)
    algorithm = property(lambda self: self.run.algorithm)
    accelerator = property(lambda self: self.run.accelerator)
    is_main = property(lambda self: self.run.is_main)

    # -- one step ----------------------------------------------------------------------------------
    def rollout_step(self, step: int) -> tuple[TrainBatch, list[Any], dict[str, float]]:
        """Step ``step``'s batch collected now: this process's collated batch, the whole batch's
        trajectories and the step's metrics (:meth:`agentrl.training.rollout_phase.RolloutPhase.collect`)."""
        taken = self.rollouts.collect(step)
        return taken.batch, taken.episodes, taken.metrics

    def update(self, batch: TrainBatch, metrics: dict[str, float], step: int = 1) -> None:
        """All of the algorithm's optimizer steps on one batch (:meth:`agentrl.training.learner.Learner.update`),
        the reference reset when one is due (:meth:`agentrl.training.learner.Learner.sync_reference`), then
        the new weights to the sampler (:meth:`agentrl.training.batches.Batches.hand_over`; held for the
        step's evaluation or checkpoint when one follows)."""
        changed = self.learner.update(batch, metrics, step, self.rollouts.why(step, metrics))
        self.episodes.updated(step, batch)
        self.learner.sync_reference(step, metrics)
        evaluate = self.eval_due(step)
        self.batches.hand_over(step, changed, hold=self.save_due(step) or evaluate, evaluate=evaluate)

    def evaluate(self, step: int | None = None, final: bool = False) -> dict[str, float]:
        """Held-out accuracy of the current policy (greedy by default); with ``step`` (the steps it
        trained, ``final``: the run's last evaluation) its episodes go to ``eval_completions.jsonl``."""
        metrics = self.rollouts.evaluate()
        if step is not None:
            self.episodes.write_eval(step, final, self.rollouts.eval_records)
        return metrics

    def train_step(self, step: int, writer: MetricsWriter, guard: InterruptGuard, progress: Any) -> dict[str, float]:
        """One step: its batch (:meth:`agentrl.training.batches.Batches.take`, interruptible), then
        update, evaluation, records and checkpoint as one unit Ctrl-C waits for; stops the run
        after too many skipped steps in a row."""
        t0 = time.perf_counter()
        _phase(progress, "rollout")
        taken = self.batches.take(step, guard)
        t1 = time.perf_counter()
        with guard.deferred():
            _phase(progress, "update")
            self.update(taken.batch, taken.metrics, step)
            taken.metrics.update(_perf(t0, t1, time.perf_counter(), len(taken.episodes)))
            self.evaluate_and_record(step, taken, writer, progress)
            if self.save_due(step):
                self.save_checkpoint(step)
            self.batches.release()
        if progress is not None:
            progress(step, taken.metrics)
        self.learner.stop_if_stuck(step, self.run_dir)
        if guard.agreed():  # deferred to here, or raised inside a callback that swallowed it
            raise KeyboardInterrupt
        return taken.metrics

    def eval_due(self, step: int) -> bool:
        """Whether the periodic evaluation runs after ``step`` (on this process)."""
        cfg = self.config
        return bool(
            cfg.eval_every and step % cfg.eval_every == 0 and step != cfg.max_steps and cfg.eval_tasks and self.is_main
        )

    def save_due(self, step: int) -> bool:
        """Whether a checkpoint is written after ``step``'s update: every ``checkpoint_every`` steps,
        and before a stop for too many skipped steps in a row."""
        cfg = self.config
        return bool(cfg.checkpoint_every and (step % cfg.checkpoint_every == 0 or self.learner.stuck()))

    def evaluate_and_record(self, step: int, taken: StepBatch, writer: MetricsWriter, progress: Any) -> None:
        """The periodic evaluation (and best policy), completions, the step-end hook and the metrics row."""
        metrics = taken.metrics
        if self.eval_due(step):
            _phase(progress, "eval")
            evaluation = self.evaluate(step)
            metrics.update(evaluation)
            self.offer_best(step, evaluation)
        self.episodes.write_step(step, taken.records)
        if self.is_main:
            self.run.hook.agentrl_on_step_end(step=step, metrics=metrics)
        writer.write(step, metrics)
        self.completed_step = step

    # -- the run -------------------------------------------------------------------------------------
    def train(self, progress: Any = None) -> TrainResult:
        """Run the steps left (all of them, or those after the resumed checkpoint) with
        evaluations before and after, writing the run dir and periodic checkpoints.

        Ctrl-C, SIGTERM or SIGHUP (:data:`agentrl.model.launch.STOP_SIGNALS`) during a rollout or
        evaluation stops at once; during an update (and its checkpoint) it stops when the step is
        complete. Either way the last complete step is checkpointed and :class:`TrainingInterrupted`
        names it and the signal; a second signal during an update or that checkpoint stops without
        it (the older checkpoints stay intact).
        """
        writer = self.open_run_dir()
        guard = InterruptGuard(collective=distributed.world_size() > 1)
        self.completed_step = self.resumed["step"] if self.resumed else 0
        with guard.installed():  # also while the interrupted run saves: a second signal breaks that save only
            try:
                history, eval_after = self.run_steps(writer, guard, progress)
            except KeyboardInterrupt as exc:
                writer.close()
                failure = None if guard.requested else plugin_exit(exc)  # raised by code, not by a signal
                if failure is not None:
                    raise TrainingError(f"the run stopped: {failure}") from None
                raise interruption(guard, self.completed_step, self.run_dir, self.save_checkpoint) from None
            finally:
                self.batches.close()
        _report(progress, "eval after", eval_after)
        owned_states = self.checkpoints.gather_owned() if self.config.save_model else {}  # a collective (FSDP)
        if self.is_main:
            self.finish(eval_after, writer, owned_states)
        distributed.barrier()  # the run dir is complete when any process returns
        return TrainResult(self.run_dir, self.eval_before, eval_after, history, self.best_record)

    def open_run_dir(self) -> MetricsWriter | NoWriter:
        """The run dir ready to write (a resumed one cut back to its checkpoint) and its metrics
        writer (one process writes the run dir, logs, evaluates and saves)."""
        cfg, run_dir, resumed = self.config, self.run_dir, self.resumed
        if not self.is_main:
            return NoWriter()
        run_dir.mkdir(parents=True, exist_ok=True)
        if resumed is None:
            links.write_text(run_dir / "config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        else:  # drop what was written after the checkpoint (and a line torn by a kill)
            self.episodes.cut_back(resumed)
            ckpt.remove_partial(run_dir)
            ckpt.set_aside_after(run_dir, resumed["step"])  # damaged newer checkpoints the resume passed over
        self.run.hook.agentrl_on_train_start(config=cfg, run_dir=str(run_dir))
        return MetricsWriter(run_dir, purge_step=resumed["step"] + 1 if resumed else None)

    def run_steps(
        self, writer: Any, guard: InterruptGuard, progress: Any
    ) -> tuple[list[dict[str, float]], dict[str, float]]:
        """The evaluation before, the steps left, the last checkpoint and (when a step trained) the one after."""
        cfg, main = self.config, self.is_main
        if self.resumed is None:
            _phase(progress, "eval")
            self.eval_before = self.evaluate(0) if cfg.eval_tasks and main else {}
            self.offer_best(0, self.eval_before)
        else:
            self.eval_before = self.resumed["eval_before"]
            if self.best is not None and main:
                self.best.resume(self.resumed["step"])
        _report(progress, "eval before", self.eval_before)
        history = read_history(self.run_dir / "metrics.jsonl") if main else []
        self.batches.start(self.completed_step)
        for step in range(self.completed_step + 1, cfg.max_steps + 1):
            history.append(self.train_step(step, writer, guard, progress))
        if self.completed_step and cfg.checkpoint_every:
            self.save_checkpoint(self.completed_step)
        self.learner.stop_if_untrained((self.resumed["step"] if self.resumed else 0) + 1, self.run_dir)
        self.batches.close()  # the engine holds the trained policy
        _phase(progress, "eval")
        return history, self.evaluate(self.completed_step, final=True) if cfg.eval_tasks and main else {}

    def finish(self, eval_after: dict[str, float], writer: Any, owned_states: dict[str, Any]) -> None:
        """The final metrics, eval.json, the exported model (the best one if it beat the last),
        the finished run's checkpoint, the plots and the end hook (main process)."""
        cfg, run_dir = self.config, self.run_dir
        if eval_after:
            writer.write(cfg.max_steps, {f"final/{k}": v for k, v in eval_after.items()})
        writer.close()
        kept_best = (
            self.best is not None
            and self.best.step is not None
            and eval_after
            and not (eval_after.get(self.best.metric, -math.inf) >= self.best.score)
        )
        record: dict[str, Any] = {"before": self.eval_before, "after": eval_after}
        if self.best is not None and self.best.step is not None:
            record["best"] = self.best_record = {**self.best.summary(), "saved_as_model": bool(kept_best)}
        links.write_text(run_dir / "eval.json", json.dumps(record, indent=2))
        if cfg.save_model:
            self.checkpoints.export("last" if kept_best else "model", owned_states)
        if kept_best:  # the best evaluated policy is the run's model; the last one is in last/
            shutil.rmtree(run_dir / "model", ignore_errors=True)
            self.best.folder.rename(run_dir / "model")
        elif self.best is not None:
            shutil.rmtree(self.best.folder, ignore_errors=True)
        self.checkpoints.finish(self.completed_step, ("last" if kept_best else "model") if cfg.save_model else None)
        from agentrl.rundir.plots import plot_run

        plot_run(run_dir)
        self.run.hook.agentrl_on_train_end(run_dir=str(run_dir), metrics=eval_after)

    # -- state on disk -------------------------------------------------------------------------------
    def save_checkpoint(self, step: int) -> Path:
        """Everything ``--resume`` needs to continue after ``step`` exactly (every process calls it),
        the batches collected for later steps included (:meth:`agentrl.training.batches.Batches.state`)."""
        ahead = self.batches.state(step)  # first: a rollout thread moves the task cursor
        return self.checkpoints.save(
            step,
            {
                "task_cursor": self.rollouts.cursor.position,
                "nonfinite_skips": self.learner.nonfinite_skips,
                "skipped_in_a_row": self.learner.skipped_in_a_row,
                "eval_before": self.eval_before,
                **ahead,
            },
        )

    def load_checkpoint(self, folder: Path) -> dict[str, Any]:
        """Restore a checkpoint written by :meth:`save_checkpoint`; returns its trainer state."""
        state = self.checkpoints.load_intact(folder)  # or an older one, when a value in it does not fit
        self.rollouts.cursor.position = state["task_cursor"]
        self.learner.nonfinite_skips, self.learner.skipped_in_a_row = (
            state["nonfinite_skips"],
            state["skipped_in_a_row"],
        )
        self.batches.restore(state)
        return state

    def offer_best(self, step: int, evaluation: dict[str, float]) -> None:
        """Keep the policy evaluated after ``step`` in ``best/`` if it is the best so far (``keep_best``)."""
        if self.best is not None and self.is_main and evaluation:
            self.best.offer(step, evaluation, self.checkpoints.save_policy)


def _phase(progress: Any, label: str) -> None:
    """Tell a progress display what the run is doing now (``eval``, ``rollout``, ``update``)."""
    if progress is not None and hasattr(progress, "phase"):
        progress.phase(label)


def _perf(t0: float, t1: float, t2: float, episodes: int) -> dict[str, float]:
    """A step's ``perf/*`` metrics: its rollout (``t0`` to ``t1``) and update (to ``t2``) times and memory."""
    return {
        "perf/rollout_seconds": t1 - t0,
        "perf/update_seconds": t2 - t1,
        "perf/step_seconds": t2 - t0,
        "perf/episodes_per_second": episodes / (t2 - t0),
        "perf/rss_gb": rss_gb(),
        "perf/peak_rss_gb": peak_rss_gb(),
    }


def _report(progress: Any, label: str, metrics: dict[str, float]) -> None:
    if progress is not None and hasattr(progress, "report"):
        progress.report(label, metrics)
