"""The Python API: :func:`train` runs a whole run and returns its :class:`TrainResult`; :class:`Trainer`
does it step by step. Both take what ``agentrl train`` takes, as keyword arguments (any config key:
``max_steps=2``, ``env_args={...}``), and Python objects where the CLI takes names: an env class or
instance, reward functions (TRL's signature too), a dataset (a path, a list of dicts, a
``datasets.Dataset``), an agent function, an algorithm class, plugin objects. The same config gives
the same run through the CLI and through this API (one process; ``agentrl train`` launches more)."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any

from agentrl.api.objects import GivenObjects, agent_spec, dataset_section, merged
from agentrl.api.progress import TrainProgress
from agentrl.api.report import headline, start_lines, summary_lines
from agentrl.config.train import TrainConfig, build_config
from agentrl.errors import ConfigError
from agentrl.plugins import PluginManager, load_plugins
from agentrl.training.interrupts import InterruptGuard
from agentrl.training.trainer import Trainer as _RunTrainer
from agentrl.training.trainer import TrainResult


class Trainer:
    """One training run, built now, trained by :meth:`train` (or a step at a time: :meth:`train_step`,
    :meth:`evaluate`, :meth:`save`, then :meth:`finish`); :meth:`close` (or ``with``) stops what it
    started and frees the run dir's lock.

    ``config``: a YAML path, a mapping or a :class:`agentrl.TrainConfig`; keyword arguments override
    it (``env``, ``algo``, ``model``, ``rewards``, ``dataset``, ``eval_dataset``, ``agent`` take
    objects too, see the module docstring); ``plugins``: plugin modules or objects to load besides
    the installed ones; ``resume``: a run dir to continue from its newest checkpoint with its own
    config (``max_steps`` may be given, and the objects it was given by name); ``verbose``: print the
    banner, a progress bar and the summary as ``agentrl train`` does.
    """

    def __init__(
        self,
        config: str | Path | dict[str, Any] | TrainConfig | None = None,
        /,
        *,
        env: Any = None,
        algo: Any = None,
        rewards: Any = None,
        reward_funcs: Any = None,
        dataset: Any = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        agent: Any = None,
        plugins: Any = (),
        resume: str | Path | None = None,
        verbose: bool = True,
        **options: Any,
    ) -> None:
        rewards, dataset = _one_of("rewards", rewards, reward_funcs), _one_of("dataset", dataset, train_dataset)
        self.manager = _plugins(plugins)
        given = GivenObjects(self.manager)
        named = {"env": given.env(env), "algo": given.algorithm(algo), "rewards": given.rewards(rewards)}
        if agent is not None:
            section = {"openai_agent": {"agent": agent_spec(agent)}}
            named.update(rollout="openai_agent", plugins=merged(options.pop("plugins", None), section))
        self.verbose, self._stack = verbose, contextlib.ExitStack()
        try:
            if resume is not None:  # the objects are registered by name; the run's own config says the rest
                cfg, checkpoint = self._resumed(resume, config, options, dataset)
            else:
                cfg, checkpoint = self._config(config, {**options, **named}, dataset, eval_dataset), None
            self._say(headline(cfg))
            self._quiet_loading()
            self.run_trainer = _RunTrainer(cfg, self.manager, resume=checkpoint)
        except BaseException:
            self._stack.close()
            raise
        self._stack.callback(self.run_trainer.run.close)
        for line in start_lines(self.run_trainer, flag="rewards="):
            self._say(line)
        self._steps: tuple[Any, InterruptGuard] | None = None  # the writer and guard of a step-by-step run
        self.history: list[dict[str, float]] = []

    config = property(lambda self: self.run_trainer.config, doc="The run's resolved :class:`agentrl.TrainConfig`.")
    run_dir = property(lambda self: self.run_trainer.run_dir, doc="Where the run is written.")
    model = property(lambda self: self.run_trainer.model, doc="The policy being trained.")
    tokenizer = property(lambda self: self.run_trainer.tokenizer, doc="The policy's tokenizer.")
    step = property(lambda self: self.run_trainer.completed_step, doc="The last completed step (0 before any).")

    def train(self) -> TrainResult:
        """Train the steps left (all of them, with the evaluations before and after), write the run
        dir and return its result; after steps taken one by one, the rest of them, then :meth:`finish`."""
        if self._steps is not None:
            while self.step < self.config.max_steps:
                self.train_step()
            return self.finish()
        progress = TrainProgress(self.config.max_steps) if self.verbose else None
        resumed = self.run_trainer.resumed
        if progress is not None and resumed:
            progress.bar.update(progress.task, completed=resumed["step"])
        with progress.bar if progress is not None else contextlib.nullcontext():
            result = self.run_trainer.train(progress=progress)
        self.history = result.history
        return self._done(result)

    def train_step(self) -> dict[str, float]:
        """One step (collect, score, update, sync; its evaluation and checkpoint when due): its metrics.
        The first call evaluates the policy before training, as :meth:`train` does."""
        trainer = self.run_trainer
        if self.config.async_steps:
            raise ConfigError(
                f"train_step() runs synchronous steps; async_steps={self.config.async_steps}: use train()"
            )
        if self.step >= self.config.max_steps:
            raise ConfigError(f"the run has done its max_steps={self.config.max_steps} steps: call finish()")
        if self._steps is None:
            writer, guard = trainer.open_run_dir(), InterruptGuard(collective=False)
            if trainer.resumed is None:
                trainer.eval_before = trainer.evaluate(0) if self.config.eval_tasks else {}
                trainer.offer_best(0, trainer.eval_before)
            else:
                trainer.completed_step, trainer.eval_before = trainer.resumed["step"], trainer.resumed["eval_before"]
            trainer.batches.start(trainer.completed_step)
            self._steps = (writer, guard)
        metrics = trainer.train_step(self.step + 1, *self._steps, None)
        self.history.append(metrics)
        return metrics

    def evaluate(self) -> dict[str, float]:
        """The current policy on the held-out tasks (``eval/*`` metrics; greedy by default)."""
        return self.run_trainer.evaluate()

    def save(self) -> Path:
        """A resumable checkpoint of the last completed step (``Trainer(resume=run_dir)`` continues)."""
        return self.run_trainer.save_checkpoint(self.step)

    def finish(self) -> TrainResult:
        """End a step-by-step run as :meth:`train` ends one: its last checkpoint, the evaluation after,
        ``eval.json``, the exported model and plots."""
        if self._steps is None:
            raise ConfigError("finish() ends a run trained with train_step(); call train_step() first")
        trainer, (writer, _) = self.run_trainer, self._steps
        if self.step and self.config.checkpoint_every:
            trainer.save_checkpoint(self.step)
        trainer.learner.stop_if_untrained(1, self.run_dir)
        trainer.batches.close()
        eval_after = trainer.evaluate(trainer.completed_step, final=True) if self.config.eval_tasks else {}
        trainer.finish(eval_after, writer, trainer.checkpoints.gather_owned() if self.config.save_model else {})
        return self._done(TrainResult(self.run_dir, trainer.eval_before, eval_after, self.history, trainer.best_record))

    def close(self) -> None:
        """Stop what the run started (an agent rollout's workers, engine replicas, env workers) and
        free the run dir's lock; the run dir stays as written."""
        self._stack.close()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- building ----------------------------------------------------------------------------------
    def _config(self, config: Any, overrides: dict[str, Any], dataset: Any, eval_dataset: Any) -> TrainConfig:
        """The run's config, its run dir locked (rows given in memory written into it)."""
        from agentrl.rundir.directory import run_dir_for
        from agentrl.rundir.lock import RunLock

        overrides = {key: value for key, value in overrides.items() if value is not None}
        if dataset is not None:
            overrides["dataset"] = {"path": "(rows given in memory)"}  # where they go: decided below
        cfg = _base_config(config, overrides)
        run_dir = run_dir_for(cfg)
        self._stack.enter_context(RunLock(run_dir))
        section = dataset_section(dataset, eval_dataset, run_dir / "dataset")
        return dataclasses.replace(
            cfg, output_dir=str(run_dir), dataset=merged(cfg.dataset, section) if section else cfg.dataset
        )

    def _resumed(
        self, run_dir: str | Path, config: Any, options: dict[str, Any], dataset: Any
    ) -> tuple[TrainConfig, Path | None]:
        """``resume``: the run's own config (``max_steps`` may be raised) and its newest checkpoint
        (None: it stopped before its first one and starts over), its run dir locked."""
        from agentrl.rundir.directory import resume_config, start_over_config
        from agentrl.rundir.lock import RunLock

        extra = sorted(key for key, value in options.items() if value is not None and key != "max_steps")
        if config is not None or dataset is not None or extra:
            given = ", ".join(extra + ["config"] * (config is not None) + ["dataset"] * (dataset is not None))
            raise ConfigError(f"resume continues the run with its own config; drop {given} (max_steps may be given)")
        self._stack.enter_context(RunLock(run_dir))
        start_over = start_over_config(run_dir, options.get("max_steps"))
        return (start_over, None) if start_over else resume_config(run_dir, options.get("max_steps"))

    def _say(self, line: str) -> None:
        if self.verbose:
            from rich.console import Console

            Console(soft_wrap=True).print(line, highlight=False)

    @staticmethod
    def _quiet_loading() -> None:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()

    def _done(self, result: TrainResult) -> TrainResult:
        for line in summary_lines(result):
            self._say(line)
        return result


def train(config: str | Path | dict[str, Any] | TrainConfig | None = None, /, **kwargs: Any) -> TrainResult:
    """Train a run from start to end and return its result (held-out metrics before and after, the
    history of step metrics, the run dir): ``agentrl.train(env="math", algo="grpo", max_steps=2)``.
    Takes what :class:`Trainer` takes."""
    with Trainer(config, **kwargs) as trainer:
        return trainer.train()


def _one_of(name: str, value: Any, trl_name_value: Any) -> Any:
    """``value``, or what TRL's name for it gave (``reward_funcs``, ``train_dataset``); not both."""
    if value is not None and trl_name_value is not None:
        trl = {"rewards": "reward_funcs", "dataset": "train_dataset"}[name]
        raise ConfigError(f"{name} and {trl} name the same thing: give one of them")
    return trl_name_value if value is None else value


def _plugins(plugins: Any) -> PluginManager:
    """The installed plugins, plus each of ``plugins``: a module path, ``file.py``, or an object
    (module or instance) with hook implementations."""
    items = [plugins] if isinstance(plugins, str) or not hasattr(plugins, "__iter__") else list(plugins)
    manager = load_plugins(modules=[p for p in items if isinstance(p, str)])
    for plugin in items:
        if not isinstance(plugin, str):
            manager.register_plugin(plugin, name=getattr(plugin, "__name__", type(plugin).__name__))
    return manager


def _base_config(config: Any, overrides: dict[str, Any]) -> TrainConfig:
    """``config`` (a YAML path, a mapping, a TrainConfig or None) with ``overrides`` on top."""
    if isinstance(config, TrainConfig):
        return build_config(None, overrides=merged(config.to_dict(), overrides))
    if isinstance(config, dict):
        return build_config(None, overrides=merged(config, overrides))
    return build_config(config, overrides=overrides)
