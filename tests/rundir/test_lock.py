"""One writer per run dir (``agentrl.rundir.lock``): a second train or resume of a run dir that a live
process trains in is refused naming it; the lock of a killed holder is taken over with a note;
a holder on another host is refused with the fix; the lock goes when its holder stops. A lock
shared with launched processes is held until the last of them ends; a ``run.lock`` that is a
symbolic link is never followed."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.config.train import TrainConfig
from agentrl.errors import ConfigError, RunDirBusyError
from agentrl.plugins import load_plugins
from agentrl.rundir.lock import LOCK_FILE, RunLock, join, read_holder
from agentrl.training.trainer import Trainer

AGENTRL = [sys.executable, "-m", "agentrl"]
HOLD = """import sys, time
from agentrl.rundir.lock import RunLock
RunLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(600)
"""
"""A process that takes a run dir's lock and keeps it until it is killed."""


def _holder(run: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "held\n"
    return proc


SHARE = """import os, subprocess, sys, time
from agentrl.rundir.lock import SHARED_LOCK, RunLock, join
run = sys.argv[1]
lock = RunLock(run)
lock.acquire()
env = {**os.environ, SHARED_LOCK: lock.share()}
joiner = subprocess.Popen([sys.executable, "-c", JOIN, run], env=env, stdout=subprocess.PIPE, text=True)
assert joiner.stdout.readline() == "joined\\n"
print(joiner.pid, flush=True)
if sys.argv[2] == "release":
    lock.release()
    print("released", flush=True)
time.sleep(600)
"""
JOIN = """import os, sys, time
from agentrl.rundir.lock import SHARED_LOCK, join
join(sys.argv[1], os.environ[SHARED_LOCK])
print("joined", flush=True)
time.sleep(600)
"""
"""A process that takes a run dir's lock and shares it with a child of its own (which holds it
until it is killed); with ``release`` it then lets its own hold go."""


def _sharing(run: Path, then: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", f"JOIN = {JOIN!r}\n" + SHARE, str(run), then], stdout=subprocess.PIPE, text=True
    )
    joiner = int(proc.stdout.readline())
    if then == "release":
        assert proc.stdout.readline() == "released\n"
    return proc, joiner


def test_the_lock_names_its_holder_and_goes_with_it(tmp_path):
    run = tmp_path / "new" / "run"
    with RunLock(run) as lock:
        holder = read_holder(run / LOCK_FILE)
        assert holder is not None and (holder.pid, holder.host) == (os.getpid(), socket.gethostname())
        assert lock.note is None
    assert not (tmp_path / "new" / "run").exists()  # created for the lock alone, and still empty: removed
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("")
    with RunLock(run):
        pass
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl"]  # the run dir stays, the lock file goes


def test_a_live_holder_is_refused_and_a_killed_ones_lock_is_taken_over(tmp_path):
    run = tmp_path / "run"
    proc = _holder(run)
    try:
        named = f"is in use: pid {proc.pid} on host {socket.gethostname()}"
        with pytest.raises(RunDirBusyError, match=re.escape(named)):
            RunLock(run).acquire()
    finally:
        proc.send_signal(signal.SIGKILL)  # no handler runs: the file stays, the kernel frees the lock
        proc.wait()
    assert read_holder(run / LOCK_FILE).pid == proc.pid
    with RunLock(run) as lock:
        assert lock.note is not None
        assert f"stale lock {run / LOCK_FILE} of pid {proc.pid}" in lock.note and "no longer runs" in lock.note
        assert read_holder(run / LOCK_FILE).pid == os.getpid()


def test_a_lock_left_by_another_host_is_refused_with_the_fix(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_FILE).write_text(json.dumps({"pid": 4242, "host": "node-7", "started": "2026-01-01T00:00:00"}))
    with pytest.raises(
        RunDirBusyError,
        match=r"locked by pid 4242 on host node-7 .*if that run no longer runs, "
        r"delete .*run\.lock",
    ):
        RunLock(run).acquire()
    assert read_holder(run / LOCK_FILE).host == "node-7"  # left as it was


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_read_only_run_dir_is_one_line_naming_the_path(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    run.chmod(0o555)
    try:
        with pytest.raises(ConfigError, match=re.escape(f"cannot write the run dir's lock file '{run / LOCK_FILE}'")):
            RunLock(run).acquire()
    finally:
        run.chmod(0o755)


def test_a_lock_file_that_cannot_be_opened_is_one_line_naming_the_path(tmp_path):
    run = tmp_path / "run"
    (run / LOCK_FILE).mkdir(parents=True)  # a folder where the lock file goes (root writes anywhere)
    with pytest.raises(
        ConfigError, match=re.escape(f"cannot write the run dir's lock file '{run / LOCK_FILE}' (Is a directory)")
    ):
        RunLock(run).acquire()


def test_a_second_resume_or_train_of_a_running_run_is_refused_naming_the_holder(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    Trainer(
        TrainConfig(
            model=str(tiny_model_dir),
            max_steps=1,
            prompts_per_step=2,
            num_generations=2,
            max_new_tokens=8,
            eval_tasks=0,
            checkpoint_every=1,
            warmup_steps=0,
            output_dir=str(run),
        ),
        load_plugins(),
    ).train()
    first = subprocess.Popen(
        [*AGENTRL, "train", "--resume", str(run), "--max-steps", "500"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while (holder := read_holder(run / LOCK_FILE)) is None or holder.pid != first.pid:
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()[1][-3000:]
            time.sleep(0.05)
        named = f"is in use: pid {first.pid} on host {socket.gethostname()}"
        second = subprocess.run(
            [*AGENTRL, "train", "--resume", str(run), "--max-steps", "500"], capture_output=True, text=True, timeout=300
        )
        assert second.returncode == 2 and named in second.stderr, second.stderr[-3000:]
        assert f"kill -TERM {first.pid}" in second.stderr
        fresh = subprocess.run(
            [*AGENTRL, "train", "--model", str(tiny_model_dir), "--output-dir", str(run)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert fresh.returncode == 2 and named in fresh.stderr, fresh.stderr[-3000:]
        assert first.poll() is None  # the first one trains on
        # SIGTERM once it has trained a step of its own: its handler is in place by then (a signal
        # during start-up ends the process by the default action, exit -15, with nothing to save;
        # the refusals above now come back fast enough for that window to be hit)
        metrics = run / "metrics.jsonl"
        while len(metrics.read_text().splitlines()) < 2:
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()[1][-3000:]
            time.sleep(0.05)
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 143, err[-3000:]
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, len(steps) + 1))  # one writer: every step once
    assert not (run / LOCK_FILE).exists()


def test_a_shared_lock_is_held_until_the_last_process_holding_it_has_ended(tmp_path):
    """The top process of a run is killed (SIGKILL: nothing of it runs any more) while a process
    it shared the lock with still runs: the run dir stays locked, named as the ended top
    process's run, until that process ends too; then the stale file is taken over."""
    run = tmp_path / "run"
    top, joiner = _sharing(run, "keep")
    try:
        top.kill()
        top.wait()
        with pytest.raises(RunDirBusyError, match=re.escape(f"is in use: a process started by pid {top.pid} on host")):
            RunLock(run).acquire()
    finally:
        os.kill(joiner, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while True:  # the joiner is the killed top's child: reparented and reaped by init
        try:
            with RunLock(run) as lock:
                assert lock.note is not None and f"of pid {top.pid}" in lock.note
            break
        except RunDirBusyError:
            assert time.monotonic() < deadline, "the lock stayed held after every holder was killed"
            time.sleep(0.05)


def test_a_shared_lock_released_by_its_taker_stays_with_the_others_and_its_file_too(tmp_path):
    """The process that took and shared the lock lets it go while the process it shared it with
    still runs: the lock file stays (naming the taker) and a second train is refused; once that
    process ends, the lock is free."""
    run = tmp_path / "run"
    top, joiner = _sharing(run, "release")
    try:
        assert read_holder(run / LOCK_FILE).pid == top.pid  # not deleted: another holder remains
        with pytest.raises(RunDirBusyError, match="is in use"):
            RunLock(run).acquire()
        os.kill(joiner, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while psutil_alive(joiner):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with RunLock(run) as lock:
            assert lock.note is not None and "whose pid is now another process's" in lock.note  # top runs on
    finally:
        top.kill()
        top.wait()


def psutil_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has closed its files: it holds no lock)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_lock_shared_for_another_run_dir_is_refused(tmp_path):
    with RunLock(tmp_path / "one") as lock:
        address = lock.share()
        (tmp_path / "two").mkdir()
        (tmp_path / "two" / LOCK_FILE).write_text("")
        with pytest.raises(ConfigError, match="belongs to another run dir"):
            join(tmp_path / "two", address)
    with pytest.raises(ConfigError, match="with the process that launched this one .*: it has ended"):
        join(tmp_path / "one", address)  # no longer shared


def test_a_symlinked_lock_file_is_never_followed(tmp_path):
    """``run.lock`` pointing at a file elsewhere (or at one that does not exist): one line naming
    the link; the file it points to is neither written, truncated nor created."""
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_FILE).symlink_to(precious)
    with pytest.raises(
        ConfigError, match=re.escape(f"lock file '{run / LOCK_FILE}' is a symbolic link (to '{precious}')")
    ):
        RunLock(run).acquire()
    assert precious.read_text() == "keep me\n"
    assert read_holder(run / LOCK_FILE) is None  # nor read through
    (run / LOCK_FILE).unlink()
    (run / LOCK_FILE).symlink_to(tmp_path / "missing")
    with pytest.raises(ConfigError, match="is a symbolic link"):
        RunLock(run).acquire()
    assert not (tmp_path / "missing").exists()


def test_resume_of_a_run_dir_whose_lock_is_a_symlink_leaves_the_target_alone(tmp_path):
    """``agentrl train --resume`` of such a run dir: exit 2, one line, the target untouched."""
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_FILE).symlink_to(precious)
    done = subprocess.run([*AGENTRL, "train", "--resume", str(run)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "is a symbolic link" in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert precious.read_text() == "keep me\n"


def test_a_lock_file_that_is_a_fifo_is_refused_without_waiting(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / LOCK_FILE)
    assert read_holder(run / LOCK_FILE) is None
    with pytest.raises(ConfigError, match="is not a regular file"):
        RunLock(run).acquire()
