"""Stopping a run on Ctrl-C, SIGTERM or SIGHUP without losing a finished step.

:class:`InterruptGuard` turns the signals into a stop at a safe point (at once during a rollout,
after the step's update and checkpoint during one); :func:`interruption` saves the last complete
step and says how to continue (:func:`agentrl.model.launch.resume_command`: with the flags the
run needs, ``--num-processes`` among them).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from agentrl.errors import TrainingInterrupted
from agentrl.model import distributed
from agentrl.model.launch import STOP_SIGNALS, detach_hung_up_terminal, resume_command
from agentrl.rundir import checkpoints as ckpt


class InterruptGuard:
    """Handling of :data:`STOP_SIGNALS` for a run: one raises KeyboardInterrupt at once, except
    inside a :meth:`deferred` unit (an update, its records and its checkpoint), where the first one
    is remembered (``pending``) and the unit completes; a second one there raises (``broke_unit``).
    Every one sets ``requested`` (``signum``: the first one): a KeyboardInterrupt raised inside a
    finalizer is swallowed by Python, so the loop also stops at the step's end when it sees the request.

    ``collective`` (several processes): a signal never raises, it only sets ``requested``; the
    processes agree after each rollout and at each step's end whether any of them saw one, and
    stop there together. Raising at once would leave the others waiting in (or pairing wrongly
    with) a collective operation the interrupted process never reaches."""

    def __init__(self, collective: bool = False) -> None:
        self.collective = collective
        self.pending = self.requested = self.broke_unit = self._deferring = False
        self.signum: int | None = None

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Install the handler (main thread only; elsewhere Python's defaults stay)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {signum: signal.signal(signum, self._handle) for signum in STOP_SIGNALS}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """A unit Ctrl-C does not break into (unless pressed twice)."""
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False

    def agreed(self) -> bool:
        """Whether any process saw a stop signal (every process calls it at the same point); one that
        saw none stops as if it had (its stop is the run's, not a KeyboardInterrupt of plugin code):
        only process 0 sees the signal when the others were not started by its launcher (Ray)."""
        agreed = any_process(self.requested)  # the same on every process, even if a signal comes now
        if agreed:
            self.requested = True
        return agreed

    def _handle(self, signum: int, frame: Any) -> None:
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        if signum == getattr(signal, "SIGHUP", None):
            detach_hung_up_terminal()  # so the messages below and the save do not fail writing to it
        if self.signum is None:
            self.signum = signum
        if self.collective:
            if not self.requested and distributed.is_main():  # one notice for the run
                warnings.warn(
                    f"{name}: every process stops at the end of this step's rollout or update, then saves a checkpoint",
                    RuntimeWarning,
                    stacklevel=2,
                )
            self.requested = True
            return
        self.requested = True  # seen at the step's end even if the raise below lands where it is swallowed
        if self._deferring and not self.pending:
            self.pending = True
            warnings.warn(
                f"{name}: stopping after this step's update, then saving a checkpoint (a second "
                f"{name} stops now without saving this step)",
                RuntimeWarning,
                stacklevel=2,
            )
            return
        self.broke_unit = self._deferring
        raise KeyboardInterrupt


def any_process(flag: bool) -> bool:
    """Whether ``flag`` is set on any process (the flag itself in a one-process run); every
    process must call it at the same point."""
    return any(distributed.gather_objects(bool(flag)))


def interruption(guard: InterruptGuard, step: int, run_dir: Path, save: Callable[[int], Path]) -> TrainingInterrupted:
    """What a stopped run raises: ``save`` checkpoints the last complete ``step`` (unless a second
    signal broke into an update or its checkpoint: then the newest complete checkpoint is what stays)."""
    signum = guard.signum or signal.SIGINT
    name = signal.Signals(signum).name
    resume = f"`{resume_command(run_dir)}`"
    if guard.broke_unit:
        how = f"stopped at once by a second signal ({name} first), before the step in progress was saved"
    elif step == 0:
        how = f"interrupted ({name}) before the first step completed"
    else:
        try:
            folder = save(step)
            return TrainingInterrupted(
                f"interrupted after step {step} ({name}); checkpoint {folder}; continue with {resume}",
                str(folder),
                signum,
            )
        except KeyboardInterrupt:  # a second signal: the checkpoint's temporary folder is gone
            how = f"stopped at once by a second signal ({name} first), before step {step}'s checkpoint was complete"
    latest = _latest_or_none(run_dir)
    if latest is None:
        return TrainingInterrupted(f"{how}; no checkpoint: {resume} starts the run over from step 0", None, signum)
    return TrainingInterrupted(
        f"{how}; the newest complete checkpoint is {latest}: continue with {resume}", latest, signum
    )


def _latest_or_none(run_dir: Path) -> str | None:
    found = ckpt.complete_checkpoints(run_dir)
    return str(found[-1]) if found else None
