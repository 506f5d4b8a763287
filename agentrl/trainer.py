"""The training loop: rollout -> score -> advantages -> normalised loss -> optimizer step.

One step (see the hook order in agentrl.hookspecs):
  1. sample ``prompts_per_step`` tasks, each run ``num_generations`` times (a group);
  2. the rollout drives the envs through the engine -> trajectories;
  3. reward functions score them (plus the env's own return);
  4. the algorithm turns rewards into per-token advantages;
  5. for each of the algorithm's ``num_iterations`` epochs and each of its ``num_mini_batches``
     mini-batches (one optimizer step each): loss denominators are counted over the mini-batch
     first, then every micro-batch's loss is backpropagated (accumulated), then every trained
     module (the policy and the algorithm's own, e.g. a critic) takes one clipped optimizer step
     (accelerate); a step whose loss or gradients are not finite is skipped and counted;
  6. the engine receives the new weights.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import shutil
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from accelerate.utils import set_seed
from transformers import get_scheduler

from agentrl import checkpoint as ckpt
from agentrl import distributed, lora, sharding
from agentrl.algorithm import Algorithm, LossContext, SetupContext, TrainableModule
from agentrl.best_model import BestModel
from agentrl.config import TrainConfig, build_plugin_config, resolve_settings
from agentrl.dynamic_sampling import GroupSelector, has_spread
from agentrl.engine import SamplingParams
from agentrl.env import CallGuard, Env, build_env, load_env_class
from agentrl.errors import CheckpointError, ConfigError, TrainingError, TrainingInterrupted, one_line
from agentrl.evaluate import evaluate
from agentrl.faults import plugin_exit
from agentrl.launch import STOP_SIGNALS, detach_hung_up_terminal
from agentrl.memory import limit_kernel_caches, peak_rss_gb, rss_gb
from agentrl.metrics import MetricsWriter, read_rows, reward_metrics, rollout_metrics
from agentrl.models import load_model, load_tokenizer
from agentrl.paths import check_output_dir
from agentrl.objectives import step_totals
from agentrl.plugins import PluginManager
from agentrl.policy import TokenLogprobs
from agentrl.precision import resolve_precision
from agentrl.rewards import resolve_rewards
from agentrl.scoring import score
from agentrl.statefiles import save_json, save_tensors
from agentrl.testing import check_env_startup
from agentrl.trajectory import TrainBatch, Trajectory, collate


def run_dir_for(config: TrainConfig) -> Path:
    """The run directory: ``output_dir``, else ``runs/<env>-<algo>-<timestamp>``."""
    label = config.env.rpartition(":")[2].replace("/", "_")  # a file env: its class name
    return Path(config.output_dir or f"runs/{label}-{config.algo}-{datetime.now():%Y%m%d-%H%M%S}")


def refuse_existing_run(run_dir: Path) -> None:
    """A ConfigError when ``run_dir`` is a file or already holds a run (its metrics would mix)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"output_dir {str(run_dir)!r} is a file, not a directory: pick another --output-dir")
    held = [name for name in ("metrics.jsonl", ckpt.CHECKPOINTS, "model") if (run_dir / name).exists()]
    if held and _finished_without_checkpoint(run_dir):
        raise ConfigError(f"output_dir {str(run_dir)!r} already holds a finished run ({', '.join(held)}) with no "
                          "checkpoint to continue from (checkpoint_every: 0): pick another --output-dir")
    if held:  # --resume continues it, or starts it over when it stopped before its first checkpoint
        raise ConfigError(f"output_dir {str(run_dir)!r} already holds a run ({', '.join(held)}): continue it with "
                          f"`agentrl train --resume {run_dir}`, or pick another --output-dir")


def _finished_without_checkpoint(run_dir: Path) -> bool:
    return (run_dir / "eval.json").is_file() and not ckpt.complete_checkpoints(run_dir)


def start_over_config(run_dir: str | Path, max_steps: int | None = None) -> TrainConfig | None:
    """For ``--resume`` of a run that stopped before its first complete checkpoint: the config it
    was started with (``max_steps`` changed if given), to train it again from step 0 after
    :func:`set_aside_unfinished`; None when the run has a checkpoint to resume from, or is no run
    dir (:func:`agentrl.checkpoint.resume_config` says so). A ConfigError for a run that finished
    without a checkpoint: there is nothing to continue."""
    from agentrl.config import build_config, load_yaml

    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file() or ckpt.complete_checkpoints(run_dir):
        return None
    if _finished_without_checkpoint(run_dir):
        raise ConfigError(f"--resume {str(run_dir)!r}: the run finished without a checkpoint (checkpoint_every: 0), "
                          "so there is nothing to continue: train a new run with another --output-dir")
    data = load_yaml((run_dir / "config.yaml").read_text(), where=str(run_dir / "config.yaml"))
    if not isinstance(data, dict):
        raise ConfigError(f"--resume {str(run_dir)!r}: config.yaml does not hold a mapping")
    data["output_dir"] = str(run_dir)
    if max_steps is not None:
        data["max_steps"] = max_steps
    return build_config(overrides=data)


UNFINISHED = "unfinished-"
"""Prefix of the folder a run started over keeps its stopped attempt's files in."""


def set_aside_unfinished(run_dir: Path) -> Path | None:
    """Move what a run that stopped before its first checkpoint wrote (metrics, completions,
    TensorBoard, ...; all but ``config.yaml``, the lock and earlier such folders) into
    ``unfinished-<time>/`` so the run can start over in its dir; that folder, or None when there
    was nothing to move. Half-written checkpoints are deleted."""
    from agentrl.runlock import LOCK_FILE

    ckpt.remove_partial(run_dir)
    keep = {"config.yaml", LOCK_FILE}
    left = [p for p in run_dir.iterdir() if p.name not in keep and not p.name.startswith(UNFINISHED)]
    if not left:
        return None
    folder = run_dir / f"{UNFINISHED}{datetime.now():%Y%m%d-%H%M%S}"
    folder.mkdir()
    for path in left:
        path.rename(folder / path.name)
    return folder


def check_prompt_room(env: Env, tokenizer: Any, max_total_tokens: int, num_tasks: int = 8) -> None:
    """A ConfigError when one of the first training prompts alone fills ``max_total_tokens``
    (such episodes end before the model speaks: a run of them trains nothing)."""
    from agentrl.chat import ChatTokenizer

    chat = ChatTokenizer(tokenizer)
    tasks = env.train_tasks()
    for task in [tasks[i] for i in range(min(num_tasks, len(tasks)))]:
        native = bool(env.tool_schemas()) and chat.renders_tools
        messages, _ = env.reset(seed=0, options={"task": task, "template_renders_tools": native})
        length = len(chat.prompt_ids(messages, tools=list(env.tool_schemas()) if native else None))
        if length >= max_total_tokens:
            raise ConfigError(f"max_total_tokens={max_total_tokens} leaves no room to sample: the prompt of training "
                              f"task {task.get('id', '?')!r} alone is {length} tokens; raise max_total_tokens")


@dataclass
class TrainResult:
    """What a finished run reports."""

    run_dir: Path
    eval_before: dict[str, float]
    eval_after: dict[str, float]
    history: list[dict[str, float]]
    best: dict[str, Any] | None = None
    """With ``keep_best``: the best evaluation (``BestModel.summary``) and ``saved_as_model``
    (whether ``model/`` holds it rather than the last policy); None without it."""


