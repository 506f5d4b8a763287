"""``agentrl train``: build the run config from the flags (or ``--resume`` a run), lock the run dir,
then train in this process or launch several; ends with held-out accuracy before vs after."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from agentrl.api.progress import TrainProgress
from agentrl.cli.options import ConfigOption, ConfigOptions
from agentrl.cli.support import (
    DisablePluginOption,
    PluginOption,
    console,
    error_console,
    plugin_manager,
    quiet_library_progress,
    run_guarded,
)
from agentrl.errors import ConfigError, TrainingInterrupted

REWARD_HELP = (
    "Reward NAME[:WEIGHT], SCHEME:ARGUMENT[:WEIGHT] (rm:MODEL_DIR, prm:MODEL_DIR, "
    "judge:policy|openai|MODEL_DIR|MODEL_ALIAS), a reward-model folder (used as rm:), path/file.py:func[:WEIGHT] "
    "or module:func[:WEIGHT] (agentrl- or TRL-style); "
    "repeatable; replaces the env's default rewards."
)


def parse_rewards(items: list[str]) -> dict[str, float]:
    """``--reward`` items as name -> weight: ``NAME``, ``NAME:WEIGHT``, ``SCHEME:ARGUMENT[:WEIGHT]``,
    ``path/file.py:func[:WEIGHT]`` or ``module:func[:WEIGHT]``."""
    out: dict[str, float] = {}
    for item in items:
        head, sep, tail = item.rpartition(":")
        # ``NAME:TEXT`` with TEXT not a number may be a reward scheme's ``rm:path``: the rewards are
        # resolved with the plugins loaded, which refuse it naming the weight when it is neither.
        name, weight = (head, tail) if sep and _looks_numeric(tail) else (item, "")
        if not name:
            raise ConfigError(f"--reward {item!r}: expected NAME[:WEIGHT] or path/file.py:func[:WEIGHT]")
        out[name] = float(weight) if weight else 1.0
        if not math.isfinite(out[name]):
            raise ConfigError(f"--reward {item!r}: weight {weight!r} must be a finite number")
    return out


TRAIN_OPTIONS = ConfigOptions(
    ConfigOption("env", default_text="math; dataset with --dataset"),
    "algo",
    "model",
    "engine",
    ConfigOption("rewards", "--reward", list[str], REWARD_HELP, "the env's", parse_rewards),
    "max_steps",
    "num_generations",
    "prompts_per_step",
    ConfigOption(
        "dataset",
        "--dataset",
        str,
        "Tasks from a .jsonl, .json, .csv or .parquet file or a saved datasets.Dataset folder (one row "
        "a task; columns reach the rewards); the env defaults to `dataset` (one turn on the prompt column).",
        "none",
        lambda path: {"path": path},
    ),
    ConfigOption("output_dir", help="Run directory.", default_text="runs/ENV-ALGO-TIME"),
    "seed",
)
"""The TrainConfig fields ``agentrl train`` takes as options (each option generated from its field)."""
RESUME_FLAGS = ("--max-steps", "--plugin", "--disable-plugin", "--resume", "--env", "--reward", "--ray")
"""The flags ``--resume`` takes (the run's own config gives the rest; ``--env`` and ``--reward``
only name the run's own, to run that code from inside the run dir: :mod:`agentrl.rundir.trust`)."""


@TRAIN_OPTIONS.command
def train(
    options: dict[str, Any],
    config: str | None = typer.Option(None, "--config", help="YAML config file."),
    set_: list[str] | None = typer.Option(None, "--set", help="Override key=value (dotted keys for sections)."),
    print_config: bool = typer.Option(False, "--print-config", help="Print the resolved config and exit."),
    plugin: PluginOption = None,
    disable_plugin: DisablePluginOption = None,
    resume: str | None = typer.Option(
        None,
        "--resume",
        help="Continue RUN_DIR from its newest checkpoint, with its own config "
        "(only --max-steps may be given, to train longer; --plugin as the run had them; --env/--reward "
        "only to name the run's own code).",
    ),
    num_processes: int | None = typer.Option(
        None,
        "--num-processes",
        help="Train in N processes (accelerate launch; DDP over GPUs, or gloo on the CPU): "
        "each rolls out prompts_per_step/N whole groups. [default: 1]",
    ),
    accelerate_config: str | None = typer.Option(
        None,
        "--accelerate-config",
        help="An accelerate config YAML (FSDP, DeepSpeed ZeRO; configs/accelerate/) to launch with.",
    ),
    ray: bool = typer.Option(
        False, "--ray", help="Run on a Ray cluster (sets the ray section to {} when the config has none)."
    ),
    eval_dataset: str | None = typer.Option(
        None, "--eval-dataset", help="Held-out tasks (same forms as --dataset) instead of a fraction of its rows."
    ),
) -> None:
    """Train a policy; ends with held-out accuracy before vs after and where the run was saved."""
    from agentrl.model.launch import process_rank

    given: dict[str, Any] = {  # every flag a launched process gets again, in this order
        **options,
        "--config": config,
        "--set": set_,
        "--plugin": plugin,
        "--disable-plugin": disable_plugin,
        "--resume": resume,
        "--ray": ray or None,
        "--eval-dataset": eval_dataset,
    }
    if process_rank() > 0:  # one process speaks for a multi-process run; errors still show everywhere
        console.quiet = True
    with contextlib.ExitStack() as lock:  # the run dir's lock (agentrl.rundir.lock), held until the command ends
        run_guarded(lambda: run_train(given, print_config, num_processes, accelerate_config, lock))


def run_train(
    given: dict[str, Any],
    print_config: bool,
    num_processes: int | None,
    accelerate_config: str | None,
    lock: contextlib.ExitStack,
) -> None:
    """The body of ``agentrl train`` (``given``: flag -> value, None where not given)."""
    from agentrl.model.launch import check_world, inside_launch, resume_flags

    check_world()  # a launched process that is not one of as many as its launcher meant: refused
    if num_processes is not None and num_processes < 1:
        raise ConfigError(f"--num-processes must be >= 1, got {num_processes}")
    lock.enter_context(resume_flags(given, num_processes, accelerate_config))  # what "continue with" names
    cfg, checkpoint = _config_from_flags(given, print_config, lock)
    manager = plugin_manager(given["--disable-plugin"], given["--plugin"])
    if cfg.ray is not None and not inside_launch() and not print_config:  # process 0 of a run on Ray
        from agentrl.cli.launching import on_ray

        with on_ray(cfg, manager, num_processes, accelerate_config, given):
            _fit(cfg, manager, checkpoint)
        return
    if (num_processes or accelerate_config) and not inside_launch() and not print_config:
        from agentrl.cli.launching import check_launch, launch

        check_launch(cfg, manager.registry, num_processes or 1, accelerate_config)
        raise typer.Exit(code=launch(cfg, num_processes or 1, accelerate_config, given))
    if print_config:
        _print_config(cfg, manager)
        return
    _fit(cfg, manager, checkpoint)


def _config_from_flags(given: dict[str, Any], print_config: bool, lock: contextlib.ExitStack) -> tuple[Any, Any]:
    """(config, checkpoint to resume or None): the resumed run's, or one built from the flags (its
    run dir locked unless only printed)."""
    from agentrl.config.train import build_config, refuse_flag_conflicts

    resume = given["--resume"]
    if resume is not None:
        extra = [flag for flag, value in given.items() if value is not None and flag not in RESUME_FLAGS]
        if extra:  # 0 is a value too
            raise ConfigError(
                f"--resume continues the run with its own config; drop {', '.join(extra)} "
                "(only --max-steps may be given; --env/--reward only to name the run's own code)"
            )
        try:
            writer = not print_config and Path(resume).is_dir() and _lock_run_dir(lock, Path(resume))
            cfg, checkpoint = _resume(resume, given, writer)
            if given["--ray"] and cfg.ray is None:
                raise ConfigError(f"--resume {resume!r} --ray: the run was not started on Ray; resume it without --ray")
            return cfg, checkpoint
        except OSError as exc:  # a full disk (the lock, the stopped attempt set aside): one line
            from agentrl.rundir.directory import disk_problem

            raise ConfigError(f"--resume {resume!r}: {disk_problem(Path(resume), exc)}") from None
    flags = TRAIN_OPTIONS.values(given)
    refuse_flag_conflicts(flags, given["--set"])
    overrides = {key: value for key, (_, value) in flags.items()}
    if given["--eval-dataset"] is not None:
        overrides["dataset"] = {**(overrides["dataset"] or {}), "eval_path": given["--eval-dataset"]}
    cfg = build_config(given["--config"], overrides=overrides, sets=given["--set"])
    if given["--ray"] and cfg.ray is None:
        cfg = dataclasses.replace(cfg, ray={})
    return (cfg if print_config else _new_run_dir(lock, cfg)), None


def _print_config(cfg: Any, manager: Any) -> None:
    """``--print-config``: the resolved config as YAML (scheme paths absolute, as a run stores them),
    each top-level key under a comment with the first sentence of its docstring."""
    import yaml

    text = yaml.safe_dump(_checked_config(cfg, manager), sort_keys=False)
    console.print(described(text), highlight=False, markup=False)


def described(text: str) -> str:
    """YAML ``text`` of a TrainConfig with ``# description`` above each top-level key (the first
    sentence of the docstring under its field, as in docs/reference/config.md)."""
    from agentrl.config.reference import config_reference

    docs = {key.name: key.doc for key in config_reference()}
    lines = []
    for line in text.splitlines():
        key = line.split(":", 1)[0]
        if line[:1].strip() and docs.get(key):
            lines.append(f"# {_first_sentence(docs[key])}")
        lines.append(line)
    return "\n".join(lines) + "\n"


def _first_sentence(doc: str) -> str:
    """The first sentence of ``doc`` on one line, without reST markup."""
    import re

    flat = " ".join(doc.replace("``", "`").split())
    end = re.search(r"(?<!e\.g)(?<!i\.e)\.\s", flat)
    return flat if end is None else flat[: end.start() + 1]


def _checked_config(cfg: Any, manager: Any) -> dict[str, Any]:
    """The resolved config as plain data, its names checked against what is installed (env,
    algorithm, engine, plugin sections, rewards, tool parsers: a ``tool_parser`` in ``env_args`` or in
    a plugin section names a registered parser; a section's ``auto`` is chosen from the model at run
    time) before any model or the trainer's modules load, so a misspelt name fails in seconds."""
    from agentrl.config.startup import resolved_dict
    from agentrl.rewards.schemes import with_absolute_paths
    from agentrl.rewards.specs import find_reward

    resolved = resolved_dict(with_absolute_paths(cfg, manager.registry), manager)  # as config.yaml will hold it
    for name in resolved["rewards"] or {}:
        find_reward(name, manager.registry)
    parsers = [resolved["env_args"].get("tool_parser")] + [
        section.get("tool_parser") for section in resolved["plugins"].values() if section.get("tool_parser") != "auto"
    ]
    for name in parsers:
        if isinstance(name, str):
            manager.registry.get("tool_parser", name)
    return resolved


def _fit(cfg: Any, manager: Any, checkpoint: Path | None) -> None:
    """Train in this process, showing progress; a signal stops it with the shell's exit status."""
    _checked_config(cfg, manager)  # a bad name fails here, before the banner and the trainer's imports
    from agentrl.api.report import headline, start_lines, summary_lines
    from agentrl.training.trainer import Trainer

    console.print(headline(cfg), highlight=False)
    quiet_library_progress()
    trainer = Trainer(cfg, manager, resume=checkpoint)
    for line in start_lines(trainer):
        console.print(line, highlight=False)
    progress = TrainProgress(cfg.max_steps, console)
    if trainer.resumed:
        progress.bar.update(progress.task, completed=trainer.resumed["step"])
    try:
        with progress.bar:
            result = trainer.train(progress=progress)
    except TrainingInterrupted as exc:
        from agentrl.model.launch import process_rank

        with contextlib.suppress(OSError):  # SIGHUP: the terminal may be gone
            if process_rank() == 0:  # one line for the run
                error_console.print(f"[bold yellow]interrupted:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(code=128 + exc.signum) from None  # the shell's code for death by that signal
    finally:
        trainer.run.close()  # an agent rollout's worker processes, engine replicas, env workers
    for line in summary_lines(result):
        console.print(line, highlight=False)


def _new_run_dir(lock: contextlib.ExitStack, cfg: Any) -> Any:
    """``cfg`` with its run dir resolved (``runs/<env>-<algo>-<time>`` when not given: the lock, the
    trainer and every process then agree on it), checked writable and locked (:func:`_lock_run_dir`)."""
    from agentrl.rundir.directory import run_dir_for
    from agentrl.rundir.paths import check_output_dir

    if cfg.output_dir is None:
        cfg = dataclasses.replace(cfg, output_dir=str(run_dir_for(cfg)))
    check_output_dir(cfg.output_dir)  # a file, or not writable: said before the lock tries to write there
    _lock_run_dir(lock, Path(cfg.output_dir))
    return cfg


def _lock_run_dir(lock: contextlib.ExitStack, run_dir: Path) -> bool:
    """Hold ``run_dir``'s lock in ``lock`` when this process writes the run (the top process, or
    process 0 of an ``accelerate launch`` started by hand; processes agentrl's launcher started
    hold that launcher's lock with it, and end with it); whether it does."""
    from agentrl.model.launch import LAUNCHED, join_launched_run, process_rank
    from agentrl.rundir.lock import RunLock

    if os.environ.get(LAUNCHED):
        join_launched_run(run_dir)
        return False
    if process_rank() > 0:
        return False
    held = lock.enter_context(RunLock(run_dir))
    if held.note:
        console.print(held.note, highlight=False)
    return True


def _resume(run_dir: str, given: dict[str, Any], writer: bool) -> tuple[Any, Path | None]:
    """``--resume``: the run's config and newest complete checkpoint; or, for a run that stopped
    before its first checkpoint, its config and None: it starts over from step 0, what its stopped
    attempt wrote moved aside first by the ``writer`` (the process holding the lock). Code its
    config names inside the run dir runs only when ``--env`` / ``--reward`` name it (:func:`_resumed_code`)."""
    from agentrl.rundir.directory import resume_config, set_aside_unfinished, start_over_config

    cfg = start_over_config(run_dir, given["--max-steps"])
    checkpoint = None
    if cfg is None:
        cfg, checkpoint = resume_config(run_dir, given["--max-steps"])
    _resumed_code(cfg, Path(run_dir), given["--env"], given["--reward"] or [])
    if checkpoint is not None:
        console.print(f"resuming {run_dir} from {checkpoint.name}", highlight=False)
        return cfg, checkpoint
    if writer:
        moved = set_aside_unfinished(Path(run_dir))
        kept = f"; what the stopped attempt wrote is in {moved}" if moved is not None else ""
        console.print(
            f"{run_dir} has no complete checkpoint (it stopped before its first one): starting it over "
            f"from step 0 with its config{kept}",
            highlight=False,
        )
    return cfg, None


def _resumed_code(cfg: Any, run_dir: Path, env: str | None, rewards: list[str]) -> None:
    """Code the resumed run's config names runs only when it is the user's, or ``--env`` /
    ``--reward`` name it (:func:`agentrl.rundir.trust.check_resumed_code`)."""
    from agentrl.rundir.trust import check_resumed_code

    check_resumed_code(cfg, run_dir, env, parse_rewards(rewards), rewards)


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
