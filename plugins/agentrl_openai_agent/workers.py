"""Agent programs run in worker processes: what an episode leaves behind ends with its worker.

:class:`AgentWorkers` keeps a pool of processes for one agent spec; :meth:`AgentWorkers.run` runs
one episode in an idle one and returns its :class:`Outcome`, a plain value. A worker is a fresh
interpreter (started with exec, never forked from the trainer, whose torch threads a fork would
copy half-way) running :mod:`agentrl_openai_agent.agent_process` (loaded by path, so neither
agentrl nor torch is imported there): it imports the agent by its spec and builds the episode's
OpenAI client itself. It is the leader of its own process group, so everything the agent starts
belongs to it.

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

import os
import queue
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import Pipe
from pathlib import Path
from typing import Any

from agentrl import MAX_ABS_REWARD
from agentrl_openai_agent import agent_process
from agentrl_openai_agent.agent_process import POLL_S, RESULTS, RETURNED, kill_tree, one_line

__all__ = ["RESULTS", "AgentLoadError", "AgentWorkers", "Outcome", "TaskNotSent", "timeout_error"]

WORKER_MODULE = "agentrl_openai_agent_worker"
"""The name :mod:`agentrl_openai_agent.agent_process` is loaded under in a worker."""
BOOT = (
    "import importlib.util as u, sys; s = u.spec_from_file_location({name!r}, {path!r}); "
    "m = u.module_from_spec(s); sys.modules[s.name] = m; s.loader.exec_module(m); m.serve(int(sys.argv[1]))"
)
START_TIMEOUT_S = 600.0
"""How long a worker may take to import the agent (a framework, torch) on a loaded machine."""


@dataclass(frozen=True)
class Outcome:
    """One episode's end. ``result``: what the agent returned, checked and plain (a float, a str,
    a list of message dicts or None); ``error``: one line when it raised, crashed or timed out (``timed_out``);
    ``invalid``: what it returned instead of a result, cut short; ``left``: what it left running
    (threads, child processes); ``replaced``: its worker was ended and a fresh one started (it left
    something, crashed or timed out)."""

    result: Any = None
    error: str | None = None
    timed_out: bool = False
    invalid: str | None = None
    left: str | None = None
    replaced: bool = False

    def problem(self, weight: float) -> str | None:
        """What is wrong with the result (not a finite reward within the reward bound once weighted
        by ``weight``, messages or None), or None."""
        if isinstance(self.result, float) and abs(self.result * weight) > MAX_ABS_REWARD:
            return f"{self.result:g} (weighted rewards must be within ±{MAX_ABS_REWARD:g}: rescale it)"
        return self.invalid


def timeout_error(limit_s: float | None) -> str:
    """The error of an episode whose agent ran past ``limit_s`` seconds of its own time."""
    limit = f"timeout_s={limit_s:g} s" if limit_s else "its timeout_s"
    return f"the agent's own time (model calls excluded) passed {limit}; its worker process was killed"


class AgentLoadError(Exception):
    """A worker could not import the agent (the message is one line)."""


class TaskNotSent(Exception):
    """The task could not be sent to a worker (it does not pickle)."""


class _Worker:
    """One worker process as the trainer sees it: its process and its end of the pipe."""

    def __init__(self, spec: str, call: dict[str, Any] | None = None) -> None:
        here, there = Pipe()
        boot = BOOT.format(name=WORKER_MODULE, path=str(Path(agent_process.__file__).resolve()))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", boot, str(there.fileno())],
            pass_fds=[there.fileno()],
            start_new_session=True,  # its own process group: everything the agent starts is in it
            stdin=subprocess.DEVNULL,
        )
        there.close()
        self.conn, self.killed = here, False
        self.conn.send({"spec": spec, "sys_path": list(sys.path), "parent": os.getpid(), "call": call})

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

    def episode(
        self,
        task: Any,
        base_url: str,
        api_key: str,
        limit_s: float | None,
        waited: Callable[[], float],
        returned: Callable[[], None],
        stop: threading.Event | None = None,
    ) -> Outcome:
        """Run one episode here: its :class:`Outcome` (``replaced``: this worker must go)."""
        try:
            self.conn.send((task, base_url, api_key))
        except (TypeError, AttributeError, ValueError, RecursionError) as exc:  # pickling fails before sending
            raise TaskNotSent(one_line(exc)) from exc
        started = time.monotonic()
        while True:
            own = time.monotonic() - started - waited()
            if (limit_s and own > limit_s) or (stop is not None and stop.is_set()):
                return Outcome(error=timeout_error(limit_s), timed_out=True, replaced=True)
            if self.conn.poll(min(POLL_S, max(limit_s - own, 0.01)) if limit_s else POLL_S):
                break
        try:
            message = self.conn.recv()
            if message == RETURNED:  # the agent function returned: calls from what it left come too late
                returned()
                message = self.conn.recv() if self.conn.poll(START_TIMEOUT_S) else ()
            kind, value, threads, children = message
        except (EOFError, OSError, ValueError):
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
    as there are workers. ``call``: how the agent is called (its plan and values:
    :func:`agentrl_openai_agent.signature.agent_call`; None: ``fn(task, client)``, or ``fn(task,
    base_url)`` when its second parameter is named so), given to the workers started after it is set."""

    def __init__(self, spec: str, size: int = 1, call: dict[str, Any] | None = None) -> None:
        self.spec = spec
        self.call = call
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
            started = [_Worker(self.spec, self.call) for _ in range(size - self.size)]
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
        returned: Callable[[], None] = lambda: None,
        stop: threading.Event | None = None,
    ) -> Outcome:
        """One episode of the agent on ``task`` against ``base_url`` with ``api_key``, in an idle
        worker. ``limit_s``: seconds of its own time, ``waited()`` (its waits for the model so far)
        not counted; past it the worker is killed and the outcome ``timed_out``. ``returned()`` is
        called as soon as the agent function has returned (before the worker looks for what it
        left running, whose calls then come too late). ``stop``: once set, the episode ends as
        timed out (its limit kept elsewhere: a remote worker's trainer). TaskNotSent when
        the task does not pickle; AgentLoadError when a replacement worker could not import the agent."""
        if self._closed.is_set():
            raise RuntimeError("the agent's workers are closed")
        item = self._idle.get()
        if isinstance(item, BaseException):
            self._idle.put(item)
            raise item
        try:
            outcome = item.episode(task, base_url, api_key, limit_s, waited, returned, stop)
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
            fresh = _Worker(self.spec, self.call)
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