class TaskCursor:
    """Walks a task sequence in seeded shuffled epochs; ``position`` is the resumable cursor."""

    def __init__(self, num_tasks: int, seed: int) -> None:
        self.num_tasks, self.seed, self.position = num_tasks, seed, 0
        self._epoch, self._order = -1, np.empty(0, dtype=np.int64)

    def take(self, n: int) -> list[int]:
        """The next ``n`` task indices (crossing epoch boundaries reshuffles)."""
        out = []
        for _ in range(n):
            epoch, offset = divmod(self.position, self.num_tasks)
            if epoch != self._epoch:  # one permutation per epoch, not per task
                self._epoch = epoch
                self._order = np.random.default_rng([self.seed, epoch]).permutation(self.num_tasks)
            out.append(int(self._order[offset]))
            self.position += 1
        return out


def check_sharded_run(config: TrainConfig, sharded: bool, fsdp: bool) -> None:
    """What a run with sharded weights (FSDP, ZeRO-3) cannot do yet: a ConfigError naming it."""
    if sharded and not fsdp and config.checkpoint_every:
        raise ConfigError(f"checkpoint_every={config.checkpoint_every}: checkpoints of DeepSpeed ZeRO-3 runs are not "
                          "supported yet; set checkpoint_every=0 (the final model is still saved) or use fsdp / zero2")
    if sharded and config.lora is not None:
        raise ConfigError("lora with sharded weights (FSDP, ZeRO-3) is not supported yet: use ddp or zero2")


def check_process_split(config: TrainConfig, num_processes: int) -> None:
    """A ConfigError unless the step's groups split evenly over the processes (a group never
    straddles two processes)."""
    if config.prompts_per_step % num_processes:
        raise ConfigError(f"prompts_per_step={config.prompts_per_step} does not split over {num_processes} processes: "
                          "each process rolls out whole groups; use a multiple of the process count")


def make_env(manager: PluginManager, config: TrainConfig) -> Env:
    """An env instance: a registered name or ``path/file.py:ClassName``."""
    factory = load_env_class(config.env) if ":" in config.env else manager.registry.get("env", config.env).factory
    env = build_env(factory, config.env_args, config.env)
    if not isinstance(env, Env):
        raise ConfigError(f"env {config.env!r} built a {type(env).__name__}, not an agentrl.Env")
    return env


