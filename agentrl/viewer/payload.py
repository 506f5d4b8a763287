"""What ``agentrl view`` puts in its page: each run dir's metrics, episodes and evaluations as one
JSON-ready dict (docs/guides/viewer.md).

A run's metrics are columns (``steps`` and one list of values per metric, None where a step did not
log it), so a 1,000-step run's curves stay small; its episodes are the lines of
``completions.jsonl`` and ``eval_completions.jsonl`` as written (docs/concepts/run-dir.md), kept
as their JSON text and spliced into the page as they are. A run that is still training may end its files in a line
half-written: that line is left out.
"""

from __future__ import annotations

import json
import math
import re
import secrets
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError, TrainingError
from agentrl.rundir.compare import RunRecord, load_run
from agentrl.rundir.episodes import EVAL_FILE, TRAIN_FILE, plain

FORMAT = 1
"""The payload's version, for the page (bumped when its shape changes)."""
EPISODE_KEYS = ("episodes", "eval_episodes")
"""A run's lists of episodes (JSON texts) in the payload."""


def build_payload(paths: list[str | Path]) -> dict[str, Any]:
    """The page's data for the run dirs at ``paths``: ``{"format", "runs": [run, ...]}``, a run
    being :func:`run_payload`'s dict; their names are the folders' names (their paths when two
    share a name). A ConfigError naming the path when one is not a run dir."""
    if not paths:
        raise ConfigError("agentrl view needs one or more run dirs (folders `agentrl train` wrote)")
    records = [load_run(path) for path in paths]
    names = [record.name for record in records]
    if len(set(names)) < len(names):
        names = [str(record.path) for record in records]
    return {"format": FORMAT, "runs": [run_payload(record, name) for record, name in zip(records, names)]}


def run_payload(record: RunRecord, name: str) -> dict[str, Any]:
    """One run's data: ``name``, ``path``, ``metrics`` (``steps`` and ``series``: metric -> a value
    per step), ``episodes``, ``eval_episodes``, ``evals`` (eval.json's before / after) and
    ``config`` (config.yaml's text, "" when absent)."""
    steps = sorted(record.steps)
    names = sorted({key for row in record.steps.values() for key in row})
    series = {key: [_number(record.steps[step].get(key)) for step in steps] for key in names}
    config = record.path / "config.yaml"
    return {
        "name": name,
        "path": str(record.path),
        "metrics": {"steps": steps, "series": {k: v for k, v in series.items() if any(x is not None for x in v)}},
        "episodes": read_episodes(record.path / TRAIN_FILE),
        "eval_episodes": read_episodes(record.path / EVAL_FILE),
        "evals": plain(record.evals),  # NaN in eval.json: null
        "config": config.read_text(errors="replace") if config.is_file() else "",
    }


def read_episodes(path: Path) -> list[str]:
    """The episodes in the JSONL file ``path`` as their JSON text, one string each ([] when there
    is none): checked, not rebuilt (10,000 episodes re-encoded would cost seconds). A TrainingError
    names the file and line of one that is not a JSON object; a last line without its newline,
    which a running run is still writing, is left out; NaN and Infinity become null."""
    if not path.is_file():
        return []
    text = path.read_text(errors="replace")
    lines = text.split("\n")
    if lines and not text.endswith("\n"):
        lines.pop()  # half-written
    episodes: list[str] = []
    odd: list[str] = []  # the NaN / Infinity constants of the line read last
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        odd.clear()
        try:
            episode = json.loads(line, parse_constant=lambda name: odd.append(name))  # NaN, Infinity: None
        except ValueError:
            episode = None
        if not isinstance(episode, dict):
            raise TrainingError(f"{path}, line {number}: not a JSON object ({line[:60]!r}); fix or delete that line")
        episodes.append(json.dumps(episode, separators=(",", ":")) if odd else line.strip())
    return episodes


def _number(value: Any) -> float | int | None:
    """A metric's value for a curve: finite numbers as they are, anything else (null, text, NaN) None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value


def page_json(payload: dict[str, Any]) -> str:
    """``payload`` as JSON safe inside an HTML ``<script>`` element (its runs' episode lists
    spliced in as the JSON texts they hold): every ``<`` escaped, so ``</script>`` and ``<!--`` in
    a message cannot end or bend the element; JSON.parse reads it back."""
    nonce = secrets.token_hex(8)  # no metric name or text of the runs can hold the markers
    runs, raw = [], {}
    for n, run in enumerate(payload["runs"]):
        runs.append(dict(run))
        for key in EPISODE_KEYS:
            marker = f"@@{nonce}-{n}-{key}@@"
            raw[json.dumps(marker)] = "[" + ",".join(run[key]) + "]"
            runs[-1][key] = marker
    text = json.dumps({**payload, "runs": runs}, separators=(",", ":"), allow_nan=False)
    text = re.sub(f'"@@{nonce}-[0-9]+-[a-z_]+@@"', lambda found: raw[found.group(0)], text)  # one pass
    return text.replace("<", "\\u003c")
