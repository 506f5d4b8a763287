"""An LLM judge on the default job: the policy grading its own episodes (``judge:policy``, the run's
engine, no second copy) vs a second copy of the default model loaded as the judge (``judge:PATH``).

    python bench/judge_memory.py [--steps 3] [--out DIR] [--tiny]

Each configuration runs the real CLI, ``python -m agentrl train --env math --algo grpo --reward
judge:WHO`` with the judge as the only reward (``--reward`` replaces the env's default rewards;
``env_reward_weight=0`` drops the env's own correctness reward), no evaluation and no saved model,
in its own subprocess, one after the other. A child's peak RSS is the sum over its process tree of
each process's peak: the child's own is ``ru_maxrss`` from ``wait4`` (exact), any process it starts
is polled (``VmHWM`` in ``/proc/PID/status``, the kernel's high-water mark); the trainer's own
``perf/peak_rss_gb`` at the end of each step is shown beside it. The
second copy is the default model saved once with ``save_pretrained`` into ``DIR/judge-model``.

From each run's ``metrics.jsonl``: seconds per step (``perf/step_seconds``), the judge's counters
summed over the steps (``judge/judged``: replies asked for, ``judge/cache_hits``,
``judge/parse_failures``, ``judge/errors``; the last three count episodes), the parse rate =
episodes whose judge reply gave a score in range / episodes that got a reply, i.e. ``1 -
parse_failures / (judged + cache_hits - errors)``, and the judge's mean score (``reward/judge_mean``,
over scored episodes, averaged over the steps that scored any). Prints a table and writes
``DIR/judge_memory.json`` (with the rollout and update seconds per step too). A parsed reply need
not follow the rubric's ``Score: N``: the parser falls back to the reply's last number.

``--tiny``: the same flow on ``agentrl.testing``'s tiny random model (saved to ``DIR/judge-model``
and used as both the policy and the judge), 1 step, short replies: seconds, for the test.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.table import Table

COUNTERS = ("judged", "cache_hits", "parse_failures", "errors")


def save_judge_model(folder: Path, tiny: bool) -> Path:
    """The judge's own copy of the model (the default one, or the tiny one) as an HF folder; reused if there."""
    if (folder / "config.json").is_file():
        return folder
    from agentrl.model.loading import DEFAULT_MODEL, load_model, load_tokenizer

    tokenizer = load_tokenizer(DEFAULT_MODEL)
    if tiny:
        from agentrl.testing import build_tiny_model

        model = build_tiny_model(len(tokenizer))
    else:
        model = load_model(DEFAULT_MODEL)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def train_command(judge: str, run_dir: Path, args: argparse.Namespace, model: str) -> list[str]:
    """The CLI call for one configuration: the judge as the only reward, no eval, nothing saved."""
    sets = [
        "env_reward_weight=0",
        "eval_tasks=0",
        "save_model=false",
        "checkpoint_every=0",
        "log_completions_every=0",
        f"call_timeout_s={args.call_timeout_s}",
        f"max_nonfinite_steps={args.steps + 1}",
        *args.set,
    ]  # a judge that scores nothing is a figure here
    if args.tiny:
        sets += ["max_new_tokens=8", "plugins.judge.max_new_tokens=8"]
    return [
        sys.executable,
        "-m",
        "agentrl",
        "train",
        "--env",
        "math",
        "--algo",
        "grpo",
        "--model",
        model,
        "--reward",
        f"judge:{judge}",
        "--max-steps",
        str(args.steps),
        "--prompts-per-step",
        str(args.prompts_per_step),
        "--num-generations",
        str(args.num_generations),
        "--output-dir",
        str(run_dir),
        *[x for s in sets for x in ("--set", s)],
    ]


def high_water_kib(pid: int) -> int:
    """``VmHWM`` of a live process in KiB (0 once it is gone or has no memory left: a zombie)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


def run_watched(cmd: list[str], log: Path, poll_s: float = 0.1) -> tuple[int, float, dict[int, int]]:
    """Run ``cmd`` (output to ``log``); its exit status, wall seconds and each tree process's peak RSS in KiB
    (``VmHWM`` polled; the child's own from ``wait4``'s ``ru_maxrss``, exact whenever it peaked)."""
    peaks: dict[int, int] = {}
    start = time.perf_counter()
    with log.open("w") as out:
        child = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        root = psutil.Process(child.pid)
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            try:
                tree = [child.pid, *(p.pid for p in root.children(recursive=True))]
            except psutil.NoSuchProcess:
                tree = [child.pid]
            for each in tree:
                peaks[each] = max(peaks.get(each, 0), high_water_kib(each))
            time.sleep(poll_s)
    child.returncode = os.waitstatus_to_exitcode(status)
    peaks[child.pid] = max(peaks.get(child.pid, 0), usage.ru_maxrss)
    return child.returncode, time.perf_counter() - start, peaks


def summarise(name: str, judge: str, run_dir: Path, wall: float, peaks: dict[int, int]) -> dict[str, Any]:
    """One configuration's figures from its metrics file and the watched process tree."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "perf/step_seconds" in line]
    counts = {key: sum(line.get(f"judge/{key}", 0.0) for line in steps) for key in COUNTERS}
    answered = counts["judged"] + counts["cache_hits"] - counts["errors"]
    scores = [s for s in (line.get("reward/judge_mean") for line in steps) if s is not None and not math.isnan(s)]
    return {
        "config": name,
        "reward": f"judge:{judge}",
        "run_dir": str(run_dir),
        "peak_rss_mib": sum(peaks.values()) / 1024,
        "processes": len(peaks),
        "trainer_peak_rss_mib": max(line["perf/peak_rss_gb"] for line in steps) * 1e9 / 2**20,
        "wall_s": wall,
        "steps": len(steps),
        **{
            f"{key}_s_per_step": sum(line[f"perf/{key}_seconds"] for line in steps) / len(steps)
            for key in ("step", "rollout", "update")
        },
        **counts,
        "parse_rate": 1 - counts["parse_failures"] / answered if answered else None,
        "judge_score_mean": sum(scores) / len(scores) if scores else None,
    }