class Trainer:
    """Builds everything a run needs from a TrainConfig and a loaded PluginManager, then trains."""

    def __init__(self, config: TrainConfig, manager: PluginManager, console: Any = None,
                 resume: Path | None = None) -> None:
        limit_kernel_caches()  # bounds oneDNN's per-shape caches (the RSS growth of long bf16 runs on a CPU)
        self.config, self.manager, self.hook = config, manager, manager.hook
        self.console = console
        self.run_dir = run_dir_for(config)
        if resume is None:
            check_output_dir(self.run_dir)
            refuse_existing_run(self.run_dir)
        self.accelerator = sharding.make_accelerator()
        self.precision = resolve_precision(config.precision, self.accelerator.device)
        self.num_processes, self.is_main = self.accelerator.num_processes, self.accelerator.is_main_process
        set_seed(config.seed + self.accelerator.process_index)  # process 0 seeds as a one-process run
        check_process_split(config, self.num_processes)
        algo_cls = manager.registry.get("algorithm", config.algo).factory
        self.algorithm: Algorithm = algo_cls(build_plugin_config(algo_cls.config_class, config.algorithm, "algorithm"))
        self.settings = resolve_settings(config, manager.registry)
        asked = self.hook.agentrl_needs_old_logprobs(config=config, settings=self.settings)
        self.needs_old_logprobs = self.algorithm.needs_old_logprobs or any(bool(a) for a in asked)
        if self.algorithm.num_mini_batches > config.batch_size // self.num_processes:
            raise ConfigError(f"algorithm {config.algo!r} asks for {self.algorithm.num_mini_batches} mini-batches "
                              f"but a rollout batch has only {config.batch_size // self.num_processes} episodes "
                              f"(prompts_per_step x num_generations, over {self.num_processes} process(es)): "
                              "lower the mini-batch count")
        self.local_batch_size = config.batch_size // self.num_processes
        self.envs = [make_env(manager, config)
                     for _ in range(max(self.local_batch_size, min(config.eval_tasks, 64), 1))]
        check_env_startup(self.envs[0], need_eval=config.eval_tasks > 0, timeout_s=config.call_timeout_s)
        self.call_guard = CallGuard.from_config(config)  # warns once per plugin per run
        self.reward_fns = resolve_rewards(config, manager.registry, self.envs[0])
        self.tokenizer = load_tokenizer(config.model)
        check_prompt_room(self.envs[0], self.tokenizer, config.max_total_tokens)
        self.model = lora.with_adapter(load_model(config.model), config.lora)  # unchanged without LoRA
        # With LoRA the reference is the policy itself, its adapter off (lora.adapter_disabled): no copy.
        self.ref_model = None if not self.algorithm.needs_reference else (
            self.model if lora.is_adapted(self.model) else self._frozen_copy(self.model))
        self.replica = sharding.sampling_replica(self.accelerator, self.model)  # FSDP / ZeRO-3 only
        check_sharded_run(config, self.replica is not None, sharding.is_fsdp(self.accelerator))
        # The base model (with LoRA, its plain view: the adapter is zero at setup) for e.g. a critic's copy,
        # before accelerate prepares the policy (FSDP shards the model in place; a copy of it would be sharded).
        self.algorithm.setup(SetupContext(model=lora.sampling_model(self.model), tokenizer=self.tokenizer,
                                          accelerator=self.accelerator,
                                          config=config, autocast=self.autocast,
                                          micro_batch_rows=self.micro_batch_rows))
        self.policy = TokenLogprobs(self.model, temperature=config.temperature, pack=config.pack_sequences)
        self.policy_pack = check_packing(self.policy, config.pack_sequences)
        self.optimizer = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad],
                                           lr=config.learning_rate,
                                           betas=config.adam_betas, weight_decay=config.weight_decay)
        self.policy, self.optimizer = self.accelerator.prepare(self.policy, self.optimizer)
        # The schedule is not prepared: accelerate's wrapper would step it once per process per step.
        self.scheduler = build_scheduler(self.optimizer, config.lr_scheduler, config.warmup_steps,
                                         self.optimizer_steps_per_run, config.lr_decay_fraction)
        if self.ref_model is not None:  # not prepared (no grads, no optimizer): place it by hand
            self.ref_model.to(self.accelerator.device)
        engine_cls = manager.registry.get("engine", config.engine).factory
        self.engine = engine_cls(model=self.replica if self.replica is not None else lora.sampling_model(self.model),
                                 tokenizer=self.tokenizer, config=config)
        rollout_cls = manager.registry.get("rollout", config.rollout).factory
        self.rollout = rollout_cls(engine=self.engine, tokenizer=self.tokenizer, config=config)
        self.owned_templates: dict[str, torch.nn.Module] = {}  # FSDP / ZeRO-3 only
        self.owned = self._prepare_owned(self.algorithm.trainable_modules())
        self.nonfinite_skips = 0  # optimizer steps skipped over the run
        self.skipped_in_a_row = 0  # rollout steps in a row whose update was skipped entirely
        self.tasks = self.envs[0].train_tasks()
        self.cursor = TaskCursor(len(self.tasks), config.seed)
        self.max_sampled = config.max_sampled_tokens or config.max_new_tokens * self.envs[0].max_turns
        self.best_record: dict[str, Any] | None = None  # what eval.json says about the best policy
        self.best = BestModel(self.run_dir, metric="eval/reward_mean") if config.keep_best and config.eval_tasks and config.save_model else None
        self.resumed: dict[str, Any] | None = self.load_checkpoint(resume) if resume is not None else None

    @property
    def optimizer_steps_per_run(self) -> int:
        """Optimizer steps the whole run takes: steps x epochs x mini-batches."""
        algo = self.algorithm
        return self.config.max_steps * algo.num_iterations * algo.num_mini_batches

    def _prepare_owned(self, modules: dict[str, TrainableModule]) -> dict[str, tuple[TrainableModule, Any, Any]]:
        """An AdamW optimizer and LR schedule per algorithm-owned module, all prepared by accelerate."""
        owned = {}
        for name, spec in modules.items():
            if name in ("model", "policy") or not name.isidentifier():
                raise ConfigError(f"algorithm {self.config.algo!r} owns a module named {name!r}: use an identifier "
                                  "other than 'model' and 'policy' (it names a folder in the run dir)")
            if self.replica is not None:  # sharded: its shape, to save the gathered weights into at the end
                self.owned_templates[name] = sharding.shape_template(spec.module)
            params = [p for p in spec.module.parameters() if p.requires_grad]
            optimizer = torch.optim.AdamW(params, lr=spec.learning_rate, betas=spec.betas,
                                          weight_decay=spec.weight_decay)
            spec.module, optimizer = self.accelerator.prepare(spec.module, optimizer)
            scheduler = build_scheduler(optimizer, spec.lr_scheduler, spec.warmup_steps, self.optimizer_steps_per_run)
            owned[name] = (spec, optimizer, scheduler)
        return owned

    @staticmethod
    def _frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
        ref = copy.deepcopy(model).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """bf16 autocast when the run computes in bf16 (fp32 master weights), else nothing."""
        return torch.autocast(self.accelerator.device.type, dtype=torch.bfloat16, enabled=self.precision.bf16)

    # -- one step ----------------------------------------------------------------------------------
    def rollout_step(self, step: int) -> tuple[TrainBatch, list[Any], dict[str, float]]:
        """Sample tasks, run this process's share of the episodes, score them; returns this
        process's collated batch, the whole batch's trajectories (every process's, in group order)
        and the step's metrics. With ``dynamic_sampling`` the batch holds the groups with a reward
        spread found over up to ``max_sampling_rounds`` rounds (:mod:`agentrl.dynamic_sampling`);
        reward and rollout metrics cover every episode sampled, kept or not."""
        cfg = self.config
        share = cfg.prompts_per_step // self.num_processes
        first = self.accelerator.process_index * share  # this process's groups: first .. first + share - 1
        selector = GroupSelector(share, cfg.num_generations, filter_groups=cfg.dynamic_sampling)
        sampled: list[Trajectory] = []
        sampled_totals: list[float] = []
        sampled_components: list[dict[str, np.ndarray]] = []
        nonfinite: dict[str, int] = {}
        errors: dict[str, int] = {}
        rounds = 0
        for round_index in range(cfg.max_sampling_rounds if cfg.dynamic_sampling else 1):
            if round_index and not sum(distributed.gather_objects(selector.missing)):
                break  # every process has its groups
            indices = self.cursor.take(cfg.prompts_per_step)  # every process walks the same cursor
            mine = indices[first:first + selector.missing]  # a refill round samples only what is missing
            rounds += 1
            if not mine:
                continue
            trajectories, totals, components = self._sample_groups(step, round_index, first, mine,
                                                                   nonfinite, errors)
            selector.add(trajectories, totals, components)
            sampled += trajectories
            sampled_totals += totals
            sampled_components.append(components)
        filled = selector.filled
        kept, kept_totals, _ = selector.batch(first)
        batch = collate(kept, kept_totals, self.tokenizer.pad_token_id,
                        env_reward_weight=cfg.env_reward_weight).to(self.accelerator.device)
        components = {name: np.concatenate([c[name] for c in sampled_components]) for name in sampled_components[0]}
        # Metrics and hooks see the whole batch: every process's share, in group order.
        shares = distributed.gather_objects((sampled, sampled_totals, components, nonfinite, errors,
                                             kept, kept_totals, filled))
        if len(shares) > 1:
            sampled = [t for share in shares for t in share[0]]
            sampled_totals = [x for share in shares for x in share[1]]
            components = {name: np.concatenate([share[2][name] for share in shares]) for name in components}
            nonfinite, errors = _summed([share[3] for share in shares]), _summed([share[4] for share in shares])
            kept = [t for share in shares for t in share[5]]
            kept_totals = [x for share in shares for x in share[6]]
        metrics = {**reward_metrics(sampled_totals, components), **rollout_metrics(sampled),
                   **{f"reward/{name}_nonfinite": float(n) for name, n in nonfinite.items() if n},
                   **{f"errors/reward/{name}": float(n) for name, n in errors.items()}}
        if cfg.dynamic_sampling:
            spread = [has_spread(sampled_totals[i:i + cfg.num_generations])
                      for i in range(0, len(sampled_totals), cfg.num_generations)]
            metrics.update({"sampling/rounds": float(rounds), "sampling/groups_sampled": float(len(spread)),
                            "sampling/spread_frac": float(np.mean(spread)),
                            "sampling/filled_groups": float(sum(share[7] for share in shares))})
        if self.is_main:
            self.hook.agentrl_on_rollout_end(trajectories=kept, step=step, metrics=metrics)
        self.step_rewards = list(kept_totals)  # the whole batch's, as collated
        return batch, kept, metrics

    def _sample_groups(self, step: int, round_index: int, first: int, task_indices: list[int],
                       nonfinite: dict[str, int], errors: dict[str, int]) -> tuple[list[Trajectory], list[float],
                                                                                    dict[str, np.ndarray]]:
        """Roll out and score ``num_generations`` episodes of each task; the groups are numbered from
        ``first`` (renumbered when the batch is chosen). Every episode samples from its own seed,
        derived from its place in the global batch: the same on any process count."""
        cfg = self.config
        tasks = [self.tasks[i] for i in task_indices for _ in range(cfg.num_generations)]
        groups = [first + g for g in range(len(task_indices)) for _ in range(cfg.num_generations)]
        sampling = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                                  top_p=cfg.top_p, top_k=cfg.top_k, seed=cfg.seed * 1_000_003 + step)
        offset = first * cfg.num_generations
        if round_index == 0:
            seeds = [cfg.seed * 1_000_003 + step * cfg.batch_size + offset + i for i in range(len(tasks))]
        else:  # refill rounds: seeds from their own stream
            seeds = [int(np.random.SeedSequence([cfg.seed, step, round_index, offset + i]).generate_state(1)[0])
                     for i in range(len(tasks))]
        trajectories = self.rollout.run(self.envs[:len(tasks)], tasks, groups, sampling, seeds=seeds)
        for i, trajectory in enumerate(trajectories):  # an abandoned env call may still touch its env
            if (trajectory.info.get("error") or {}).get("timed_out"):
                self.envs[i] = make_env(self.manager, cfg)
        totals, components = score(trajectories, self.reward_fns, cfg.env_reward_weight, nonfinite,
                                   guard=self.call_guard, errors=errors)
        return trajectories, totals, components

    def micro_batches(self, batch: TrainBatch) -> list[TrainBatch]:
        """Micro-batches of similar lengths (less padding; the loss is invariant to the split)."""
        return [batch.select(rows) for rows in self.micro_batch_rows(batch)]

    def micro_batch_rows(self, batch: TrainBatch) -> list[list[int]]:
        """Row groups, longest rows first, within ``micro_batch_size`` and ``micro_batch_tokens``; with
        sharded weights as many groups on every process (each forward gathers the shards: a collective)."""
        groups = batch.groups.tolist() if self.policy_pack else None  # packed: a micro-batch per group
        plan = plan_micro_batches(batch.lengths.tolist(), self.config.micro_batch_size,
                                  self.config.micro_batch_tokens, groups)
        if self.replica is None:
            return plan
        return split_to_count(plan, max(distributed.gather_objects(len(plan))))

    @torch.no_grad()
    def frozen_logprobs(self, scorer: torch.nn.Module, batch: TrainBatch) -> torch.Tensor:
        """Logprobs of ``scorer`` (a ``TokenLogprobs``: the policy's or the reference's) for the whole
        batch, no grad."""
        out = torch.zeros_like(batch.loss_mask)
        for rows in self.micro_batch_rows(batch):
            mb = batch.select(rows)
            with self.autocast():
                lp, _ = scorer(mb.input_ids, mb.attention_mask, mb.loss_mask, with_entropy=False)
            out[rows, : lp.shape[1]] = lp
        return out

    def update(self, batch: TrainBatch, metrics: dict[str, float], step: int = 1) -> None:
        """All of the algorithm's optimizer steps on one rollout batch (``step`` is 1-based)."""
        algo = self.algorithm
        batch.to(self.accelerator.device)  # a batch built by a caller may still be on the CPU
        logged_before = set(metrics)
        scored = distributed.all_sum(torch.isfinite(batch.rewards).sum().double())  # over every process
        if not bool(scored > 0):  # nothing scored: no signal, only Adam momentum
            self.skipped_in_a_row += 1
            metrics["train/skipped_unscored_batch"] = 1.0
            warnings.warn(f"step {step}: no episode of the batch has a finite reward; the update was skipped",
                          RuntimeWarning, stacklevel=2)
            return
        if self.needs_old_logprobs:
            # The prepared policy's own module: under FSDP its hooks gather the shards (self.model's alone do not).
            batch.extras["old_logprobs"] = self.frozen_logprobs(self.accelerator.unwrap_model(self.policy), batch)
        if self.ref_model is not None:
            with lora.adapter_disabled(self.ref_model):
                reference = TokenLogprobs(self.ref_model, temperature=self.config.temperature,
                                          pack=self.policy_pack)
                batch.extras["ref_logprobs"] = self.frozen_logprobs(reference, batch)
        for factor in self.hook.agentrl_adjust_loss_mask(batch=batch, config=self.config, settings=self.settings,
                                                         metrics=metrics):
            batch.loss_mask = batch.loss_mask * factor.to(batch.loss_mask.device)
        batch.extras["advantages"] = algo.compute_advantages(batch, metrics)
        train_policy = algo.trains_policy(step)
        stats = StepStats()
        stepped = False
        for epoch in range(algo.num_iterations):
            for rows in self.mini_batch_rows(batch, step, epoch):
                mini = batch.select(rows)
                stepped |= self.optimizer_step(mini, step, train_policy, stats, metrics)
        self.skipped_in_a_row = 0 if stepped else self.skipped_in_a_row + 1
        # What hooks and the algorithm logged here is this process's: the mean over processes.
        metrics.update(_mean_over_processes({k: v for k, v in metrics.items() if k not in logged_before}))
        metrics.update(stats.means(combine=distributed.gather_objects))
        metrics["train/nonfinite_skipped_steps"] = float(self.nonfinite_skips)
        if train_policy:
            self.engine.sync_weights(self.sampling_model())

    def mini_batch_rows(self, batch: TrainBatch, step: int, epoch: int) -> list[list[int]]:
        """The algorithm's mini-batches of ``batch``: all rows when it asks for one, else a seeded
        shuffle of the rows cut into ``num_mini_batches`` near-equal parts (new order each epoch)."""
        parts = self.algorithm.num_mini_batches
        if parts == 1:
            return [list(range(batch.num_rows))]
        generator = torch.Generator().manual_seed(self.config.seed * 1_000_003 + step * 1_009 + epoch)
        order = torch.randperm(batch.num_rows, generator=generator)
        return [chunk.tolist() for chunk in torch.tensor_split(order, parts) if len(chunk)]

    def optimizer_step(self, batch: TrainBatch, step: int, train_policy: bool, stats: StepStats,
                       metrics: dict[str, float]) -> bool:
        """One optimizer step of every trained module on ``batch`` (a mini-batch): denominators
        counted over its micro-batches first, then accumulate, clip, step; skipped if not finite
        (returns whether it stepped)."""
        cfg, policy = self.config, self.policy
        micro = self.micro_batches(batch)
        totals = step_totals([mb.loss_mask for mb in micro],
                             num_tokens_rollout=float(self.accelerator.reduce(batch.loss_mask.sum(), "sum")),
                             max_completion_length=self.max_sampled,
                             reduce=lambda t: self.accelerator.reduce(t, "sum"))
        models = [policy] + [spec.module for spec, _, _ in self.owned.values()]
        step_loss = 0.0
        for i, mb in enumerate(micro):
            with contextlib.ExitStack() as stack:
                if i < len(micro) - 1:  # gradients are all-reduced once, after the last micro-batch
                    for model in models:
                        stack.enter_context(self.accelerator.no_sync(model))
                with self.autocast(), torch.set_grad_enabled(train_policy):
                    logprobs, entropy = policy(mb.input_ids, mb.attention_mask, mb.loss_mask)
                old = mb.extras.get("old_logprobs", logprobs.detach())
                out = self.algorithm.loss(LossContext(
                    batch=mb, logprobs=logprobs, old_logprobs=old, ref_logprobs=mb.extras.get("ref_logprobs"),
                    totals=totals, hook=self.hook, config=cfg, metrics=metrics, step=step,
                    train_policy=train_policy, autocast=self.autocast, settings=self.settings))
                if out.loss.requires_grad:
                    # Denominators are global, so undo DDP's gradient averaging (x num_processes).
                    self.accelerator.backward(out.loss * self.accelerator.num_processes)
            step_loss += float(out.loss.detach())
            stats.add_scalar("loss/total", float(out.loss.detach()))
            for key, value in out.scalars.items():
                stats.add_scalar(key, value)
            stats.add_tokens("policy/entropy", entropy, mb.loss_mask)
            log_r = logprobs.detach() - mb.sampler_logprobs  # (n, T) trainer vs sampler, same support
            stats.add_tokens("policy/sampler_logprob_gap", log_r.abs(), mb.loss_mask)
            stats.add_tokens("policy/sampler_kl", torch.expm1(log_r) - log_r, mb.loss_mask)  # k3 of KL(sampler||trainer)
            for key, value in out.token_stats.items():
                stats.add_tokens(key, value.detach(), mb.loss_mask)
        trained = ([("policy", self.model, self.optimizer, self.scheduler, cfg.max_grad_norm)] if train_policy else [])
        trained += [(name, spec.module, opt, sched, spec.max_grad_norm) for name, (spec, opt, sched) in self.owned.items()]
        norms = {name: float(self.accelerator.clip_grad_norm_(module.parameters(), max_norm or float("inf")))
                 for name, module, _, _, max_norm in trained}
        step_loss = float(distributed.all_sum(torch.tensor(step_loss, dtype=torch.float64)))  # every process agrees
        finite = math.isfinite(step_loss) and all(math.isfinite(n) for n in norms.values())  # norms: global already
        for name, _, optimizer, scheduler, _ in trained:
            prefix = "train" if name == "policy" else name
            stats.add_scalar(f"{prefix}/grad_norm", norms[name], shared=True)
            stats.add_scalar(f"{prefix}/learning_rate", float(scheduler.get_last_lr()[0]), shared=True)
            if finite:
                optimizer.step()
                scheduler.step()
        if not finite:
            self.nonfinite_skips += 1
            warnings.warn(f"step {step}: loss {step_loss} or gradient norms {norms} are not finite; "
                          "the optimizer step was skipped", RuntimeWarning, stacklevel=2)
        for _, module, optimizer, _, _ in trained:
            optimizer.zero_grad(set_to_none=True)
        if not train_policy:
            self.optimizer.zero_grad(set_to_none=True)
        stats.end_step()
        return finite

    # -- the run -------------------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """Held-out accuracy of the current policy (greedy by default)."""
        cfg = self.config
        eval_tasks = list(self.envs[0].eval_tasks())[: cfg.eval_tasks]
        metrics, _ = evaluate(self.rollout, self.envs, eval_tasks, max_new_tokens=cfg.max_new_tokens,
                              temperature=cfg.eval_temperature, seed=cfg.seed,
                              reward_fns=self.reward_fns, batch_size=len(self.envs), guard=self.call_guard,
                              env_weight=cfg.env_reward_weight)
        if cfg.eval_sampled and cfg.eval_temperature != cfg.temperature:
            sampled, _ = evaluate(self.rollout, self.envs, eval_tasks, max_new_tokens=cfg.max_new_tokens,
                                  temperature=cfg.temperature, seed=cfg.seed, batch_size=len(self.envs))
            metrics["eval/accuracy_sampled"] = sampled["eval/accuracy"]
        return metrics

    def train(self, progress: Any = None) -> TrainResult:
        """Run the steps left (all of them, or those after the resumed checkpoint) with
        evaluations before and after, writing the run dir and periodic checkpoints.

        Ctrl-C, SIGTERM or SIGHUP (:data:`STOP_SIGNALS`) during a rollout or evaluation stops at
        once; during an update (and its checkpoint) it stops when the step is complete. Either way the
        last complete step is checkpointed and :class:`TrainingInterrupted` names it and the signal;
        a second signal during an update or that checkpoint stops without it (the older checkpoints
        stay intact).
        """
        cfg, run_dir, resumed, main = self.config, self.run_dir, self.resumed, self.is_main
        if main:  # one process writes the run dir, logs, evaluates and saves
            run_dir.mkdir(parents=True, exist_ok=True)
            if resumed is None:
                (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
            else:  # drop what was written after the checkpoint (and a line torn by a kill)
                for log in ("metrics", "completions"):
                    if lost := ckpt.truncate(run_dir / f"{log}.jsonl", resumed[f"{log}_bytes"]):
                        print(f"note: {lost}", flush=True)
                ckpt.remove_partial(run_dir)
                ckpt.set_aside_after(run_dir, resumed["step"])  # damaged newer checkpoints the resume passed over
            self.hook.agentrl_on_train_start(config=cfg, run_dir=str(run_dir))
        writer = MetricsWriter(run_dir, purge_step=resumed["step"] + 1 if resumed else None) if main else _NoWriter()
        guard = InterruptGuard(collective=distributed.world_size() > 1)
        self.completed_step = resumed["step"] if resumed else 0
        with guard.installed():  # also while the interrupted run saves: a second signal breaks that save only
            try:
                if resumed is None:
                    _phase(progress, "eval")
                    self.eval_before = self.evaluate() if cfg.eval_tasks and main else {}
                    self.offer_best(0, self.eval_before)
                else:
                    self.eval_before = resumed["eval_before"]
                    if self.best is not None and main:
                        self.best.resume(resumed["step"])
                _report(progress, "eval before", self.eval_before)
                history = read_history(run_dir / "metrics.jsonl") if main else []
                for step in range(self.completed_step + 1, cfg.max_steps + 1):
                    history.append(self.train_step(step, writer, guard, progress))
                if self.completed_step and cfg.checkpoint_every:
                    self.save_checkpoint(self.completed_step)
                _phase(progress, "eval")
                eval_after = self.evaluate() if cfg.eval_tasks and main else {}
            except KeyboardInterrupt as exc:
                writer.close()
                failure = None if guard.requested else plugin_exit(exc)  # raised by code, not by a signal
                if failure is not None:
                    raise TrainingError(f"the run stopped: {failure}") from None
                raise self._interrupted(guard) from None
        _report(progress, "eval after", eval_after)
        owned_states = self.gather_owned() if cfg.save_model else {}  # a collective under FSDP / ZeRO-3
        if main:
            if eval_after:
                writer.write(cfg.max_steps, {f"final/{k}": v for k, v in eval_after.items()})
            writer.close()
            kept_best = self.best is not None and self.best.step is not None and eval_after and not (
                eval_after.get(self.best.metric, -math.inf) >= self.best.score)
            record = {"before": self.eval_before, "after": eval_after}
            if self.best is not None and self.best.step is not None:
                record["best"] = self.best_record = {**self.best.summary(), "saved_as_model": bool(kept_best)}
            (run_dir / "eval.json").write_text(json.dumps(record, indent=2))
            if cfg.save_model:
                self.export(run_dir, "last" if kept_best else "model", owned_states)
            if kept_best:  # the best evaluated policy is the run's model; the last one is in last/
                shutil.rmtree(run_dir / "model", ignore_errors=True)
                self.best.folder.rename(run_dir / "model")
            elif self.best is not None:
                shutil.rmtree(self.best.folder, ignore_errors=True)
            self.finish_checkpoints(("last" if kept_best else "model") if cfg.save_model else None)
            from agentrl.plots import plot_run

            plot_run(run_dir)
            self.hook.agentrl_on_train_end(run_dir=str(run_dir), metrics=eval_after)
        distributed.barrier()  # the run dir is complete when any process returns
        return TrainResult(run_dir, self.eval_before, eval_after, history, self.best_record)

    def train_step(self, step: int, writer: MetricsWriter, guard: InterruptGuard, progress: Any) -> dict[str, float]:
        """One step: rollout (interruptible), then update, evaluation, records and checkpoint as
        one unit Ctrl-C waits for; stops the run after too many skipped steps in a row."""
        cfg = self.config
        boundary = (self.cursor.position, ckpt.rng_states())
        t0 = time.perf_counter()
        _phase(progress, "rollout")
        try:
            batch, trajectories, metrics = self.rollout_step(step)
            if _any_process(guard.requested):  # every process stops here together (several processes)
                raise KeyboardInterrupt
        except KeyboardInterrupt:  # nothing trained yet: rewind to the step boundary
            self.cursor.position = boundary[0]
            ckpt.set_rng_states(boundary[1])
            raise
        t1 = time.perf_counter()
        with guard.deferred():
            _phase(progress, "update")
            self.update(batch, metrics, step)
            t2 = time.perf_counter()
            metrics.update({"perf/rollout_seconds": t1 - t0, "perf/update_seconds": t2 - t1,
                            "perf/step_seconds": t2 - t0,
                            "perf/episodes_per_second": len(trajectories) / (t2 - t0),
                            "perf/rss_gb": rss_gb(), "perf/peak_rss_gb": peak_rss_gb()})
            if (cfg.eval_every and step % cfg.eval_every == 0 and step != cfg.max_steps and cfg.eval_tasks
                    and self.is_main):
                _phase(progress, "eval")
                evaluation = self.evaluate()
                metrics.update(evaluation)
                self.offer_best(step, evaluation)
            if self.is_main:
                if cfg.log_completions_every and (step == 1 or step % cfg.log_completions_every == 0):
                    _log_completions(self.run_dir, step, trajectories, self.step_rewards)
                self.hook.agentrl_on_step_end(step=step, metrics=metrics)
            writer.write(step, metrics)
            self.completed_step = step
            too_many = self.skipped_in_a_row >= cfg.max_nonfinite_steps
            if cfg.checkpoint_every and (step % cfg.checkpoint_every == 0 or too_many):
                self.save_checkpoint(step)
        if progress is not None:
            progress(step, metrics)
        if too_many:
            last_good = step - self.skipped_in_a_row
            raise TrainingError(
                f"steps {last_good + 1}-{step}: {self.skipped_in_a_row} steps in a row had a non-finite loss or "
                f"gradient, or no scored episode (max_nonfinite_steps={cfg.max_nonfinite_steps}); stopping. The "
                f"weights are those after step {last_good}; {self.run_dir}/metrics.jsonl shows the steps "
                "(train/grad_norm, loss/total, reward/*). Lower learning_rate or check the rewards")
        if _any_process(guard.requested):  # deferred to here, or raised inside a callback that swallowed it
            raise KeyboardInterrupt
        return metrics

    def _interrupted(self, guard: InterruptGuard) -> TrainingInterrupted:
        """Checkpoint the last complete step (unless a second signal broke into an update or its
        checkpoint: then the newest complete checkpoint is what stays)."""
        step, signum = self.completed_step, guard.signum or signal.SIGINT
        name = signal.Signals(signum).name
        resume = f"`agentrl train --resume {self.run_dir}`"
        if guard.broke_unit:
            how = f"stopped at once by a second signal ({name} first), before the step in progress was saved"
        elif step == 0:
            how = f"interrupted ({name}) before the first step completed"
        else:
            try:
                folder = self.save_checkpoint(step)
                return TrainingInterrupted(f"interrupted after step {step} ({name}); checkpoint {folder}; continue "
                                           f"with {resume}", str(folder), signum)
            except KeyboardInterrupt:  # a second signal: the checkpoint's temporary folder is gone
                how = f"stopped at once by a second signal ({name} first), before step {step}'s checkpoint was complete"
        latest = _latest_or_none(self.run_dir)
        if latest is None:
            return TrainingInterrupted(f"{how}; no checkpoint: {resume} starts the run over from step 0", None, signum)
        return TrainingInterrupted(f"{how}; the newest complete checkpoint is {latest}: continue with {resume}",
                                   latest, signum)

    # -- checkpoints ---------------------------------------------------------------------------------
    def save_checkpoint(self, step: int) -> Path:
        """Write everything ``--resume`` needs to continue after ``step`` exactly (atomically).
        Every process calls it (each one's RNG and engine state is kept); the main one writes."""
        unwrap = self.accelerator.unwrap_model
        processes = distributed.gather_objects({"rng": ckpt.rng_states(), "engine": self.engine.state_dict()})
        sharded = self.replica is not None  # FSDP (check_sharded_run): whole states, gathered by every process
        if sharded:
            self.sampling_model()  # the replica now holds the whole policy
            optim_states = {"policy": sharding.whole_optimizer_state(self.policy, self.optimizer)}
            optim_states.update({name: sharding.whole_optimizer_state(spec.module, opt)
                                 for name, (spec, opt, _) in self.owned.items()})
            module_states = {name: sharding.whole_module_state(spec.module) for name, (spec, _, _) in self.owned.items()}
        else:
            optim_states = {"policy": self.optimizer.state_dict()}
            optim_states.update({name: opt.state_dict() for name, (_, opt, _) in self.owned.items()})
            module_states = {name: unwrap(spec.module).state_dict() for name, (spec, _, _) in self.owned.items()}
        if not self.is_main:
            distributed.barrier()  # returns once the checkpoint is complete on disk
            return ckpt.checkpoint_dir(self.run_dir, step)

        def write(folder: Path) -> None:
            if lora.is_adapted(self.model):  # the adapter alone: the base is config.model, unchanged
                lora.save_adapter(self.model, folder / "adapter")
            else:
                (self.replica if sharded else self.model).save_pretrained(folder / "model")
                self.tokenizer.save_pretrained(folder / "model")
            schedules = {"policy": self.scheduler.state_dict()}
            schedules.update({name: sched.state_dict() for name, (_, _, sched) in self.owned.items()})
            save_tensors(module_states, folder / ckpt.MODULES)
            save_tensors(optim_states, folder / ckpt.OPTIMIZERS)
            plugins: dict[str, Any] = {}
            self.hook.agentrl_save_state(state=plugins)
            save_json({"schedules": schedules, "processes": processes, "algorithm": self.algorithm.state_dict(),
                            "plugins": plugins}, folder / ckpt.EXTRA)
            (folder / ckpt.STATE).write_text(json.dumps({
                "step": step, "task_cursor": self.cursor.position,
                "metrics_bytes": ckpt.file_size(self.run_dir / "metrics.jsonl"),
                "completions_bytes": ckpt.file_size(self.run_dir / "completions.jsonl"),
                "nonfinite_skips": self.nonfinite_skips, "skipped_in_a_row": self.skipped_in_a_row,
                "eval_before": self.eval_before, "sharded": sharded, "config": self.config.to_dict()}, indent=1))

        folder = ckpt.write_atomically(self.run_dir, step, write, self.config.keep_checkpoints)
        distributed.barrier()
        return folder

    def load_checkpoint(self, folder: Path) -> dict[str, Any]:
        """Restore a checkpoint written by :meth:`save_checkpoint`; returns its trainer state."""
        saved = ckpt.read_checkpoint(folder)  # a CheckpointError naming a file that cannot be read safely
        state, optim = saved.trainer, saved.optimizers
        sharded = self.replica is not None
        if bool(state.get("sharded", False)) != sharded:
            written, needed = ("an FSDP run", "--accelerate-config fsdp") if state.get("sharded") else (
                "a run without sharded weights", "the accelerate config it was written with (not fsdp)")
            raise ConfigError(f"checkpoint {str(folder)!r} was written by {written}; resume it with {needed}")
        if self.is_main and any(moments is None for moments in optim.values()):  # slimmed (a finished run's)
            print(f"note: {folder.name} is a finished run's checkpoint without optimizer state: the AdamW moments "
                  "restart from zero (keep_finished_checkpoints: true keeps them)", flush=True)
        if lora.is_adapted(self.model):
            lora.load_adapter(self.model, folder / "adapter")
        elif sharded:  # whole states, sharded again as this run's processes hold them
            load_weights(self.replica, ckpt.weights_folder(self.run_dir, folder))
            policy_state = {f"model.{key}": value for key, value in self.replica.state_dict().items()}
            sharding.load_whole_state(self.policy, self.optimizer, policy_state, optim["policy"])
        else:
            load_weights(self.model, ckpt.weights_folder(self.run_dir, folder))
        for name, (spec, opt, _) in self.owned.items():
            if sharded:
                sharding.load_whole_state(spec.module, opt, saved.modules[name], optim[name])
            else:
                self.accelerator.unwrap_model(spec.module).load_state_dict(saved.modules[name])
        pairs = [("policy", self.optimizer, self.scheduler)] + [(n, o, s) for n, (_, o, s) in self.owned.items()]
        for name, optimizer, scheduler in pairs:
            if not sharded and optim[name] is not None:
                optimizer.load_state_dict(optim[name])
            scheduler.load_state_dict(saved.schedules[name])
            reapply_schedule(scheduler)  # --resume --max-steps N: the rate of the schedule as now configured
        processes = saved.processes
        if len(processes) != self.num_processes:
            raise ConfigError(f"checkpoint {str(folder)!r} was written by {len(processes)} process(es); resume it with "
                              f"the same count, not {self.num_processes} (each process's sampling state is in it)")
        own = processes[self.accelerator.process_index]
        self.engine.load_state_dict(own["engine"])
        self.engine.sync_weights(self.sampling_model())
        self.algorithm.load_state_dict(saved.algorithm)
        self.hook.agentrl_load_state(state=saved.plugins)
        ckpt.set_rng_states(own["rng"])
        self.cursor.position = state["task_cursor"]
        self.nonfinite_skips, self.skipped_in_a_row = state["nonfinite_skips"], state["skipped_in_a_row"]
        return state

    def finish_checkpoints(self, exported: str | None) -> None:
        """At the end of a run that finished normally: keep only the checkpoint of its last step
        (when one was written), slimmed by :func:`agentrl.checkpoint.slim_finished`, unless
        ``keep_finished_checkpoints``; ``exported``: the run dir's folder the last policy went to."""
        final = ckpt.checkpoint_dir(self.run_dir, self.completed_step)
        if (final / ckpt.COMPLETE).is_file() and not self.config.keep_finished_checkpoints:
            ckpt.slim_finished(self.run_dir, final, exported)

    def sampling_model(self) -> torch.nn.Module:
        """The weights the engine samples from now: with LoRA a plain view holding the merged
        weights, under FSDP / ZeRO-3 the full replica gathered from the shards (every process
        calls this), else the trained model itself."""
        if self.replica is not None:
            sharding.gather_into(self.accelerator, self.policy, self.replica, prefix="model.")
            return self.replica
        return lora.sampling_model(self.model)

    def offer_best(self, step: int, evaluation: dict[str, float]) -> None:
        """Keep the policy evaluated after ``step`` in ``best/`` if it is the best so far (``keep_best``)."""
        if self.best is not None and self.is_main and evaluation:
            self.best.offer(step, evaluation, self.save_policy)

    def save_policy(self, folder: Path) -> None:
        """The policy as a ``from_pretrained``-loadable folder with its tokenizer (LoRA merged)."""
        policy = self.accelerator.unwrap_model(self.policy).model
        (self.replica if self.replica is not None else lora.sampling_model(policy)).save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)

    def gather_owned(self) -> dict[str, torch.nn.Module]:
        """The algorithm's modules whole, by name, when the run shards weights (every process calls
        this: the gather is a collective); empty otherwise (they are whole already)."""
        return {name: sharding.unsharded(self.owned_templates[name], sharding.full_state_dict(self.accelerator, spec.module))
                for name, (spec, _, _) in self.owned.items() if name in self.owned_templates}

    def export(self, run_dir: Path, name: str = "model", gathered: dict[str, torch.nn.Module] | None = None) -> None:
        """The final model in ``run_dir/name`` (``from_pretrained``-loadable, with its tokenizer; with
        LoRA merged, plus the adapter alone in ``adapter/``) and the algorithm's modules (``gathered``:
        their whole copies under FSDP / ZeRO-3, from :meth:`gather_owned`)."""
        policy = self.accelerator.unwrap_model(self.policy).model
        self.save_policy(run_dir / name)
        if lora.is_adapted(policy):
            lora.save_adapter(policy, run_dir / "adapter")
        for name, (spec, _, _) in self.owned.items():
            whole = (gathered or {}).get(name)
            save_module(whole if whole is not None else self.accelerator.unwrap_model(spec.module), run_dir / name)


