"""Launches that would not make one run of as many processes as asked on this host are refused at
start-up, in one line, with exit status 2 and nothing left in the run dir (the real CLI, in a
subprocess): an accelerate config for several machines (agentrl's launcher starts processes on
this host only), one whose accelerate launcher starts a single process (``MULTI_CPU``, ``NO``) for
``--num-processes 2``, a process agentrl's launcher meant as one of 2 that sees a world of 1, and
``accelerate launch`` by hand with a config that starts one process per machine. Before these
checks each of them trained silently as separate one-process runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

LAUNCH_VARIABLES = (
    "AGENTRL_LAUNCHED",
    "AGENTRL_NUM_PROCESSES",
    "AGENTRL_PARENT_PID",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PMI_SIZE",
    "OMPI_COMM_WORLD_SIZE",
    "MV2_COMM_WORLD_SIZE",
    "ACCELERATE_DYNAMO_BACKEND",
)

ONE_HOST = (
    "agentrl's launcher starts processes on this host only; for several machines use --ray "
    "(docs/guides/multi-node.md) or `torchrun --nnodes` on each machine (docs/guides/scaling.md)"
)


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any launcher's variables (the test may run under one), plus ``extra``."""
    env = {key: value for key, value in os.environ.items() if key not in LAUNCH_VARIABLES}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def train_args(model: Path, run_dir: Path) -> list[str]:
    return [
        "train",
        "--env",
        "math",
        "--model",
        str(model),
        "--prompts-per-step",
        "2",
        "--num-generations",
        "2",
        "--max-steps",
        "1",
        "--set",
        "eval_tasks=0",
        "--set",
        "precision=fp32",
        "--output-dir",
        str(run_dir),
    ]


def accelerate_config(folder: Path, **settings: object) -> Path:
    """An accelerate config file with accelerate's usual keys and ``settings`` over them."""
    values: dict[str, object] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "MULTI_GPU",
        "num_machines": 1,
        "num_processes": 2,
        "mixed_precision": "no",
        "dynamo_backend": "no",
        **settings,
    }
    path = folder / "accelerate.yaml"
    path.write_text(yaml.safe_dump({key: value for key, value in values.items() if value is not None}))
    return path


def assert_refused(result: subprocess.CompletedProcess[str], message: str, run_dir: Path) -> None:
    """Exit status 2, one stderr line holding ``message``, no traceback, no run dir."""
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert not run_dir.exists(), sorted(p.name for p in run_dir.iterdir())


@pytest.mark.parametrize(
    ("settings", "processes", "message"),
    [
        (
            {"num_machines": 2, "machine_rank": 0, "main_process_ip": "127.0.0.1", "main_process_port": 29555},
            ["--num-processes", "2"],
            f"sets num_machines: 2, but {ONE_HOST}",
        ),
        (  # accelerate's MULTI_CPU launcher would run one process on each machine
            {"distributed_type": "MULTI_CPU", "num_machines": 2, "main_process_ip": "127.0.0.1"},
            [],
            f"sets num_machines: 2, but {ONE_HOST}",
        ),
        (
            {"distributed_type": "MULTI_CPU"},
            ["--num-processes", "2"],
            "sets distributed_type: MULTI_CPU, for which accelerate starts one process on this host "
            "(it expects mpirun), not 2: use distributed_type: MULTI_GPU",
        ),
        (
            {"distributed_type": None},
            ["--num-processes", "2"],
            "sets distributed_type: NO, for which accelerate starts one process on this host",
        ),
    ],
    ids=["two-machines", "multi-cpu-two-machines", "multi-cpu", "no-distributed-type"],
)
def test_an_accelerate_config_that_is_not_one_run_on_this_host_is_refused(
    settings: dict[str, object], processes: list[str], message: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    config = accelerate_config(tmp_path, **settings)
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "agentrl", *train_args(tiny_model_dir, run_dir), "--accelerate-config", str(config)]
        + processes,
        capture_output=True,
        text=True,
        timeout=300,
        env=clean_env(),
    )
    assert_refused(result, message, run_dir)
    assert f"--accelerate-config {str(config)!r}" in result.stderr


def test_a_launched_process_that_is_not_one_of_as_many_as_meant_is_refused(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A process agentrl's launcher started as one of 2 (``AGENTRL_NUM_PROCESSES``) that no launcher
    joined to the others (no ``WORLD_SIZE``): whatever started it so, it does not train alone."""
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "agentrl", *train_args(tiny_model_dir, run_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        env=clean_env(AGENTRL_LAUNCHED="1", AGENTRL_NUM_PROCESSES="2"),
    )
    assert_refused(
        result,
        "agentrl's launcher started this run in 2 processes, but this one sees a world of 1 (WORLD_SIZE=unset)",
        run_dir,
    )


def test_accelerate_launch_by_hand_with_one_process_per_machine_is_refused(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """``accelerate launch`` with a two-machine MULTI_CPU config starts one process here (it leaves
    the rest to mpirun); that process refuses instead of training as a run of its own. accelerate
    then reports the exit status its own way (status 1 and its traceback), after agentrl's line."""
    config = accelerate_config(
        tmp_path, distributed_type="MULTI_CPU", num_machines=2, main_process_ip="127.0.0.1", main_process_port=29555
    )
    run_dir = tmp_path / "run"
    accelerate = Path(sys.executable).with_name("accelerate")
    result = subprocess.run(
        [
            str(accelerate),
            "launch",
            "--config_file",
            str(config),
            "-m",
            "agentrl",
            *train_args(tiny_model_dir, run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=clean_env(),
    )
    assert result.returncode != 0 and "returned non-zero exit status 2" in result.stderr, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert (
        "accelerate launch started this process for several processes or machines (MASTER_ADDR=127.0.0.1) but "
        "alone (no WORLD_SIZE)" in errors[0]
    )
    assert "training" not in result.stdout and not run_dir.exists()
