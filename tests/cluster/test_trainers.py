"""``agentrl train --ray --num-processes 2`` on the simulated cluster: process 0 in ``agentrl train``
on the head node, process 1 a Ray actor's subprocess on the ``trainer`` node. The run equals one
process (weights to fp32 rounding, metrics, completions: the comparison of
tests/e2e/test_multiprocess.py); placement that cannot happen is one line; a process that dies
stops the run with one line; ``kill -9`` of ``agentrl train`` leaves no process of the run behind;
``--resume`` continues to the one-process result."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

pytest.importorskip("ray")

_spec = importlib.util.spec_from_file_location(
    "multiprocess_runs", Path(__file__).parents[1] / "e2e" / "test_multiprocess.py"
)
assert _spec is not None and _spec.loader is not None
multiprocess_runs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(multiprocess_runs)
assert_same_run, common, metric_rows = (
    multiprocess_runs.assert_same_run,
    multiprocess_runs.common,
    multiprocess_runs.metric_rows,
)

STEPS = 4
BANNER = re.compile(r"trainers: 0 on node (\w+) head \(([^)]+)\), 1 on node (\w+) \(([^)]+)\)")


@pytest.fixture(scope="module")
def shared(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], Path]:
    """The runs' common flags, and the one-process run of them (in this process) they are compared with."""
    folder = tmp_path_factory.mktemp("ray-trainers")
    args = common(tiny_model_dir, folder, "grpo", "algorithm.scale_rewards=batch", "checkpoint_every=1")
    slow = folder / "slow_vowels.py"  # the same reward, a second per call: a stop lands mid-run
    slow.write_text("import time\n" + multiprocess_runs.REWARD.replace('"""\n', '"""\n    time.sleep(1)\n', 1))
    args[args.index(f"{folder / 'vowels.py'}:vowels")] = f"{slow}:vowels"
    multiprocess_runs.one_process(*args, "--max-steps", str(STEPS), "--output-dir", str(folder / "one"))
    return args, folder / "one"


def on_ray(cluster: Any, *resources: str) -> list[str]:
    """The flags of a two-process run on ``cluster``, process 1 on the ``trainer`` node."""
    trainer = resources[0] if resources else "{CPU: 1, trainer: 1}"
    return ["--ray", "--num-processes", "2", "--set", f"ray.address={cluster.address}"] + [
        "--set",
        f"ray.trainer_resources={trainer}",
    ]


def agentrl(*args: str, **kwargs: Any) -> subprocess.Popen[str]:
    """``agentrl ARGS`` in a subprocess of its own (process 0 of the run is that process)."""
    return subprocess.Popen(
        [sys.executable, "-m", "agentrl", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "AGENTRL_LAUNCHED": ""},
        **kwargs,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 600) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def run_processes(run: Path) -> list[psutil.Process]:
    """Every live process whose command line names ``run`` (process 0 and the trainer subprocesses)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if str(run) in " ".join(proc.info["cmdline"] or []) and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def wait_for(condition: Any, proc: subprocess.Popen[str], what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"ended before {what}: " + "".join(proc.communicate()[1])[-3000:]
        assert time.monotonic() < deadline, f"no {what} within {timeout}s"
        time.sleep(0.2)


def subprocess_of(run: Path, driver: int) -> psutil.Process:
    """Process 1 of the run: the subprocess of its actor (its command line names the run dir)."""
    others = [p for p in run_processes(run) if p.pid != driver and "agentrl" in " ".join(p.cmdline())]
    assert len(others) == 1, [p.cmdline() for p in others]
    return others[0]


def newest_checkpoint(run: Path) -> int:
    """The step of the run's newest complete checkpoint (0: none)."""
    return max((int(c.parent.name.split("-")[1]) for c in run.glob("checkpoints/step-*/COMPLETE")), default=0)


def none_left(run: Path, within: float) -> None:
    deadline = time.monotonic() + within
    while left := run_processes(run):
        assert time.monotonic() < deadline, f"still running {within}s later: {[p.cmdline()[:4] for p in left]}"
        time.sleep(0.1)


ROLES = (
    "ray.engines=2",
    "ray.engine_resources={CPU: 1, engine: 1}",
    "ray.env_workers=2",
    "ray.env_worker_resources={CPU: 1, env: 1}",
)
"""Each trainer process drives one engine replica on the engine node and one env worker on the env node."""


def test_two_processes_engine_replicas_and_env_workers_on_ray_equal_one(ray_cluster, shared, tmp_path):
    """Process 1 runs on the trainer node, the engine replicas on the engine node, the env workers
    on the env node (the banner says so), and the run equals one process: weights, metrics (but
    ``perf/*``, ``faults/*``), completions."""
    args, one = shared
    run = tmp_path / "ray"
    roles = [item for role in ROLES for item in ("--set", role)]
    command = [*args, "--max-steps", str(STEPS), "--output-dir", str(run), *on_ray(ray_cluster), *roles]
    code, out, err = finish(agentrl(*command))
    assert code == 0, out[-3000:] + err[-3000:]
    banner = BANNER.search(out)
    assert banner, out[-3000:]
    assert ray_cluster.node_ids["head"].startswith(banner.group(1))
    assert ray_cluster.node_ids["trainer"].startswith(banner.group(3))
    engines = re.search(r"sampler: 1 hf replica.* on Ray: node (\w+) ", out)
    envs = re.search(r"env workers: 1 on node (\w+) ", out)
    assert engines and envs, out[-3000:]
    assert ray_cluster.node_ids["engine"].startswith(engines.group(1))
    assert ray_cluster.node_ids["env"].startswith(envs.group(1))
    faults = [row for row in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]
    assert all(row["faults/engine_restarts"] == row["faults/env_worker_restarts"] == 0 for row in faults)
    assert_same_run(one, run)