class _NoWriter:
    """The metrics writer of a process other than the main one: writes nothing."""

    def write(self, step: int, metrics: dict[str, float]) -> None:
        return None

    def close(self) -> None:
        return None


class InterruptGuard:
    """Handling of :data:`STOP_SIGNALS` for a run: one raises KeyboardInterrupt at once, except
    inside a :meth:`deferred` unit (an update, its records and its checkpoint), where the first one
    is remembered (``pending``) and the unit completes; a second one there raises (``broke_unit``).
    Every one sets ``requested`` (``signum``: the first one): a KeyboardInterrupt raised inside a
    finalizer is swallowed by Python, so the loop also stops at the step's end when it sees the request.

    ``collective`` (several processes): a signal never raises, it only sets ``requested``; the
    processes agree after each rollout and at each step's end whether any of them saw one, and
    stop there together. Raising at once would leave the others waiting in (or pairing wrongly
    with) a collective operation the interrupted process never reaches."""

    def __init__(self, collective: bool = False) -> None:
        self.collective = collective
        self.pending = self.requested = self.broke_unit = self._deferring = False
        self.signum: int | None = None

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Install the handler (main thread only; elsewhere Python's defaults stay)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {signum: signal.signal(signum, self._handle) for signum in STOP_SIGNALS}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """A unit Ctrl-C does not break into (unless pressed twice)."""
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False

    def _handle(self, signum: int, frame: Any) -> None:
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        if signum == getattr(signal, "SIGHUP", None):
            detach_hung_up_terminal()  # so the messages below and the save do not fail writing to it
        if self.signum is None:
            self.signum = signum
        if self.collective:
            if not self.requested:
                warnings.warn(f"{name}: every process stops at the end of this step's rollout or update, then "
                              "saves a checkpoint", RuntimeWarning, stacklevel=2)
            self.requested = True
            return
        self.requested = True  # seen at the step's end even if the raise below lands where it is swallowed
        if self._deferring and not self.pending:
            self.pending = True
            warnings.warn(f"{name}: stopping after this step's update, then saving a checkpoint (a second "
                          f"{name} stops now without saving this step)", RuntimeWarning, stacklevel=2)
            return
        self.broke_unit = self._deferring
        raise KeyboardInterrupt


def _any_process(flag: bool) -> bool:
    """Whether ``flag`` is set on any process (the flag itself in a one-process run); every
    process must call it at the same point."""
    return any(distributed.gather_objects(bool(flag)))


def _mean_over_processes(values: dict[str, float]) -> dict[str, float]:
    """Each key's mean over the processes that logged it (the value itself in a one-process run)."""
    parts = distributed.gather_objects(values)
    if len(parts) == 1:
        return values
    keys = {k for part in parts for k in part}
    return {k: sum(p[k] for p in parts if k in p) / sum(k in p for p in parts) for k in sorted(keys)}


def _summed(counts: list[dict[str, int]]) -> dict[str, int]:
    """Per-name counts added over processes."""
    out: dict[str, int] = {}
    for part in counts:
        for name, n in part.items():
            out[name] = out.get(name, 0) + n
    return out


def _latest_or_none(run_dir: Path) -> str | None:
    found = ckpt.complete_checkpoints(run_dir)
    return str(found[-1]) if found else None


def read_history(path: Path) -> list[dict[str, float]]:
    """The per-step metrics rows already in ``metrics.jsonl`` (a resumed run's earlier steps)."""
    return [{k: v for k, v in row.items() if k != "step"} for row in read_rows(path)
            if not any(k.startswith("final/") for k in row)]


def load_weights(model: torch.nn.Module, folder: Path) -> None:
    """Load a ``save_pretrained`` folder's safetensors into ``model`` in place (exact values);
    only keys tied to a loaded one (an LM head sharing the embedding) may be missing."""
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{str(folder)!r} holds no *.safetensors weights file: resume from another checkpoint, "
                              "or start the run again")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            weights.update(load_file(file))
        except Exception as exc:  # safetensors raises its own error type for a cut or garbled file
            raise CheckpointError(f"{file} is unreadable ({one_line(exc)}): resume from another checkpoint, or "
                                  "start the run again") from None
    missing, unexpected = model.load_state_dict(weights, strict=False)
    loaded = {p.data_ptr() for name, p in model.named_parameters(remove_duplicate=False) if name in weights}
    params = dict(model.named_parameters(remove_duplicate=False))
    untied = [k for k in missing if k not in params or params[k].data_ptr() not in loaded]
    if untied or unexpected:
        raise ConfigError(f"checkpoint {str(folder)!r} does not fit the model: missing {untied[:5]}, "
                          f"unexpected {unexpected[:5]}")


