"""Two runs' ``completions.jsonl`` compared: the same episodes, their numbers up to float rounding."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def assert_same_completions(one: Path, two: Path, tolerance: float = 2e-4) -> None:
    """Every line of run ``one``'s ``completions.jsonl`` equals run ``two``'s: texts, token ids and
    everything else that is not a float exactly; floats (logprobs written to 4 decimals, rewards,
    advantages) within ``tolerance``. Runs on one and on two processes reduce gradients in another
    order, so a weight may differ in its last bit and a rounded 4th decimal may move."""
    lines_one = (one / "completions.jsonl").read_text().splitlines()
    lines_two = (two / "completions.jsonl").read_text().splitlines()
    assert len(lines_one) == len(lines_two) > 0
    for number, (a, b) in enumerate(zip(lines_one, lines_two), start=1):
        _assert_close(json.loads(a), json.loads(b), tolerance, f"line {number}")


def _assert_close(a: Any, b: Any, tolerance: float, where: str) -> None:
    if isinstance(a, float) or isinstance(b, float):
        assert isinstance(a, (int, float)) and isinstance(b, (int, float)), where
        assert abs(a - b) <= tolerance, f"{where}: {a} vs {b}"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            _assert_close(a[key], b[key], tolerance, f"{where}.{key}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_close(x, y, tolerance, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"
