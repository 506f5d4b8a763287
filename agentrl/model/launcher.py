"""The launcher of ``agentrl train --num-processes N``: ``python -m agentrl.model.launcher ARGS`` is
``accelerate launch ARGS`` (torchrun inside it), run so that the run ends as one.

It ends when the ``agentrl train`` that started it ends (:func:`agentrl.model.launch.die_with_parent`),
and the training processes end with it. A stop signal (forwarded by the top process) stops the
training processes at one step boundary and then ends this process with 128 + the signal, without
torchrun's traceback; a training process that fails is reported in one line (its own error is
already on the terminal) instead of torchrun's report, and its exit status is this process's.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from typing import Any

from agentrl.model.launch import PARENT_PID, STOP_SIGNALS, die_with_parent


def main() -> None:
    """``accelerate launch`` with this process's arguments; exits with the run's status."""
    die_with_parent()
    os.environ[PARENT_PID] = str(os.getpid())  # the processes started below end with this one
    import torch.distributed.run  # noqa: F401  (its loggers exist from here on)
    from accelerate.commands.launch import main as accelerate_launch
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    _quiet_torchrun()
    for signum in STOP_SIGNALS:  # torchrun puts its own in place as it starts the processes
        signal.signal(signum, _stop_before_start)
    try:
        accelerate_launch()
    except SignalException as exc:  # torchrun stopped the processes (they saved) and waited for them
        sys.exit(128 + int(exc.sigval))
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        sys.exit(_status(failure.exitcode, f"training process {rank} (pid {failure.pid})"))
    except subprocess.CalledProcessError as exc:  # accelerate's launcher of one process
        sys.exit(_status(exc.returncode, "the training process"))


def _stop_before_start(signum: int, frame: Any) -> None:
    """A stop signal before torchrun handles them: end now when nothing was started yet; otherwise
    (accelerate's launcher of one process: the process got the signal with this one's group) wait
    for it to stop."""
    import psutil  # accelerate's own dependency

    if not psutil.Process().children():
        raise SystemExit(128 + signum)


def _status(code: int, who: str) -> int:
    """The shell's exit status for a process's ``code``: one line on stderr when a signal ended it
    (nothing else says so; an exit status comes after the process's own error)."""
    if code >= 0:
        return code
    name = signal.Signals(-code).name
    print(f"error: {who} was ended by {name}; the run stopped", file=sys.stderr, flush=True)
    return 128 - code


def _quiet_torchrun() -> None:
    """Nothing from torchrun's loggers: its warnings (a signal received, processes told to close)
    are said by this process and the trainer instead, and its "failed (exitcode: N)" error comes
    after the failed process's own error line (or this process's line for a signal)."""
    import torch.distributed.elastic.agent.server.local_elastic_agent  # noqa: F401  (the agent's loggers too)

    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.CRITICAL)


if __name__ == "__main__":
    main()
