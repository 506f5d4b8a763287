"""Building a run from its config: every part the loop needs, made once, in a fixed order.

:func:`build_run` checks the config against the plugins, then loads the algorithm, envs, rewards,
tokenizer, model (LoRA, reference, sampling replica), optimizers and schedules of every trained
module, engine and rollout, and returns them as a :class:`Run`. The order is part of the
behaviour: modules initialised from the global RNG (a critic head) get the same weights every time.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate.utils import set_seed

from agentrl.algorithms.base import Algorithm, SetupContext, TrainableModule
from agentrl.config.cluster import ray_options
from agentrl.config.startup import resolve_settings
from agentrl.config.train import TrainConfig, build_plugin_config
from agentrl.env import CallGuard, Env, build_env, call_with_timeout, load_env_class
from agentrl.env.base import ASK_REWARD
from agentrl.env.datasets import use_dataset
from agentrl.errors import ConfigError
from agentrl.model import lora, sharding
from agentrl.model.activation_checkpointing import checkpoint_blocks
from agentrl.model.launch import check_process_split
from agentrl.model.loading import load_model, load_tokenizer
from agentrl.model.policy import TokenLogprobs, check_packing
from agentrl.model.precision import Precision, resolve_precision
from agentrl.plugins import PluginManager
from agentrl.rewards.schemes import RewardContext
from agentrl.rewards.specs import resolve_rewards
from agentrl.sampling.chat import ChatTokenizer
from agentrl.sampling.engine import Engine
from agentrl.sampling.rollout import Rollout
from agentrl.sampling.versioned_engine import VersionedEngine
from agentrl.testing import check_env_startup
from agentrl.tools.calls import resolve_tool_parser
from agentrl.training.batching import micro_batch_rows
from agentrl.training.memory import keep_large_blocks, limit_kernel_caches
from agentrl.training.optimizers import adamw
from agentrl.training.schedules import build_scheduler


@dataclass
class Trained:
    """A module the run trains, with its AdamW optimizer and LR schedule: the policy (``spec`` None)
    or one of the algorithm's own modules (a critic)."""

    module: torch.nn.Module
    """As accelerate prepared it (the policy: its ``TokenLogprobs`` wrapper)."""
    parameters_of: torch.nn.Module
    """Whose parameters are clipped (the policy: the model itself)."""
    optimizer: Any
    scheduler: Any
    max_grad_norm: float | None
    spec: TrainableModule | None = None


@dataclass
class Run:
    """Everything a run is made of, built by :func:`build_run`: the parts, no behaviour (the
    learner trains them, :class:`agentrl.training.learner.Learner`; the rollout phase samples with
    them, :class:`agentrl.training.rollout_phase.RolloutPhase`)."""

    config: TrainConfig
    manager: PluginManager
    accelerator: Any
    precision: Precision
    algorithm: Algorithm
    settings: dict[str, Any]
    needs_old_logprobs: bool
    envs: list[Env]
    call_guard: CallGuard
    reward_fns: dict[str, Any]
    tokenizer: Any
    model: torch.nn.Module
    ref_model: torch.nn.Module | None
    replica: torch.nn.Module | None
    """FSDP / ZeRO-3: the whole policy each process samples from; None otherwise."""
    policy: Any = None
    policy_pack: bool = False
    trained: dict[str, Trained] = field(default_factory=dict)
    """The policy first (``"policy"``), then the algorithm's modules by name."""
    owned_templates: dict[str, torch.nn.Module] = field(default_factory=dict)
    engine: Engine = field(init=False)
    """The config's engine, sampling from the policy (built once the policy is prepared)."""
    rollout: Rollout = field(init=False)
    """The config's rollout, driving the envs through :attr:`engine`."""
    env_pool: Any = None
    """The env workers on a Ray cluster whose stand-ins :attr:`envs` are (``ray.env_workers``); None otherwise."""
    counters: list[Callable[[], dict[str, float]]] = field(default_factory=list)
    """Each returns counts since its last call (``faults/*``: a remote engine, env worker or a
    rollout's own worker restarted: the rollout's ``counts`` method, when it has one), summed over
    the processes into the next step's metrics."""

    def fresh_env(self, index: int) -> Env:
        """A new env for slot ``index`` (whose call ran past ``call_timeout_s`` and may still touch
        the old one): on the same env worker when the envs run in workers, else built here."""
        env = self.env_pool.fresh(index) if self.env_pool is not None else make_env(self.manager, self.config)
        self.envs[index] = env
        return env

    def close(self) -> None:
        """Stop what the run started besides this process: the rollout's workers, engine replicas,
        env workers (each part that has a ``close``)."""
        engine = getattr(self, "engine", None)
        for part in (getattr(self, "rollout", None), getattr(engine, "engine", engine), self.env_pool):
            close = getattr(part, "close", None)
            if callable(close):
                close()

    @property
    def hook(self) -> Any:
        """The plugin manager's hook relay (``run.hook.agentrl_on_step_end(...)``)."""
        return self.manager.hook

    @property
    def is_main(self) -> bool:
        """Whether this is the process that writes the run dir, logs and evaluates."""
        return self.accelerator.is_main_process

    @property
    def num_processes(self) -> int:
        """How many processes train the run together."""
        return self.accelerator.num_processes


