"""Plugin code that would end or hang the process becomes a named failure instead.

* ``raise SystemExit(0)``, ``sys.exit()`` or ``raise KeyboardInterrupt`` in a reward function, an
  env, a hook or a plugin module is that plugin's failure: :func:`plugin_exit` turns it into a
  :class:`PluginExit` (an ordinary exception, so ``on_call_error`` applies where it does for any
  other exception). A real Ctrl-C (or SIGTERM, SIGHUP) stays an interrupt: a KeyboardInterrupt
  raised by a Python signal handler is recognised by the handler's frame in its traceback. Under
  Python's default SIGINT handler (no frame to tell by), a KeyboardInterrupt in the main thread
  counts as Ctrl-C; in any other thread it is always the code's own (signals reach the main thread
  only), and the run calls env methods and reward functions in worker threads (``call_timeout_s``).
* :func:`import_deadline`: a plugin import that runs past ``AGENTRL_PLUGIN_IMPORT_TIMEOUT`` seconds
  (default 60) is interrupted and named in a :class:`agentrl.PluginError`; if it cannot be
  interrupted (a hang inside C code), the process prints the same line and exits with status 2.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from typing import Any

from agentrl.errors import ConfigError, PluginError


class PluginExit(Exception):
    """Plugin code raised SystemExit or KeyboardInterrupt: that plugin's failure, not the end of the run."""


def raised_by_signal(exc: BaseException) -> bool:
    """Whether ``exc`` came from a signal rather than from the code that was running (module docstring)."""
    if threading.current_thread() is not threading.main_thread():
        return False  # Python runs signal handlers in the main thread only
    handlers = set()
    for signum in signal.valid_signals():
        try:
            handler = signal.getsignal(signum)
        except (OSError, ValueError):
            continue
        code = getattr(getattr(handler, "__func__", handler), "__code__", None)
        if code is not None:
            handlers.add(code)
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in handlers:
            return True
        tb = tb.tb_next
    return isinstance(exc, KeyboardInterrupt) and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def plugin_exit(exc: BaseException) -> PluginExit | None:
    """``exc`` as a :class:`PluginExit` when it is a SystemExit or KeyboardInterrupt that code raised
    itself, else None (any other exception, or a signal's KeyboardInterrupt: a real interrupt)."""
    if not isinstance(exc, (SystemExit, KeyboardInterrupt)) or raised_by_signal(exc):
        return None
    failure = PluginExit(f"{exc!r} raised by plugin code (it would have ended the run) at {raised_at(exc)}")
    failure.__cause__ = exc
    return failure


def raised_at(exc: BaseException) -> str:
    """``file.py:12 in fn``: where ``exc`` was raised (its traceback's innermost frame)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "an unknown place"
    last = frames[-1]
    return f"{last.filename}:{last.lineno} in {last.name}"


IMPORT_TIMEOUT_VAR = "AGENTRL_PLUGIN_IMPORT_TIMEOUT"
DEFAULT_IMPORT_TIMEOUT_S = 60.0
GRACE_S = 5.0
"""How long an interrupted import may take to stop before the process exits (a hang in C code)."""


def import_timeout_s() -> float | None:
    """Seconds one plugin import may take: ``$AGENTRL_PLUGIN_IMPORT_TIMEOUT`` (0: no limit), default 60."""
    raw = os.environ.get(IMPORT_TIMEOUT_VAR, "").strip()
    if not raw:
        return DEFAULT_IMPORT_TIMEOUT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not (seconds >= 0 and seconds != float("inf")):
        raise ConfigError(f"{IMPORT_TIMEOUT_VAR}={raw!r} is invalid: expected a number of seconds >= 0 (0: no limit)")
    return seconds or None


@contextlib.contextmanager
def import_deadline(what: str, seconds: float | None, hint: str = "") -> Iterator[None]:
    """Run an import of ``what`` (e.g. ``plugin 'x' (entry point ...)``) within ``seconds`` (None: no
    limit; :func:`import_timeout_s` gives the user's); ``hint``: what to do about it, said first.

    Past the limit a watchdog thread interrupts the main thread (SIGINT sent to it, caught by a
    handler of this block's own) and the block raises PluginError naming ``what``. A real Ctrl-C
    before then is an interrupt as usual; a KeyboardInterrupt the module raises itself becomes a
    :class:`PluginExit`. Off the main thread, or if the import does not stop within
    :data:`GRACE_S` (a hang in C code), the watchdog prints the message and exits the process with
    status 2.
    """
    if seconds is None:
        yield
        return
    message = (
        f"{what} did not finish importing within {seconds:g} s: it hangs (or is very slow) at import. "
        f"{hint}Raise {IMPORT_TIMEOUT_VAR} (now {seconds:g}; 0: no limit) if it is only slow"
    )
    main = threading.current_thread() is threading.main_thread()
    previous: Any = signal.getsignal(signal.SIGINT) if main else None
    # a handler installed outside Python (None) could not be put back; no pthread_kill: not POSIX
    guarded = previous is not None and hasattr(signal, "pthread_kill")
    main_id, done, expired, signalled = threading.get_ident(), threading.Event(), threading.Event(), threading.Event()

    def watch() -> None:
        if done.wait(seconds):
            return
        expired.set()
        if guarded and not done.is_set():
            signal.pthread_kill(main_id, signal.SIGINT)
        if done.wait(GRACE_S if guarded else 0):
            return
        print(f"error: {message}", file=sys.stderr, flush=True)
        os._exit(2)

    def on_sigint(signum: int, frame: Any) -> None:
        signalled.set()
        if expired.is_set():
            raise KeyboardInterrupt
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt

    if guarded:
        signal.signal(signal.SIGINT, on_sigint)
    threading.Thread(target=watch, name="agentrl-import-watchdog", daemon=True).start()
    try:
        yield
    except KeyboardInterrupt as exc:
        if expired.is_set():
            raise PluginError(message) from None
        if signalled.is_set() or (main and not guarded):  # a real Ctrl-C (or one that cannot be told apart)
            raise
        raise PluginExit(f"{exc!r} raised by plugin code at {raised_at(exc)}") from exc
    finally:
        done.set()
        if guarded:
            signal.signal(signal.SIGINT, previous)
