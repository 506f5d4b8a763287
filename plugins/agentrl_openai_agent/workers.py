"""Agent programs run in worker processes: what an episode leaves behind ends with its worker.

:class:`AgentWorkers` keeps a pool of processes for one agent spec; :meth:`AgentWorkers.run` runs
one episode in an idle one and returns its :class:`Outcome`, a plain value. A worker is a fresh
interpreter (started with exec, never forked from the trainer, whose torch threads a fork would
copy half-way) that loads this file by path, so neither agentrl nor torch is imported there, imports
the agent by its spec and builds the episode's OpenAI client itself. It is the leader of its own
process group, so everything the agent starts belongs to it.

After each episode the worker is kept for the next one only if it is clean: a worker whose agent
left threads running or child processes behind, crashed, or ran past its time limit is killed with
its whole process tree and process group, and a fresh one is started in the background. Each
worker watches its parent: when the trainer dies (even by ``kill -9``) the worker ends its tree and
itself. :meth:`AgentWorkers.close` (also at interpreter exit) ends every worker.

The interface is small and transport-neutral (a task, a base URL and an API key in; a picklable
outcome back), so the same workers can be placed elsewhere; the time limit is kept on this side,
which knows each episode's waits for the model (:mod:`agentrl_openai_agent.clock`).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import math
import numbers
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

WORKER_MODULE = "agentrl_openai_agent_worker"
"""The name this file is loaded under in a worker (by path: the package, agentrl and torch stay out)."""
BOOT = (
    "import importlib.util as u, sys; s = u.spec_from_file_location({name!r}, {path!r}); "
    "m = u.module_from_spec(s); sys.modules[s.name] = m; s.loader.exec_module(m); m.serve(int(sys.argv[1]))"
)
WATCHDOG = "agentrl-worker-watchdog"
POLL_S = 0.25
"""How often a worker checks that its parent lives, and the trainer checks an episode's time limit."""
START_TIMEOUT_S = 600.0
"""How long a worker may take to import the agent (a framework, torch) on a loaded machine."""
GRACE_S = 0.2
"""How long threads the agent started may take to finish after it returned, before they count as left."""
RESULTS = "return a finite reward, the final messages (a list of messages) or None"
"""What an agent may return."""
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class Outcome:
    """One episode's end. ``result``: what the agent returned, checked and plain (a float, a list of
    message dicts or None); ``error``: one line when it raised, crashed or timed out (``timed_out``);
    ``invalid``: what it returned instead of a result, cut short; ``left``: what it left running
    (threads, child processes); ``replaced``: its worker was ended and a fresh one started (it left
    something, crashed or timed out)."""

    result: Any = None
    error: str | None = None
    timed_out: bool = False
    invalid: str | None = None
    left: str | None = None
    replaced: bool = False


class AgentLoadError(Exception):
    """A worker could not import the agent (the message is one line)."""


class TaskNotSent(Exception):
    """The task could not be sent to a worker (it does not pickle)."""


def one_line(exc: BaseException, limit: int = 200) -> str:
    """``Type: message`` flattened to one short line (as :func:`agentrl.one_line`, without agentrl)."""
    return f"{type(exc).__name__}: {' '.join(_ANSI.sub('', str(exc)).split())[:limit]}"


def import_agent(spec: str) -> Any:
    """The function ``spec`` names (``path/to/file.py:name`` or ``module:name``); ValueError when
    the spec has no ``:``, the import's own error when it cannot be imported."""
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise ValueError("the spec must be 'path/to/file.py:function' or 'module:function'")
    if where.endswith(".py"):
        module_spec = importlib.util.spec_from_file_location(f"agentrl_agent_{Path(where).stem}", where)
        if module_spec is None or module_spec.loader is None or not Path(where).is_file():
            raise FileNotFoundError(f"no such file: {where}")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_spec.name] = module
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    return getattr(module, name)


def takes_base_url(fn: Any) -> bool:
    """Whether the agent's second parameter is named ``base_url`` (it gets the URL, not a client)."""
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return False
    return len(names) > 1 and names[1] == "base_url"


