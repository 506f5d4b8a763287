"""What one step of the ``openai_agent`` rollout shares while its agents run (:class:`Step`)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from agentrl import Engine, RequestQueue, SamplingParams, request_queue
from agentrl_openai_agent.clock import ModelWaits
from agentrl_openai_agent.record import EpisodeRecord
from agentrl_openai_agent.server import RequestError, episode_api_key, episode_credentials, episode_key


@dataclass
class Step:
    """What one step's episodes share while their agents run: the tasks, seeds and sampling, the
    request queue, each episode's record, lock and waits for the model, and the engine's failures."""

    tasks: list[dict[str, Any]]
    seeds: list[int | None]
    sampling: SamplingParams
    batcher: RequestQueue
    keys: dict[str, int]
    records: list[EpisodeRecord]
    locks: list[threading.Lock]
    waits: ModelWaits
    """Each episode's time waiting for the model (not counted against ``timeout_s``)."""
    engine_errors: list[BaseException] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    """Episodes whose agent returned (no more calls from them)."""
    api_keys: list[str] = field(default_factory=list)
    """Each episode's api key (its client's: :mod:`agentrl_openai_agent.server`, whose call is it)."""
    counts_lock: threading.Lock = field(default_factory=threading.Lock)
    """Guards the records' refused-request counts (counted outside the episodes' locks)."""

    def refused(self, key: str, error: RequestError) -> None:
        """Count a refused request in the metrics of the episode that made it: the URL's, or the
        one whose api key it bore (a URL no episode has, with no api key of ours: not counted)."""
        index = self.keys.get(key) if error.episode is None else error.episode
        if index is not None:
            with self.counts_lock:
                self.records[index].count_refused(error.status)

    def again(self, index: int, key: str) -> str:
        """Ready episode ``index`` to run again from the start (its remote worker died): its URL key
        ``key`` and api key revoked (what its dead agent still sends is refused), fresh ones issued,
        an empty record and wait clock, its seed unchanged (the same calls sample the same tokens).
        Returns the new URL key."""
        fresh = episode_key(index)
        self.keys.pop(key, None)
        self.keys[fresh] = index
        self.api_keys[index] = episode_api_key(index)
        with self.locks[index]:
            self.records[index] = EpisodeRecord()
        self.waits.restart(index)
        while index in self.finished:
            self.finished.remove(index)
        return fresh


def open_step(
    engine: Engine,
    batch_wait_s: float,
    tasks: list[dict[str, Any]],
    seeds: list[int | None],
    sampling: SamplingParams,
    workers: int,
) -> Step:
    """The step's shared state, its request queue open: a batch waits for the agents running now
    or about to (at most ``workers``), each episode keyed by fresh credentials (its base URL's
    key, its client's api key). The queue samples in the thread that serves it
    (:func:`agentrl.sample_here`)."""
    finished: list[int] = []
    keys, api_keys = episode_credentials(len(tasks))
    batcher = request_queue(engine, batch_wait_s, lambda: min(workers, len(tasks) - len(finished)), worker_thread=False)
    return Step(
        list(tasks),
        list(seeds),
        sampling,
        batcher,
        keys,
        [EpisodeRecord() for _ in tasks],
        [threading.Lock() for _ in tasks],
        ModelWaits(len(tasks)),
        finished=finished,
        api_keys=api_keys,
    )