def _phase(progress: Any, label: str) -> None:
    """Tell a progress display what the run is doing now (``eval``, ``rollout``, ``update``)."""
    if progress is not None and hasattr(progress, "phase"):
        progress.phase(label)


def save_module(module: torch.nn.Module, folder: Path) -> None:
    """Save an algorithm-owned module: ``save_pretrained`` if it has one, else ``state_dict.pt``."""
    folder.mkdir(parents=True, exist_ok=True)
    if hasattr(module, "save_pretrained"):
        module.save_pretrained(folder)
    else:
        torch.save(module.state_dict(), folder / "state_dict.pt")


def split_to_count(groups: list[list[int]], count: int) -> list[list[int]]:
    """``groups`` split further, largest first, into ``count`` groups (each split halves a group in
    order, so every limit a group met still holds)."""
    groups = [list(g) for g in groups]
    while len(groups) < count:
        i = max(range(len(groups)), key=lambda j: len(groups[j]))
        if len(groups[i]) < 2:
            raise RuntimeError(f"cannot run {count} micro-batches on {sum(map(len, groups))} rows: under FSDP / ZeRO-3 "
                               "every process needs as many rows as the process with the most micro-batches")
        half = (len(groups[i]) + 1) // 2
        groups[i:i + 1] = [groups[i][:half], groups[i][half:]]
    return groups


