"""The ``agentrl`` command: thin wrappers that parse, call the library, and print."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from agentrl.errors import AgentRLError, TrainingInterrupted

app = typer.Typer(rich_markup_mode=None, help="Train LLM agents with reinforcement learning.", no_args_is_help=True,
                  pretty_exceptions_enable=False, add_completion=False)
console = Console(stderr=False, soft_wrap=True)  # a log file gets whole lines, never re-wrapped
error_console = Console(stderr=True, soft_wrap=True)
_state = {"debug": False}


@app.callback()
def main(debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors.")) -> None:
    """agentrl: plugin-based RL for LLM agents."""
    _state["debug"] = debug
    filter_library_warnings()


LIBRARY_WARNINGS = (
    (FutureWarning, r"`past_key_values` is deprecated"),
)
"""(category, message start) of library warnings no agentrl user can act on. transformers >= 5.24
renamed a causal LM's ``past_key_values`` argument ``cache`` and warns at every decode of the hf
engine, which passes the old name (accepted until 5.40)."""


def filter_library_warnings() -> None:
    """Hide the warnings in ``LIBRARY_WARNINGS`` (and only those) for this process."""
    import warnings

    for category, message in LIBRARY_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)


def _run(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except AgentRLError as exc:
        if _state["debug"]:
            raise
        error_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(code=2) from None
    except SystemExit as exc:  # sys.exit() in plugin code outside a guarded call (agentrl never calls it)
        if _state["debug"]:
            raise
        from agentrl.faults import raised_at

        error_console.print(f"[bold red]error:[/] {escape(repr(exc))} raised at {escape(raised_at(exc))}: plugin "
                            "code may not end the run", highlight=False)
        raise typer.Exit(code=2) from None


def _manager(disabled: list[str], modules: list[str]) -> Any:
    from agentrl.plugins import load_plugins

    return load_plugins(disabled=disabled, modules=modules)


class _Progress:
    """Training progress: a live rich bar with the current phase (eval / rollout / update) and the
    last step's reward on a terminal; one plain line per step when output goes to a file or pipe."""

    def __init__(self, total: int) -> None:
        self.total, self.live = total, console.is_terminal
        self.bar = Progress(TextColumn("[bold]{task.fields[phase]:<7}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                            console=console, disable=not self.live)
        self.task = self.bar.add_task("train", total=total, info="", phase="start")

    def phase(self, label: str) -> None:
        """Show what the run is doing now."""
        self.bar.update(self.task, phase=label)

    def __call__(self, step: int, metrics: dict[str, float]) -> None:
        info = (f"reward {metrics.get('reward/total_mean', float('nan')):.3f} "
                f"len {metrics.get('rollout/sampled_tokens_mean', 0):.0f} "
                f"{metrics.get('perf/step_seconds', 0):.1f}s/step")
        self.bar.update(self.task, completed=step, info=info)
        if not self.live:
            console.print(f"step {step}/{self.total}: {info}", highlight=False)

    def report(self, label: str, metrics: dict[str, float]) -> None:
        """One line per evaluation: accuracy with its standard error and the task count."""
        if metrics:
            sampled = metrics.get("eval/accuracy_sampled")
            extra = f" (sampled {sampled:.3f})" if sampled is not None else ""
            n = int(metrics["eval/num_tasks"])
            self.bar.console.print(f"{label}: accuracy {metrics['eval/accuracy']:.3f} "
                                   f"+/- {standard_error(metrics['eval/accuracy'], n):.3f}{extra} on {n} held-out "
                                   f"tasks, mean env return {metrics['eval/env_return_mean']:.3f}", highlight=False)


def standard_error(accuracy: float, n: int) -> float:
    """Standard error of an accuracy measured on ``n`` tasks (binomial; 0.5 where p is 0 or 1,
    so a perfect score on 8 tasks still reads as uncertain)."""
    p = accuracy if 0 < accuracy < 1 else 0.5
    return math.sqrt(p * (1 - p) / max(n, 1))


def noise_note(before: float, after: float, n: int) -> str:
    """Empty when the before/after change exceeds twice its standard error, else a warning."""
    se = math.sqrt(standard_error(before, n) ** 2 + standard_error(after, n) ** 2)
    if abs(after - before) > 2 * se:
        return ""
    return (f" (a change under 2 standard errors, {2 * se:.3f} on {n} tasks, is noise: raise eval_tasks "
            "or compare several seeds)")


def _default(key: str) -> str:
    """`` [default: X]`` for a TrainConfig key, shown in ``train --help``."""
    from agentrl.config import TrainConfig

    return f" [default: {getattr(TrainConfig, key)}]"


@app.command()
def train(
    env: Optional[str] = typer.Option(None, "--env", help="Environment name or path/file.py:Class." + _default("env")),
    algo: Optional[str] = typer.Option(None, "--algo", help="Algorithm name." + _default("algo")),
    model: Optional[str] = typer.Option(None, "--model", help="HF folder, run dir, hub id or alias." + _default("model")),
    engine: Optional[str] = typer.Option(None, "--engine", help="Generation engine name." + _default("engine")),
    reward: Optional[list[str]] = typer.Option(
        None, "--reward", help="Reward NAME[:WEIGHT], path/file.py:func[:WEIGHT] or module:func[:WEIGHT] "
        "(agentrl- or TRL-style); repeatable; replaces the env's default rewards. [default: the env's]"),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="Optimizer steps." + _default("max_steps")),
    num_generations: Optional[int] = typer.Option(None, "--num-generations",
                                                  help="Episodes per task." + _default("num_generations")),
    prompts_per_step: Optional[int] = typer.Option(None, "--prompts-per-step",
                                                   help="Tasks per step." + _default("prompts_per_step")),
    output_dir: Optional[str] = typer.Option(None, "--output-dir", help="Run directory. [default: runs/ENV-ALGO-TIME]"),
    seed: Optional[int] = typer.Option(None, "--seed", help="Random seed." + _default("seed")),
    config: Optional[str] = typer.Option(None, "--config", help="YAML config file."),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="Override key=value (dotted keys for sections)."),
    print_config: bool = typer.Option(False, "--print-config", help="Print the resolved config and exit."),
    plugin: Optional[list[str]] = typer.Option(None, "--plugin", help="Extra plugin to load: module.path or path/file.py."),
    disable_plugin: Optional[list[str]] = typer.Option(None, "--disable-plugin", help="Plugin not to load."),
    resume: Optional[str] = typer.Option(
        None, "--resume", help="Continue RUN_DIR from its newest checkpoint, with its own config "
        "(only --max-steps may be given, to train longer; --plugin as the run had them)."),
    num_processes: Optional[int] = typer.Option(
        None, "--num-processes", help="Train in N processes (accelerate launch; DDP over GPUs, or gloo on the CPU): "
        "each rolls out prompts_per_step/N whole groups. [default: 1]"),
    accelerate_config: Optional[str] = typer.Option(
        None, "--accelerate-config", help="An accelerate config YAML (FSDP, DeepSpeed ZeRO; configs/accelerate/) "
        "to launch with."),
) -> None:
    """Train a policy; ends with held-out accuracy before vs after and where the run was saved."""
    from agentrl.config import build_config, refuse_flag_conflicts
    from agentrl.launch import inside_launch, process_rank

    if process_rank() > 0:  # one process speaks for a multi-process run; errors still show everywhere
        console.quiet = True
    lock = contextlib.ExitStack()  # the run dir's lock (agentrl.runlock), held until the command ends

    def run() -> None:
        from agentrl.errors import ConfigError

        checkpoint = None
        if num_processes is not None and num_processes < 1:
            raise ConfigError(f"--num-processes must be >= 1, got {num_processes}")
        if resume is not None:
            given = {"--env": env, "--algo": algo, "--model": model, "--engine": engine, "--reward": reward,
                     "--num-generations": num_generations, "--prompts-per-step": prompts_per_step,
                     "--output-dir": output_dir, "--seed": seed, "--config": config, "--set": set_}
            extra = [flag for flag, value in given.items() if value is not None]  # 0 is a value too
            if extra:
                raise ConfigError(f"--resume continues the run with its own config; drop {', '.join(extra)} "
                                  "(only --max-steps may be given)")
            writer = not print_config and Path(resume).is_dir() and _lock_run_dir(lock, Path(resume))
            cfg, checkpoint = _resume(resume, max_steps, writer)
        else:
            rewards = _parse_rewards(reward) if reward else None
            flags = {"env": ("--env", env), "algo": ("--algo", algo), "model": ("--model", model),
                     "engine": ("--engine", engine), "rewards": ("--reward", rewards),
                     "max_steps": ("--max-steps", max_steps), "num_generations": ("--num-generations", num_generations),
                     "prompts_per_step": ("--prompts-per-step", prompts_per_step),
                     "output_dir": ("--output-dir", output_dir), "seed": ("--seed", seed)}
            refuse_flag_conflicts(flags, set_)
            cfg = build_config(config, overrides={key: value for key, (_, value) in flags.items()}, sets=set_)
            if not print_config:
                cfg = _new_run_dir(lock, cfg)
        manager = _manager(disable_plugin or [], plugin or [])
        if (num_processes or accelerate_config) and not inside_launch() and not print_config:
            given: dict[str, Any] = {
                "--env": env, "--algo": algo, "--model": model, "--engine": engine, "--reward": reward,
                "--max-steps": max_steps, "--num-generations": num_generations,
                "--prompts-per-step": prompts_per_step, "--output-dir": output_dir, "--seed": seed,
                "--config": config, "--set": set_, "--plugin": plugin, "--disable-plugin": disable_plugin,
                "--resume": resume}
            raise typer.Exit(code=_launch(cfg, num_processes or 1, accelerate_config, given))
        if print_config:
            import yaml

            from agentrl.config import resolved_dict
            from agentrl.rewards import find_reward

            resolved = resolved_dict(cfg, manager)
            for name in resolved["rewards"] or {}:  # refused here as train refuses them
                find_reward(name, manager.registry)
            console.print(yaml.safe_dump(resolved, sort_keys=False), highlight=False)
            return
        from agentrl import sharding
        from agentrl.trainer import Trainer

        console.print(f"[bold]agentrl[/] {cfg.algo} on {cfg.env} with {cfg.model}: {cfg.max_steps} steps x "
                      f"{cfg.prompts_per_step} tasks x {cfg.num_generations} episodes", highlight=False)
        _quiet_library_progress()
        trainer = Trainer(cfg, manager, resume=checkpoint)
        console.print(_rewards_line(cfg, trainer), highlight=False)
        console.print(f"precision: {trainer.run.precision.name} ({trainer.run.precision.reason})", highlight=False)
        if trainer.run.num_processes > 1:
            console.print(sharding.layout(trainer.accelerator), highlight=False)
        progress = _Progress(cfg.max_steps)
        if trainer.resumed:
            progress.bar.update(progress.task, completed=trainer.resumed["step"])
        try:
            with progress.bar:
                result = trainer.train(progress=progress)
        except TrainingInterrupted as exc:
            with contextlib.suppress(OSError):  # SIGHUP: the terminal may be gone
                error_console.print(f"[bold yellow]interrupted:[/] {escape(str(exc))}", highlight=False)
            raise typer.Exit(code=128 + exc.signum) from None  # the shell's code for death by that signal
        before = result.eval_before.get("eval/accuracy")
        after = result.eval_after.get("eval/accuracy")
        if before is not None and after is not None:
            n = int(result.eval_after["eval/num_tasks"])
            console.print(f"[bold]held-out accuracy: {before:.3f} -> {after:.3f}[/]{noise_note(before, after, n)}",
                          highlight=False)
        best = result.best
        if best is not None and best["saved_as_model"]:
            accuracy = best["metrics"].get("eval/accuracy", math.nan)
            console.print(f"model/ holds the best evaluated policy: step {best['step']}, held-out mean reward "
                          f"{best['score']:.3f}, accuracy {accuracy:.3f} (the last step's policy: last/)",
                          highlight=False)
        console.print(f"run saved to {result.run_dir}", highlight=False)

    with lock:
        _run(run)