def build_run(config: TrainConfig, manager: PluginManager) -> Run:
    """Every part of a run, checked and built in order (see the module docstring)."""
    limit_kernel_caches()  # bounds oneDNN's per-shape caches (the RSS growth of long bf16 runs on a CPU)
    accelerator = sharding.make_accelerator()
    if accelerator.device.type == "cpu":
        keep_large_blocks()  # no page faults for the big logits and gradients (agentrl.training.memory)
    precision = resolve_precision(config.precision, accelerator.device)
    set_seed(config.seed + accelerator.process_index)  # process 0 seeds as a one-process run
    check_process_split(config, accelerator.num_processes)
    algorithm, settings, needs_old = _algorithm(config, manager, accelerator.num_processes)
    local_batch = config.batch_size // accelerator.num_processes
    envs = [make_env(manager, config) for _ in range(max(local_batch, min(config.eval_tasks, 64), 1))]
    check_env_startup(envs[0], need_eval=config.eval_tasks > 0, timeout_s=config.call_timeout_s)
    env_pool = remote_envs(manager, envs, config)
    call_guard = CallGuard.from_config(config)  # warns once per plugin per run
    context = RewardContext(config=config, settings=settings, device=accelerator.device, precision=precision)
    reward_fns = resolve_rewards(config, manager.registry, envs[0], context)
    if not reward_fns and not envs[0].scores_episodes:  # e.g. a dataset of prompts with no answer column
        raise ConfigError(f"env {config.env!r} does not score episodes itself and no reward was given: {ASK_REWARD}")
    tokenizer = context.tokenizer = load_tokenizer(config.model)
    check_prompt_room(envs[0], tokenizer, config.max_total_tokens)
    model, ref_model = _policy_and_reference(config, algorithm)
    replica = sharding.sampling_replica(accelerator, model)  # FSDP / ZeRO-3 only
    check_sharded_run(config, replica is not None, sharding.is_fsdp(accelerator))
    parts = (accelerator, precision, algorithm, settings, needs_old, envs, call_guard, reward_fns, tokenizer, model)
    run = Run(config, manager, *parts, ref_model, replica)
    if env_pool is not None:
        run.env_pool, run.envs = env_pool, env_pool.envs
    _setup_algorithm(run)
    _train_policy(run)
    if ref_model is not None:  # not prepared (no grads, no optimizer): place it by hand
        ref_model.to(accelerator.device)
    run.engine, run.rollout = engine_and_rollout(
        manager, config, replica if replica is not None else lora.sampling_model(model), tokenizer
    )
    context.engine = run.engine  # a judge reward samples from the policy's own engine
    engine_counter = getattr(getattr(run.engine, "engine", run.engine), "counts", None)  # under VersionedEngine too
    rollout_counter = getattr(run.rollout, "counts", None)  # a rollout's own workers (openai_agent's actors)
    env_counter = getattr(run.env_pool, "counts", None)
    run.counters += [counter for counter in (env_counter, engine_counter, rollout_counter) if counter is not None]
    _train_owned(run, algorithm.trainable_modules())
    return run


