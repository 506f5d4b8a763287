"""Behaviour unchanged: a 5-step GRPO run, a PPO run of 2 epochs x 2 mini-batches and an interrupted
and resumed GRPO run on the tiny model give the metrics history and final weights recorded in
tests/data/behaviour_golden.json from the code before a refactor.

Each scenario runs in a fresh process with one CPU thread (tests/record_behaviour.py, which also
rewrites the data file: ``python tests/record_behaviour.py --record``). Floats are bit-for-bit
reproducible only on the same CPU type with the same torch/transformers, so the comparison is
bitwise (sha256 of every tensor, exact metric values) when this machine's fingerprint equals the
recorded one, and within rel 1e-4 / abs 1e-6 otherwise; step numbers, metric names and tensor
names, dtypes and shapes are always exact. The assertion message says which mode was used.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import subprocess
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("record_behaviour", HERE / "record_behaviour.py")
record_behaviour = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(record_behaviour)

REL, ABS = 1e-4, 1e-6
SHOWN = 12  # differences listed in a failure message


# ---------------------------------------------------------------------------------------------
# The comparison


def same_number(a: Any, b: Any, exact: bool) -> bool:
    """Equal (NaN equals NaN), or within REL/ABS unless ``exact``."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b or (not exact and math.isclose(a, b, rel_tol=REL, abs_tol=ABS))
    return a == b


def compare_weights(where: str, golden: dict[str, dict], got: dict[str, dict], exact: bool) -> list[str]:
    """Differences between two ``{tensor: summary}`` maps."""
    problems = []
    if missing := sorted(golden.keys() - got.keys()):
        problems.append(f"{where}: tensors missing: {missing}")
    if extra := sorted(got.keys() - golden.keys()):
        problems.append(f"{where}: tensors not in the recording: {extra}")
    for name in sorted(golden.keys() & got.keys()):
        g, r = golden[name], got[name]
        for fact in ("dtype", "shape"):
            if g[fact] != r[fact]:
                problems.append(f"{where} {name}: {fact} {r[fact]} != recorded {g[fact]}")
        if exact and g["sha256"] != r["sha256"]:
            problems.append(f"{where} {name}: bytes differ (sha256); sum {r['sum']!r} vs recorded {g['sum']!r}")
        for fact in ("sum", "norm"):
            if not same_number(g[fact], r[fact], exact):
                problems.append(f"{where} {name}: {fact} {r[fact]!r} != recorded {g[fact]!r}")
    return problems


def compare_metrics(golden: list[dict], got: list[dict], exact: bool) -> list[str]:
    """Differences between two metrics histories (rows of metrics.jsonl)."""
    steps, got_steps = [row["step"] for row in golden], [row["step"] for row in got]
    if steps != got_steps:
        return [f"metrics: rows for steps {got_steps} != recorded {steps}"]
    problems = []
    for index, (g, r) in enumerate(zip(golden, got)):
        where = f"metrics row {index} (step {g['step']})"
        if missing := sorted(g.keys() - r.keys()):
            problems.append(f"{where}: keys missing: {missing}")
        if extra := sorted(r.keys() - g.keys()):
            problems.append(f"{where}: keys not in the recording: {extra}")
        for key in sorted(g.keys() & r.keys()):
            if not same_number(g[key], r[key], exact):
                problems.append(f"{where}: {key} = {r[key]!r} != recorded {g[key]!r}")
    return problems


def compare(golden: dict, got: dict, exact: bool) -> list[str]:
    """Every difference between a scenario's recorded figures and ``got``; empty when the same."""
    return [
        *[
            f"the tiny model the runs start from (not the trainer): {p}"
            for p in compare_weights("tiny model", golden["tiny_model"], got["tiny_model"], exact)
        ],
        *compare_metrics(golden["metrics"], got["metrics"], exact),
        *compare_weights("weights", golden["weights"], got["weights"], exact),
    ]


def mode_line(recorded: dict[str, str], here: dict[str, str]) -> tuple[bool, str]:
    """(bitwise?, a sentence saying which comparison is used and why)."""
    if recorded == here:
        return True, f"compared BITWISE (this machine's fingerprint equals the recording's: {here})"
    differs = {
        k: (here.get(k), recorded.get(k))
        for k in sorted(recorded.keys() | here.keys())
        if recorded.get(k) != here.get(k)
    }
    return False, (
        f"compared with TOLERANCE rel {REL} / abs {ABS} (this machine differs from the recording's "
        f"in {', '.join(f'{k}: {a!r} here, {b!r} recorded' for k, (a, b) in differs.items())})"
    )


def failure(scenario: str, mode: str, problems: list[str], golden: dict) -> str:
    shown = "\n  ".join(problems[:SHOWN])
    more = f"\n  ... and {len(problems) - SHOWN} more" if len(problems) > SHOWN else ""
    return (
        f"scenario {scenario!r} no longer behaves as recorded from {golden['recorded_from']}; {mode}:\n  "
        f"{shown}{more}\nIf the change is meant to alter behaviour, re-record: python tests/record_behaviour.py "
        "--record"
    )


# ---------------------------------------------------------------------------------------------
# Running the scenarios (each in its own process, all at once)


