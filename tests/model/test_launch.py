"""The processes of a multi-process run end with the one that started them (``die_with_parent``:
the kernel's parent-death signal, and a thread that watches the parent's id), and the command
printed to continue a stopped run carries the flags it needs (``resume_flags``)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from agentrl.model.launch import PARENT_PID, RESUME_FLAGS, resume_command, resume_flags

CHAIN = """import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", CHILD], env={**os.environ, "AGENTRL_PARENT_PID": str(os.getpid())},
                         stdout=subprocess.PIPE, text=True)
assert child.stdout.readline() == "ready\\n"
print(child.pid, flush=True)
time.sleep(600)
"""
"""A parent that starts a child running CHILD, prints the child's pid and sleeps until killed."""
BY_PRCTL = """import time
from agentrl.model.launch import die_with_parent
die_with_parent()
print("ready", flush=True)
time.sleep(600)
"""
BY_WATCHER = """import os, threading, time
from agentrl.model import launch
threading.Thread(target=launch._watch_parent, args=(int(os.environ["AGENTRL_PARENT_PID"]),), daemon=True).start()
print("ready", flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("child", [BY_PRCTL, BY_WATCHER], ids=["prctl", "watcher"])
def test_a_child_ends_when_its_parent_is_killed(child):
    """SIGKILL to the parent (no handler of it runs): its child is gone within seconds, by the
    kernel's parent-death signal, or by the thread that sees its parent id change (where prctl is
    missing)."""
    parent = subprocess.Popen([sys.executable, "-c", f"CHILD = {child!r}\n" + CHAIN], stdout=subprocess.PIPE, text=True)
    pid = int(parent.stdout.readline())
    try:
        assert _alive(pid)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 5
        while _alive(pid):
            assert time.monotonic() < deadline, "the child outlived its parent"
            time.sleep(0.05)
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_process_whose_parent_ended_before_it_asked_ends_at_once():
    """The parent named in the environment is not this process's parent any more (it ended while
    this one started): the process ends itself instead of running on as an orphan."""
    done = subprocess.run(
        [sys.executable, "-c", "from agentrl.model.launch import die_with_parent; die_with_parent(); print('ran on')"],
        env={**os.environ, PARENT_PID: "1"},  # never the parent of a process started here
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -signal.SIGKILL and "ran on" not in done.stdout


def _flags(monkeypatch, given: dict, num_processes: int | None = None, accelerate_config: str | None = None) -> str:
    monkeypatch.delenv(RESUME_FLAGS, raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with resume_flags(given, num_processes, accelerate_config):
        command = resume_command(Path("runs/my run"))
    assert RESUME_FLAGS not in os.environ  # restored
    return command


def test_the_resume_command_carries_the_flags_the_run_needs(monkeypatch):
    assert _flags(monkeypatch, {}) == "agentrl train --resume 'runs/my run'"
    assert (
        _flags(monkeypatch, {"--plugin": ["my plugin.py"], "--disable-plugin": ["math_env"]}, 2, "fsdp")
        == "agentrl train --resume 'runs/my run' --num-processes 2 --accelerate-config fsdp "
        "--plugin 'my plugin.py' --disable-plugin math_env"
    )
    # a resume trained longer: config.yaml keeps the first max_steps, so the hint names the new one
    assert _flags(monkeypatch, {"--resume": "runs/my run", "--max-steps": 80}).endswith("--max-steps 80")
    assert "--max-steps" not in _flags(monkeypatch, {"--max-steps": 80})  # a new run's is in its config.yaml
    assert shlex.split(_flags(monkeypatch, {}))[3] == "runs/my run"


def test_launched_processes_keep_their_launchers_resume_flags_and_hand_started_ones_count_themselves(monkeypatch):
    monkeypatch.setenv(RESUME_FLAGS, "--num-processes 4")
    with resume_flags({"--plugin": ["x.py"]}, None, None):
        assert resume_command("run").endswith("--resume run --num-processes 4")
    assert os.environ[RESUME_FLAGS] == "--num-processes 4"
    monkeypatch.delenv(RESUME_FLAGS)
    monkeypatch.setenv("WORLD_SIZE", "2")  # accelerate launch -m agentrl train, by hand
    with resume_flags({}, None, None):
        assert resume_command("run") == "agentrl train --resume run --num-processes 2"
