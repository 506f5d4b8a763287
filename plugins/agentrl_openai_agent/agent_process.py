"""What runs inside an agent's worker process, and the helpers both sides share.

A worker (:mod:`agentrl_openai_agent.workers`) is a fresh interpreter that loads this file by its
path, not as part of the package, so neither agentrl nor torch is imported there: :func:`serve`
imports the agent by its spec, then runs one episode per message from the trainer, building the
episode's OpenAI client itself, checking what the agent returned (:func:`checked_result`) and
reporting the threads and child processes it left running. A watchdog thread ends the worker and
everything it started once the trainer is gone (even after ``kill -9``), and the worker adopts the
orphans among the processes the agent starts, so a daemon is still its descendant.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import math
import numbers
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

WATCHDOG = "agentrl-worker-watchdog"
POLL_S = 0.25
"""How often a worker checks that its parent lives (and the trainer an episode's time limit)."""
RETURNED = ("returned",)
"""Said as soon as the agent function returns, before the worker looks for what it left running."""
GRACE_S = 0.2
"""How long threads the agent started may take to finish after it returned, before they count as left."""
RESULTS = "return a finite reward, the final answer (a str), the final messages (a list of messages) or None"
"""What an agent may return."""
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


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


def call_arguments(call: Mapping[str, Any], task: Any, sources: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """The positional and keyword arguments of one episode's call of the agent, by its call plan
    (:func:`agentrl_openai_agent.signature.agent_call`): the task (or its ``field``) first, then
    the values of ``sources`` (``base_url``, ``client``, ``api_key``, ``model``, ``max_turns``)
    the plan names."""
    first = task if call["field"] is None else task[call["field"]]
    args = [first, *(sources[name] for name in call["positional"])]
    return args, {name: sources[name] for name in call["keywords"]}


def needs_client(call: Mapping[str, Any]) -> bool:
    """Whether the plan passes the agent a client (the worker then builds one per episode)."""
    return "client" in call["positional"] or "client" in call["keywords"]


def checked_result(result: Any) -> tuple[str, Any]:
    """``("ok", value)`` for a finite number (as a float), a str (the final answer), a list of
    messages (as dicts) or None; ``("invalid", what it is, cut short)`` for anything else (a
    bool, NaN, a list of ints...)."""
    if result is None:
        return "ok", None
    if isinstance(result, str):  # str(): a subclass of the agent's would not unpickle in the trainer
        return "ok", str(result)
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
        call = hello.get("call") or {
            "field": None,
            "positional": ["base_url" if takes_base_url(fn) else "client"],
            "keywords": [],
            "values": {},
        }
        make = _client_maker(inspect.iscoroutinefunction(fn)) if needs_client(call) else None
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
        kind, value = _episode(fn, make, call, *message)
        try:
            conn.send(RETURNED)
            left = _threads_left(), _children_left()
            try:
                conn.send((kind, value, *left))
            except OSError:
                raise
            except Exception as exc:  # the agent returned something that does not pickle
                conn.send(("raised", f"its result cannot be sent back to the trainer: {one_line(exc)}", *left))
        except OSError:  # the process that runs this worker is gone: end quietly, with all the agent started
            kill_tree(os.getpid())
            return


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

    warm = make("http://127.0.0.1:9/v1", "warm-up")
    _ = warm.chat.completions.with_raw_response.create  # imports the client's lazy modules now
    return make


def _episode(
    fn: Any, make: Callable[[str, str], Any] | None, call: Mapping[str, Any], task: Any, base_url: str, api_key: str
) -> tuple[str, Any]:
    """Run the agent on ``task`` as its call plan says: ``("ok", result)``, ``("invalid", what)``
    or ``("raised", line)``."""
    os.environ.update(OPENAI_BASE_URL=base_url, OPENAI_API_KEY=api_key)  # for agents that build their own
    is_async = inspect.iscoroutinefunction(fn)
    client: Any = None
    try:
        if make is not None:
            client = make(base_url, api_key)
        sources = {**call.get("values", {}), "base_url": base_url, "api_key": api_key, "client": client}
        args, kwargs = call_arguments(call, task, sources)
        result = asyncio.run(fn(*args, **kwargs)) if is_async else fn(*args, **kwargs)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the agent's failure
        return "raised", one_line(exc)
    finally:
        if client is not None and hasattr(client, "close") and not is_async:
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
