"""agentrl.sampling.request_queue: requests one at a time, batched into the real hf engine's generate calls."""

from __future__ import annotations

import threading

import pytest

from agentrl import EngineError, SamplingParams
from agentrl.config.train import TrainConfig
from agentrl.plugins import load_plugins
from agentrl.sampling.request_queue import BatchingQueue, GenerationRequest, request_queue, sample_here
from agentrl.testing import build_tiny_model


class Recording:
    """The real hf engine, keeping each generate call's prompts."""

    def __init__(self, tokenizer):
        factory = load_plugins().registry.get("engine", "hf").factory
        self.inner = factory(
            model=build_tiny_model(len(tokenizer)),
            tokenizer=tokenizer,
            config=TrainConfig(engine_args={"dtype": "float32"}),
        )
        self.calls = []

    def generate(self, prompts, sampling):
        self.calls.append([p[0] for p in prompts])
        return self.inner.generate(prompts, sampling)


PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]]


def test_requests_sample_what_generate_samples_with_their_seeds_in_order(tokenizer):
    engine = Recording(tokenizer)
    queue = request_queue(engine, 30.0, lambda: len(PROMPTS))
    assert isinstance(queue, BatchingQueue)
    caps = [3, 8, 5, 8]
    futures = [
        queue.submit(GenerationRequest(p, SamplingParams(max_new_tokens=cap), seed=100 + i, order=i))
        for i, (p, cap) in reversed(list(enumerate(zip(PROMPTS, caps))))
    ]
    results = [f.result(timeout=60) for f in reversed(futures)]
    queue.close()
    assert engine.calls == [[5, 8, 10, 14]] and queue.batches == [4]  # one batch, in ``order``, not arrival order
    direct = engine.inner.generate(PROMPTS, SamplingParams(max_new_tokens=8, prompt_seeds=(100, 101, 102, 103)))
    for result, expected, cap in zip(results, direct, caps):
        assert result.token_ids == expected.token_ids[:cap]  # each cut to its own cap
        assert result.logprobs == pytest.approx(expected.logprobs[:cap], abs=1e-5)
        assert len(result.token_ids) <= cap
        assert result.finish_reason == ("length" if len(expected.token_ids) > cap else expected.finish_reason)


def test_a_batch_waits_for_the_running_requesters_only_and_splits_by_temperature(tokenizer):
    engine = Recording(tokenizer)
    running = [2]
    queue = request_queue(engine, 30.0, lambda: running[0])
    first = [
        queue.submit(GenerationRequest(p, SamplingParams(max_new_tokens=2, temperature=t), seed=i, order=i))
        for i, (p, t) in enumerate(zip(PROMPTS[:2], (1.0, 0.0)))
    ]
    [f.result(timeout=60) for f in first]
    running[0] = 1  # one requester left: its request goes at once, however long wait_s is
    queue.submit(GenerationRequest(PROMPTS[2], SamplingParams(max_new_tokens=2), seed=7)).result(timeout=20)
    queue.close()
    assert engine.calls == [[5], [8], [10]] and queue.batches == [1, 1, 1]


class Failing:
    def generate(self, prompts, sampling):
        raise RuntimeError("device lost")


def test_failures_reach_every_caller_and_a_closed_queue_refuses(tokenizer):
    queue = request_queue(Failing(), 30.0, lambda: 2)
    futures = [queue.submit(GenerationRequest(p, SamplingParams(), seed=i)) for i, p in enumerate(PROMPTS[:2])]
    for future in futures:
        with pytest.raises(RuntimeError, match="device lost"):
            future.result(timeout=20)
    queue.close()
    with pytest.raises(EngineError, match="closed"):
        queue.submit(GenerationRequest(PROMPTS[0], SamplingParams()))

    def broken() -> int:
        raise ValueError("no count")

    queue = request_queue(Recording(tokenizer), 1.0, broken)  # the worker itself fails: no future left pending
    future = queue.submit(GenerationRequest(PROMPTS[0], SamplingParams()))
    with pytest.raises(ValueError, match="no count"):
        future.result(timeout=20)


def test_an_engine_may_supply_its_own_queue(tokenizer):
    class OwnQueue(Recording):
        def request_queue(self, wait_s, running):
            self.asked = (wait_s, running())
            return BatchingQueue(self, wait_s, running)

    engine = OwnQueue(tokenizer)
    with request_queue(engine, 0.25, lambda: 3) as queue:
        assert engine.asked == (0.25, 3) and isinstance(queue, BatchingQueue)
    assert not queue._thread.is_alive()  # leaving the block closed it


class ThreadRecording(Recording):
    """The real hf engine, keeping the thread each generate call ran in."""

    def generate(self, prompts, sampling):
        self.threads = [*getattr(self, "threads", []), threading.current_thread()]
        return super().generate(prompts, sampling)


def test_sample_here_samples_in_the_calling_thread_while_the_requesters_run_in_another(tokenizer):
    engine = ThreadRecording(tokenizer)
    queue = request_queue(engine, 30.0, lambda: len(PROMPTS), worker_thread=False)
    assert not queue.serves_itself

    def requesters() -> list[list[int]]:
        futures = [
            queue.submit(GenerationRequest(p, SamplingParams(max_new_tokens=4), seed=i, order=i))
            for i, p in enumerate(PROMPTS)
        ]
        results = [f.result(timeout=60).token_ids for f in futures]
        queue.close()
        return [threading.current_thread().name, *results]

    helper, *results = sample_here(queue, requesters)
    assert engine.threads == [threading.current_thread()] and helper == "agentrl-requesters"
    direct = engine.inner.generate(PROMPTS, SamplingParams(max_new_tokens=4, prompt_seeds=(0, 1, 2, 3)))
    assert results == [g.token_ids for g in direct]  # as a worker thread samples them


def test_sample_here_raises_what_the_requesters_raised_and_ends_serving(tokenizer):
    queue = request_queue(Recording(tokenizer), 30.0, lambda: 1, worker_thread=False)

    def requesters() -> None:
        queue.submit(GenerationRequest(PROMPTS[0], SamplingParams(max_new_tokens=2))).result(timeout=60)
        raise KeyError("env lost")  # without closing the queue: sample_here closes it

    with pytest.raises(KeyError, match="env lost"):
        sample_here(queue, requesters)
    with pytest.raises(EngineError, match="closed"):
        queue.submit(GenerationRequest(PROMPTS[0], SamplingParams()))
    failing = request_queue(Failing(), 30.0, lambda: 1, worker_thread=False)
    with pytest.raises(RuntimeError, match="device lost"):  # an engine failure reaches the requester
        sample_here(failing, lambda: failing.submit(GenerationRequest(PROMPTS[0], SamplingParams())).result(60))
    threaded = request_queue(Recording(tokenizer), 30.0, lambda: 1)  # samples on its own: no serving here
    with pytest.raises(EngineError, match="own worker thread"):
        threaded.serve()
    assert sample_here(threaded, lambda: 7) == 7
    threaded.close()
