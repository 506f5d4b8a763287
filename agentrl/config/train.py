"""``TrainConfig``: every knob of a run, validated when it is built.

The docstring under each field is the only help text (``agentrl train --print-config`` shows the
resolved whole). Plugin sections (``algorithm``, ``env_args``, ``engine_args``, each of ``plugins``)
are plain dicts here, validated by the plugin's config class at start-up; ``lora`` here (LoRAConfig).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, StringConstraints

from agentrl.config.checks import build_plugin_config
from agentrl.config.cluster import ray_options
from agentrl.config.dataset import absolute_dataset
from agentrl.config.lora import lora_options
from agentrl.config.rules import Allowed, Note, OneOf, first_failure, section_message
from agentrl.config.yaml_text import load_yaml
from agentrl.errors import ConfigError, one_line
from agentrl.imports import absolute_spec

Positive = Annotated[int, Field(ge=1)]
NonNegative = Annotated[int, Field(ge=0)]
Beta = Annotated[float, Field(ge=0, lt=1)]
Name = Annotated[str, StringConstraints(pattern=r"\S"), Allowed("a non-empty name")]


@dataclass(frozen=True)
class TrainConfig:
    """Configuration of one training run (YAML file + CLI flags + ``--set key=value``)."""

    model: Name = "smollm2-135m"
    """Local HF folder, run dir, hub id, or alias (``smollm2-135m``: the embedded default)."""
    env: Name | None = None
    """Environment name (``agentrl plugins`` lists them) or ``path/to/file.py:ClassName``; null:
    ``dataset`` (prompts, scored by the rewards) when a ``dataset`` is given, else ``math``."""
    env_args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the environment's constructor."""
    algo: Name = "grpo"
    """Algorithm name."""
    algorithm: dict[str, Any] = field(default_factory=dict)
    """Options of the algorithm (validated by its config class, e.g. GRPOConfig)."""
    engine: Name = "hf"
    """Generation engine name."""
    engine_args: dict[str, Any] = field(default_factory=dict)
    """Options of the engine (e.g. ``dtype: bfloat16``)."""
    lora: dict[str, Any] | None = None
    """LoRA options (validated by ``agentrl.model.lora.LoRAConfig``: ``r``, ``alpha``, ``target_modules``,
    ...): train low-rank adapters on the frozen model instead of every weight. None: full
    fine-tune; a mapping, ``{}`` included, turns LoRA on (``--set lora.r=16``). Needs peft."""
    plugins: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Settings of step-hook plugins, one section per plugin (``plugins.sampler_correction.mode:
    tis``); each plugin registers and validates its own section, ``--print-config`` lists them all
    with their defaults. A step-hook plugin does nothing unless its section turns it on."""
    rollout: Name = "multi_turn"
    """Rollout function name (multi_turn also covers single-turn envs)."""
    rewards: dict[str, float] | None = None
    """Reward functions (registered names, ``file.py:func`` or ``module:func``; agentrl- or
    TRL-style) and their weights, added to the env's own reward. None: the env's
    ``default_rewards``; a mapping replaces them (list them again to keep them)."""
    reward_completion_format: Annotated[str, OneOf("conversational", "plain")] = "conversational"
    """What TRL-style reward functions receive as ``completions`` and ``prompts``: ``conversational``
    (message lists, as TRL gives for chat datasets) or ``plain`` (the final reply's text; the last
    opening user message's text)."""
    env_reward_weight: float = 1.0
    """Weight of the environment's own reward (its per-turn rewards summed)."""

    max_steps: Positive = 40
    """Optimizer steps (one rollout batch each, times ``num_iterations``)."""
    prompts_per_step: Positive = 4
    """Tasks sampled per step; each is rolled out ``num_generations`` times."""
    num_generations: Positive = 8
    """Group size: episodes per task (GRPO needs >= 2)."""
    max_new_tokens: Positive = 64
    """Cap on tokens the model samples in one turn."""
    max_sampled_tokens: Positive | None = None
    """Cap on tokens the model samples over an episode (None: max_new_tokens x env max_turns);
    also Dr. GRPO's normalising constant."""
    max_total_tokens: Positive = 2048
    """Cap on a whole episode's tokens (prompt, sampled, env); reaching it truncates."""
    temperature: Annotated[float, Field(gt=0), Allowed("> 0 for training (greedy samples give identical groups)")] = 1.0
    """Sampling temperature; trainer logprobs use the same temperature."""
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    """Nucleus sampling mass (1.0 = off)."""
    top_k: Annotated[int, Field(ge=0), Note("0: off")] = 0
    """Top-k sampling (0 = off)."""

    learning_rate: Annotated[float, Field(gt=0)] = 2e-5
    """AdamW peak learning rate."""
    lr_scheduler: Annotated[str, OneOf("wsd", "constant", "linear", "cosine")] = "wsd"
    """``wsd`` (warm-up, stable, decay: constant, then linear to 0 over the last
    ``lr_decay_fraction`` of the run), ``constant``, ``linear`` (decay to 0) or ``cosine``; after
    ``warmup_steps``."""
    warmup_steps: NonNegative = 0
    """Linear warm-up steps."""
    lr_decay_fraction: Annotated[float, Field(gt=0, le=1), Note("the share of the run the wsd decay lasts")] = 0.375
    """``wsd`` only: share of the optimizer steps after warm-up that decay the learning rate
    linearly to 0 (rounded, at least one step); 0.375 is the last 15 of the default 40 steps."""
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    """AdamW weight decay."""
    adam_betas: Annotated[tuple[Beta, Beta], Field(strict=False), Allowed("two numbers in [0, 1)")] = (0.9, 0.99)
    """AdamW betas."""
    max_grad_norm: Annotated[float, Field(gt=0)] | None = 1.0
    """Clip the global gradient norm to this (None: no clipping)."""
    micro_batch_size: Positive = 8
    """Sequences per forward/backward at most; a step accumulates over all its micro-batches."""
    micro_batch_tokens: Positive = 4096
    """Tokens per forward/backward at most, bounding activation memory (~1.8 MB a token, default
    model, bf16 autocast): padded rows count rows x longest row; a packed forward
    (``pack_sequences``) counts its distinct tokens, a shared prefix once. A longer row goes alone."""
    gradient_checkpointing: bool = False
    """Recompute each decoder block in the backward pass instead of keeping its activations, for the
    policy and modules an algorithm trains (:mod:`agentrl.model.activation_checkpointing`); same gradients."""
    precision: Annotated[str, OneOf("auto", "bf16", "fp32")] = "auto"
    """``auto``: ``bf16`` where the hardware computes bf16 natively (a CPU with AMX or AVX512-BF16,
    a GPU with bf16), ``fp32`` elsewhere (on a CPU without native bf16 it is 3.6-30x slower), decided at
    start-up and printed with its reason (:mod:`agentrl.model.precision`); ``bf16`` (autocast, fp32
    master weights) or ``fp32`` as given. The hf engine's ``dtype: auto`` follows it."""
    pack_sequences: bool = True
    """Run each training micro-batch as one prefix-tree sequence (:mod:`agentrl.model.packing`): tokens
    that rows share (a group's prompt, common openings) are computed once and padding never, with
    micro-batches planned so that rows sharing a prefix (a group's episodes, an agent episode's
    segments) run together. Same logprobs to float rounding (checked at start-up;
    off with a warning where the model's attention takes no custom mask). False: padded rows."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: train only on groups whose rewards differ (zero group-relative advantage
    otherwise), rolling out more tasks for up to ``max_sampling_rounds`` rounds per step; if the rounds
    run out, zero-spread groups fill the batch. Logs ``sampling/*``."""
    max_sampling_rounds: Positive = 3
    """Rollout rounds per step at most with ``dynamic_sampling`` (the first one included); a refill
    round rolls out only the missing groups."""
    mask_truncated_completions: bool = False
    """Drop episodes cut by a length/turn limit from the loss (DAPO overlong filtering)."""
    seed: Annotated[int, Field(ge=0, lt=2**32), Allowed("an integer in [0, 2**32)")] = 0
    """Seed for model init, task order and sampling."""
    output_dir: Annotated[
        Annotated[str, StringConstraints(pattern=r"\S")] | None,
        Allowed("a folder path or null (runs/<env>-<algo>-<time>)"),
    ] = None
    """Run directory (None: ``runs/<env>-<algo>-<timestamp>``)."""
    eval_tasks: NonNegative = 64
    """Held-out tasks evaluated before and after training (0: skip evaluation)."""
    eval_every: NonNegative = 20
    """Also evaluate every this many steps (0: only before and after)."""
    eval_temperature: Annotated[float, Field(ge=0), Note("0: greedy")] = 0.0
    """Temperature for evaluation (0: greedy)."""
    eval_sampled: bool = False
    """Also report accuracy at the training temperature (``eval/accuracy_sampled``): a second evaluation."""
    keep_best: bool = True
    """Save the policy with the best held-out mean reward (``eval/reward_mean``: the run's own objective
    on the greedy evaluation, at step 0, every ``eval_every`` steps and the end; ties: the later) as
    ``<run_dir>/model``, not the most accurate (which may not box its answers); the last policy then
    goes to ``<run_dir>/last``; ``eval.json`` records which. False: ``model/`` is the last policy."""
    log_completions_every: NonNegative = 1
    """Write each episode to ``completions.jsonl`` (~1 KB) every this many steps and the first (0: never)."""
    log_tokens: Annotated[str, OneOf("none", "tokens", "logprobs")] = "tokens"
    """Per-token detail of each written episode (``token_view``, what ``agentrl view`` colours):
    ``tokens``: every token's text, whether it was prompt, sampled or env, and the sampler's logprob
    (~2-3x the line's size); ``logprobs``: also the trainer's logprob and entropy of each sampled
    token before the update (one more forward pass on the written steps); ``none``: messages only."""
    save_model: bool = True
    """Save the trained policy to ``<run_dir>/model`` at the end."""
    checkpoint_every: NonNegative = 10
    """Write a resumable checkpoint (``<run_dir>/checkpoints/step-N``: policy, algorithm-owned
    modules, optimizers, schedules, RNG states, task cursor, metrics position) every this many
    steps (0: only on Ctrl-C and at the end); ``agentrl train --resume RUN_DIR`` continues."""
    keep_checkpoints: Positive = 2
    """Checkpoints kept on disk (the newest); older ones are deleted after a new one is complete."""
    keep_finished_checkpoints: bool = False
    """Leave a finished run's checkpoints whole, so ``--resume RUN_DIR --max-steps N`` continues
    exactly as one longer run would. False: a run that ends normally keeps only its last checkpoint,
    without the optimizer moments and without the weights when ``model/`` (``last/``) holds them;
    ``--resume --max-steps N`` still continues it, its moments afresh. A run stopped by Ctrl-C or
    an error always keeps its checkpoints whole."""
    max_nonfinite_steps: Positive = 3
    """Stop the run when this many steps in a row trained nothing: a non-finite loss or gradient,
    or no scored episode (each episode raised, timed out or got no finite reward); the error names
    why. A run none of whose steps trained fails at its end the same way, saving no ``model/``."""
    call_timeout_s: Annotated[float, Field(gt=0)] = 60.0
    """Limit on one call of a reward function or an env method (``reset``/``step``), in seconds."""
    on_call_error: Annotated[str, OneOf("skip", "fail")] = "skip"
    """What a reward function or env call that raises or exceeds ``call_timeout_s`` does:
    ``skip`` scores that episode as missing (no gradient from it), counts it in
    ``errors/reward/<name>`` or ``errors/env`` and goes on; ``fail`` stops the run naming the plugin, the sample and
    the exception."""
    env_workers: Positive = 32
    """How many env calls (``reset``/``step`` of the live episodes) run at once: threads for sync
    envs, the same bound on one event loop for ``async def`` ones; each call keeps its
    ``call_timeout_s``. Each episode samples from its own seed, so the tokens do not depend on which
    env answers first. 1: one after another. An env class with ``concurrent_safe = False`` is always
    called one at a time."""
    async_steps: NonNegative = 0
    """Collect the episodes of the next N steps while a step trains (:mod:`agentrl.training.async_rollouts`):
    step t trains on episodes sampled by the policy after step t - 1 - N (one version per batch,
    so a resumed run is the same as an uninterrupted one); the ``sampler_correction`` plugin's
    ``auto`` then corrects the stale tokens (TIS). 0: synchronous."""
    partial_rollouts: bool = False
    """With ``async_steps``: episodes in flight continue with each new policy version as soon as it
    is published (between decode steps: ``hf``, ``vllm``; else turns); fresher, not bitwise reproducible."""
    dataset: dict[str, Any] | None = None
    """Tasks from a dataset instead of the env's own (``agentrl train --dataset tasks.jsonl``; validated
    by ``agentrl.config.dataset.DatasetConfig``: ``path``, ``eval_path``, ``eval_fraction``, ...), the
    env's episodes run on its rows (docs/guides/datasets.md). null: the env's tasks."""
    ray: dict[str, Any] | None = None
    """Run on a Ray cluster (``pip install 'agentrl[ray]'``; ``agentrl train --ray`` sets ``{}``):
    trainer processes, engine replicas and env workers placed by resources (validated by
    ``agentrl.config.cluster.RayConfig``: ``address``, ``engines``, ``env_workers``, ...;
    docs/guides/multi-node.md). null: everything on this host."""

    def __post_init__(self) -> None:
        """Check each value's type and range, then the rules relating fields; make paths absolute."""
        failure = first_failure(TrainConfig, {f.name: getattr(self, f.name) for f in dataclasses.fields(self)})
        if failure is not None:
            raise ConfigError(section_message(failure))
        if self.max_total_tokens <= self.max_new_tokens:
            # The prompt must fit too: checked once the env and tokenizer are built (build.check_prompt_room).
            raise ConfigError(
                f"max_total_tokens={self.max_total_tokens} must be > max_new_tokens="
                f"{self.max_new_tokens}: an episode holds the prompt and the sampled tokens"
            )
        if self.rewards is not None and "" in self.rewards:
            raise ConfigError("rewards has an empty name: use a registered name, file.py:func or module:func")
        if self.env_reward_weight == 0 and self.rewards is not None and not any(self.rewards.values()):
            raise ConfigError(
                f"env_reward_weight=0 with rewards={self.rewards!r} leaves nothing to reward: every "
                "episode would score 0 and nothing would train"
            )
        if self.partial_rollouts and not self.async_steps:
            raise ConfigError("partial_rollouts=true needs async_steps >= 1 (got 0): nothing is in flight")
        if self.lora is not None:
            lora_options(self.lora)
        if self.ray is not None:
            ray_options(self.ray)
        if self.dataset is not None:
            object.__setattr__(self, "dataset", absolute_dataset(self.dataset))
        env = self.env if self.env is not None else "dataset" if self.dataset is not None else "math"
        object.__setattr__(self, "env", _absolute(env, "env"))  # frozen: set once, here
        if self.rewards is not None:
            object.__setattr__(self, "rewards", {_absolute(name, "rewards"): w for name, w in self.rewards.items()})

    @property
    def batch_size(self) -> int:
        """Episodes per step: prompts_per_step x num_generations."""
        return self.prompts_per_step * self.num_generations

    def to_dict(self) -> dict[str, Any]:
        """The config as plain data (for YAML and the run dir)."""
        data = dataclasses.asdict(self)
        data["adam_betas"] = list(self.adam_betas)
        return data


def _absolute(spec: str, key: str) -> str:
    try:
        return absolute_spec(spec)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{key}: {spec!r} is not a usable path ({one_line(exc)})") from None


def field_names() -> list[str]:
    """All TrainConfig keys."""
    return [f.name for f in dataclasses.fields(TrainConfig)]


def build_config(
    file: str | Path | None = None, overrides: dict[str, Any] | None = None, sets: list[str] | None = None
) -> TrainConfig:
    """File values, then ``sets`` (``key=value``, YAML-parsed, dotted keys into dict sections),
    then ``overrides`` (CLI flags that were given); unknown keys are errors."""
    data: dict[str, Any] = {}
    if file is not None:
        path = Path(file)
        if not path.is_file():
            what = "is a folder, not a file" if path.is_dir() else "does not exist"
            raise ConfigError(f"config file {str(file)!r} {what}")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config file {str(file)!r} could not be read as UTF-8 text: {one_line(exc)}") from None
        loaded = load_yaml(text, f"config file {str(file)!r}") or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(file)!r} must hold a mapping, got {type(loaded).__name__}")
        data.update(loaded)
    for item in sets or []:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        _set_dotted(data, key.strip(), load_yaml(raw, f"--set {item!r}"))
    for key, value in (overrides or {}).items():  # a flag's section (``--dataset``) merges into the file's
        if value is not None:
            data[key] = {**data[key], **value} if isinstance(value, dict) and isinstance(data.get(key), dict) else value
    if isinstance(data.get("adam_betas"), list):
        data["adam_betas"] = tuple(data["adam_betas"])
    return build_plugin_config(TrainConfig, data, "")


def refuse_flag_conflicts(flags: dict[str, tuple[str, Any]], sets: list[str] | None) -> None:
    """ConfigError when a command-line flag and a ``--set`` item give one key different values (neither
    silently wins). ``flags``: config key -> (the flag's name, its value; None when not given)."""
    for item in sets or []:
        key, sep, raw = item.partition("=")
        flag, value = flags.get(key.strip(), ("", None))
        if sep and value is not None and load_yaml(raw, f"--set {item!r}") != value:
            raise ConfigError(
                f"{key.strip()} is given twice with different values: {flag} {value!r} and --set {item!r}; give it once"
            )


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    head, _, rest = key.partition(".")
    if not rest:
        data[head] = value
        return
    section = data.setdefault(head, {})
    if not isinstance(section, dict):
        raise ConfigError(f"--set {key}: {head!r} is not a section")
    _set_dotted(section, rest, value)
