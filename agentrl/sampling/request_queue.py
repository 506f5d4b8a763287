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

Which thread samples. A :class:`BatchingQueue` samples in a worker thread of its own, unless built
with ``worker_thread=False``: then :func:`sample_here` runs the requesters' loop in a helper thread
and the engine in the calling thread, the one that also runs the update. On a CPU that is what keeps
decoding fast: torch's OpenMP runtime (GNU libgomp) keeps a pool of workers per thread that ever ran
a parallel operator, and once the pools hold more threads than there are cores it stops spinning
between operators and sleeps instead, so a decode step's hundreds of small matmuls each wait for a
worker to wake. Sampled from a second thread beside the trainer's, a GRPO step's generation took
9.3 s; from the trainer's own thread 6.7 s (the same 32 prompts and seeds, 2 cores, AMD EPYC Zen 4).
"""

from __future__ import annotations

import abc
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from agentrl.errors import EngineError
from agentrl.sampling.engine import Engine, Generation, SamplingParams

T = TypeVar("T")


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


def request_queue(
    engine: Engine, wait_s: float, running: Callable[[], int], worker_thread: bool = True
) -> RequestQueue:
    """The queue for ``engine``: its own ``request_queue(wait_s, running)`` when it has one, else a
    :class:`BatchingQueue` (``worker_thread=False``: one that :func:`sample_here` serves).
    ``running()`` is how many requesters may still submit (those that have not finished): a batch
    waits for at most that many requests."""
    own = getattr(engine, "request_queue", None)
    if callable(own):
        return own(wait_s, running)
    return BatchingQueue(engine, wait_s, running, worker_thread)


def sample_here(queue: RequestQueue, requesters: Callable[[], T]) -> T:
    """``requesters()`` (which submits to ``queue`` and closes it when done), with the engine's
    sampling in this thread: ``requesters`` runs in a helper thread while this one serves ``queue``
    (a :class:`BatchingQueue` built with ``worker_thread=False``; any other queue samples on its
    own, and ``requesters`` simply runs here). Returns what ``requesters`` returned, or raises what
    it raised; an interrupt here fails the pending requests and is raised at once."""
    if not isinstance(queue, BatchingQueue) or queue.serves_itself:
        return requesters()
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = requesters()
        except BaseException as exc:  # handed to the serving thread, which raises it
            outcome["error"] = exc
        finally:
            queue.close()  # ends serve() even when requesters failed before closing it

    helper = threading.Thread(target=run, name="agentrl-requesters", daemon=True)
    helper.start()
    queue.serve()
    helper.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


class BatchingQueue(RequestQueue):
    """Batches pending requests into ``engine.generate`` calls, in a worker thread of its own, or
    (``worker_thread=False``) in the thread that calls :meth:`serve` (module docstring)."""

    def __init__(self, engine: Engine, wait_s: float, running: Callable[[], int], worker_thread: bool = True) -> None:
        self.engine, self.wait_s, self.running = engine, wait_s, running
        self.batches = []
        self._closed = False
        self._queue: queue.Queue[GenerationRequest | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        if worker_thread:
            self._thread = threading.Thread(target=self._loop, name="agentrl-batching-queue", daemon=True)
            self._thread.start()

    @property
    def serves_itself(self) -> bool:
        """Whether a worker thread of the queue's own samples (else :meth:`serve` must)."""
        return self._thread is not None

    def serve(self) -> None:
        """Sample the requests in this thread until the queue is closed (a queue built with
        ``worker_thread=False``); an exception here fails every request held and is raised."""
        if self._thread is not None:
            raise EngineError("this request queue samples in its own worker thread: serve() is for worker_thread=False")
        self._loop(reraise=True)

    def submit(self, request: GenerationRequest) -> Future:
        """Queue ``request`` (see :meth:`RequestQueue.submit`); EngineError once the queue is closed."""
        if self._closed:
            raise EngineError("the request queue is closed: submit before close()")
        self._queue.put(request)
        return request.future

    def close(self) -> None:
        """Stop sampling after the batches already queued (a worker thread: waits for them)."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
        if self._thread is not None:
            self._thread.join()

    def _loop(self, reraise: bool = False) -> None:
        """The worker: batches until closed; an unexpected failure fails every request it holds
        or will get, never leaving a future pending (and is raised again with ``reraise``)."""
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
            if reraise:
                raise

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
