"""Weights that change between vLLM's decode steps (an asynchronous run with ``partial_rollouts``).

When the run sets ``Engine.before_decode_step``, the ``vllm`` engine drives vLLM one engine step
at a time (``generate`` here, the continuous-batching queue in ``continuous.py``) and asks the hook
before each step. A new version is loaded by ``VLLMEngine.sync_weights``, whose prefix-cache reset
preempts every running request (``reset_prefix_cache(reset_running_requests=True)``): vLLM then
recomputes each one's prompt and tokens so far with the new weights before it samples again, so
no KV computed with the old weights is extended and a token sampled after the change is exactly
the new version's sample, with its logprob (one prefill per request per change). Requests are
added with cumulative outputs, so every step reports each request's tokens so far and
:class:`TokenVersions` stamps the new ones with the version the step ran with.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agentrl import Generation, SamplingParams
from agentrl_vllm_engine.common import generation

if TYPE_CHECKING:
    from agentrl_vllm_engine.engine import VLLMEngine

_ids = itertools.count()


class TokenVersions:
    """Per vLLM request, the policy version of each token it has sampled so far.

    ``ask`` is the engine's ``before_decode_step``; :meth:`refresh` calls it before each engine
    step (loading a newer version first, which preempts the running requests). When its first
    answer is None (the run's collection has stopped) nothing is recorded at all."""

    def __init__(self, ask: Callable[[], int | None]) -> None:
        self.ask = ask
        self.version: int | None = None
        self.started = self.tracking = False
        self.seen: dict[str, list[int]] = {}

    def refresh(self) -> None:
        """Ask for the version the next step samples from."""
        version = self.ask()
        if not self.started:
            self.started, self.tracking = True, version is not None
        if version is not None:
            self.version = version

    def record(self, output: Any) -> None:
        """Stamp the tokens ``output`` (a cumulative ``RequestOutput``) has gained since the last step."""
        if not self.tracking:
            return
        versions = self.seen.setdefault(output.request_id, [])
        versions += [self.version] * (len(output.outputs[0].token_ids) - len(versions))

    def stamp(self, request_id: str, generation: Generation) -> Generation:
        """``generation`` (request ``request_id``'s, finished) with its tokens' versions."""
        versions = self.seen.pop(request_id, None)
        if self.tracking and versions is not None:
            generation.token_versions = versions[: len(generation.token_ids)]
            generation.policy_version = versions[0] if versions else self.version
        return generation


def add_request(engine: VLLMEngine, prompt: list[int], params: Any, every_step: bool = True) -> str:
    """Add one request to ``engine``'s vLLM without running it; its id. ``every_step``: an output
    with its tokens so far after every step (cumulative), else only the final one."""
    from vllm.sampling_params import RequestOutputKind

    params.output_kind = RequestOutputKind.CUMULATIVE if every_step else RequestOutputKind.FINAL_ONLY
    request_id = f"agentrl{next(_ids)}"  # what its outputs carry (vLLM's internal id adds a suffix)
    engine.llm.llm_engine.add_request(request_id, engine.tokens_prompt(prompt), params)
    return request_id


def generate(
    engine: VLLMEngine, prompts: list[list[int]], sampling: SamplingParams, seeds: list[int]
) -> list[Generation]:
    """``VLLMEngine.generate``'s samples, one engine step at a time with the hook asked before each
    (the module docstring); the same tokens and logprobs as ``LLM.generate`` when nothing changes."""
    versions = TokenVersions(engine.before_decode_step)
    rows = [add_request(engine, prompt, engine.vllm_params(sampling, seed)) for prompt, seed in zip(prompts, seeds)]
    done: dict[str, Generation] = {}
    try:
        while len(done) < len(rows):
            versions.refresh()
            for output in engine.llm.llm_engine.step():
                versions.record(output)
                if output.finished:
                    done[output.request_id] = versions.stamp(
                        output.request_id, generation(output.outputs[0], engine.stop_ids)
                    )
    except BaseException:
        engine.llm.llm_engine.abort_request([r for r in rows if r not in done])
        raise
    return [done[r] for r in rows]
