"""The ``hf`` engine: batched, KV-cached sampling from a Hugging Face causal LM, token-exact.

Which policy samples (``engine_args.dtype``):

* ``auto`` (default): ``bfloat16`` when the run computes in bf16 (``precision``, whose ``auto``
  asks the hardware: :func:`agentrl.resolve_precision`), else ``float32``.
* ``bfloat16``: a bf16 copy of the trainer's weights (1.5x the tokens/s of fp32 on a CPU with
  AMX; far slower than fp32 on an AVX2-only CPU). ``sync_weights(model)`` copies the trainer's
  parameters into it in place after every optimizer step; a tied LM head is the same tensor as
  the embedding, so it follows.
* ``bfloat16_weights``: an fp32 copy holding the trainer's weights rounded to bf16, synced the same
  way: bf16's sampler at fp32's speed where bf16 compute is emulated. ``auto`` picks it where
  ``precision: auto`` chose fp32, so the default job samples from the same rounded weights on every
  CPU. It is what makes the main job learn the ``\\boxed{}`` format there: an AdamW step of lr 2e-5
  is below bf16's spacing for most weights, so the sampler moves only where several steps agree;
  sampling from the exact fp32 weights, the policy followed every step's noise and settled on
  short unboxed answers within ten steps on some seeds (docs/benchmarks/hardware.md).
* ``float32``: the trainer's own model object, put in eval mode for the call and restored after.

Logprob semantics. Tokens are drawn from ``softmax(warp(logits / T))`` in float32 (logits upcast
first: docs/concepts/guards.md#logprob-parity), where ``warp`` keeps the ``top_k`` largest scores and then the
smallest set
reaching mass ``top_p`` (the order and tie rules of transformers' warpers and vLLM) and sets the
rest to -inf. ``Generation.logprobs[t]`` is the sampled token's full-vocabulary
``log_softmax(logits / T)``, the same support as the trainer's logprobs (docs/concepts/guards.md#logprob-parity: a
renormalised logprob would exceed the trainer's by ``-log(kept mass)`` and every sampler/trainer
ratio would silently carry it); ``Generation.kept_logmass[t]`` is ``log(kept mass)``, so the
probability the token was actually drawn with is ``logprobs - kept_logmass``. Greedy
(``temperature=0``) reports ``log_softmax(logits)`` at T=1. ``float32`` matches a separate fp32
forward of prompt + completion to ~1e-5; ``bfloat16`` gives the bf16 sampler's own numbers (the
behaviour policy): on SmolLM2 a mean |difference| of ~0.04 to the trainer's.

The decode loop is written out rather than calling ``model.generate``: it owns its
``torch.Generator`` (a seed never touches the global RNG; a seeded batch gives every prompt its
own generator and draws by inverse CDF, so a prompt samples the same tokens in any batch), never
inherits sampling defaults from the model's ``generation_config`` (transformers fills an unset ``top_k`` with 50),
computes each step's logprobs on the fly instead of keeping every step's (B, V) scores, prefills each distinct
prompt once (a GRPO group shares its prompt) and drops finished rows from the batch.
Left padding, the attention mask and ``position_ids = cumsum(mask) - 1`` are built here from the
unpadded id lists, never from token ids (SmolLM2's pad id is its eos id,
docs/concepts/guards.md#padding-and-stop-tokens).

Weights can change between decode steps (``swaps_between_decode_steps``): an asynchronous run with
partial rollouts sets ``before_decode_step``, and when it reports a new version the live rows'
sequences so far are prefilled again with the new weights (the old KV cache is dropped, not
extended), so every later token is sampled from, and has the logprob of, the new version alone;
``Generation.token_versions`` records each token's. The recompute costs one prefill per change.

The KV cache grows in place (:mod:`agentrl_hf_engine.kv_cache`): each layer's buffer has room for
the prompt and ``max_new_tokens`` (at most :data:`RESERVE`, doubled when full), so a step writes its
position instead of copying the whole cache as transformers' ``DynamicCache`` does (models with
sliding-window or recurrent layers keep ``DynamicCache``). In those models on a CPU the engine's own
copy of the weights (every ``dtype`` but ``float32``) attends a decode step's one new position by two
float32 matmuls over the grouped KV heads instead of ``sdpa``
(:mod:`agentrl_hf_engine.decode_attention`). A bf16 copy on a CPU also keeps its linear layers' weights
in oneDNN's blocked layout, packed again at every weight sync, so that a decode step's small
matmuls do not reorder them on every call (``engine_args.packed_weights``,
:mod:`agentrl_hf_engine.packed_linear`; bit for bit the same outputs); so does the fp32 copy of
``bfloat16_weights``, where oneDNN is faster than MKL's ``F.linear`` (logprobs to float rounding).

With ``engine_args.prefix_cache_mb`` > 0, finished sequences' KV is kept across calls
(:mod:`agentrl_hf_engine.prefix_cache`) and a prompt prefills only what follows its longest cached
prefix; the cache is cleared on ``sync_weights`` and on a version change (docs/guides/engines.md).
Within a call, the ids every distinct prompt begins with (``engine_args.share_prefix_min_tokens``
or more: a system prompt) are prefilled once as one row whose KV each row's prefill starts from.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from typing import Annotated, Any

import torch
from pydantic import Field

from agentrl import (
    Allowed,
    Engine,
    EngineError,
    Generation,
    OneOf,
    SamplingParams,
    build_plugin_config,
    check_declared,
    eval_mode,
    head_matches,
    hookimpl,
    resolve_precision,
    stop_token_ids,
    token_ids,
)
from agentrl_hf_engine.decode_attention import use_decode_attention
from agentrl_hf_engine.packed_linear import PackedLinear, can_pack, pack_linears, repack
from agentrl_hf_engine.prefix_cache import (
    KV,
    PrefixCache,
    batch_cache,
    only_full_attention,
    row_kv,
    shared_start,
)

ROUNDED = "bfloat16_weights"
"""fp32 compute on the trainer's weights rounded to bf16 (see :class:`HFEngineConfig`)."""
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, ROUNDED: torch.float32}
"""Each ``engine_args.dtype`` and the dtype its sampling copy stores."""
SAMPLES_WITH = {
    "float32": "fp32, the trainer's own weights",
    "bfloat16": "bf16, a copy of the weights",
    ROUNDED: "fp32, a copy of the weights rounded to bf16",
}
"""What each ``engine_args.dtype`` samples with, in words (the banner's ``sampler:`` line)."""
_NO_IDS = torch.empty(0, 0, dtype=torch.long)  # the warpers' unused input_ids
CDF_BLOCK = 256
"""Vocabulary entries per block of :func:`inverse_cdf_sample`'s two-level search."""
RESERVE = 256
"""Most positions a new KV cache reserves past the prompt: a decode of up to this many tokens never
grows it; a longer one doubles it when full, so rows that stop early never held ``max_new_tokens``."""


