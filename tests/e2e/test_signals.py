"""SIGTERM and SIGHUP stop a run as Ctrl-C does: the step in progress is finished (update,
checkpoint) or rewound (rollout), the last complete step is checkpointed, the exit status is
128 + the signal, and ``--resume`` continues to the uninterrupted run bit for bit. A second
signal during a checkpoint write leaves the older checkpoint intact. In a run of two processes a
SIGTERM to the top process stops every process at one step boundary (none left running, no
torchrun traceback) and the command it prints continues the run; a SIGKILL to it ends every
process within seconds, and the run dir stays locked until the last one has ended.
A run that stopped before its first checkpoint starts over with ``--resume``."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch
from cli_in_process import agentrl_in_process
from safetensors.torch import load_file

from agentrl.config.train import TrainConfig
from agentrl.errors import ConfigError, RunDirBusyError, TrainingInterrupted
from agentrl.plugins import load_plugins
from agentrl.rundir.checkpoints import complete_checkpoints
from agentrl.rundir.directory import refuse_existing_run, resume_config, start_over_config
from agentrl.rundir.lock import LOCK_FILE, RunLock
from agentrl.testing import LOCKSTEP_ARGS, lockstep_plugins
from agentrl.training.trainer import Trainer

# A plugin with state of its own (a counter logged every step) that sends this process a signal at
# the places AGENTRL_TEST_SIGNAL_IN lists: "rollout@3" (step 3's rollout), "update@3" (step 3's
# records, inside its update unit), "checkpoint@3" (writing the checkpoint after step 3); a place
# listed twice sends two signals there.
SIGNAL_PLUGIN = """
import os, signal
from agentrl import hookimpl

calls = {"n": 0}
SIGNUM = getattr(signal, os.environ.get("AGENTRL_TEST_SIGNAL", "SIGTERM"))
PLACES = [p for p in os.environ.get("AGENTRL_TEST_SIGNAL_IN", "").split(",") if p]

def send(place, step):
    for _ in range(PLACES.count(f"{place}@{step}")):
        os.kill(os.getpid(), SIGNUM)

@hookimpl
def agentrl_on_rollout_end(trajectories, step, metrics):
    send("rollout", step)

@hookimpl
def agentrl_on_step_end(step, metrics):
    calls["n"] += 1
    metrics["custom/calls"] = float(calls["n"])
    send("update", step)

@hookimpl
def agentrl_save_state(state):
    state["counter"] = dict(calls)
    send("checkpoint", calls["n"])  # the checkpoint of the step just completed

@hookimpl
def agentrl_load_state(state):
    calls.update(state["counter"])
"""


def _config(model_dir: Path, out: Path, **overrides) -> TrainConfig:
    base = dict(
        model=str(model_dir),
        max_steps=4,
        prompts_per_step=2,
        num_generations=3,
        max_new_tokens=8,
        eval_tasks=4,
        eval_every=2,
        output_dir=str(out),
        log_completions_every=1,
        checkpoint_every=1,
        keep_checkpoints=2,
        lr_scheduler="cosine",
        warmup_steps=1,
        learning_rate=1e-3,
        plugins=lockstep_plugins(),
    )
    return TrainConfig(**{**base, **overrides})


def _manager(folder: Path):
    """A fresh copy of the signal plugin (a file per folder: each is its own module)."""
    folder.mkdir()
    plugin = folder / "signal_plugin.py"
    plugin.write_text(SIGNAL_PLUGIN)
    return load_plugins(modules=[str(plugin)])


def _lines(run_dir: Path) -> list[dict]:
    """metrics.jsonl rows without the timing figures (which differ between any two runs)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in rows]


def _assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa and wa.keys() == wb.keys()
    for key in wa:
        assert torch.equal(wa[key], wb[key]), key