def _new_run_dir(lock: contextlib.ExitStack, cfg: Any) -> Any:
    """``cfg`` with its run dir resolved (``runs/<env>-<algo>-<time>`` when not given: the lock, the
    trainer and every process then agree on it), checked writable and locked (:func:`_lock_run_dir`)."""
    from agentrl.paths import check_output_dir
    from agentrl.rundir import run_dir_for

    if cfg.output_dir is None:
        cfg = dataclasses.replace(cfg, output_dir=str(run_dir_for(cfg)))
    check_output_dir(cfg.output_dir)  # a file, or not writable: said before the lock tries to write there
    _lock_run_dir(lock, Path(cfg.output_dir))
    return cfg


def _lock_run_dir(lock: contextlib.ExitStack, run_dir: Path) -> bool:
    """Hold ``run_dir``'s lock in ``lock`` when this process writes the run (the top process, or
    process 0 of an ``accelerate launch`` started by hand; processes agentrl's launcher started
    leave it to that launcher); whether it does."""
    from agentrl.launch import LAUNCHED, process_rank
    from agentrl.runlock import RunLock

    if os.environ.get(LAUNCHED) or process_rank() > 0:
        return False
    held = lock.enter_context(RunLock(run_dir))
    if held.note:
        console.print(held.note, highlight=False)
    return True