@pytest.fixture(scope="module")
def golden() -> dict:
    if not record_behaviour.GOLDEN.is_file():
        pytest.fail(f"{record_behaviour.GOLDEN} is missing: record it with python tests/record_behaviour.py --record")
    return json.loads(record_behaviour.GOLDEN.read_text())


def _run(name: str, tiny_model: Path, workdir: Path, changed: dict[str, Any]) -> dict:
    """Scenario ``name``'s figures, and under ``"changed"`` those of the run with ``changed`` (if any)."""
    workdir.mkdir(parents=True)
    out, changed_out = workdir / "figures.json", workdir / "changed.json"
    command = record_behaviour.scenario_command(
        name, tiny_model, workdir, out, changed, changed_out if changed else None
    )
    done = subprocess.run(command, env=record_behaviour.child_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"scenario {name} failed (exit {done.returncode}):\n{done.stderr[-4000:]}"
    figures = json.loads(out.read_text())
    figures["changed"] = json.loads(changed_out.read_text()) if changed else None
    return figures


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory, golden) -> Iterator[dict[str, Future]]:
    """Every scenario, all started at once, the GRPO one followed by GRPO with the learning rate 1%
    higher (about 3 x 0.7 GB of memory)."""
    lr = golden["configs"]["grpo"]["learning_rate"]
    jobs = {"grpo": {"learning_rate": lr * 1.01}, "resume": {}, "ppo": {}}
    assert set(jobs) == set(record_behaviour.SCENARIOS)
    pool = ThreadPoolExecutor(max_workers=len(jobs))  # single-threaded processes: the OS shares the cores
    root = tmp_path_factory.mktemp("behaviour")
    futures = {name: pool.submit(_run, name, tiny_model_dir, root / name, changed) for name, changed in jobs.items()}
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("scenario", record_behaviour.SCENARIOS)
def test_behaviour_is_as_recorded(runs, golden, scenario):
    got = runs[scenario].result()
    assert got["threads"] == 1
    exact, mode = mode_line(golden["fingerprint"], got["fingerprint"])
    problems = compare(golden["scenarios"][scenario], got, exact)
    assert not problems, failure(scenario, mode, problems, golden)


def test_the_resumed_run_equals_the_straight_one(runs):
    """Same machine, same moment: the interrupted-and-resumed run is bit for bit the 5 straight steps."""
    straight, resumed = runs["grpo"].result(), runs["resume"].result()
    assert compare(straight, resumed, exact=True) == []


# ---------------------------------------------------------------------------------------------
# The comparison can fail


def test_a_one_percent_learning_rate_change_is_detected_in_both_modes(runs, golden):
    recorded, changed = golden["scenarios"]["grpo"], runs["grpo"].result()["changed"]
    for exact in (True, False):
        problems = compare(recorded, changed, exact)
        assert any(p.startswith("weights ") for p in problems), problems  # the trained weights moved
        assert any(p.startswith("metrics ") and "train/learning_rate" not in p for p in problems), problems
        assert not any("tiny model" in p for p in problems)  # the starting point is the same
    tolerated = compare(recorded, changed, exact=False)
    assert any("model.embed_tokens.weight: sum" in p for p in tolerated), tolerated  # beyond rel 1e-4


def test_comparison_rules(golden):
    recorded = golden["scenarios"]["ppo"]
    assert compare(recorded, copy.deepcopy(recorded), exact=True) == []

    nudged = copy.deepcopy(recorded)  # one metric one ulp off, one tensor's bytes changed
    row = nudged["metrics"][-1]
    key = next(k for k, v in row.items() if k != "step" and isinstance(v, float) and v != 0)
    row[key] = math.nextafter(row[key], math.inf)
    name = next(iter(nudged["weights"]))
    nudged["weights"][name]["sha256"] = "0" * 64
    assert len(compare(recorded, nudged, exact=True)) == 2
    assert compare(recorded, nudged, exact=False) == []

    drifted = copy.deepcopy(recorded)  # beyond the tolerance
    drifted["metrics"][-1][key] = recorded["metrics"][-1][key] * (1 + 3 * REL) + 10 * ABS
    drifted["weights"][name]["norm"] *= 1 + 3 * REL
    assert len(compare(recorded, drifted, exact=False)) == 2

    shaped = copy.deepcopy(recorded)  # integer facts: exact in both modes
    shaped["metrics"][-1].pop(key)
    shaped["metrics"][1]["step"] += 1
    shaped["weights"][name]["shape"][0] += 1
    shaped["tiny_model"].pop(next(iter(shaped["tiny_model"])))
    for exact in (True, False):
        problems = compare(recorded, shaped, exact)
        assert any("rows for steps" in p for p in problems)
        assert any("shape" in p for p in problems) and any("tiny model" in p for p in problems)
    shaped["metrics"][1]["step"] -= 1
    assert any("keys missing" in p for p in compare(recorded, shaped, exact=False))

    here = dict(golden["fingerprint"], torch="0.0")
    assert mode_line(golden["fingerprint"], golden["fingerprint"])[0] is True
    exact, line = mode_line(golden["fingerprint"], here)
    assert not exact and "TOLERANCE" in line and "torch" in line