@pytest.fixture(scope="module")
def straight(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run every interrupted one must equal."""
    root = tmp_path_factory.mktemp("straight")
    Trainer(_config(tiny_model_dir, root / "run"), _manager(root / "plugin")).train()
    return root / "run"


def _interrupt_then_resume(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signame: str, places: str, **overrides
) -> TrainingInterrupted:
    """Train with the signal plugin sending ``signame`` at ``places``, then resume to the end."""
    run = tmp_path / "run"
    monkeypatch.setenv("AGENTRL_TEST_SIGNAL", signame)
    monkeypatch.setenv("AGENTRL_TEST_SIGNAL_IN", places)
    with pytest.raises(TrainingInterrupted) as info:
        Trainer(_config(tiny_model_dir, run, **overrides), _manager(tmp_path / "a")).train()
    assert not (run / "model").exists()  # no final export from an interrupted run
    monkeypatch.delenv("AGENTRL_TEST_SIGNAL_IN")
    config, checkpoint = resume_config(run)
    assert str(checkpoint) == info.value.checkpoint
    Trainer(config, _manager(tmp_path / "b"), resume=checkpoint).train()
    return info.value


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
@pytest.mark.parametrize(("place", "saved"), [("rollout", 2), ("update", 3), ("checkpoint", 3)])
def test_signal_then_resume_equals_straight_bit_for_bit(
    tiny_model_dir, tmp_path, monkeypatch, straight, signame, place, saved
):
    """A rollout is dropped (the step rewound); an update and a checkpoint write are finished."""
    stopped = _interrupt_then_resume(tiny_model_dir, tmp_path, monkeypatch, signame, f"{place}@3")
    run = tmp_path / "run"
    assert stopped.signum == getattr(signal, signame)
    assert stopped.checkpoint == str(run / "checkpoints" / f"step-{saved:06d}")
    assert f"interrupted after step {saved} ({signame})" in str(stopped) and f"--resume {run}" in str(stopped)
    assert _lines(run) == _lines(straight)  # every step once, identical values, the plugin's counter included
    assert [row["custom/calls"] for row in _lines(run) if "custom/calls" in row] == [1.0, 2.0, 3.0, 4.0]
    _assert_same_weights(straight / "model", run / "model")
    assert (run / "completions.jsonl").read_text() == (straight / "completions.jsonl").read_text()


def test_second_signal_during_a_checkpoint_write_keeps_the_older_one(tiny_model_dir, tmp_path, monkeypatch, straight):
    """The first SIGTERM is deferred to the step's end; the second breaks step 3's checkpoint,
    whose temporary folder goes: step 2's stays, is named, and resumes to the straight run."""
    stopped = _interrupt_then_resume(tiny_model_dir, tmp_path, monkeypatch, "SIGTERM", "checkpoint@3,checkpoint@3")
    run = tmp_path / "run"
    assert stopped.checkpoint == str(run / "checkpoints" / "step-000002")
    assert "second signal (SIGTERM first)" in str(stopped) and "step-000002" in str(stopped)
    assert _lines(run) == _lines(straight)
    _assert_same_weights(straight / "model", run / "model")


def test_second_signal_during_the_interrupted_save_keeps_the_older_one(tiny_model_dir, tmp_path, monkeypatch, straight):
    """SIGHUP in step 4's rollout: the run saves step 3 (checkpoints every 2 steps: none yet); a
    second SIGHUP while that is written leaves step 2's checkpoint, from which resume is exact."""
    stopped = _interrupt_then_resume(
        tiny_model_dir, tmp_path, monkeypatch, "SIGHUP", "rollout@4,checkpoint@3", checkpoint_every=2
    )
    run = tmp_path / "run"
    assert stopped.checkpoint == str(run / "checkpoints" / "step-000002")
    assert "before step 3's checkpoint was complete" in str(stopped)
    assert _lines(run) == _lines(straight)
    _assert_same_weights(straight / "model", run / "model")


AGENTRL = [sys.executable, "-m", "agentrl"]
TINY = [
    "--num-generations",
    "2",
    "--prompts-per-step",
    "2",
    "--set",
    "max_new_tokens=8",
    "--set",
    "eval_tasks=0",
    *LOCKSTEP_ARGS,
]


def _wait_for_steps(proc: subprocess.Popen, run: Path, steps: int, timeout: float = 300) -> None:
    """Until ``run``'s metrics.jsonl holds ``steps`` lines (the process must still run)."""
    metrics, deadline = run / "metrics.jsonl", time.monotonic() + timeout
    while not (metrics.is_file() and metrics.read_text().count("\n") >= steps):
        assert proc.poll() is None, (proc.communicate()[1] or "")[-3000:]
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.05)