def plan_micro_batches(lengths: list[int], max_rows: int, max_tokens: int,
                       groups: list[int] | None = None) -> list[list[int]]:
    """Split row indices into micro-batches, longest first, each with at most ``max_rows`` rows and
    ``rows x longest <= max_tokens`` padded tokens (a row longer than ``max_tokens`` alone).

    With ``groups`` (the rows' GRPO group ids, for packed forwards) rows of a group stay together:
    group by group, longest first within each, so a micro-batch shares its prompt."""
    if groups is None:
        order = sorted(range(len(lengths)), key=lambda r: -lengths[r])
    else:
        order = sorted(range(len(lengths)), key=lambda r: (groups[r], -lengths[r]))
    plan: list[list[int]] = []
    longest = 0
    for row in order:
        current = plan[-1] if plan else None
        if current and len(current) < max_rows and (len(current) + 1) * max(longest, lengths[row]) <= max_tokens:
            current.append(row)
            longest = max(longest, lengths[row])
        else:
            plan.append([row])
            longest = lengths[row]
    return plan


def check_packing(policy: TokenLogprobs, asked: bool) -> bool:
    """Whether the policy's forward packs shared prefixes: asked, supported by the model's
    attention, and agreeing with the padded forward (max |logprob difference| <= 1e-3 in fp32 on a
    test batch); otherwise turned off with a warning saying why."""
    if not asked:
        return False
    attention = getattr(policy.model.config, "_attn_implementation", None)
    if not policy.pack:
        warnings.warn(f"pack_sequences: the model's attention {attention!r} takes no custom mask; the training "
                      "forward runs padded rows", RuntimeWarning, stacklevel=2)
        return False
    error = policy.packing_error()
    if not error <= 1e-3:
        policy.pack = False
        warnings.warn(f"pack_sequences: the packed forward differs from the padded one by {error:.2g} on this model "
                      f"(attention {attention!r}); the training forward runs padded rows", RuntimeWarning, stacklevel=2)
    return policy.pack