def test_trainer_resources_no_node_has_are_one_line(ray_cluster, tiny_model_dir, tmp_path):
    started = time.monotonic()
    code, out, err = finish(
        agentrl(
            "train",
            "--model",
            str(tiny_model_dir),
            "--output-dir",
            str(tmp_path / "run"),
            *on_ray(ray_cluster, "{CPU: 1, gpu_node: 1}"),
            "--set",
            "ray.start_timeout_s=3",
        )
    )
    assert code == 2, out[-3000:] + err[-3000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(
        "error: ray: 1 trainer process(es) needing {'CPU': 1, 'gpu_node': 1} not placed within 3s: the cluster has {"
    ), err
    assert "trainer: 2" in lines[0]  # what the cluster has
    assert time.monotonic() - started < 120
    assert not (tmp_path / "run").exists()


MISSING_ON_A_NODE = """import os
if os.environ.get("RANK") == "1":  # what a package missing on process 1's node does
    import fancy_lib_missing_here  # noqa: F401
"""


def test_a_process_that_ends_before_the_group_forms_is_one_line(ray_cluster, tiny_model_dir, tmp_path):
    """Process 1 fails to import a plugin on its node: process 0 stops at once, naming it and its error."""
    plugin = tmp_path / "node_plugin.py"
    plugin.write_text(MISSING_ON_A_NODE)
    run = tmp_path / "run"
    args = ["train", "--model", str(tiny_model_dir), "--output-dir", str(run), "--plugin", str(plugin)]
    code, out, err = finish(agentrl(*args, *on_ray(ray_cluster)))
    assert code == 2, out[-3000:] + err[-3000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert re.match(
        r"error: trainer process 1 on node \w+ \(.*\) exited with status 2 before the processes formed their "
        r"group: plugin '.*node_plugin.py': .*No module named 'fancy_lib_missing_here'",
        lines[0],
    ), err


@pytest.mark.timeout(900)
def test_a_dead_process_stops_the_run_sigterm_saves_kill_9_leaves_none_then_resume_equals_one(
    ray_cluster, shared, tmp_path
):
    """Process 1 killed after step 1: the run stops with one line naming it. ``--resume`` as that
    line says, stopped by SIGTERM to process 0 alone (process 1 learns of it from process 0): both
    stop at one step and save, exit 143. Resumed again, ``kill -9`` of process 0: no process of the
    run is left seconds later. Resumed once more, it finishes equal to one process."""
    args, one = shared
    run = tmp_path / "ray"
    driver = agentrl(*args, "--max-steps", str(STEPS), "--output-dir", str(run), *on_ray(ray_cluster))
    try:
        wait_for(lambda: (run / "checkpoints" / "step-000001" / "COMPLETE").exists(), driver, "step 1")
        subprocess_of(run, driver.pid).kill()
        killed = time.monotonic()
        code, out, err = finish(driver, timeout=300)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert code == 2, out[-3000:] + err[-3000:]
    assert time.monotonic() - killed < 90
    line = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(line) == 1 and re.match(r"error: trainer process 1 on node \w+ \(.*\) was killed by SIGKILL", line[0]), (
        err
    )
    hint = re.search(r"continue it from its last checkpoint with `([^`]+)`", line[0]).group(1)
    assert hint == f"agentrl train --resume {run} --ray --num-processes 2"
    none_left(run, within=10)
    for stop in (signal.SIGTERM, signal.SIGKILL):
        done = newest_checkpoint(run)
        assert done < STEPS
        resumed = agentrl(*hint.split()[1:])
        try:
            wait_for(lambda done=done: newest_checkpoint(run) > done, resumed, "a further checkpoint")
            assert subprocess_of(run, resumed.pid)
            resumed.send_signal(stop)  # to process 0 alone
            code, out, err = finish(resumed, timeout=300)
            none_left(run, within=10)
        finally:
            if resumed.poll() is None:
                resumed.kill()
        if stop == signal.SIGTERM:
            assert code == 143 and "interrupted after step" in err and f"continue with `{hint}`" in err, err[-3000:]
        else:
            assert code == -signal.SIGKILL
    code, out, err = finish(agentrl(*hint.split()[1:]))
    assert code == 0, out[-3000:] + err[-3000:]
    assert_same_run(one, run)


def test_one_process_on_ray_trains_here_and_accelerate_configs_are_refused(ray_cluster, tiny_model_dir, tmp_path):
    """``--ray`` without ``--num-processes``: one trainer process, this one (on the head node); with
    ``--accelerate-config``: one line, since Ray places the processes."""
    from cli_in_process import TINY, agentrl_in_process

    flags = ["train", "--model", str(tiny_model_dir), *TINY, "--set", "eval_tasks=0", "--ray"]
    flags += ["--set", f"ray.address={ray_cluster.address}"]
    done = agentrl_in_process(*flags, "--output-dir", str(tmp_path / "one"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    banner = re.search(r"^trainers: 0 on node (\w+) head \(", done.stdout, re.M)
    assert banner and ray_cluster.node_ids["head"].startswith(banner.group(1)), done.stdout[-3000:]
    refused = agentrl_in_process(
        *flags, "--num-processes", "2", "--accelerate-config", "ddp", "--output-dir", str(tmp_path / "two")
    )
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        "error: --accelerate-config with the ray section: Ray places the trainer processes (one per "
        "ray.trainer_resources); accelerate configs are for the processes of one host: drop one of them"
    ], refused.stderr