@dataclass(frozen=True)
class HFEngineConfig:
    """Options of the ``hf`` engine (``engine_args`` in the run config)."""

    dtype: Annotated[str, OneOf("auto", *DTYPES)] = "auto"
    """``auto``: ``bfloat16`` when the run's ``precision`` resolves to bf16, ``bfloat16_weights``
    when ``precision: auto`` resolves to fp32, ``float32`` when precision is set to fp32;
    ``bfloat16``: sample from a bf16 copy of the weights, synced after each step (faster where the
    CPU has native bf16); ``bfloat16_weights``: an fp32 copy of the weights rounded to bf16 (the
    same rounding, fp32 compute); ``float32``: sample from the trainer's own model object (exact
    logprob parity)."""
    batch_size: Annotated[int, Field(ge=1), Allowed("an integer >= 1")] = 64
    """Most prompts decoded together; larger requests are split."""
    prefix_cache_mb: Annotated[float, Field(ge=0), Allowed("a number of MiB >= 0")] = 0
    """MiB of KV for the prefix cache (0: off): finished sequences' KV kept across calls in a radix
    tree over their token ids, so a later prompt that starts with stored ids (the next turn, an
    agent's next call, a shared system prompt) prefills only the tokens after them; least recently
    used evicted first, cleared on every weight sync. A hit's logprobs equal the uncached engine's
    to float rounding, not bit for bit, so what is sampled depends on what the cache held (other
    processes, replicas or checkpoints, other near-ties): opt-in."""
    share_prefix_min_tokens: Annotated[int, Field(ge=0), Allowed("an integer >= 0")] = 64
    """A call's distinct prompts that all begin with the same ids, at least this many (a system
    prompt, an agent's instructions), prefill them once as one row whose KV every row starts from,
    instead of once per row (0: off). Tokens match, logprobs to float rounding; below the default
    the saving does not pay for the extra forward call."""
    packed_weights: bool = True
    """On a CPU in ``bfloat16``, keep the sampling copy's linear weights in oneDNN's blocked layout,
    reordered once per weight sync instead of on every call (:mod:`agentrl_hf_engine.packed_linear`):
    the same tokens and logprobs bit for bit, decode steps ~1.25x faster, the weights' memory once
    more. In ``bfloat16_weights`` the fp32 copy too (oneDNN instead of MKL: decode steps 1.3-1.65x
    faster, logprobs to float rounding). ``float32`` is never packed. False: off."""

    def __post_init__(self) -> None:
        """Raise ConfigError naming the key, the bad value and what is allowed."""
        check_declared(self, "engine_args")


