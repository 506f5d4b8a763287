"""The ``agentrl`` command: thin wrappers that parse, call the library, and print."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from typing import Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from agentrl.errors import AgentRLError

app = typer.Typer(help="Train LLM agents with reinforcement learning.", no_args_is_help=True,
                  pretty_exceptions_enable=False, add_completion=False)
console = Console(stderr=False)
_state = {"debug": False}


@app.callback()
def main(debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors.")) -> None:
    """agentrl: plugin-based RL for LLM agents."""
    _state["debug"] = debug


def _run(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except AgentRLError as exc:
        if _state["debug"]:
            raise
        console.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(code=2) from None


def _manager(disabled: list[str], modules: list[str]) -> Any:
    from agentrl.plugins import load_plugins

    return load_plugins(disabled=disabled, modules=modules)


class _Progress:
    """rich progress bar with live reward, plus one line per evaluation."""

    def __init__(self, total: int) -> None:
        self.bar = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                            console=console)
        self.task = self.bar.add_task("train", total=total, info="")

    def __call__(self, step: int, metrics: dict[str, float]) -> None:
        info = (f"reward {metrics.get('reward/total_mean', float('nan')):.3f} "
                f"len {metrics.get('rollout/sampled_tokens_mean', 0):.0f} "
                f"{metrics.get('perf/step_seconds', 0):.1f}s/step")
        self.bar.update(self.task, completed=step, info=info)

    def report(self, label: str, metrics: dict[str, float]) -> None:
        if metrics:
            sampled = metrics.get("eval/accuracy_sampled")
            extra = f" (sampled {sampled:.3f})" if sampled is not None else ""
            self.bar.console.print(f"{label}: accuracy {metrics['eval/accuracy']:.3f}{extra} on "
                                   f"{int(metrics['eval/num_tasks'])} held-out tasks, mean env return "
                                   f"{metrics['eval/env_return_mean']:.3f}")


@app.command()
def train(
    env: Optional[str] = typer.Option(None, "--env", help="Environment name or path/file.py:Class."),
    algo: Optional[str] = typer.Option(None, "--algo", help="Algorithm name."),
    model: Optional[str] = typer.Option(None, "--model", help="HF folder, run dir, hub id or alias."),
    engine: Optional[str] = typer.Option(None, "--engine", help="Generation engine name."),
    reward: Optional[list[str]] = typer.Option(None, "--reward", help="Reward NAME[:WEIGHT]; repeatable."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="Optimizer steps."),
    num_generations: Optional[int] = typer.Option(None, "--num-generations", help="Episodes per task."),
    prompts_per_step: Optional[int] = typer.Option(None, "--prompts-per-step", help="Tasks per step."),
    output_dir: Optional[str] = typer.Option(None, "--output-dir", help="Run directory."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Random seed."),
    config: Optional[str] = typer.Option(None, "--config", help="YAML config file."),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="Override key=value (dotted keys for sections)."),
    print_config: bool = typer.Option(False, "--print-config", help="Print the resolved config and exit."),
    plugin: Optional[list[str]] = typer.Option(None, "--plugin", help="Extra plugin module to load."),
    disable_plugin: Optional[list[str]] = typer.Option(None, "--disable-plugin", help="Plugin not to load."),
) -> None:
    """Train a policy; ends with held-out accuracy before vs after and where the run was saved."""
    from agentrl.config import build_config

    def run() -> None:
        rewards = _parse_rewards(reward) if reward else None
        cfg = build_config(config, overrides={
            "env": env, "algo": algo, "model": model, "engine": engine, "rewards": rewards,
            "max_steps": max_steps, "num_generations": num_generations, "prompts_per_step": prompts_per_step,
            "output_dir": output_dir, "seed": seed}, sets=set_)
        manager = _manager(disable_plugin or [], plugin or [])
        if print_config:
            import yaml

            from agentrl.config import resolved_dict

            console.print(yaml.safe_dump(resolved_dict(cfg, manager), sort_keys=False), highlight=False)
            return
        from agentrl.trainer import Trainer

        console.print(f"[bold]agentrl[/] {cfg.algo} on {cfg.env} with {cfg.model}: {cfg.max_steps} steps x "
                      f"{cfg.prompts_per_step} tasks x {cfg.num_generations} episodes", highlight=False)
        trainer = Trainer(cfg, manager)
        progress = _Progress(cfg.max_steps)
        with progress.bar:
            result = trainer.train(progress=progress)
        before = result.eval_before.get("eval/accuracy")
        after = result.eval_after.get("eval/accuracy")
        if before is not None and after is not None:
            console.print(f"[bold]held-out accuracy: {before:.3f} -> {after:.3f}[/]")
        console.print(f"run saved to {result.run_dir}", highlight=False)

    _run(run)


def _parse_rewards(items: list[str]) -> dict[str, float]:
    from agentrl.errors import ConfigError

    out: dict[str, float] = {}
    for item in items:
        name, _, weight = item.partition(":")
        try:
            out[name] = float(weight) if weight else 1.0
        except ValueError:
            raise ConfigError(f"--reward {item!r}: weight {weight!r} is not a number (use NAME or NAME:WEIGHT)") from None
        if not math.isfinite(out[name]):
            raise ConfigError(f"--reward {item!r}: weight {weight!r} must be a finite number")
    return out


@app.command("eval")
def eval_(
    model: str = typer.Option("smollm2-135m", "--model", help="HF folder, run dir, hub id or alias."),
    env: str = typer.Option("math", "--env", help="Environment name or path/file.py:Class."),
    num_tasks: int = typer.Option(64, "--num-tasks", help="Held-out tasks to evaluate."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", help="Tokens per turn."),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy."),
    engine: str = typer.Option("hf", "--engine", help="Generation engine."),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="Override key=value (e.g. env_args.difficulty=...)."),
    as_json: bool = typer.Option(False, "--json", help="Print metrics as JSON."),
) -> None:
    """Accuracy of a model or run dir on an env's held-out split."""

    def run() -> None:
        from agentrl.config import build_config
        from agentrl.evaluate import evaluate
        from agentrl.models import load_model, load_tokenizer
        from agentrl.trainer import make_env, reward_functions

        cfg = build_config(overrides={"model": model, "env": env, "engine": engine,
                                      "max_new_tokens": max_new_tokens, "eval_tasks": num_tasks}, sets=set_)
        manager = _manager([], [])
        envs = [make_env(manager, cfg) for _ in range(min(max(num_tasks, 1), 64))]
        tokenizer, policy = load_tokenizer(cfg.model), load_model(cfg.model)
        eng = manager.registry.get("engine", cfg.engine).factory(model=policy, tokenizer=tokenizer, config=cfg)
        rollout = manager.registry.get("rollout", cfg.rollout).factory(engine=eng, tokenizer=tokenizer, config=cfg)
        tasks = list(envs[0].eval_tasks())[:num_tasks]
        metrics, _ = evaluate(rollout, envs, tasks, max_new_tokens=cfg.max_new_tokens, temperature=temperature,
                              seed=cfg.seed, reward_fns=reward_functions(manager, cfg, envs[0]),
                              batch_size=len(envs))
        if as_json:
            print(json.dumps(metrics))
        else:
            for key, value in metrics.items():
                console.print(f"{key}: {value:.4f}", highlight=False)

    _run(run)


@app.command()
def plugins(as_json: bool = typer.Option(False, "--json", help="Print as JSON.")) -> None:
    """Installed plugins and what each registers."""

    def run() -> None:
        manager = _manager([], [])
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
    from agentrl.plots import plot_run

    console.print(f"wrote {plot_run(run_dir)}", highlight=False)


if __name__ == "__main__":
    sys.exit(app())
