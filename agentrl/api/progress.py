"""What a training run shows while it runs (``agentrl train`` and :func:`agentrl.train`): the
progress bar (or one line per step), each evaluation's accuracy with its
standard error, and whether a before/after change is noise."""

from __future__ import annotations

import math

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from agentrl.rewards.unscored import Unscored


class TrainProgress:
    """Training progress: a live rich bar with the current phase (eval / rollout / update) and the
    last step's reward on a terminal; one plain line per step when output goes to a file or pipe."""

    def __init__(self, total: int, console: Console | None = None) -> None:
        console = console or Console(soft_wrap=True)
        self.total, self.live, self.console = total, console.is_terminal or console.is_jupyter, console
        self.bar = Progress(
            TextColumn("[bold]{task.fields[phase]:<7}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            disable=not self.live,
        )
        self.task = self.bar.add_task("train", total=total, info="", phase="start")

    def phase(self, label: str) -> None:
        """Show what the run is doing now."""
        self.bar.update(self.task, phase=label)

    def __call__(self, step: int, metrics: dict[str, float]) -> None:
        why = unscored_of(metrics, "train/")
        unscored = f" ({why.unscored} of {why.episodes} unscored)" if why and why.unscored else ""
        info = (
            f"reward {metrics.get('reward/total_mean', float('nan')):.3f}{unscored} "
            f"len {metrics.get('rollout/sampled_tokens_mean', 0):.0f} "
            f"{metrics.get('perf/step_seconds', 0):.1f}s/step"
        )
        self.bar.update(self.task, completed=step, info=info)
        if not self.live:
            self.console.print(f"step {step}/{self.total}: {info}", highlight=False)

    def report(self, label: str, metrics: dict[str, float]) -> None:
        """One line per evaluation: accuracy with its standard error and the task count (``0 of N
        scored`` and why instead when no episode was scored; the unscored count when some were not)."""
        if not metrics:
            return
        n, why = int(metrics["eval/num_tasks"]), unscored_of(metrics, "eval/")
        if why is not None and not why.scored:
            self.bar.console.print(f"{label}: {scored_text(why)}, no accuracy", highlight=False)
            return
        sampled = metrics.get("eval/accuracy_sampled")
        extra = f" (sampled {sampled:.3f})" if sampled is not None else ""
        unscored = f" ({why.unscored} unscored, counted unsolved: {why.causes()})" if why and why.unscored else ""
        self.bar.console.print(
            f"{label}: accuracy {metrics['eval/accuracy']:.3f} "
            f"+/- {standard_error(metrics['eval/accuracy'], n):.3f}{extra} on {n} held-out "
            f"tasks{unscored}, mean env return {metrics['eval/env_return_mean']:.3f}",
            highlight=False,
        )


def unscored_of(metrics: dict[str, float], prefix: str) -> Unscored | None:
    """The scored and unscored episode counts in an evaluation's (``eval/``) or a step's (``train/``)
    ``metrics``; None when they hold none (written before they were counted)."""
    if f"{prefix}episodes_scored" not in metrics:
        return None
    return Unscored.from_metrics([metrics], prefix)


def scored_text(why: Unscored) -> str:
    """An evaluation that scored no episode in words: ``0 of 8 scored (8 raised)``."""
    return f"0 of {why.episodes} scored ({why.causes()})"


def accuracy_text(metrics: dict[str, float]) -> str:
    """An evaluation's accuracy (``0.500``), or ``0 of 8 scored (8 raised)`` when it scored no episode."""
    why = unscored_of(metrics, "eval/")
    return scored_text(why) if why is not None and not why.scored else f"{metrics['eval/accuracy']:.3f}"


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
    return (
        f" (a change under 2 standard errors, {2 * se:.3f} on {n} tasks, is noise: raise eval_tasks "
        "or compare several seeds)"
    )