def run_config(name: str, slug: str, judge: str, out: Path, args: argparse.Namespace, model: str) -> dict[str, Any]:
    """Train one configuration in a watched subprocess (``out/runs/<slug>``, ``out/<slug>.log``); SystemExit
    with its log's tail if it fails."""
    run_dir = out / "runs" / slug
    if run_dir.exists():
        raise SystemExit(f"{run_dir} exists: pass another --out, or remove it")
    cmd = train_command(judge, run_dir, args, model)
    print("$", " ".join(cmd), flush=True)
    log = out / f"{slug}.log"
    code, wall, peaks = run_watched(cmd, log)
    text = log.read_text()
    if code == 2 and "error: the run trained nothing" in text:  # a judge that never parsed: still measured
        print(f"note: run {slug}: no reply of the judge parsed, so it trained nothing (parse rate 0)", flush=True)
    elif code != 0:
        raise SystemExit(f"{name} failed (exit {code}); the end of {log}:\n{text[-3000:]}")
    return summarise(name, judge, run_dir, wall, peaks)


def show(rows: list[dict[str, Any]], title: str) -> None:
    """The comparison as a rich table, the difference in peak RSS under it."""
    table = Table(title=title)
    for column in (
        "config",
        "peak RSS MiB",
        "trainer peak MiB",
        "wall s",
        "s/step",
        "rollout s/step",
        "update s/step",
        "judged",
        "cache hits",
        "parse failures",
        "parse rate",
        "mean judge score",
    ):
        table.add_column(column, justify="left" if column == "config" else "right", no_wrap=column == "config")
    for r in rows:
        rate = "-" if r["parse_rate"] is None else f"{r['parse_rate']:.3f}"
        score = "-" if r["judge_score_mean"] is None else f"{r['judge_score_mean']:.3f}"
        table.add_row(
            r["config"],
            f"{r['peak_rss_mib']:.0f}",
            f"{r['trainer_peak_rss_mib']:.0f}",
            f"{r['wall_s']:.1f}",
            *(f"{r[f'{key}_s_per_step']:.1f}" for key in ("step", "rollout", "update")),
            *(f"{r[key]:.0f}" for key in ("judged", "cache_hits", "parse_failures")),
            rate,
            score,
        )
    console = Console(width=150)
    console.print(table)
    extra = rows[1]["peak_rss_mib"] - rows[0]["peak_rss_mib"]
    console.print(
        f"a second copy as the judge: {extra:+.0f} MiB peak RSS "
        f"({rows[1]['step_s_per_step'] - rows[0]['step_s_per_step']:+.1f} s/step)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="training steps per configuration (3; --tiny: 1)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where the runs, logs and judge_memory.json go (default: a new temporary folder)",
    )
    parser.add_argument("--tiny", action="store_true", help="the tiny random model, 1 step (seconds)")
    parser.add_argument("--prompts-per-step", type=int, default=2, help="tasks per step (the default job: 4)")
    parser.add_argument("--num-generations", type=int, default=8, help="episodes per task (the default job: 8)")
    parser.add_argument(
        "--call-timeout-s",
        type=float,
        default=600.0,
        help="call_timeout_s: a judge call past it leaves the batch unscored (the default 60 s "
        "can pass on a loaded CPU)",
    )
    parser.add_argument("--set", action="append", default=[], help="extra key=value for both configurations")
    args = parser.parse_args()
    args.steps = args.steps or (1 if args.tiny else 3)
    out = args.out or Path(tempfile.mkdtemp(prefix="judge-memory-"))
    out.mkdir(parents=True, exist_ok=True)
    judge_model = save_judge_model(out / "judge-model", args.tiny)
    model = str(judge_model) if args.tiny else "smollm2-135m"
    rows = [
        run_config("judge:policy (shared engine)", "policy", "policy", out, args, model),
        run_config("judge:PATH (second copy)", "second-copy", str(judge_model), out, args, model),
    ]
    episodes = args.prompts_per_step * args.num_generations
    title = (
        f"{args.steps} step(s) of math/grpo on {'the tiny model' if args.tiny else model}, "
        f"{episodes} episodes/step, the judge the only reward"
    )
    show(rows, title)
    result = {
        "steps": args.steps,
        "tiny": args.tiny,
        "episodes_per_step": episodes,
        "model": model,
        "sets": args.set,
        "rows": rows,
    }
    (out / "judge_memory.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"written {out / 'judge_memory.json'}")


if __name__ == "__main__":
    main()