@pytest.mark.parametrize(("signame", "code"), [("SIGTERM", 143), ("SIGHUP", 129)])
def test_cli_saves_says_how_to_resume_and_exits_with_the_signals_code(tiny_model_dir, tmp_path, signame, code):
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [
            *AGENTRL,
            "train",
            "--model",
            str(tiny_model_dir),
            "--max-steps",
            "50",
            *TINY,
            "--set",
            "checkpoint_every=0",
            "--output-dir",
            str(run),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for_steps(proc, run, 1)
    proc.send_signal(getattr(signal, signame))
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == code, err[-3000:]
    step = len(_lines(run))
    assert f"interrupted after step {step} ({signame})" in err and f"--resume {run}" in err
    assert complete_checkpoints(run)[-1].name == f"step-{step:06d}"  # saved although checkpoint_every=0
    assert not (run / "run.lock").exists()  # the lock went with the process


def _in_a_terminal_of_its_own() -> None:
    """In the child before exec: a new session whose controlling terminal is its stdin (a pty)."""
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def test_closing_the_terminal_saves_and_exits_129(tiny_model_dir, tmp_path):
    """The terminal a run prints to closes (the kernel sends SIGHUP; every write to it fails now):
    the run still saves its last step, drops its lock and exits 129."""
    run = tmp_path / "run"
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [
            *AGENTRL,
            "train",
            "--model",
            str(tiny_model_dir),
            "--max-steps",
            "50",
            *TINY,
            "--set",
            "checkpoint_every=0",
            "--output-dir",
            str(run),
        ],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        preexec_fn=_in_a_terminal_of_its_own,
    )
    os.close(slave)
    drain = threading.Thread(target=lambda: _read_until_closed(master), daemon=True)  # a terminal shows it all
    drain.start()
    try:
        _wait_for_steps(proc, run, 1)
    finally:
        os.close(master)  # the terminal goes away
    assert proc.wait(timeout=300) == 129
    step = len(_lines(run))
    assert complete_checkpoints(run)[-1].name == f"step-{step:06d}"
    assert not (run / "run.lock").exists()


def _read_until_closed(fd: int) -> None:
    with contextlib.suppress(OSError):
        while os.read(fd, 4096):
            pass