def _policy_and_reference(config: TrainConfig, algorithm: Algorithm) -> tuple[torch.nn.Module, torch.nn.Module | None]:
    """The policy (with the config's LoRA adapter) and the reference the algorithm needs: with
    LoRA the policy itself, its adapter off (:func:`agentrl.model.lora.adapter_disabled`), no copy."""
    model = lora.with_adapter(load_model(config.model), config.lora)  # unchanged without LoRA
    ref_model = None if not algorithm.needs_reference else (model if lora.is_adapted(model) else _frozen_copy(model))
    if ref_model is model and algorithm.reference_reset[0]:
        raise ConfigError(
            f"algorithm.ref_sync_every={algorithm.reference_reset[0]} with lora: the reference is the "
            "policy with its adapter off, which a reset cannot move; set ref_sync_every 0 or drop lora"
        )
    return model, ref_model


def _setup_algorithm(run: Run) -> None:
    """``Algorithm.setup`` with the base model (with LoRA, its plain view: the adapter is zero at
    setup) for e.g. a critic's copy, before accelerate prepares the policy (FSDP shards the model
    in place; a copy of it would be sharded)."""
    run.algorithm.setup(
        SetupContext(
            model=lora.sampling_model(run.model),
            tokenizer=run.tokenizer,
            accelerator=run.accelerator,
            config=run.config,
            autocast=functools.partial(run.precision.autocast, run.accelerator.device),
            micro_batch_rows=lambda batch: micro_batch_rows(
                batch, run.config, run.policy_pack, sharded=run.replica is not None
            ),
        )
    )


def engine_and_rollout(
    manager: PluginManager, config: TrainConfig, model: torch.nn.Module, tokenizer: Any
) -> tuple[Engine, Rollout]:
    """The config's engine sampling from ``model`` (replicas on a Ray cluster when ``ray.engines``
    is set), and its rollout driving that engine."""
    ray_config = ray_options(config.ray)
    if ray_config is not None and ray_config.engines:
        from agentrl.cluster.engines import RemoteEngines

        engine: Engine = RemoteEngines(config, ray_config, model=model, tokenizer=tokenizer, manager=manager)
    else:
        engine = manager.registry.get("engine", config.engine).factory(model=model, tokenizer=tokenizer, config=config)
    if config.async_steps:  # each call stamped with the version that sampled it (partial_rollouts: the newest)
        engine = VersionedEngine(engine, config.partial_rollouts)
    rollout = manager.registry.get("rollout", config.rollout).factory(engine=engine, tokenizer=tokenizer, config=config)
    return engine, rollout


@dataclass
class Sampler:
    """What sampling and scoring a policy needs, with no training parts (``agentrl eval``)."""

    envs: list[Env]
    tokenizer: Any
    model: torch.nn.Module
    engine: Engine
    rollout: Rollout
    reward_fns: dict[str, Any]
    call_guard: CallGuard


def build_sampler(config: TrainConfig, manager: PluginManager, envs: list[Env]) -> Sampler:
    """The config's model, engine, rollout and rewards around ``envs`` (from :func:`make_env`)."""
    tokenizer, model = load_tokenizer(config.model), load_model(config.model)
    engine, rollout = engine_and_rollout(manager, config, model, tokenizer)
    context = RewardContext(
        config=config,
        settings=resolve_settings(config, manager.registry),
        precision=resolve_precision(config.precision),
        tokenizer=tokenizer,
        engine=engine,
    )
    return Sampler(
        envs,
        tokenizer,
        model,
        engine,
        rollout,
        resolve_rewards(config, manager.registry, envs[0], context),
        CallGuard.from_config(config),
    )