def _resume(run_dir: str, max_steps: int | None, writer: bool) -> tuple[Any, Path | None]:
    """``--resume``: the run's config and newest complete checkpoint; or, for a run that stopped
    before its first checkpoint, its config and None: it starts over from step 0, what its stopped
    attempt wrote moved aside first by the ``writer`` (the process holding the lock)."""
    from agentrl.rundir import resume_config, set_aside_unfinished, start_over_config

    cfg = start_over_config(run_dir, max_steps)
    if cfg is None:
        cfg, checkpoint = resume_config(run_dir, max_steps)
        console.print(f"resuming {run_dir} from {checkpoint.name}", highlight=False)
        return cfg, checkpoint
    if writer:
        moved = set_aside_unfinished(Path(run_dir))
        kept = f"; what the stopped attempt wrote is in {moved}" if moved is not None else ""
        console.print(f"{run_dir} has no complete checkpoint (it stopped before its first one): starting it over "
                      f"from step 0 with its config{kept}", highlight=False)
    return cfg, None


def _launch(cfg: Any, num_processes: int, accelerate_config: str | None, given: dict[str, Any]) -> int:
    """Check the split and prepare the model here, then run this command in ``num_processes``
    processes under ``accelerate launch``; their exit status."""
    import torch

    from agentrl.launch import launch_command, run_launched
    from agentrl.models import resolve_model
    from agentrl.build import check_process_split

    check_process_split(cfg, num_processes)
    if not given["--resume"]:  # every process must agree on the run dir
        from agentrl.rundir import run_dir_for

        given["--output-dir"] = str(run_dir_for(cfg))
    resolve_model(cfg.model)  # an alias is converted once, here, not by every process at once
    args: list[str] = []
    for flag, value in given.items():
        for item in value if isinstance(value, list) else [value]:
            if item is not None:
                args += [flag, str(item)]
    command = launch_command(num_processes, accelerate_config, args, cpu=not torch.cuda.is_available())
    console.print(f"launching {num_processes} processes: {' '.join(command[1:4])} ...", highlight=False)
    return run_launched(command)