def checked_result(result: Any) -> tuple[str, Any]:
    """``("ok", value)`` for a finite number (as a float), a list of messages (as dicts) or None;
    ``("invalid", what it is, cut short)`` for anything else (a bool, NaN, a list of ints...)."""
    if result is None:
        return "ok", None
    if isinstance(result, numbers.Real) and not isinstance(result, bool):
        value = float(result)
        return ("ok", value) if math.isfinite(value) else ("invalid", repr(value))
    if isinstance(result, list):
        messages = [m.model_dump(exclude_none=True) if hasattr(m, "model_dump") else m for m in result]
        if all(isinstance(m, Mapping) and isinstance(m.get("role"), str) for m in messages):
            return "ok", [dict(m) for m in messages]
    text = repr(result)
    return "invalid", f"{type(result).__name__} {text[:80]}{'...' if len(text) > 80 else ''}"


def kill_tree(pid: int, reaped: bool = False) -> None:
    """SIGKILL process ``pid``, every descendant and every process of its process group (``pid``
    itself may be this process). ``reaped``: ``pid`` has ended and been waited for, so only its
    group is left to end (the pid may be another process's by now)."""
    import psutil

    procs = []
    if not reaped:
        try:
            root = psutil.Process(pid)
            if pid != os.getpid():
                root.suspend()  # it starts nothing more while its tree is ended
            procs = root.children(recursive=True)
        except psutil.Error:
            pass
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass
    try:
        os.killpg(pid, signal.SIGKILL)  # this process too, when it is the group's
        if not reaped:
            os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# -- in the worker ----------------------------------------------------------------------------------------


def serve(fd: int) -> None:
    """A worker's life: import the agent, then run one episode per message until told to stop."""
    conn = Connection(fd)
    try:
        hello = conn.recv()
    except (EOFError, OSError):  # the trainer ended before it said hello
        return
    sys.path[:] = hello["sys_path"]
    _watch_parent(hello["parent"])
    _adopt_orphans()
    try:
        fn = import_agent(hello["spec"])
        make = None if takes_base_url(fn) else _client_maker(inspect.iscoroutinefunction(fn))
    except BaseException as exc:
        conn.send(("error", one_line(exc)))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        kind, value = _episode(fn, make, *message)
        left = _threads_left(), _children_left()
        try:
            conn.send((kind, value, *left))
        except Exception as exc:  # the agent returned something that does not pickle
            conn.send(("raised", f"its result cannot be sent back to the trainer: {one_line(exc)}", *left))


def _client_maker(is_async: bool) -> Callable[[str, str], Any]:
    """``make(base_url, api_key)``: an episode's ``openai.OpenAI`` (``AsyncOpenAI``), cheap to build
    (the TLS context, which takes 0.1 s or more to load, is built once) and its code imported now,
    not in the first episode's time."""
    import ssl

    import certifi
    import openai

    context = ssl.create_default_context(cafile=os.environ.get("SSL_CERT_FILE") or certifi.where())
    kind, http = (
        (openai.AsyncOpenAI, openai.DefaultAsyncHttpxClient) if is_async else (openai.OpenAI, openai.DefaultHttpxClient)
    )

    def make(base_url: str, api_key: str) -> Any:
        return kind(base_url=base_url, api_key=api_key, max_retries=0, http_client=http(verify=context))

    _ = make(
        "http://127.0.0.1:9/v1", "warm-up"
    ).chat.completions.with_raw_response.create.__name__  # imports its lazy modules
    return make


def _episode(
    fn: Any, make: Callable[[str, str], Any] | None, task: Any, base_url: str, api_key: str
) -> tuple[str, Any]:
    """Run the agent on ``task``: ``("ok", result)``, ``("invalid", what)`` or ``("raised", line)``."""
    os.environ.update(OPENAI_BASE_URL=base_url, OPENAI_API_KEY=api_key)  # for agents that build their own
    is_async = inspect.iscoroutinefunction(fn)
    client: Any = base_url
    try:
        if make is not None:
            client = make(base_url, api_key)
        result = asyncio.run(fn(task, client)) if is_async else fn(task, client)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the agent's failure
        return "raised", one_line(exc)
    finally:
        if hasattr(client, "close") and not is_async:
            client.close()
    return checked_result(result)


