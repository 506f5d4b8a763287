"""Does a training config learn, and reliably? Held-out accuracy over several seeds, by step and by minute.

    python bench/learning.py run --name NAME [--seeds 0 1 2] [--out bench/results/learning] -- TRAIN_ARGS...
    python bench/learning.py report RUN_DIR [RUN_DIR ...] [--png PATH] [--json PATH] [--minutes 5 10 15]

``run`` trains one config once per seed, one seed after the other: ``python -m agentrl train --seed S
--output-dir OUT/NAME-sS TRAIN_ARGS...`` (output in ``OUT/NAME-sS.log``), times it and writes
``OUT/NAME-sS/bench.json`` (seed, wall seconds, return code, TRAIN_ARGS). A seed whose run dir already
holds ``eval.json`` and ``bench.json`` is skipped, so an interrupted bench resumes where it stopped; a
run dir without ``eval.json`` (a run killed half-way) is deleted and trained again. A failing run is
shown with the tail of its log and the bench goes on (exit status 1 at the end). It ends with the report
of its seeds (``OUT/NAME.png``, ``OUT/NAME.json``).

``report`` reads finished run dirs (a shell glob is fine: what is not a run dir is skipped) and groups
them into configs by name, ``NAME-s<digits>`` -> ``NAME``. Per config it prints a table whose rows are
the eval points (before training = step 0, every ``eval_every`` step, the end) plus:

* ``best``: per seed, the eval point with the highest greedy accuracy (the other columns are that
  point's values);
* ``at N min`` (``--minutes``): per seed, the last eval point reached within N minutes of training
  (step 0 if none); a seed whose training was shorter contributes its end values (footnoted).

and whose columns are ``mean [min, max]`` over seeds of: greedy held-out accuracy (``eval/accuracy``),
sampled accuracy at the training temperature (``eval/accuracy_sampled``), format rate (the env's
``eval/env/boxed`` if logged, else the mean ``format`` reward ``eval/format_mean``; ``-`` when neither)
and training minutes. Training minutes are the cumulative sum of ``perf/step_seconds`` (rollout and
update; evaluation, model loading and checkpoints are not counted); each seed's total wall time, all
included, comes from ``bench.json``. Below the table: whether greedy accuracy at the end beats the start
on every seed, and whether the format rate at the end is >= 0.9 on every seed.

The PNG (``--png``, default ``learning.png`` in the first run dir's parent folder) has 2 x 3 panels:
greedy accuracy, sampled accuracy, format rate against step (top) and training minutes (bottom). Each
config is one colour: the mean over seeds at each eval point (x = the mean step / mean minutes of that
point over seeds) and a band from the seeds' min to max. ``--json`` writes the same numbers: per config
its seeds' series and the table's rows.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

METRICS = ("greedy", "sampled", "format")  # the eval point fields summarised per row (minutes too)
FORMAT_GOAL = 0.9
SEED_SUFFIX = re.compile(r"-s(\d+)$")
POLL_SECONDS = 2.0  # how often ``run`` looks at the training run's progress


# -- reading run dirs --------------------------------------------------------------------------------------
@dataclass
class Point:
    """One evaluation of one seed: ``kind`` is "before" (step 0), "step" (an intermediate eval) or "end"."""

    kind: str
    step: int
    minutes: float
    greedy: float | None
    sampled: float | None
    format: float | None


@dataclass
class Run:
    """One seed's run dir, reduced to its eval points."""

    path: str
    config: str
    seed: str
    points: list[Point]
    total_minutes: float
    wall_seconds: float | None
    returncode: int | None


def config_name(dir_name: str) -> str:
    """The config a run dir belongs to: its name without a trailing ``-s<digits>``."""
    return SEED_SUFFIX.sub("", dir_name)


def _number(value: Any) -> float | None:
    """A finite float, or None (missing, null, NaN, not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a ``.jsonl`` file; unparseable lines (a torn last line) are skipped."""
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and _number(row.get("step")) is not None:
            rows.append(row)
    return rows


def eval_values(metrics: dict[str, Any]) -> tuple[float | None, float | None, float | None]:
    """(greedy accuracy, sampled accuracy, format rate) of one eval's metrics; None where absent."""
    fmt = _number(metrics.get("eval/env/boxed"))
    if fmt is None:
        fmt = _number(metrics.get("eval/format_mean"))
    return _number(metrics.get("eval/accuracy")), _number(metrics.get("eval/accuracy_sampled")), fmt