def test_run_stopped_before_its_first_checkpoint_starts_over_with_resume(tiny_model_dir, tmp_path):
    """Killed (SIGKILL: no handler runs) after 2 steps of a run without periodic checkpoints: a
    fresh start into its dir (taking over the dead process's lock) points to --resume, and --resume
    starts it over from step 0, keeping the stopped attempt's files; the steps come out the same
    as the first time."""
    run = tmp_path / "run"
    args = ["--model", str(tiny_model_dir), *TINY, "--set", "checkpoint_every=0", "--set", "log_completions_every=1"]
    proc = subprocess.Popen(
        [*AGENTRL, "train", *args, "--max-steps", "3", "--output-dir", str(run)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for_steps(proc, run, 2)
    proc.kill()
    proc.communicate()
    first = _lines(run)
    assert len(first) >= 2 and not complete_checkpoints(run) and (run / "run.lock").exists()

    # The fresh start and the resume run in this process: what they do is no process's test.
    again = agentrl_in_process("train", *args, "--max-steps", "3", "--output-dir", str(run))
    assert again.returncode == 2 and f"continue it with `agentrl train --resume {run}`" in again.stderr
    assert f"took over the stale lock {run / 'run.lock'} of pid {proc.pid}" in again.stdout  # the killed one's

    resumed = agentrl_in_process("train", "--resume", str(run))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "starting it over from step 0" in resumed.stdout
    (kept,) = run.glob("unfinished-*")
    assert kept.name in resumed.stdout and _lines(kept) == first  # nothing the stopped attempt wrote is lost
    assert [row["step"] for row in _lines(run)] == [1, 2, 3]
    assert _lines(run)[:2] == first[:2]  # the same steps again
    assert (run / "model").is_dir() and not (run / "run.lock").exists()


def test_a_finished_run_without_checkpoints_sends_both_ways_to_another_dir(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    Trainer(
        _config(tiny_model_dir, run, max_steps=1, eval_tasks=0, checkpoint_every=0, warmup_steps=0), load_plugins()
    ).train()
    with pytest.raises(ConfigError, match="finished without a checkpoint .* another --output-dir"):
        start_over_config(run)
    with pytest.raises(ConfigError, match="finished run .* no checkpoint to continue from .* another --output-dir"):
        refuse_existing_run(run)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.timeout(900)
def test_sigterm_to_the_top_of_a_two_process_run_stops_every_process(tiny_model_dir, tmp_path):
    """``kill -TERM`` to ``agentrl train --num-processes 2`` alone (not its group): the launcher and
    both training processes stop at one step boundary, the last complete step is saved, nothing is
    left running, the exit status is 143, the terminal shows one ``interrupted:`` line (no
    torchrun traceback or notices), and the command it names, run as printed, continues the run
    in two processes to the one-process result."""
    from test_multiprocess import assert_same_run, common, metric_rows, one_process

    args = common(tiny_model_dir, tmp_path, "grpo", "checkpoint_every=0")
    one = tmp_path / "one"
    one_process(*args, "--max-steps", "3", "--output-dir", str(one))
    two = tmp_path / "two"
    top = subprocess.Popen(
        [*AGENTRL, *args, "--max-steps", "3", "--output-dir", str(two), "--num-processes", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "AGENTRL_LAUNCHED": ""},
    )
    family: list[psutil.Process] = []
    try:
        _wait_for_steps(top, two, 1, timeout=600)  # step 1 is written; steps 2 and 3 take seconds each
        family = psutil.Process(top.pid).children(recursive=True)
        assert len([p for p in family if "agentrl" in " ".join(p.cmdline())]) >= 3  # launcher + 2 processes
        top.send_signal(signal.SIGTERM)  # to the top process alone, as `kill -TERM PID` or `timeout` does
        _, err = top.communicate(timeout=300)
        time.sleep(1)
        assert [p.pid for p in family if _alive(p.pid)] == []  # nothing left running
    finally:
        for p in [top, *family]:
            if _alive(p.pid):
                p.kill()
    assert top.returncode == 143, err[-3000:]
    step = len(metric_rows(two))
    assert f"interrupted after step {step} (SIGTERM)" in err, err[-3000:]
    assert "Traceback" not in err and "death signal" not in err and err.count("interrupted:") == 1, err[-3000:]
    assert complete_checkpoints(two)[-1].name == f"step-{step:06d}"
    assert not (two / LOCK_FILE).exists()  # every holder ended, the last one deleted it
    hint = re.search(r"continue with `([^`]+)`", err).group(1)
    assert hint == f"agentrl train --resume {two} --num-processes 2"
    program, *hint_args = shlex.split(hint)
    assert program == "agentrl"
    resumed = subprocess.run(  # as printed: `agentrl` is this interpreter's
        [*AGENTRL, *hint_args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "AGENTRL_LAUNCHED": ""},
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_run(one, two)


def _lock_held(run: Path) -> bool:
    """Whether a process holds ``run``'s lock (the flock the CLI's RunLock is refused by), found
    without taking it over: the killed run's stale file stays for the resume below to report."""
    fd = os.open(run / LOCK_FILE, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # lets the probe's own lock go
    return False


@pytest.mark.timeout(900)
def test_kill_9_of_the_top_of_a_two_process_run_ends_every_process_and_the_lock_goes_last(tiny_model_dir, tmp_path):
    """``kill -9`` of ``agentrl train --num-processes 2`` (no handler of it runs): the launcher and
    both training processes end within seconds (none trains on beside a new run); until the last
    has ended the run dir is locked (each holds the top process's lock; a --resume is refused),
    and then a --resume starts it over, taking over the killed run's stale lock."""
    run = tmp_path / "run"
    log = tmp_path / "err.txt"
    with log.open("w") as err:
        top = subprocess.Popen(
            [*AGENTRL, "train", "--model", str(tiny_model_dir), "--max-steps", "500", *TINY]
            + ["--set", "checkpoint_every=0", "--output-dir", str(run), "--num-processes", "2"],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, "AGENTRL_LAUNCHED": ""},
        )
    family: list[psutil.Process] = []
    try:
        _wait_for_steps(top, run, 1, timeout=600)
        (launcher,) = psutil.Process(top.pid).children()
        workers = launcher.children()  # torchrun's training processes, each in a session of its own
        assert "agentrl.model.launcher" in launcher.cmdline() and len(workers) == 2, [p.cmdline() for p in workers]
        family = [launcher, *workers]
        for worker in workers:  # each holds the lock file open (the top process's lock, shared)
            assert str(run / LOCK_FILE) in [f.path for f in worker.open_files()]
        with pytest.raises(RunDirBusyError, match=f"is in use: pid {top.pid} "):
            RunLock(run).acquire()
        top.kill()
        top.wait()
        killed = time.monotonic()
        while alive := [p.pid for p in family if _alive(p.pid)]:
            # refused while any process of the run lives; free (below) only after they have all ended
            assert _lock_held(run) or not [p.pid for p in family if _alive(p.pid)], alive
            assert time.monotonic() - killed < 5, f"still running 5 s after the kill: {alive}"
            time.sleep(0.02)
    finally:
        for p in [top, *family]:
            if _alive(p.pid):
                p.kill()
    while _lock_held(run):  # a process's threads may still be exiting when its main one is a zombie
        assert time.monotonic() - killed < 10, "the lock stayed held after every process of the run ended"
        time.sleep(0.02)
    resumed = agentrl_in_process("train", "--resume", str(run), "--max-steps", "1")  # no process's test
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"took over the stale lock {run / LOCK_FILE} of pid {top.pid}" in resumed.stdout, log.read_text()[-3000:]
    assert "starting it over from step 0" in resumed.stdout