def _rewards_line(cfg: Any, trainer: Any) -> str:
    """What the run is rewarded for, and where that choice came from."""
    parts = [f"env return x{cfg.env_reward_weight:g}"]
    parts += [f"{name} x{weight:g}" for name, (_, weight) in trainer.run.reward_fns.items()]
    defaults = trainer.envs[0].default_rewards
    if cfg.rewards is None:
        source = "the env's defaults"
    elif defaults and any(name not in cfg.rewards for name in defaults):
        listed = " ".join(f"--reward {name}:{weight:g}" for name, weight in defaults.items())
        source = f"--reward replaces the env's defaults; add {listed} to keep them"
    else:
        source = "--reward"
    return f"rewards: {' + '.join(parts)} ({source})"


def _quiet_library_progress() -> None:
    """Silence transformers' own loading bars: they would break up agentrl's display."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _parse_rewards(items: list[str]) -> dict[str, float]:
    """``NAME``, ``NAME:WEIGHT``, ``path/file.py:func[:WEIGHT]`` or ``module:func[:WEIGHT]``."""
    from agentrl.errors import ConfigError

    out: dict[str, float] = {}
    for item in items:
        head, sep, tail = item.rpartition(":")
        name, weight = (head, tail) if sep and _looks_numeric(tail) else (item, "")
        if sep and not weight and head.isidentifier() and not _importable(head):
            raise ConfigError(f"--reward {item!r}: weight {tail!r} is not a number, and {head!r} is not an "
                              "importable module (use NAME[:WEIGHT], path/file.py:func[:WEIGHT] or module:func[:WEIGHT])")
        if not name:
            raise ConfigError(f"--reward {item!r}: expected NAME[:WEIGHT] or path/file.py:func[:WEIGHT]")
        out[name] = float(weight) if weight else 1.0
        if not math.isfinite(out[name]):
            raise ConfigError(f"--reward {item!r}: weight {weight!r} must be a finite number")
    return out


def _importable(module: str) -> bool:
    import importlib.util

    if "" not in sys.path:
        sys.path.insert(0, "")
    return importlib.util.find_spec(module) is not None


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# What ``agentrl eval RUN_DIR`` takes from the run's config.yaml (below --set and the flags): how it
# evaluated (env, rewards, lengths, rollout, engine and its dtype, precision, seed, temperature).
RUN_EVAL_KEYS = ("env", "env_args", "rewards", "env_reward_weight", "reward_completion_format", "rollout",
                 "max_new_tokens", "max_sampled_tokens", "max_total_tokens", "engine", "engine_args", "precision",
                 "seed", "eval_temperature", "call_timeout_s", "on_call_error")
ENV_KEYS = ("env", "env_args", "rewards")  # not taken from the run when --env names another env


@app.command("eval")
def eval_(
    run_dir: Optional[str] = typer.Argument(None, metavar="RUN_DIR", show_default=False,
                                            help="Run dir (or HF folder, hub id, alias) to evaluate; as --model."),
    model: Optional[str] = typer.Option(None, "--model", help="HF folder, run dir, hub id or alias. "
                                        "[default: smollm2-135m]"),
    env: Optional[str] = typer.Option(None, "--env", help="Environment name or path/file.py:Class. "
                                      "[default: the run's env for a run dir, else math]"),
    num_tasks: int = typer.Option(64, "--num-tasks", help="Held-out tasks to evaluate."),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens",
                                                 help="Tokens per turn. [default: the run's, else 64]"),
    temperature: Optional[float] = typer.Option(None, "--temperature", help="0 = greedy. "
                                                "[default: the run's eval_temperature, else 0]"),
    engine: Optional[str] = typer.Option(None, "--engine", help="Generation engine. [default: the run's, else hf]"),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="Override key=value (e.g. env_args.difficulty=..., "
                                             "engine_args.dtype=float32)."),
    as_json: bool = typer.Option(False, "--json", help="Print metrics as JSON."),
    plugin: Optional[list[str]] = typer.Option(None, "--plugin", help="Extra plugin to load: module.path or path/file.py."),
    disable_plugin: Optional[list[str]] = typer.Option(None, "--disable-plugin", help="Plugin not to load."),
) -> None:
    """Accuracy of a model or run dir on an env's held-out split. A run dir (agentrl eval RUN_DIR)
    is evaluated as the run evaluated it: its env, env_args and rewards (unless --env is given),
    engine and engine_args (dtype included), precision, lengths, seed and eval temperature, from its
    config.yaml; --set and the flags override them."""

    def run() -> None:
        from agentrl.config import build_config, refuse_flag_conflicts
        from agentrl.env import CallGuard
        from agentrl.evaluate import evaluate
        from agentrl.models import DEFAULT_MODEL, load_model, load_tokenizer
        from agentrl.rewards import resolve_rewards
        from agentrl.errors import ConfigError
        from agentrl.build import make_env

        if run_dir is not None and model is not None and run_dir != model:
            raise ConfigError(f"eval: give the model once, as RUN_DIR or --model, not both ({run_dir!r}, {model!r})")
        target = run_dir or model or DEFAULT_MODEL
        if num_tasks < 1:
            raise ConfigError(f"--num-tasks must be >= 1, got {num_tasks}")
        if temperature is not None and not (math.isfinite(temperature) and temperature >= 0):
            raise ConfigError(f"--temperature must be a finite number >= 0 (0: greedy), got {temperature}")
        run_config = _run_config(target)
        base = {k: run_config[k] for k in RUN_EVAL_KEYS if k in run_config and (env is None or k not in ENV_KEYS)}
        given = {"model": target, "env": env, "engine": engine, "max_new_tokens": max_new_tokens,
                 "eval_tasks": num_tasks}
        refuse_flag_conflicts({"model": ("RUN_DIR/--model", run_dir or model), "env": ("--env", env),
                               "engine": ("--engine", engine), "max_new_tokens": ("--max-new-tokens", max_new_tokens)},
                              set_)
        cfg = build_config(overrides={k: v for k, v in given.items() if v is not None},
                           sets=[*_as_sets(base), *(set_ or [])])  # the run's values, then --set, then flags
        heat = cfg.eval_temperature if temperature is None else temperature
        manager = _manager(disable_plugin or [], plugin or [])
        envs = [make_env(manager, cfg) for _ in range(min(max(num_tasks, 1), 64))]
        tasks = list(envs[0].eval_tasks())[:num_tasks]
        source = "the run's env" if run_config and env is None else "--env" if env else "the default env"
        args = f" {cfg.env_args}" if cfg.env_args else ""
        engine_args = f" {cfg.engine_args}" if cfg.engine_args else ""
        typer.echo(f"evaluating {target} on {cfg.env}{args} ({source}): {len(tasks)} held-out tasks, "
                   f"temperature {heat:g}, engine {cfg.engine}{engine_args}, precision {cfg.precision}", err=as_json)
        _quiet_library_progress()
        tokenizer, policy = load_tokenizer(cfg.model), load_model(cfg.model)
        eng = manager.registry.get("engine", cfg.engine).factory(model=policy, tokenizer=tokenizer, config=cfg)
        rollout = manager.registry.get("rollout", cfg.rollout).factory(engine=eng, tokenizer=tokenizer, config=cfg)
        metrics, _ = evaluate(rollout, envs, tasks, max_new_tokens=cfg.max_new_tokens, temperature=heat,
                              seed=cfg.seed, reward_fns=resolve_rewards(cfg, manager.registry, envs[0]),
                              batch_size=len(envs), guard=CallGuard.from_config(cfg), env_weight=cfg.env_reward_weight)
        if as_json:
            print(json.dumps({"model": target, "env": cfg.env, "env_args": cfg.env_args, "engine": cfg.engine,
                              "engine_args": cfg.engine_args, "precision": cfg.precision, **metrics}))
        else:
            for key, value in metrics.items():
                console.print(f"{key}: {value:.4f}", highlight=False)

    _run(run)


def _as_sets(values: dict[str, Any]) -> list[str]:
    """``values`` as ``--set key=value`` items (JSON is YAML), so that later --set items refine
    them key by key (``--set engine_args.dtype=float32`` keeps the run's other engine_args)."""
    return [f"{key}={json.dumps(value)}" for key, value in values.items()]


def _run_config(model: str) -> dict[str, Any]:
    """The saved config of a run dir (``model`` points at one), else {}."""
    from pathlib import Path

    from agentrl.config import load_yaml
    from agentrl.errors import ConfigError

    path = Path(model).expanduser() / "config.yaml"
    if not model or not path.is_file():
        return {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"run config {str(path)!r} could not be read as UTF-8 text: {exc}") from None
    data = load_yaml(text, f"run config {str(path)!r}")
    return data if isinstance(data, dict) else {}


@app.command()
def plugins(
    as_json: bool = typer.Option(False, "--json", help="Print as JSON."),
    plugin: Optional[list[str]] = typer.Option(None, "--plugin", help="Extra plugin to load: module.path or path/file.py."),
    disable_plugin: Optional[list[str]] = typer.Option(None, "--disable-plugin", help="Plugin not to load."),
) -> None:
    """Installed plugins (and any --plugin) and what each registers."""

    def run() -> None:
        manager = _manager(disable_plugin or [], plugin or [])
        rows = [{"name": p.name, "module": p.module, "distribution": p.distribution, "version": p.version,
                 "registers": p.registered} for p in manager.plugins.values()]
        if as_json:
            print(json.dumps(rows, indent=2))
            return
        table = Table("plugin", "package", "registers")
        for row in rows:
            regs = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in row["registers"].items())
            table.add_row(row["name"], f"{row['distribution'] or '-'} {row['version'] or ''}", regs or "(hooks only)")
        console.print(table)

    _run(run)


@app.command()
def plot(run_dir: str = typer.Argument(..., help="Run directory with metrics.jsonl.")) -> None:
    """Write PNG plots of a run (training.png in the run dir)."""

    def run() -> None:
        import warnings

        from agentrl.plots import plot_run

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = plot_run(run_dir)
        for warning in caught:
            error_console.print(f"[bold yellow]warning:[/] {escape(str(warning.message))}", highlight=False)
        console.print(f"wrote {out}", highlight=False)

    _run(run)


def _add_subcommands() -> None:
    from agentrl.scaffold import app as new_app

    app.add_typer(new_app, name="new")


_add_subcommands()

if __name__ == "__main__":
    sys.exit(app())