def cumulative_minutes(lines: list[dict[str, Any]]) -> dict[int, float]:
    """Training minutes up to and including each step (sum of ``perf/step_seconds``, first line per step)."""
    seconds: dict[int, float] = {}
    for line in lines:
        step = int(line["step"])
        value = _number(line.get("perf/step_seconds"))
        if value is not None and step not in seconds:
            seconds[step] = value
    total, out = 0.0, {}
    for step in sorted({int(line["step"]) for line in lines} | set(seconds)):
        total += seconds.get(step, 0.0)
        out[step] = total / 60
    return out


def is_run_dir(path: Path) -> bool:
    """A finished training run: a folder with ``metrics.jsonl`` and ``eval.json``."""
    return path.is_dir() and (path / "metrics.jsonl").is_file() and (path / "eval.json").is_file()


def load_run(run_dir: Path) -> Run:
    """The eval points of a finished run dir: step 0 and the end from ``eval.json``, the rest from
    ``metrics.jsonl`` (lines with ``eval/`` keys; the ``final/`` line is left out)."""
    lines = read_jsonl(run_dir / "metrics.jsonl")
    evals = json.loads((run_dir / "eval.json").read_text())
    evals = evals if isinstance(evals, dict) else {}
    minutes = cumulative_minutes(lines)
    last = max(minutes, default=0)
    total = minutes.get(last, 0.0)
    points = [Point("before", 0, 0.0, *eval_values(evals.get("before") or {}))]
    seen = set()
    for line in lines:
        step = int(line["step"])
        if 0 < step < last and step not in seen and any(k.startswith("eval/") for k in line):
            seen.add(step)
            points.append(Point("step", step, minutes.get(step, 0.0), *eval_values(line)))
    points.sort(key=lambda p: p.step)
    points.append(Point("end", last, total, *eval_values(evals.get("after") or {})))
    bench = {}
    if (run_dir / "bench.json").is_file():
        try:
            bench = json.loads((run_dir / "bench.json").read_text())
        except ValueError:
            pass
    match = SEED_SUFFIX.search(run_dir.name)
    seed = f"s{bench['seed']}" if "seed" in bench else f"s{match.group(1)}" if match else run_dir.name
    return Run(
        str(run_dir),
        config_name(run_dir.name),
        seed,
        points,
        total,
        _number(bench.get("wall_seconds")),
        bench.get("returncode"),
    )


def group_runs(runs: list[Run]) -> dict[str, list[Run]]:
    """Runs by config name, in order of first appearance; seeds sorted within a config."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.config, []).append(run)
    key = lambda r: (int(r.seed[1:]) if r.seed[1:].isdigit() else math.inf, r.seed)  # noqa: E731
    return {name: sorted(group, key=key) for name, group in groups.items()}


# -- summarising ---------------------------------------------------------------------------------------
def summarize(values: list[float | None]) -> dict[str, Any]:
    """``{"n", "mean", "min", "max"}`` over the values that are not None (None stats when there are none)."""
    present = [v for v in values if v is not None]
    if not present:
        return {"n": 0, "mean": None, "min": None, "max": None}
    return {"n": len(present), "mean": sum(present) / len(present), "min": min(present), "max": max(present)}


def best_point(run: Run) -> Point | None:
    """The eval point with the highest greedy accuracy (the earliest on a tie); None if none has one."""
    scored = [p for p in run.points if p.greedy is not None]
    return max(scored, key=lambda p: p.greedy, default=None)  # max keeps the first of equal keys


def point_at_minutes(run: Run, minutes: float) -> tuple[Point, bool]:
    """The last eval point within ``minutes`` of training (step 0 if none), and whether the run's whole
    training was shorter than that (then it is the end point)."""
    within = [p for p in run.points if p.minutes <= minutes + 1e-9]
    return (within[-1] if within else run.points[0]), run.total_minutes < minutes


def _row(label: str, kind: str, points: list[Point], note: str = "") -> dict[str, Any]:
    """A table row: the stats over seeds of each metric, minutes and step at the given points."""
    row = {"label": label, "kind": kind, "n": len(points), "note": note}
    for field in (*METRICS, "minutes", "step"):
        row[field] = summarize([getattr(p, field) for p in points])
    return row


def config_rows(runs: list[Run], minutes: list[float]) -> tuple[list[dict[str, Any]], list[str]]:
    """The table rows of one config (eval points, best, at N min) and its footnotes."""
    rows = []
    steps = sorted({p.step for r in runs for p in r.points if p.kind == "step"})
    rows.append(_row("before (step 0)", "before", [r.points[0] for r in runs]))
    for step in steps:
        rows.append(
            _row(f"step {step}", "step", [p for r in runs for p in r.points if p.kind == "step" and p.step == step])
        )
    ends = [r.points[-1] for r in runs]
    lo, hi = min(p.step for p in ends), max(p.step for p in ends)
    rows.append(_row(f"end (step {lo})" if lo == hi else f"end (steps {lo}-{hi})", "end", ends))
    rows.append(_row("best", "best", [p for p in map(best_point, runs) if p is not None]))
    notes = []
    for limit in minutes:
        picked = [point_at_minutes(r, limit) for r in runs]
        short = [f"{r.seed} ended at {r.total_minutes:.1f} min" for r, (_, early) in zip(runs, picked) if early]
        label = f"at {limit:g} min" + ("*" if short else "")
        rows.append(_row(label, "minutes", [p for p, _ in picked], note="; ".join(short)))
        if short:
            notes.append(f"* at {limit:g} min: {', '.join(short)} (their end values are used)")
    return rows, notes


def verdicts(runs: list[Run]) -> dict[str, Any]:
    """Greedy end > start on every seed (and the deltas), format at end >= 0.9 on every seed (None when
    the config has no format metric), and each seed's wall seconds."""
    deltas = {
        r.seed: (
            r.points[-1].greedy - r.points[0].greedy
            if r.points[-1].greedy is not None and r.points[0].greedy is not None
            else None
        )
        for r in runs
    }
    has_format = any(p.format is not None for r in runs for p in r.points)
    end_format = {r.seed: r.points[-1].format for r in runs}
    return {
        "greedy_improved_every_seed": all(d is not None and d > 0 for d in deltas.values()),
        "greedy_deltas": deltas,
        "format_ok_every_seed": (
            all(f is not None and f >= FORMAT_GOAL for f in end_format.values()) if has_format else None
        ),
        "end_format": end_format,
        "wall_seconds": {r.seed: r.wall_seconds for r in runs if r.wall_seconds is not None},
    }