def reapply_schedule(scheduler: Any) -> None:
    """Set each group's rate to what the schedule gives at its current step. A loaded state keeps
    the rate it was saved with, which for a run resumed with more steps is the old schedule's."""
    scheduler.last_epoch -= 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "step() before optimizer.step()": no update here
        scheduler.step()


def wsd_decay_steps(fraction: float, steps_after_warmup: int) -> int:
    """Optimizer steps of the wsd decay: ``fraction`` of the steps after warm-up, rounded, at least
    one and at most all of them (0.375 of 40 is 15)."""
    if not 0 < fraction <= 1:
        raise ConfigError(f"lr_decay_fraction must be in (0, 1], got {fraction!r}")
    return min(max(1, round(fraction * steps_after_warmup)), max(1, steps_after_warmup))


def build_scheduler(optimizer: torch.optim.Optimizer, name: str, warmup_steps: int, total_steps: int,
                    decay_fraction: float = TrainConfig.lr_decay_fraction) -> Any:
    """A transformers LR schedule; ``constant`` with warm-up is ``constant_with_warmup`` (the plain
    ``constant`` schedule ignores ``num_warmup_steps``); ``wsd`` is transformers' warm-up, stable,
    decay schedule, decaying linearly to 0 over :func:`wsd_decay_steps` of the steps."""
    if name == "constant" and warmup_steps > 0:
        name = "constant_with_warmup"
    if name == "wsd":
        decay_steps = wsd_decay_steps(decay_fraction, total_steps - warmup_steps)
        return get_scheduler("warmup_stable_decay", optimizer, num_warmup_steps=warmup_steps,
                             num_training_steps=total_steps,
                             scheduler_specific_kwargs={"num_decay_steps": decay_steps, "decay_type": "linear"})
    return get_scheduler(name, optimizer, num_warmup_steps=warmup_steps, num_training_steps=total_steps)