def sampling_dtype(asked: str, precision: str, device: torch.device) -> str:
    """The dtype the engine samples in: ``asked`` unless ``auto``, which follows the run's precision:
    ``bfloat16`` where the run computes in bf16, ``bfloat16_weights`` where ``precision: auto``
    chose fp32 (the hardware has no native bf16), ``float32`` where the config asked for fp32."""
    if asked != "auto":
        return asked
    if resolve_precision(precision, device).bf16:
        return "bfloat16"
    return ROUNDED if precision == "auto" else "float32"


def warp_logits(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """The scores sampled from: float32 ``logits / T`` with top-k then top-p applied (-inf = dropped).

    ``logits`` is ``(B, V)``; greedy (``temperature == 0``) returns the upcast logits unchanged.
    """
    # transformers' own warpers (vLLM's order and tie rules); neither reads ``input_ids``. Imported
    # here, not at the top: loading the plugin (every CLI command) stays light.
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    scores = logits.float()  # (B, V)
    if sampling.temperature == 0:
        return scores
    if sampling.temperature != 1.0:
        scores = scores / sampling.temperature
    if 0 < sampling.top_k < scores.shape[-1]:
        scores = TopKLogitsWarper(sampling.top_k)(_NO_IDS, scores)
    if sampling.top_p < 1.0:
        scores = TopPLogitsWarper(sampling.top_p)(_NO_IDS, scores)
    return scores


@dataclass
class _Outputs:
    """What one decode has sampled so far, per sequence (B of them): the ids, their full-vocabulary
    logprobs, their kept log-mass, the policy version of each, and each sequence's finish reason."""

    tokens: list[list[int]]
    logprobs: list[list[float]]
    kept: list[list[float]]
    versions: list[list[int | None]]
    reasons: list[str]

    @classmethod
    def empty(cls, sequences: int) -> _Outputs:
        """Nothing sampled yet for ``sequences`` sequences, each ending at the length cap unless it stops."""
        return cls(
            [[] for _ in range(sequences)],
            [[] for _ in range(sequences)],
            [[] for _ in range(sequences)],
            [[] for _ in range(sequences)],
            ["length"] * sequences,
        )

    def record(
        self,
        active: list[int],
        sampled: torch.Tensor,
        full: torch.Tensor,
        picked: torch.Tensor,
        stopped: torch.Tensor,
        version: int | None,
    ) -> None:
        """Append one step's draw of the live rows (``active``: each row's sequence) to their sequences:
        the ``sampled`` ids, ``full`` logprobs and kept log-mass ``full - picked``, each (A,), sampled
        with ``version``; a row whose token is a stop id (``stopped``, (A,)) ends with ``stop``."""
        rows = zip(active, sampled.tolist(), full.tolist(), (full - picked).tolist(), stopped.tolist())
        for seq, token, logprob, logmass, done in rows:
            self.tokens[seq].append(token)
            self.logprobs[seq].append(logprob)
            self.kept[seq].append(logmass)
            self.versions[seq].append(version)
            if done:
                self.reasons[seq] = "stop"

    def generations(self, tracked: bool) -> list[Generation]:
        """One Generation per sequence; its tokens' versions only when the decode ``tracked`` them."""
        stamped = self.versions if tracked else [None] * len(self.tokens)
        return [
            Generation(token_ids=t, logprobs=lp, kept_logmass=k, finish_reason=r, token_versions=v)
            for t, lp, k, r, v in zip(self.tokens, self.logprobs, self.kept, self.reasons, stamped)
        ]


class HFEngine(Engine):
    """Sample completions from a HF causal LM; see the module docstring for the logprob semantics."""

    config_class = HFEngineConfig
    swaps_between_decode_steps = True

    def __init__(self, model: torch.nn.Module, tokenizer: Any = None, config: Any = None) -> None:
        args = dict(getattr(config, "engine_args", None) or {})
        self.options: HFEngineConfig = build_plugin_config(HFEngineConfig, args, "engine_args")
        self.stop_ids = stop_token_ids(model, tokenizer)
        self.pad_id = _pad_id(model, tokenizer, self.stop_ids)
        self.device = next(model.parameters()).device
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(getattr(config, "seed", 0)))
        budget = int(self.options.prefix_cache_mb * 2**20)
        self._grows = only_full_attention(model.config)  # a cache growing in place fits its layers
        self.prefix_cache: PrefixCache | None = PrefixCache(budget) if budget > 0 and self._grows else None
        self._counts = {"prefix_hit_tokens": 0, "prefilled_tokens": 0}
        self.dtype = sampling_dtype(self.options.dtype, getattr(config, "precision", "auto"), self.device)
        if self.dtype == "float32":
            self.model = model
        else:
            self.model = _low_precision_copy(model, DTYPES[self.dtype])
            if self.dtype == ROUNDED:
                self.sync_weights(model)  # the copy's fp32 weights, rounded
            if self._grows and self.device.type == "cpu":  # decode steps attend by matmul (measured on CPUs)
                use_decode_attention(self.model)  # the copy only: the trainer's model keeps sdpa
            if self.options.packed_weights and can_pack(self.model, float32=self.dtype == ROUNDED):
                pack_linears(self.model)  # the copy only, again
        parameters = inspect.signature(model.forward).parameters
        self._keep_logits = "logits_to_keep" in parameters
        # transformers >= 5.24 renamed the forward's ``past_key_values`` to ``cache`` (and warns at the old name)
        self._cache_arg = "cache" if "cache" in parameters else "past_key_values"
        packed_head = isinstance(self.model.get_output_embeddings(), PackedLinear)  # faster than the own head
        self._own_head = (
            self.device.type == "cpu"
            and DTYPES[self.dtype] == torch.float32
            and not packed_head
            and head_matches(self.model)
        )

    def counts(self) -> dict[str, float]:
        """Tokens taken from the prefix cache and tokens prefilled since the last call, as
        ``engine/prefix_hit_tokens`` and ``engine/prefilled_tokens`` (the run adds them to the next
        step's metrics, summed over processes); nothing while the cache is off."""
        if self.prefix_cache is None:
            return {}  # off: the run's metrics are as they were
        counts = {f"engine/{key}": float(value) for key, value in self._counts.items()}
        self._counts = dict.fromkeys(self._counts, 0)
        return counts

    @property
    def keeps_synced_model(self) -> bool:
        """In float32 the engine samples from the module :meth:`sync_weights` was given; otherwise
        from a copy of its own."""
        return self.dtype == "float32"

    @property
    def description(self) -> str:
        """``hf`` engine, what it samples with and the dtype that chose it."""
        return f"hf engine, {SAMPLES_WITH[self.dtype]} (engine_args.dtype: {self.options.dtype} -> {self.dtype})"

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Copy ``model``'s parameters and buffers into the sampling copy, in place (no reallocation).

        Parameters tied in the copy (SmolLM2's LM head and embedding) must be tied in ``model`` too.
        The prefix cache is cleared: its KV is the old weights'.
        """
        if self.prefix_cache is not None:
            self.prefix_cache.clear()
        if self.dtype == "float32":
            self.model = model  # sampling uses the trainer's object itself
            return
        for kind in ("parameters", "buffers"):
            source = dict(getattr(model, f"named_{kind}")(remove_duplicate=False))
            target = dict(getattr(self.model, f"named_{kind}")(remove_duplicate=False))
            if source.keys() != target.keys():
                missing = sorted(source.keys() ^ target.keys())[:5]
                raise EngineError(f"sync_weights: model {kind} differ from the engine's copy: {missing}")
            copied: dict[int, torch.Tensor] = {}
            rounded = self.dtype == ROUNDED and kind == "parameters"
            with torch.no_grad():
                for name, tensor in target.items():
                    if id(tensor) in copied:  # tied: one tensor under two names
                        if copied[id(tensor)] is not source[name]:
                            raise EngineError(
                                f"sync_weights: {name!r} is tied in the engine's copy but not in "
                                "the trainer's model; build the engine from the model as trained"
                            )
                        continue
                    tensor.copy_(source[name].to(torch.bfloat16) if rounded else source[name])
                    copied[id(tensor)] = source[name]
        repack(self.model)

    def state_dict(self) -> dict[str, Any]:
        """The generator used for batches without a seed and the token counts not yet reported.
        Saving also empties the prefix cache: its KV is not saved, so the run goes on from here
        exactly as a run resumed from this save does."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()
        return {"generator": self.generator.get_state(), "counts": dict(self._counts)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the generator and the counts (a checkpoint without them leaves them as built)."""
        if "generator" in state:
            self.generator.set_state(state["generator"])
        self._counts.update(state.get("counts", {}))

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Generation]:
        """Sample one completion per prompt, ``batch_size`` prompts at a time (shortest first)."""
        sampling.validate()
        vocab = self.model.get_output_embeddings().weight.shape[0]
        for i, prompt in enumerate(prompts):
            if len(prompt) == 0:
                raise EngineError(f"prompt {i} is empty: every prompt needs at least one token id")
            if min(prompt) < 0 or max(prompt) >= vocab:
                raise EngineError(
                    f"prompt {i} has token ids outside [0, {vocab}): min {min(prompt)}, max {max(prompt)}"
                )
        seeds = sampling.seeds_for(len(prompts))
        generators: list[torch.Generator] | None = None
        if seeds is not None:  # one stream per prompt: its draws do not depend on its batch-mates
            generators = [torch.Generator(device=self.device).manual_seed(seed) for seed in seeds]
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # less padding per chunk
        results: list[Generation | None] = [None] * len(prompts)
        # dropout off (docs/concepts/guards.md#dropout)
        with eval_mode(self.model), torch.no_grad(), torch.autocast(self.device.type, enabled=False):
            for start in range(0, len(order), self.options.batch_size):
                chunk = order[start : start + self.options.batch_size]
                streams = [generators[i] for i in chunk] if generators is not None else None
                generations = self._decode([prompts[i] for i in chunk], sampling, streams)
                for i, generation in zip(chunk, generations):
                    results[i] = generation
        return [r for r in results if r is not None]  # every slot is filled

    def _decode(
        self, prompts: list[list[int]], sampling: SamplingParams, streams: list[torch.Generator] | None
    ) -> list[Generation]:
        """One KV-cached decode of ``prompts`` (B of them, U distinct); ``streams`` holds one
        generator per prompt (None: the engine's own generator draws for the whole batch).

        With :attr:`before_decode_step` set (an asynchronous run's partial rollouts) it is asked for
        the version before the prefill and before every decode step; new weights recompute the
        live rows' whole sequences (prompt and tokens so far) instead of extending the old KV
        cache, so a token after the change is the new version's sample, logprob and all."""
        refresh = self.before_decode_step
        version = refresh() if refresh is not None else None
        if self.prefix_cache is not None:
            self.prefix_cache.use_version(version)
        reserve = min(sampling.max_new_tokens, RESERVE)  # room past the prompts (grown when needed)
        logits, cache, mask, ids = self._start(prompts, reserve)  # (B, V), its cache, (B, P), (B, P)
        position = mask.sum(-1) - 1  # (B,) of each row's last token
        tracked = refresh is not None and version is not None  # None: the run's thread has stopped
        history = ids if tracked else None  # the ids so far, which a recompute needs
        stop = torch.tensor(sorted(self.stop_ids), device=self.device)
        outputs = _Outputs.empty(len(prompts))
        truncates = sampling.temperature != 0 and (sampling.top_k > 0 or sampling.top_p < 1.0)
        active = list(range(len(prompts)))  # sequence index of each live row
        for step in range(sampling.max_new_tokens):
            sampled, full, picked = self._draw(logits, sampling, streams, active, truncates)
            stopped = torch.isin(sampled, stop)  # (A,)
            outputs.record(active, sampled, full, picked, stopped, version)
            if step == sampling.max_new_tokens - 1 or bool(stopped.all()):
                self._remember(cache, mask, range(len(active)), active, prompts, outputs)
                break
            if bool(stopped.any()):  # drop finished rows from the batch and the cache
                self._remember(cache, mask, stopped.nonzero().squeeze(-1).tolist(), active, prompts, outputs)
                keep = (~stopped).nonzero().squeeze(-1)  # (A',)
                cache.batch_select_indices(keep)
                mask, position, sampled = mask[keep], position[keep], sampled[keep]
                history = history[keep] if history is not None else None
                active = [active[j] for j in keep.tolist()]
            position = position + 1
            mask = torch.cat([mask, mask.new_ones((len(active), 1))], dim=-1)  # (A, P + step + 1)
            if history is not None:
                history = torch.cat([history, sampled[:, None]], dim=-1)  # (A, P + step + 1)
                now = refresh()
                if now is not None and now != version:  # new weights: the cache is the old version's
                    version = now
                    if self.prefix_cache is not None:
                        self.prefix_cache.clear(version)
                    self._counts["prefilled_tokens"] += int(mask.sum())
                    room = min(sampling.max_new_tokens - step, RESERVE)
                    logits, cache = self._prefill(history, mask, reserve=room)
                    continue
            logits = self._extend(sampled, mask, position, cache)  # (A, V)
        return outputs.generations(tracked)

    def _remember(
        self, cache: Any, mask: torch.Tensor, rows: Any, active: list[int], prompts: list[list[int]], outputs: _Outputs
    ) -> None:
        """Store the KV of the batch rows ``rows`` (their sequences: ``active``) in the prefix
        cache: each sequence's prompt and every sampled token but the last (never fed)."""
        if self.prefix_cache is None:
            return
        for row in rows:
            seq = active[row]
            ids = prompts[seq] + outputs.tokens[seq][:-1]
            self.prefix_cache.store(ids, row_kv(cache, row, mask[row].bool()))

    def _extend(self, sampled: torch.Tensor, mask: torch.Tensor, position: torch.Tensor, cache: Any) -> torch.Tensor:
        """One decode step: the live rows' sampled tokens (A,) appended to ``cache`` at ``position``
        (A,) under ``mask`` (A, L); the logits (A, V) of each row's next token."""
        return self._forward(sampled[:, None], mask, position[:, None], cache)  # (A, V)

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any) -> torch.Tensor:
        """The model over ``ids`` (R, W) extending ``cache``; the logits (R, V) of each row's next token.

        On a CPU in fp32 (where :func:`head_matches` held at start-up) the decoder runs alone and the
        output embedding is applied here as ``W @ h^T``: MKL computes that ~2x faster than the
        ``h @ W^T`` of ``nn.Linear`` for the few rows of a decode step (bench/decode_step.py)."""
        if self._own_head:
            out = self.model.get_decoder()(
                input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **{self._cache_arg: cache}
            )
            return head_logits(self.model.get_output_embeddings(), out.last_hidden_state[:, -1])
        # An index tensor, not the int 1: the int slices a non-contiguous (R, 1, H) view, for which
        # torch's CPU linear expands the LM head weight per row (bf16: 2 s instead of 5 ms).
        last = torch.tensor([ids.shape[1] - 1], device=self.device)
        extra = {"logits_to_keep": last} if self._keep_logits else {}
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **{self._cache_arg: cache},
            **extra,
        )
        return out.logits[:, -1]

    def _new_cache(self, reserve: int) -> Any:
        """An empty KV cache with room for ``reserve`` positions past its first write, written in
        place (:class:`agentrl_hf_engine.kv_cache.GrowingCache`) where every layer is full attention."""
        from agentrl_hf_engine.kv_cache import new_cache

        return new_cache(self.model.config, reserve, self._grows)

    def _start(self, prompts: list[list[int]], reserve: int) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor]:
        """Each distinct prompt prefilled once (a GRPO group shares its prompt), then expanded to one
        row per prompt: the next-token logits (B, V), the KV cache (room for ``reserve`` more
        positions), the attention mask (B, P) and the left-padded ids (B, P)."""
        distinct: dict[tuple[int, ...], int] = {}
        rows = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
        hits: list[tuple[int, KV | None]] = [(0, None)] * len(distinct)
        if self.prefix_cache is not None:
            hits = [self.prefix_cache.lookup(list(p)) for p in distinct]
        self._counts["prefix_hit_tokens"] += sum(length for length, _ in hits)
        hits = self._share_prefix(list(distinct), hits)
        cached = max(length for length, _ in hits)  # the widest hit: each row's is padded to it
        self._counts["prefilled_tokens"] += sum(len(p) - length for p, (length, _) in zip(distinct, hits))
        width = max(len(p) - length for p, (length, _) in zip(distinct, hits))  # the widest suffix
        layout = []  # per row: (id or None for padding) over cached + width columns
        for p, (length, _) in zip(distinct, hits):
            suffix = list(p[length:])
            hit = [None] * (cached - length) + list(p[:length])
            layout.append(hit + [None] * (width - len(suffix)) + suffix)
        ids = torch.tensor([[self.pad_id if t is None else t for t in r] for r in layout], device=self.device)  # (U, P)
        mask = torch.tensor([[int(t is not None) for t in r] for r in layout], device=self.device)  # (U, P)
        past = batch_cache(self._new_cache(width + reserve), hits, cached) if cached else None
        logits, cache = self._prefill(ids[:, cached:], mask, past, reserve)  # (U, V)
        expand = torch.tensor(rows, device=self.device)  # (B,) prompt row of each sequence
        if len(distinct) < len(prompts):
            cache.batch_select_indices(expand)
        return logits[expand], cache, mask[expand], ids[expand]

    def _share_prefix(
        self, prompts: list[tuple[int, ...]], hits: list[tuple[int, KV | None]]
    ) -> list[tuple[int, KV | None]]:
        """``hits`` (each prompt's cached length and KV) with the prompts' common start, when it
        is at least ``share_prefix_min_tokens`` ids, prefilled here once as a single row, as the hit
        of every row. (A prefix cache entry that gives one row that much gives it to every row.)"""
        least = self.options.share_prefix_min_tokens
        shared = min(len(shared_start(prompts)), min(map(len, prompts)) - 1)  # each row's last id is prefilled
        if not least or len(prompts) < 2 or not self._grows or shared < least:
            return hits
        if all(length >= shared for length, _ in hits):
            return hits
        ids = torch.tensor([prompts[0][:shared]], device=self.device)  # (1, S)
        _, cache = self._prefill(ids, torch.ones_like(ids))
        kv = row_kv(cache, 0, torch.ones(shared, dtype=torch.bool, device=self.device))
        self._counts["prefilled_tokens"] += shared
        return [(length, cached) if length >= shared else (shared, kv) for length, cached in hits]

    def _prefill(
        self, ids: torch.Tensor, mask: torch.Tensor, past: Any = None, reserve: int = 0
    ) -> tuple[torch.Tensor, Any]:
        """The KV cache over left-padded ``ids`` (R, W) and the logits (R, V) of each row's next
        token: a fresh cache with room for ``reserve`` more positions, or ``past`` (R rows of C
        positions) extended; ``mask`` (R, C + W)."""
        cache = past if past is not None else self._new_cache(reserve)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, -ids.shape[1] :]  # (R, W)
        return self._forward(ids, mask, positions, cache), cache

    def _draw(
        self,
        logits: torch.Tensor,
        sampling: SamplingParams,
        streams: list[torch.Generator] | None,
        active: list[int],
        truncates: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One token per live row from ``logits`` (A, V): the tokens, their full-vocabulary
        logprobs ``log_softmax(logits / T)`` and their logprobs under the distribution drawn from
        (top-k / top-p renormalised), each (A,)."""
        scores = warp_logits(logits, sampling)  # (A, V)
        log_probs = scores.log_softmax(dim=-1)  # (A, V)
        if sampling.temperature == 0:
            sampled = scores.argmax(dim=-1)  # (A,)
        elif streams is None:
            sampled = torch.multinomial(log_probs.exp(), 1, generator=self.generator).squeeze(-1)  # (A,)
        else:
            uniforms = torch.stack(
                [torch.rand((), generator=streams[seq], device=self.device, dtype=torch.float64) for seq in active]
            )  # (A,)
            sampled = inverse_cdf_sample(log_probs, uniforms)  # (A,)
        picked = log_probs.gather(-1, sampled[:, None]).squeeze(-1)  # (A,) drawn with
        full = picked  # (A,) full-vocabulary log_softmax(logits / T) at the sampled token
        if truncates:
            full_log_probs = (logits.float() / sampling.temperature).log_softmax(dim=-1)  # (A, V)
            full = full_log_probs.gather(-1, sampled[:, None]).squeeze(-1)  # (A,)
        return sampled, full, picked


def inverse_cdf_sample(log_probs: torch.Tensor, uniforms: torch.Tensor, block: int = CDF_BLOCK) -> torch.Tensor:
    """Row ``a``'s token for the uniform draw ``uniforms[a]``: the first index whose cumulative
    probability exceeds ``u x total`` (a zero-probability token is never picked). Each row is
    sampled from its own draw alone, whatever else is in the batch.

    Two levels, in float64 sums of the probabilities: the ``block``-token block whose cumulative mass
    passes the target, then the token within it, so each row cumulates one block instead of the
    whole vocabulary in float64 (a tenth of a decode step's time on a CPU at 32 rows otherwise)."""
    rows, vocab = log_probs.shape
    probs = torch.nn.functional.pad(log_probs.exp(), (0, -vocab % block)).view(rows, -1, block)  # (A, N, block)
    block_cdf = probs.sum(-1, dtype=torch.float64).cumsum(-1)  # (A, N)
    target = uniforms.to(torch.float64) * block_cdf[:, -1]  # (A,)
    last_with_mass = (block_cdf < block_cdf[:, -1:]).sum(-1)  # (A,) the first block reaching the total
    chosen = torch.searchsorted(block_cdf, target[:, None], right=True).squeeze(-1).minimum(last_with_mass)  # (A,)
    before = block_cdf.gather(-1, (chosen - 1).clamp(min=0)[:, None]).squeeze(-1).where(chosen > 0, 0.0)  # (A,)
    inside = probs[torch.arange(rows, device=probs.device), chosen]  # (A, block)
    within = inside.to(torch.float64).cumsum(-1)  # (A, block)
    # The first index past the target has mass (a zero adds nothing to the sum before it); none
    # does when float64 rounding put the target past the block's own total: its last token with mass.
    offset = torch.searchsorted(within, (target - before).clamp(min=0)[:, None], right=True).squeeze(-1)  # (A,)
    last_token = block - 1 - (inside > 0).flip(-1).to(torch.int8).argmax(-1)  # (A,)
    return chosen * block + torch.where(offset < block, offset, last_token)


def head_logits(head: torch.nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
    """``head(hidden)`` for ``hidden`` (R, H), computed as ``(W @ hidden^T)^T`` -> (R, V) contiguous."""
    logits = (head.weight @ hidden.T).T
    if head.bias is not None:
        logits = logits + head.bias
    return logits.contiguous()


def _pad_id(model: torch.nn.Module, tokenizer: Any, stop_ids: set[int]) -> int:
    """A filler id for left padding (masked out, so any valid id works)."""
    ids = token_ids(getattr(getattr(model, "generation_config", None), "pad_token_id", None))
    return (ids + token_ids(getattr(tokenizer, "pad_token_id", None)) + sorted(stop_ids))[0]


def _low_precision_copy(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """An eval-mode copy of ``model`` with parameters in ``dtype`` (ties kept, buffers untouched:
    RoPE's ``inv_freq`` stays float32) and no gradients."""
    original_grads = {name: p.grad for name, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = None  # not worth copying
    try:
        clone = copy.deepcopy(model)
    finally:
        for name, p in model.named_parameters():
            p.grad = original_grads[name]
    for p in clone.parameters():  # each tied parameter once
        p.data = p.data.to(dtype)
        p.requires_grad_(False)
    return clone.eval()


@hookimpl
def agentrl_register_engines(register: Any) -> None:
    """Register the ``hf`` engine."""
    register("hf", HFEngine)
