"""An agent's own time: its run minus its waits for the model, what ``plugins.openai_agent.timeout_s`` limits.

An agent's episode waits for the model on every call, and on a CPU a batch of 32 episodes' calls
can take minutes, longer on a loaded machine: a wall-clock limit would cut healthy episodes
because the engine was slow. The limit therefore counts only the agent's own time (its code, its
tools, its network calls): :class:`ModelWaits` adds up, per episode, the time at least one of its
calls was waiting for the engine, and :func:`run_with_own_time_limit` abandons the agent once its
wall time minus that wait passes the limit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from agentrl import CallGuard, CallTimeout

POLL_S = 0.25
"""How often the limit is checked while the agent runs."""


class ModelWaits:
    """Per episode, seconds spent waiting for the model (overlapping calls counted once)."""

    def __init__(self, episodes: int) -> None:
        self._lock = threading.Lock()
        self._waited = [0.0] * episodes
        self._in_flight = [0] * episodes
        self._since = [0.0] * episodes

    @contextmanager
    def waiting(self, episode: int) -> Iterator[None]:
        """Count the block's time as episode ``episode``'s wait for the model."""
        with self._lock:
            if self._in_flight[episode] == 0:
                self._since[episode] = time.monotonic()
            self._in_flight[episode] += 1
        try:
            yield
        finally:
            with self._lock:
                self._in_flight[episode] -= 1
                if self._in_flight[episode] == 0:
                    self._waited[episode] += time.monotonic() - self._since[episode]

    def waited(self, episode: int) -> float:
        """Seconds episode ``episode`` has waited for the model so far (a wait in progress included)."""
        with self._lock:
            ongoing = time.monotonic() - self._since[episode] if self._in_flight[episode] else 0.0
            return self._waited[episode] + ongoing


def run_with_own_time_limit(fn: Callable[[], Any], limit_s: float | None, waited: Callable[[], float]) -> Any:
    """``fn()``, raising :class:`agentrl.CallTimeout` once its wall time minus ``waited()`` (its
    waits for the model) passes ``limit_s`` (None or <= 0: no limit, run in the caller's thread).
    Past the limit the call is abandoned in its daemon thread, as :class:`agentrl.CallGuard` does."""
    if limit_s is None or limit_s <= 0:
        return CallGuard().call(fn)
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = CallGuard().call(fn)  # no limit here; a SystemExit inside is the agent's failure
        except BaseException as exc:  # handed to the caller
            outcome["error"] = exc

    started = time.monotonic()
    worker = threading.Thread(target=target, name="agentrl-agent-episode", daemon=True)
    worker.start()
    while worker.is_alive():
        own = time.monotonic() - started - waited()
        if own > limit_s:
            raise CallTimeout(
                f"the agent's own time (model calls excluded) passed timeout_s={limit_s:g} s; "
                "it was abandoned and may still be running in a background thread"
            )
        worker.join(min(POLL_S, max(limit_s - own, 0.01)))
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
