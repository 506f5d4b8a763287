"""Helpers for task sources and for env adapters that wrap a library (reasoning-gym, TextArena,
GEM, verifiers): seeded task draws, seed-only tasks, library failures named in one line, and a
private state for the process-wide RNGs such libraries draw from."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import numpy as np

from agentrl.env.tasks import LazyTasks, Task
from agentrl.errors import AgentRLError, EnvLibraryError, one_line


def seeded_rng(seed: int) -> np.random.Generator:
    """A numpy Generator for task sources (one place, so seeding is uniform)."""
    return np.random.default_rng(seed)


class SeedTasks(LazyTasks):
    """Tasks that are just seeds, for envs whose episodes a seeded library generates (games).

    Task ``i`` is ``{"id": f"{name}-{split}-{i}", "seed": first_seed + i}``: give the training and
    held-out splits ranges of seeds that do not overlap.
    """

    def __init__(self, name: str, split: str, first_seed: int, length: int) -> None:
        super().__init__(length)
        self.name, self.split, self.first_seed = name, split, first_seed

    def make(self, index: int) -> Task:
        """Task ``index``: its id and seed."""
        return {"id": f"{self.name}-{self.split}-{index}", "seed": self.first_seed + index}


@contextlib.contextmanager
def library_call(library: str, env_id: str, call: str) -> Iterator[None]:
    """Run a block of calls into the library an env adapter wraps (and the adapter's conversion of
    what it returns): an exception raised there becomes an :class:`EnvLibraryError` whose one line
    names the library, the env id and the call, e.g. ``textarena env 'Countdown-v0' failed in
    step: ValueError: ...``; during a run ``on_call_error`` then skips the episode or stops the run.
    An agentrl error raised in the block passes through unchanged."""
    try:
        yield
    except AgentRLError:
        raise
    except Exception as exc:
        raise EnvLibraryError(f"{library} env {env_id!r} failed in {call}: {one_line(exc)}") from exc


class PrivateGlobalRandom:
    """A private state for Python's and numpy's process-wide RNGs, for libraries that use them.

    Game libraries (TextArena, GEM) seed and draw from ``random`` / ``np.random`` directly, so
    several env instances stepped in turn would consume each other's random streams. Run every
    call into such a library inside ``with rng.active():`` and each instance draws from its own
    stream: the global states are swapped in on entry and swapped back out on exit. Not
    thread-safe (the global RNGs are shared by threads): an env that uses it sets
    ``concurrent_safe = False``, so the rollout calls it one episode at a time.
    """

    def __init__(self, seed: int = 0) -> None:
        self._python: Any = None
        self._numpy: Any = None
        self.seed(seed)

    def seed(self, seed: int) -> None:
        """Restart both private streams from ``seed``."""
        self._python = random.Random(seed).getstate()
        self._numpy = np.random.RandomState(seed % 2**32).get_state()

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Make the private states the global ones for the duration of the block."""
        saved_python, saved_numpy = random.getstate(), np.random.get_state()
        random.setstate(self._python)
        np.random.set_state(self._numpy)
        try:
            yield
        finally:
            self._python, self._numpy = random.getstate(), np.random.get_state()
            random.setstate(saved_python)
            np.random.set_state(saved_numpy)
