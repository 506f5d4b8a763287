"""Continuous batching for the ``vllm`` engine: requests that arrive one at a time join vLLM's
running batch between decode steps (``VLLMEngine.request_queue``).

A worker thread drives the in-process vLLM while the queue is open. Each loop it adds the requests
that arrived since the last step (sorted by ``order``; each with its own seed, or the next one of
the engine's generator) and runs one engine ``step()``; a finished request's future gets the
:class:`Generation` that ``VLLMEngine.generate`` would give for the same prompt, sampling and seed
(the same vLLM sampling parameters, the same conversion). When nothing is running, the worker waits
for the first request, then, like ``BatchingQueue``, until every running requester has one pending
or ``wait_s`` has passed, so the first step starts with a full batch; while vLLM decodes it never
waits. A failing step fails every pending request (those in vLLM, aborted there, and those queued);
a request vLLM refuses (a prompt longer than ``max_model_len``) fails alone.

When the engine's ``before_decode_step`` is set (an asynchronous run with ``partial_rollouts``),
the worker asks it before every step, so the weights can change while requests are running
(``stepwise.py``: they are recomputed with the new weights), and each Generation records the
version of each of its tokens.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from agentrl import EngineError, GenerationRequest, RequestQueue
from agentrl_vllm_engine.common import generation, use_torch_threads
from agentrl_vllm_engine.stepwise import TokenVersions, add_request

if TYPE_CHECKING:
    from agentrl_vllm_engine.engine import VLLMEngine


class VLLMRequestQueue(RequestQueue):
    """Adds each request to the running vLLM batch as it arrives (module docstring)."""

    def __init__(self, engine: VLLMEngine, wait_s: float, running: Callable[[], int]) -> None:
        self.engine, self.wait_s, self.running = engine, wait_s, running
        self.batches: list[int] = []
        self.added_at: list[int] = []
        """The engine step before which each entry of ``batches`` was added (0: the first step)."""
        self.steps = 0
        """Engine steps run so far."""
        self._inbox: queue.Queue[GenerationRequest | None] = queue.Queue()
        self._in_vllm: dict[str, GenerationRequest] = {}
        self._lock, self._closed, self._closing = threading.Lock(), False, False
        hook = engine.before_decode_step
        self.versions = None if hook is None else TokenVersions(hook)
        """Each running request's tokens' versions, when weights may change between decode steps."""
        self._thread = threading.Thread(target=self._loop, name="agentrl-vllm-queue", daemon=True)
        self._thread.start()

    def submit(self, request: GenerationRequest) -> Future:
        """Queue ``request``; a bad prompt or sampling value fails its future alone."""
        try:
            self.engine.validate([request.prompt], request.sampling)
        except EngineError as exc:
            request.future.set_exception(exc)
            return request.future
        with self._lock:
            if self._closed:
                raise EngineError("this vllm request queue is closed: open a new one with engine.request_queue()")
            self._inbox.put(request)
        return request.future

    def is_worker(self) -> bool:
        """Whether the caller is this queue's worker thread (which may load weights between steps)."""
        return threading.current_thread() is self._thread

    def close(self) -> None:
        """Sample every request already submitted, stop the worker and give vLLM back to the engine."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._inbox.put(None)
        self._thread.join()
        self.engine.queue_closed()

    def _loop(self) -> None:
        use_torch_threads()  # a new thread's OpenMP pool would use the default
        while not (self._closing and not self._in_vllm):
            try:
                self._add(self._collect())
                if self._in_vllm:
                    self._step()
            except Exception as exc:
                self._fail(exc)

    def _collect(self) -> list[GenerationRequest]:
        """The requests that arrived since the last step; when vLLM is idle, wait as the module
        docstring says."""
        new: list[GenerationRequest] = []
        if not self._in_vllm and not self._closing:
            new += self._take(block=True)
            deadline = time.monotonic() + self.wait_s
            while new and not self._closing and len(new) < self.running():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                new += self._take(block=True, timeout=min(remaining, 0.005))  # short polls: see BatchingQueue
        while taken := self._take(block=False):
            new += taken
        return new

    def _take(self, block: bool, timeout: float | None = None) -> list[GenerationRequest]:
        """At most one request from the inbox ([] when none came or the close marker did)."""
        try:
            item = self._inbox.get(block=block, timeout=timeout)
        except queue.Empty:
            return []
        if item is None:
            self._closing = True
            return []
        return [item]

    def _add(self, requests: list[GenerationRequest]) -> None:
        added = 0
        for request in sorted(requests, key=lambda r: r.order):
            seed = self.engine.seeds.getrandbits(63) if request.seed is None else int(request.seed) % 2**63
            params = self.engine.vllm_params(request.sampling, seed)
            try:
                request_id = add_request(self.engine, request.prompt, params, every_step=self.versions is not None)
            except Exception as exc:  # this request only: vLLM refused it
                _settle(request.future, exc=exc)
                continue
            self._in_vllm[request_id] = request
            added += 1
        if added:
            self.batches.append(added)
            self.added_at.append(self.steps)

    def _step(self) -> None:
        if self.versions is not None:
            self.versions.refresh()
        outputs = self.engine.llm.llm_engine.step()
        self.steps += 1
        for output in outputs:
            if self.versions is not None:
                self.versions.record(output)
            if output.finished and output.request_id in self._in_vllm:
                request = self._in_vllm.pop(output.request_id)
                result = generation(output.outputs[0], self.engine.stop_ids)
                _settle(
                    request.future, result if self.versions is None else self.versions.stamp(output.request_id, result)
                )

    def _fail(self, exc: Exception) -> None:
        """``exc`` reaches every pending request: those in vLLM (aborted there) and those queued."""
        pending = list(self._in_vllm.values())
        with contextlib.suppress(Exception):  # the engine already failed: its error is what callers see
            self.engine.llm.llm_engine.abort_request(list(self._in_vllm))
        self._in_vllm.clear()
        if self.versions is not None:
            self.versions.seen.clear()
        while taken := self._take(block=False):
            pending += taken
        for request in pending:
            _settle(request.future, exc=exc)


def _settle(future: Future, result: Any = None, exc: BaseException | None = None) -> None:
    """Give ``future`` its result or exception unless its caller cancelled it."""
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)