def build_report(runs: list[Run], minutes: list[float]) -> dict[str, Any]:
    """Per config: its seeds' series, the table rows, footnotes and verdicts (JSON-ready)."""
    report = {}
    for name, group in group_runs(runs).items():
        rows, notes = config_rows(group, minutes)
        report[name] = {
            "seeds": [asdict(r) for r in group],
            "rows": rows,
            "footnotes": notes,
            "has_format": any(p.format is not None for r in group for p in r.points),
            "verdicts": verdicts(group),
        }
    return report


# -- output --------------------------------------------------------------------------------------------
def fmt_stat(stat: dict[str, Any], digits: int = 3) -> str:
    """``mean [min, max]``, or ``-`` when no seed has the value."""
    if stat["mean"] is None:
        return "-"
    return f"{stat['mean']:.{digits}f} [{stat['min']:.{digits}f}, {stat['max']:.{digits}f}]"


def print_report(report: dict[str, Any], console: Console) -> None:
    """One rich table per config, then its verdicts and footnotes."""
    for name, cfg in report.items():
        seeds = ", ".join(s["seed"] for s in cfg["seeds"])
        table = Table(title=escape(f"{name}: {len(cfg['seeds'])} seed(s) ({seeds}), mean [min, max] over seeds"))
        for col in ("eval point", "n", "greedy acc", "sampled acc", "format", "train min"):
            table.add_column(col, justify="left" if col == "eval point" else "right", no_wrap=True)
        for row in cfg["rows"]:
            if row["kind"] == "best":
                table.add_section()
            table.add_row(
                row["label"],
                str(row["n"]),
                fmt_stat(row["greedy"]),
                fmt_stat(row["sampled"]),
                fmt_stat(row["format"]) if cfg["has_format"] else "-",
                fmt_stat(row["minutes"], 1),
            )
        console.print(table)
        v = cfg["verdicts"]
        deltas = ", ".join(f"{seed} {'n/a' if d is None else f'{d:+.3f}'}" for seed, d in v["greedy_deltas"].items())
        console.print(
            f"greedy end > start on every seed: {'yes' if v['greedy_improved_every_seed'] else 'no'} "
            f"(per-seed deltas {deltas})"
        )
        if v["format_ok_every_seed"] is None:
            console.print("format at end >= 0.9 on every seed: - (no boxed-answer metric)")
        else:
            ends = ", ".join(f"{seed} {'n/a' if f is None else f'{f:.3f}'}" for seed, f in v["end_format"].items())
            console.print(
                f"format at end >= {FORMAT_GOAL} on every seed: {'yes' if v['format_ok_every_seed'] else 'no'} ({ends})"
            )
        if v["wall_seconds"]:
            walls = ", ".join(f"{seed} {s / 60:.1f} min" for seed, s in v["wall_seconds"].items())
            console.print(f"wall time per seed (training, evaluation, model loading): {walls}")
        for note in cfg["footnotes"]:
            console.print(note)
        console.print()