def _algorithm(
    config: TrainConfig, manager: PluginManager, num_processes: int
) -> tuple[Algorithm, dict[str, Any], bool]:
    """The algorithm, the settings sections, and whether the update needs the sampling policy's logprobs."""
    algo_cls = manager.registry.get("algorithm", config.algo).factory
    algorithm: Algorithm = algo_cls(build_plugin_config(algo_cls.config_class, config.algorithm, "algorithm"))
    settings = resolve_settings(config, manager.registry)
    asked = manager.hook.agentrl_needs_old_logprobs(config=config, settings=settings)
    needs_old = algorithm.needs_old_logprobs or any(bool(a) for a in asked)
    if algorithm.num_mini_batches > config.batch_size // num_processes:
        raise ConfigError(
            f"algorithm {config.algo!r} asks for {algorithm.num_mini_batches} mini-batches "
            f"but a rollout batch has only {config.batch_size // num_processes} episodes "
            f"(prompts_per_step x num_generations, over {num_processes} process(es)): "
            "lower the mini-batch count"
        )
    return algorithm, settings, needs_old


def _train_policy(run: Run) -> None:
    """The policy's logprob forward, its AdamW and LR schedule, prepared by accelerate."""
    config = run.config
    if config.gradient_checkpointing and not checkpoint_blocks(run.model):
        raise ConfigError(
            f"gradient_checkpointing=true: {type(run.model).__name__} has no decoder blocks to "
            "checkpoint (no transformers GradientCheckpointingLayer, no nn.ModuleList of blocks); "
            "set gradient_checkpointing false"
        )
    # A sparse embedding gradient only where the weights are whole (a shard's flat parameter would not take it)
    policy = TokenLogprobs(
        run.model, config.temperature, pack=config.pack_sequences, sparse_embedding=run.replica is None
    )
    run.policy_pack = check_packing(policy, config.pack_sequences)
    optimizer = adamw(
        [p for p in run.model.parameters() if p.requires_grad],
        sharded=run.replica is not None,
        lr=config.learning_rate,
        betas=config.adam_betas,
        weight_decay=config.weight_decay,
    )
    run.policy, optimizer = run.accelerator.prepare(policy, optimizer)
    # The schedule is not prepared: accelerate's wrapper would step it once per process per step.
    scheduler = build_scheduler(
        optimizer, config.lr_scheduler, config.warmup_steps, _optimizer_steps(run), config.lr_decay_fraction
    )
    run.trained["policy"] = Trained(run.policy, run.model, optimizer, scheduler, config.max_grad_norm)


def _train_owned(run: Run, modules: dict[str, TrainableModule]) -> None:
    """An AdamW optimizer and LR schedule per algorithm-owned module, all prepared by accelerate."""
    for name, spec in modules.items():
        if name in ("model", "policy") or not name.isidentifier():
            raise ConfigError(
                f"algorithm {run.config.algo!r} owns a module named {name!r}: use an identifier "
                "other than 'model' and 'policy' (it names a folder in the run dir)"
            )
        if run.replica is not None:  # sharded: its shape, to save the gathered weights into at the end
            run.owned_templates[name] = sharding.shape_template(spec.module)
        if run.config.gradient_checkpointing:  # a module without blocks (a small head) runs as it is
            checkpoint_blocks(spec.module)
        params = [p for p in spec.module.parameters() if p.requires_grad]
        optimizer = adamw(
            params, run.replica is not None, lr=spec.learning_rate, betas=spec.betas, weight_decay=spec.weight_decay
        )
        spec.module, optimizer = run.accelerator.prepare(spec.module, optimizer)
        scheduler = build_scheduler(optimizer, spec.lr_scheduler, spec.warmup_steps, _optimizer_steps(run))
        run.trained[name] = Trained(spec.module, spec.module, optimizer, scheduler, spec.max_grad_norm, spec)


