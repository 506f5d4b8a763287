"""What a run says before and after it trains (``agentrl train`` prints it; :func:`agentrl.train` too):
the banner (what trains on what, the rewards and where they came from, the precision, the sampler,
where the env workers run) and the summary (held-out accuracy before -> after, episodes scored,
which policy ``model/`` holds, where the run is)."""

from __future__ import annotations

import math
from typing import Any

from agentrl.api.progress import accuracy_text, noise_note, unscored_of
from agentrl.rewards.unscored import Unscored


def headline(cfg: Any) -> str:
    """The first line: algorithm, env, model and the run's size (rich markup)."""
    return (
        f"[bold]agentrl[/] {cfg.algo} on {cfg.env} with {cfg.model}: {cfg.max_steps} steps x "
        f"{cfg.prompts_per_step} tasks x {cfg.num_generations} episodes"
    )


def start_lines(trainer: Any, flag: str = "--reward") -> list[str]:
    """The banner's lines after the headline, for a built (internal) trainer (``flag``: how the
    user gave rewards: ``--reward``, or ``rewards=`` from Python)."""
    from agentrl.model import sharding
    from agentrl.model.activation_checkpointing import checkpointed_summary

    cfg, run = trainer.config, trainer.run
    engine = run.engine  # an engine need not subclass Engine: its class names it then
    lines = [
        rewards_line(cfg, trainer, flag),
        f"precision: {run.precision.name} ({run.precision.reason})",
        f"sampler: {getattr(engine, 'description', type(engine).__name__)}",
    ]
    if run.env_pool is not None:
        lines.append(run.env_pool.description)
    if cfg.gradient_checkpointing:
        lines.append(f"gradient checkpointing: {checkpointed_summary(trainer.model)}")
    if run.num_processes > 1:
        lines.append(sharding.layout(trainer.accelerator))
    return lines


def rewards_line(cfg: Any, trainer: Any, flag: str = "--reward") -> str:
    """What the run is rewarded for, and where that choice came from."""
    parts = [f"env return x{cfg.env_reward_weight:g}"]
    parts += [f"{name} x{weight:g}" for name, (_, weight) in trainer.run.reward_fns.items()]
    defaults = trainer.envs[0].default_rewards
    if cfg.rewards is None:
        source = "the env's defaults"
    elif defaults and any(name not in cfg.rewards for name in defaults):
        listed = " ".join(f"{flag} {name}:{weight:g}" for name, weight in defaults.items())
        if not flag.startswith("--"):
            listed = repr({name: weight for name, weight in defaults.items()})
        source = f"{flag} replaces the env's defaults; add {listed} to keep them"
    else:
        source = flag
    return f"rewards: {' + '.join(parts)} ({source})"


def summary_lines(result: Any) -> list[str]:
    """Held-out accuracy before -> after (``0 of N scored`` for an evaluation that scored no
    episode), the episodes scored over the run, which policy model/ holds, and where the run is
    (rich markup)."""
    lines = []
    before, after = result.eval_before, result.eval_after
    if "eval/accuracy" in before and "eval/accuracy" in after:
        n = int(after["eval/num_tasks"])
        both = all((unscored_of(m, "eval/") or Unscored(scored=1)).scored for m in (before, after))
        note = noise_note(before["eval/accuracy"], after["eval/accuracy"], n) if both else ""
        lines.append(f"[bold]held-out accuracy: {accuracy_text(before)} -> {accuracy_text(after)}[/]{note}")
    episodes = Unscored.from_metrics(result.history, "train/")
    if episodes.episodes:
        why = f" ({episodes.causes()})" if episodes.unscored else ""
        steps = sum("train/episodes_scored" in row for row in result.history)
        lines.append(f"episodes: {episodes.scored} scored, {episodes.unscored} unscored{why} over {steps} steps")
    best = result.best
    if best is not None and best["saved_as_model"]:
        accuracy = best["metrics"].get("eval/accuracy", math.nan)
        lines.append(
            f"model/ holds the best evaluated policy: step {best['step']}, held-out mean reward "
            f"{best['score']:.3f}, accuracy {accuracy:.3f} (the last step's policy: last/)"
        )
    lines.append(f"run saved to {result.run_dir}")
    return lines