def write_plot(report: dict[str, Any], path: Path) -> Path:
    """The 2 x 3 PNG: greedy, sampled, format against step (top row) and training minutes (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(16, 9), squeeze=False)
    titles = {
        "greedy": "held-out accuracy (greedy)",
        "sampled": "held-out accuracy (sampled)",
        "format": "format rate (boxed answers)",
    }
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, cfg) in enumerate(report.items()):
        colour = colours[i % len(colours)]
        rows = [r for r in cfg["rows"] if r["kind"] in ("before", "step", "end")]
        for col, metric in enumerate(METRICS):
            points = [r for r in rows if r[metric]["mean"] is not None]
            if not points:  # e.g. no format metric in a multi-turn env, no sampled eval
                continue
            for ax, xkey in zip(axes[:, col], ("step", "minutes")):
                x = [r[xkey]["mean"] for r in points]
                ax.plot(
                    x,
                    [r[metric]["mean"] for r in points],
                    marker="o",
                    color=colour,
                    label=f"{name} (n={len(cfg['seeds'])})",
                )
                ax.fill_between(
                    x,
                    [r[metric]["min"] for r in points],
                    [r[metric]["max"] for r in points],
                    color=colour,
                    alpha=0.2,
                    linewidth=0,
                )
    for col, metric in enumerate(METRICS):
        for row, xlabel in enumerate(("step", "training minutes (mean over seeds)")):
            ax = axes[row, col]
            ax.set_title(f"{titles[metric]} by {'step' if row == 0 else 'training minutes'}")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(titles[metric].split(" (")[0])
            ax.set_ylim(0, 1)
            ax.grid(alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=8)
            else:  # say why the panel is empty
                why = {
                    "sampled": "no sampled evaluation\n(the runs had eval_sampled: false)",
                    "format": "no format metric logged",
                }.get(metric, "no evaluation logged")
                ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, color="grey")
    fig.suptitle("mean over seeds, band = min..max")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(path, dpi=90)
    finally:
        plt.close(fig)
    return path


def report_dirs(
    dirs: list[Path], minutes: list[float], png: Path | None, json_path: Path | None, console: Console
) -> dict[str, Any]:
    """Load the run dirs among ``dirs``, print the report, write the PNG (and JSON); returns the report."""
    runs = []
    for path in dirs:
        if is_run_dir(path):
            runs.append(load_run(path))
        elif path.is_dir():
            console.print(
                f"[yellow]skipped {escape(str(path))}: no metrics.jsonl and eval.json (not a finished run)[/yellow]"
            )
    if not runs:
        console.print("[red]no finished run dirs to report on[/red]")
        return {}
    report = build_report(runs, minutes)
    print_report(report, console)
    png = png or Path(runs[0].path).parent / "learning.png"
    console.print(f"wrote {write_plot(report, png)}")
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=1))
        console.print(f"wrote {json_path}")
    return report


# -- running ----------------------------------------------------------------------------------------
def train_command(seed: int, run_dir: Path, extra: list[str]) -> list[str]:
    """The ``agentrl train`` command line of one seed."""
    return [sys.executable, "-m", "agentrl", "train", "--seed", str(seed), "--output-dir", str(run_dir), *extra]


def is_done(run_dir: Path) -> bool:
    """A seed already benched: its run dir holds eval.json and bench.json."""
    return (run_dir / "eval.json").is_file() and (run_dir / "bench.json").is_file()


def _last_step(path: Path, offset: int) -> tuple[int | None, int]:
    """The step of the last complete line of ``metrics.jsonl`` after ``offset``, and the new offset."""
    if not path.is_file():
        return None, offset
    with path.open("rb") as f:
        f.seek(offset)
        chunk = f.read()
    end = chunk.rfind(b"\n")
    if end < 0:
        return None, offset
    step = None
    for line in chunk[:end].splitlines()[::-1]:
        try:
            step = int(json.loads(line)["step"])
            break
        except (ValueError, KeyError, TypeError):
            continue
    return step, offset + end + 1


def _max_steps(run_dir: Path) -> int | None:
    """``max_steps`` from the run's config.yaml, once the run has written it."""
    try:
        import yaml

        return int(yaml.safe_load((run_dir / "config.yaml").read_text())["max_steps"])
    except Exception:  # not written yet, or half-written
        return None


