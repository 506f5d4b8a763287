"""What the in-process ``vllm`` engine (:mod:`agentrl_vllm_engine.engine`), its request queue
(:mod:`agentrl_vllm_engine.continuous`), its step-by-step loop (:mod:`agentrl_vllm_engine.stepwise`)
and the ``vllm_server`` engine (:mod:`agentrl_vllm_engine.server`) share: which ``logprobs_mode``
gives the trainer's logprobs, the options that keep a prompt whole on CPU, the sampling thread's
torch threads, and a vLLM completion as a Generation."""

from __future__ import annotations

from typing import Any

import torch

from agentrl import EngineError, Generation


def logprobs_mode(temperature: float, top_k: int, top_p: float) -> str:
    """The vLLM ``logprobs_mode`` whose sampled-token logprob is the full-vocabulary
    ``log_softmax(logits / T)`` for a run sampling with these settings (:mod:`agentrl_vllm_engine.engine`,
    "Logprobs")."""
    if top_k <= 0 and top_p >= 1.0:
        return "processed_logprobs"
    if temperature == 1.0:
        return "raw_logprobs"
    raise EngineError(
        f"the vllm engine cannot report the sampler's full-vocabulary logprobs with top_k={top_k}, "
        f"top_p={top_p} and temperature={temperature}: vLLM gives them renormalised over the kept "
        "tokens (after temperature) or before temperature. Use temperature 1 with top_k/top_p, or "
        "turn top_k/top_p off, or use --engine hf"
    )


def whole_prompts(max_model_len: int) -> dict[str, Any]:
    """On CPU, vLLM options that never split a prompt over engine steps (none on a GPU).

    A prompt prefilled in parts (chunked prefill: a step's prompt tokens over its budget, as when a
    batch of long turns starts, or requests preempted by a weight change are recomputed) has the
    sample of each partial step discarded, and vLLM rewinds the request's seeded generator, which
    a CPU generator cannot do: ``RuntimeError: CPU Generator does not use offset``. Without chunked
    prefill a request waits for a step with room for its whole prompt (what vLLM does itself on CPU
    for MLA models)."""
    if torch.cuda.is_available():
        return {}
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(max_model_len, 4096)}


def use_torch_threads() -> None:
    """Size the calling thread's OpenMP pool as torch's thread count (:mod:`agentrl_vllm_engine.engine`, "Threads")."""
    torch.set_num_threads(torch.get_num_threads())


def generation(completion: Any, stop_ids: list[int]) -> Generation:
    """A vLLM ``CompletionOutput`` as a token-exact Generation."""
    ids = [int(t) for t in completion.token_ids]
    logprobs = [float(step[token].logprob) for step, token in zip(completion.logprobs, ids)]
    stopped = completion.finish_reason == "stop" and bool(ids) and ids[-1] in stop_ids
    return Generation(token_ids=ids, logprobs=logprobs, finish_reason="stop" if stopped else "length")
