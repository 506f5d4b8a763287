"""Generation requests one at a time: what lets episodes advance on their own.

A rollout whose episodes each proceed as soon as their env (or agent) is ready submits one
:class:`GenerationRequest` per model call and waits on its future; the queue decides how pending
requests share the engine. :func:`request_queue` returns the engine's own queue when the engine
defines ``request_queue(wait_s, running)`` (an engine with native continuous batching, such as
vLLM's, adds requests between decode steps), else a :class:`BatchingQueue`: it samples the
pending requests in one ``engine.generate`` as soon as every requester still running has one
pending, or ``wait_s`` after the first arrived; requests that arrive while a batch runs form the
next one.

Reproducible whatever the timing: each request carries its own seed (sampled through
``SamplingParams.prompt_seeds``, so its draws do not depend on its batch-mates) and a batch is
put in ``order`` (the episode's index), so the same requests arriving in another order give the
same batch.
"""

from __future__ import annotations

import abc
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from agentrl.errors import EngineError
from agentrl.sampling.engine import Engine, Generation, SamplingParams


@dataclass
class GenerationRequest:
    """One model call: prompt ids, how to sample (``sampling.max_new_tokens`` is this call's cap,
    ``seed`` its own seed, None: the engine's generator), its place in a batch (``order``);
    ``future`` gets the :class:`Generation` (or the engine's exception)."""

    prompt: list[int]
    sampling: SamplingParams
    seed: int | None = None
    order: int = 0
    future: Future = field(default_factory=Future)


class RequestQueue(abc.ABC):
    """Takes generation requests as they arrive and samples them (module docstring)."""

    batches: list[int]
    """Size of each batch (or engine step's new requests) sampled, in order: for metrics and tests."""

    @abc.abstractmethod
    def submit(self, request: GenerationRequest) -> Future:
        """Queue ``request``; its future gets the Generation, cut to its own ``max_new_tokens``."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop taking requests, after sampling the ones already queued."""

    def __enter__(self) -> RequestQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def request_queue(engine: Engine, wait_s: float, running: Callable[[], int]) -> RequestQueue:
    """The queue for ``engine``: its own ``request_queue(wait_s, running)`` when it has one, else a
    :class:`BatchingQueue`. ``running()`` is how many requesters may still submit (those that have
    not finished): a batch waits for at most that many requests."""
    own = getattr(engine, "request_queue", None)
    if callable(own):
        return own(wait_s, running)
    return BatchingQueue(engine, wait_s, running)


class BatchingQueue(RequestQueue):
    """Batches pending requests into ``engine.generate`` calls, in a worker thread (module docstring)."""

    def __init__(self, engine: Engine, wait_s: float, running: Callable[[], int]) -> None:
        self.engine, self.wait_s, self.running = engine, wait_s, running
        self.batches = []
        self._closed = False
        self._queue: queue.Queue[GenerationRequest | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="agentrl-batching-queue", daemon=True)
        self._thread.start()

    def submit(self, request: GenerationRequest) -> Future:
        """Queue ``request`` (see :meth:`RequestQueue.submit`); EngineError once the queue is closed."""
        if self._closed:
            raise EngineError("the request queue is closed: submit before close()")
        self._queue.put(request)
        return request.future

    def close(self) -> None:
        """Stop the worker after the batches already queued (waits for them)."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
        self._thread.join()

    def _loop(self) -> None:
        """The worker: batches until closed; an unexpected failure fails every request it holds
        or will get, never leaving a future pending."""
        try:
            self._batches()
        except BaseException as exc:
            self._closed = True
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    _settle(item, exc=exc)

    def _batches(self) -> None:
        while (first := self._queue.get()) is not None:
            pending = [first]
            try:
                closing = self._wait_for_more(pending)
                pending.sort(key=lambda r: r.order)
                for key in dict.fromkeys(_batch_key(r) for r in pending):
                    self._sample([r for r in pending if _batch_key(r) == key])
            except BaseException as exc:
                for request in pending:
                    _settle(request, exc=exc)
                raise
            if closing:
                return

    def _wait_for_more(self, pending: list[GenerationRequest]) -> bool:
        """Add requests to ``pending`` until every running requester has one there, or ``wait_s``
        after the first; True when the queue was closed meanwhile."""
        deadline = time.monotonic() + self.wait_s
        while len(pending) < self.running():  # some requester has no request pending yet
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:  # short polls: a requester that finishes instead of submitting ends the wait too
                item = self._queue.get(timeout=min(remaining, 0.005))
            except queue.Empty:
                continue
            if item is None:
                return True
            pending.append(item)
        return False

    def _sample(self, requests: list[GenerationRequest]) -> None:
        """One ``engine.generate`` for ``requests`` (same temperature/top_p/top_k); every caller of
        the batch sees an engine failure."""
        seeds = [r.seed for r in requests]
        sampling = replace(
            requests[0].sampling,
            max_new_tokens=max(r.sampling.max_new_tokens for r in requests),
            seed=None,
            prompt_seeds=None if None in seeds else tuple(seeds),
        )
        self.batches.append(len(requests))
        try:
            generations = self.engine.generate([r.prompt for r in requests], sampling)
            if len(generations) != len(requests):
                raise RuntimeError(f"the engine returned {len(generations)} generations for {len(requests)} prompts")
        except Exception as exc:
            for request in requests:
                _settle(request, exc=exc)
            return
        for request, generation in zip(requests, generations):
            _settle(request, cut(generation, request.sampling.max_new_tokens))


def _settle(request: GenerationRequest, result: Generation | None = None, exc: BaseException | None = None) -> None:
    """Give ``request``'s future its result or exception, unless it is already done (cancelled)."""
    if request.future.done():
        return
    if exc is not None:
        request.future.set_exception(exc)
    else:
        request.future.set_result(result)


def _batch_key(request: GenerationRequest) -> tuple[Any, ...]:
    sampling = request.sampling
    return sampling.temperature, sampling.top_p, sampling.top_k


def cut(generation: Generation, max_new_tokens: int) -> Generation:
    """``generation`` cut to ``max_new_tokens`` (finish reason ``length`` when cut)."""
    if len(generation.token_ids) <= max_new_tokens:
        return generation
    kept = None if generation.kept_logmass is None else list(generation.kept_logmass[:max_new_tokens])
    versions = None if generation.token_versions is None else list(generation.token_versions[:max_new_tokens])
    return Generation(
        list(generation.token_ids[:max_new_tokens]),
        "length",
        list(generation.logprobs[:max_new_tokens]),
        kept,
        generation.policy_version,
        versions,
    )