def _threads_left() -> list[str]:
    """The names of the threads the agent left running (after :data:`GRACE_S` for them to finish)."""
    import _thread

    deadline = time.monotonic() + GRACE_S
    left = []
    for thread in threading.enumerate():
        if thread is threading.main_thread() or thread.name == WATCHDOG:
            continue
        try:
            thread.join(max(deadline - time.monotonic(), 0.0))
        except RuntimeError:  # a thread started outside threading that called into it
            pass
        if thread.is_alive():
            left.append(thread.name)
    unnamed = _thread._count() - 1 - len(left)  # the watchdog is not the agent's
    while unnamed > 0 and time.monotonic() < deadline:  # a thread that just ended may still be counted
        time.sleep(0.01)
        unnamed = _thread._count() - 1 - len(left)
    return left + ["a thread started with _thread"] * max(unnamed, 0)


def _adopt_orphans() -> None:
    """Make this worker the parent of every orphan among the processes the agent starts (Linux: a
    child subreaper), so a daemon that double-forked is still its descendant, seen and ended."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def _children_left() -> list[str]:
    """``name pid`` of each process the agent started that still runs (those that ended are reaped
    first: they are not left over). With :func:`_adopt_orphans` its children are all its descendants."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
    try:
        tasks = Path("/proc/self/task")
        pids = [int(p) for task in tasks.iterdir() for p in (task / "children").read_text().split()]
    except OSError:  # not Linux, or a kernel without the children file
        import psutil

        pids = [p.pid for p in psutil.Process().children()]
    names = []
    for pid in pids:
        try:
            names.append(f"{Path(f'/proc/{pid}/comm').read_text().strip()} {pid}")
        except OSError:
            names.append(str(pid))
    return names