class StepStats:
    """Metrics of a rollout batch's optimizer steps: token statistics as loss-mask-weighted means
    over all of them, scalars summed within an optimizer step and averaged over the steps. Over
    several processes, token sums and scalars add up (each process's loss is its share of the
    global loss) except ``shared`` scalars, the same on every process (grad norm, learning rate)."""

    def __init__(self) -> None:
        self.tokens: dict[str, list[float]] = {}
        self.scalars: dict[str, float] = {}
        self.current: dict[str, float] = {}
        self.shared: set[str] = set()
        self.steps = 0

    def add_tokens(self, key: str, value: torch.Tensor, mask: torch.Tensor) -> None:
        """Add ``value`` ``(n, T)`` weighted by ``mask`` ``(n, T)``."""
        num, den = self.tokens.get(key, (0.0, 0.0))
        self.tokens[key] = [num + float((value * mask).sum()), den + float(mask.sum())]

    def add_scalar(self, key: str, value: float, shared: bool = False) -> None:
        """Add ``value`` to this optimizer step's sum for ``key`` (``shared``: every process
        logs the same value, so processes do not add up)."""
        self.current[key] = self.current.get(key, 0.0) + value
        if shared:
            self.shared.add(key)

    def end_step(self) -> None:
        """Close one optimizer step."""
        for key, value in self.current.items():
            self.scalars[key] = self.scalars.get(key, 0.0) + value
        self.current, self.steps = {}, self.steps + 1

    def means(self, combine: Any = None) -> dict[str, float]:
        """Name -> value over all closed optimizer steps; ``combine`` gathers every process's
        ``(tokens, scalars)`` (``distributed.gather_objects``) to report the whole batch's."""
        tokens, scalars = dict(self.tokens), dict(self.scalars)
        parts = combine((self.tokens, self.scalars)) if combine is not None else [(tokens, scalars)]
        if len(parts) > 1:
            tokens = {k: [sum(p[0][k][i] for p in parts if k in p[0]) for i in (0, 1)] for k in tokens}
            scalars = {k: v if k in self.shared else sum(p[1].get(k, 0.0) for p in parts) for k, v in scalars.items()}
        out = {key: value / max(self.steps, 1) for key, value in scalars.items()}
        out.update({key: num / max(den, 1.0) for key, (num, den) in tokens.items()})
        return out


def _report(progress: Any, label: str, metrics: dict[str, float]) -> None:
    if progress is not None and hasattr(progress, "report"):
        progress.report(label, metrics)


def _log_completions(run_dir: Path, step: int, trajectories: list[Any], rewards: list[float]) -> None:
    with (run_dir / "completions.jsonl").open("a") as f:
        for traj, reward in zip(trajectories, rewards):
            f.write(json.dumps({"step": step, "group": traj.group, "reward": reward,
                                "answer": traj.task.get("answer"), "messages": traj.messages}) + "\n")


def iter_steps(history: list[dict[str, float]], key: str) -> Iterator[tuple[int, float]]:
    """(step, value) pairs of ``key`` in a run's history, skipping steps without it."""
    for step, metrics in enumerate(history, start=1):
        if key in metrics:
            yield step, metrics[key]