def _optimizer_steps(run: Run) -> int:
    """Optimizer steps the whole run takes: steps x epochs x mini-batches."""
    return run.config.max_steps * run.algorithm.num_iterations * run.algorithm.num_mini_batches


def _frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def check_prompt_room(env: Env, tokenizer: Any, max_total_tokens: int, num_tasks: int = 8) -> None:
    """A ConfigError when one of the first training prompts alone fills ``max_total_tokens``
    (such episodes end before the model speaks: a run of them trains nothing)."""
    chat = ChatTokenizer(tokenizer)
    tasks = env.train_tasks()
    for task in [tasks[i] for i in range(min(num_tasks, len(tasks)))]:
        native = bool(env.tool_schemas()) and chat.renders_tools
        messages, _ = call_with_timeout(
            env.reset,
            None,
            seed=0,  # an ``async def`` reset is awaited
            options={"task": task, "template_renders_tools": native},
        )
        length = len(chat.prompt_ids(messages, tools=list(env.tool_schemas()) if native else None))
        if length >= max_total_tokens:
            raise ConfigError(
                f"max_total_tokens={max_total_tokens} leaves no room to sample: the prompt of training "
                f"task {task.get('id', '?')!r} alone is {length} tokens; raise max_total_tokens"
            )


def check_sharded_run(config: TrainConfig, sharded: bool, fsdp: bool) -> None:
    """What a run with sharded weights (FSDP, ZeRO-3) cannot do yet: a ConfigError naming it (LoRA on
    them is refused earlier, by the capability table: :mod:`agentrl.config.capabilities`)."""
    if sharded and not fsdp and config.checkpoint_every:
        raise ConfigError(
            f"checkpoint_every={config.checkpoint_every}: checkpoints of DeepSpeed ZeRO-3 runs are not "
            "supported yet; set checkpoint_every=0 (the final model is still saved) or use fsdp / zero2"
        )


def remote_envs(manager: PluginManager, envs: list[Env], config: TrainConfig) -> Any:
    """With ``ray.env_workers`` set, the env workers whose stand-ins (``pool.envs``) replace
    ``envs`` (:class:`agentrl.cluster.envs.RemoteEnvs`, loading the run's plugins); None without, or
    when the rollout places the env workers itself (its class sets ``places_env_workers``: the
    ``openai_agent`` rollout runs agent programs in them)."""
    ray_config = ray_options(config.ray)
    if ray_config is None or not ray_config.env_workers:
        return None
    if getattr(manager.registry.get("rollout", config.rollout).factory, "places_env_workers", False):
        return None
    from agentrl.cluster.envs import RemoteEnvs
    from agentrl.cluster.replica import plugin_choice

    disabled, modules = plugin_choice(manager)
    return RemoteEnvs(envs, config, ray_config, plugin_modules=tuple(modules), disabled_plugins=tuple(disabled))


def make_env(manager: PluginManager, config: TrainConfig) -> Env:
    """An env instance: a registered name or ``path/file.py:ClassName``; a ``tool_parser`` named in
    ``env_args`` is the parser registered under that name."""
    factory = load_env_class(config.env) if ":" in config.env else manager.registry.get("env", config.env).factory
    env_args = resolve_tool_parser(config.env_args, lambda name: manager.registry.get("tool_parser", name).factory)
    env = build_env(factory, env_args, config.env)
    if not isinstance(env, Env):
        raise ConfigError(f"env {config.env!r} built a {type(env).__name__}, not an agentrl.Env")
    return use_dataset(env, config.dataset)  # the dataset's rows as its tasks, when the run has one
