"""An agent's own time: its run minus its waits for the model, what ``plugins.openai_agent.timeout_s`` limits.

An agent's episode waits for the model on every call, and on a CPU a batch of 32 episodes' calls
can take minutes, longer on a loaded machine: a wall-clock limit would cut healthy episodes
because the engine was slow. The limit therefore counts only the agent's own time (its code, its
tools, its network calls): :class:`ModelWaits` adds up, per episode, the time at least one of its
calls was waiting for the engine, and :meth:`agentrl_openai_agent.workers.AgentWorkers.run` kills
the agent's worker process once the episode's wall time minus that wait passes the limit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


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

    def restart(self, episode: int) -> None:
        """Start episode ``episode``'s count again from zero (it runs again from the start)."""
        with self._lock:
            self._waited[episode] = 0.0
            self._since[episode] = time.monotonic()