def run_seed(
    seed: int, run_dir: Path, log: Path, extra: list[str], progress: Any = None, task: Any = None
) -> dict[str, Any]:
    """Train one seed (deleting a leftover run dir first), write and return its bench.json."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    command = train_command(seed, run_dir, extra)
    start, offset, total = time.perf_counter(), 0, None
    with log.open("w") as out:
        out.write(" ".join(command) + "\n")
        out.flush()
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            time.sleep(POLL_SECONDS)
            if progress is not None:
                step, offset = _last_step(run_dir / "metrics.jsonl", offset)
                total = total or _max_steps(run_dir)
                progress.update(task, **({"total": total} if total else {}), **({"completed": step} if step else {}))
    bench = {"seed": seed, "wall_seconds": time.perf_counter() - start, "returncode": proc.returncode, "args": extra}
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "bench.json").write_text(json.dumps(bench, indent=1) + "\n")
    return bench


def log_tail(log: Path, lines: int = 25) -> str:
    """The last lines of a log file."""
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.is_file() else "(no log)"


def run_bench(name: str, seeds: list[int], out: Path, extra: list[str], minutes: list[float], console: Console) -> int:
    """Train every seed not done yet, then report on the seeds; returns the exit status."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    out.mkdir(parents=True, exist_ok=True)
    failed = []
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    ) as progress:
        overall = progress.add_task(f"{name}: seeds", total=len(seeds))
        for seed in seeds:
            run_dir, log = out / f"{name}-s{seed}", out / f"{name}-s{seed}.log"
            if is_done(run_dir):
                progress.console.print(f"{run_dir}: done already, skipped")
            else:
                task = progress.add_task(f"seed {seed}: steps", total=None)
                bench = run_seed(seed, run_dir, log, extra, progress, task)
                progress.remove_task(task)
                if bench["returncode"] != 0:
                    failed.append(seed)
                    progress.console.print(
                        f"seed {seed} failed (exit {bench['returncode']}); last lines of {log}:",
                        style="red",
                        markup=False,
                    )
                    progress.console.print(log_tail(log), markup=False, highlight=False)
                else:
                    progress.console.print(f"seed {seed}: {bench['wall_seconds'] / 60:.1f} min -> {run_dir}")
            progress.advance(overall)
    report_dirs(
        [out / f"{name}-s{seed}" for seed in seeds], minutes, out / f"{name}.png", out / f"{name}.json", console
    )
    if failed:
        console.print(f"[red]failed seeds: {failed} (logs in {escape(str(out))})[/red]")
    return 1 if failed else 0


# -- command line ---------------------------------------------------------------------------------------
def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The parsed options and the arguments after ``--`` (passed on to ``agentrl train``)."""
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train one config over several seeds, then report")
    run.add_argument("--name", required=True, help="config name: run dirs are OUT/NAME-s<seed>")
    run.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds (default 0 1 2)")
    run.add_argument(
        "--out",
        type=Path,
        default=Path("bench/results/learning"),
        help="folder of the run dirs, logs and report (default bench/results/learning)",
    )
    report = sub.add_parser("report", help="tables and plot of finished run dirs, grouped by config")
    report.add_argument("run_dirs", nargs="+", type=Path)
    report.add_argument(
        "--png", type=Path, default=None, help="plot path (default learning.png in the first run dir's parent folder)"
    )
    report.add_argument("--json", type=Path, default=None, help="also write the numbers as JSON")
    for p in (run, report):
        p.add_argument(
            "--minutes",
            type=float,
            nargs="+",
            default=[5, 10, 15],
            help="training-minute budgets for the 'at N min' rows (default 5 10 15)",
        )
    args = parser.parse_args(argv)
    if extra and args.command != "run":
        parser.error("arguments after -- are only for 'run'")
    return args, extra


def main(argv: list[str] | None = None) -> int:
    args, extra = parse_args(sys.argv[1:] if argv is None else argv)
    console = Console()
    if not console.is_terminal:  # piped to a file: rich would wrap the tables at 80 columns
        console.width = max(console.width, 120)
    if args.command == "run":
        return run_bench(args.name, args.seeds, args.out, extra, args.minutes, console)
    return 0 if report_dirs(args.run_dirs, args.minutes, args.png, args.json, console) else 1


if __name__ == "__main__":
    sys.exit(main())