def _watch_parent(parent: int) -> None:
    """A daemon thread that ends this worker's tree and itself once ``parent`` is gone."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(POLL_S)
        kill_tree(os.getpid())

    threading.Thread(target=watch, name=WATCHDOG, daemon=True).start()


# -- in the trainer ---------------------------------------------------------------------------------------


class _Worker:
    """One worker process as the trainer sees it: its process and its end of the pipe."""

    def __init__(self, spec: str) -> None:
        here, there = Pipe()
        boot = BOOT.format(name=WORKER_MODULE, path=str(Path(__file__).resolve()))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", boot, str(there.fileno())],
            pass_fds=[there.fileno()],
            start_new_session=True,  # its own process group: everything the agent starts is in it
            stdin=subprocess.DEVNULL,
        )
        there.close()
        self.conn, self.killed = here, False
        self.conn.send({"spec": spec, "sys_path": list(sys.path), "parent": os.getpid()})

    def wait_ready(self) -> None:
        """Block until the worker has imported the agent; AgentLoadError when it could not."""
        if not self.conn.poll(START_TIMEOUT_S):
            raise AgentLoadError(f"the worker did not import the agent within {START_TIMEOUT_S:g} s")
        try:
            kind, value = self.conn.recv()
        except (EOFError, OSError):
            raise AgentLoadError(f"the worker exited while importing the agent ({self._died()})") from None
        if kind != "ready":
            raise AgentLoadError(value)

    def episode(self, task: Any, base_url: str, api_key: str, limit_s: float | None, waited: Callable[[], float]):
        """Run one episode here: its :class:`Outcome` (``replaced``: this worker must go)."""
        try:
            self.conn.send((task, base_url, api_key))
        except (TypeError, AttributeError, ValueError, RecursionError) as exc:  # pickling fails before sending
            raise TaskNotSent(one_line(exc)) from exc
        started = time.monotonic()
        while True:
            own = time.monotonic() - started - waited()
            if limit_s and own > limit_s:
                error = f"the agent's own time (model calls excluded) passed timeout_s={limit_s:g} s"
                return Outcome(error=f"{error}; its worker process was killed", timed_out=True, replaced=True)
            if self.conn.poll(min(POLL_S, max(limit_s - own, 0.01)) if limit_s else POLL_S):
                break
        try:
            kind, value, threads, children = self.conn.recv()
        except (EOFError, OSError):
            return Outcome(error=f"the agent's worker process died ({self._died()})", replaced=True)
        left = []
        if threads:
            left.append(f"left {len(threads)} thread(s) running ({', '.join(threads[:3])})")
        if children:
            left.append(f"left {len(children)} child process(es) ({', '.join(children[:3])})")
        fields = {"ok": "result", "raised": "error", "invalid": "invalid"}
        return Outcome(**{fields[kind]: value}, left="; ".join(left) or None, replaced=bool(left))

    def _died(self) -> str:
        """How the worker ended: its exit code or signal."""
        try:
            code = self.proc.wait(5)
        except subprocess.TimeoutExpired:
            return "it stopped answering"
        return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"

    def kill(self) -> None:
        """End the worker, its process group and every process it started (once)."""
        if self.killed:
            return
        self.killed = True
        kill_tree(self.proc.pid, self.proc.poll() is not None)  # its group outlives it with the agent's children
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        self.conn.close()


def _kill_all(workers: set[_Worker], closed: threading.Event, lock: threading.Lock) -> None:
    """End every worker in ``workers`` (at :meth:`AgentWorkers.close` or interpreter exit); no
    replacement starts after it."""
    with lock:
        closed.set()
        ending = list(workers)
    for worker in ending:
        worker.kill()
        workers.discard(worker)


class AgentWorkers:
    """A pool of worker processes running agent ``spec`` one episode at a time each (module docstring).

    ``size``: how many; :meth:`grow` adds more. :meth:`run` is called from as many threads at once
    as there are workers."""

    def __init__(self, spec: str, size: int = 1) -> None:
        self.spec = spec
        self.size = 0
        self.replaced = 0
        """Workers replaced so far."""
        self.starting = 0
        """Replacements being started now."""
        self._idle: queue.Queue[_Worker | BaseException] = queue.Queue()
        self._live: set[_Worker] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._finalizer = weakref.finalize(self, _kill_all, self._live, self._closed, self._lock)
        self.grow(size)

    def grow(self, size: int) -> None:
        """Start workers until there are ``size`` (in parallel; returns once they are ready)."""
        with self._lock:
            if self._closed.is_set():
                raise RuntimeError("the agent's workers are closed")
            started = [_Worker(self.spec) for _ in range(size - self.size)]
            self._live.update(started)
            self.size = max(self.size, size)
        try:
            for worker in started:
                worker.wait_ready()
        except AgentLoadError:
            for worker in started:
                worker.kill()
                self._live.discard(worker)
            self.size -= len(started)
            raise
        for worker in started:
            self._idle.put(worker)

    def run(
        self,
        task: Any,
        base_url: str,
        api_key: str,
        limit_s: float | None = None,
        waited: Callable[[], float] = lambda: 0.0,
    ) -> Outcome:
        """One episode of the agent on ``task`` against ``base_url`` with ``api_key``, in an idle
        worker. ``limit_s``: seconds of its own time, ``waited()`` (its waits for the model so far)
        not counted; past it the worker is killed and the outcome ``timed_out``. TaskNotSent when
        the task does not pickle; AgentLoadError when a replacement worker could not import the agent."""
        if self._closed.is_set():
            raise RuntimeError("the agent's workers are closed")
        item = self._idle.get()
        if isinstance(item, BaseException):
            self._idle.put(item)
            raise item
        try:
            outcome = item.episode(task, base_url, api_key, limit_s, waited)
        except TaskNotSent:
            self._idle.put(item)
            raise
        if outcome.replaced:
            self._replace(item)
        else:
            self._idle.put(item)
        return outcome

    def _replace(self, worker: _Worker) -> None:
        """Kill ``worker`` (its tree and group) and start a fresh one in the background."""
        worker.kill()
        with self._lock:
            self._live.discard(worker)
            self.replaced += 1
            if self._closed.is_set():
                return
            fresh = _Worker(self.spec)
            self._live.add(fresh)
            self.starting += 1

        def ready() -> None:
            try:
                fresh.wait_ready()
            except AgentLoadError as exc:
                self._idle.put(exc)
                return
            finally:
                with self._lock:
                    self.starting -= 1
            self._idle.put(fresh)

        threading.Thread(target=ready, name="agentrl-agent-worker-start", daemon=True).start()

    def pids(self) -> list[int]:
        """The worker processes' ids."""
        with self._lock:
            return [worker.proc.pid for worker in self._live]

    def close(self) -> None:
        """End every worker and what it started; later :meth:`run` calls fail."""
        self._finalizer()
        self._idle.put(RuntimeError("the agent's workers are closed"))
