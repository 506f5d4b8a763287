"""Seconds per GRPO step: agentrl's ``Trainer`` against TRL's ``GRPOTrainer``, same config, one process.

    python bench/trl_vs_agentrl.py [--steps 5] [--skip-first 1] [--only agentrl|trl] [--trl-first]
                                   [--interleave] [--threads N] [--precision auto|fp32]
                                   [--trl-arg KEY=VALUE ...] [--out PATH]

Both train the default model (SmolLM2-135M-Instruct, the local HF folder of
``agentrl.model.loading.resolve_model("smollm2-135m")``) on the ``math`` env's training tasks for ``--steps``
optimizer steps, one system after the other (agentrl first unless ``--trl-first``; the first is deleted
and garbage-collected before the second is built). Reported per system: each step's seconds, the
median over the steps after the first ``--skip-first`` (warm-up), completions/s (32 / median), the
mean number of sampled tokens, and the split generation+scoring vs update. The headline is
``agentrl / TRL`` median seconds per step (the target is <= 0.3). Figures go to the terminal and to
``bench/results/trl_vs_agentrl.json`` (git-ignored).

What is timed:
  * agentrl: ``perf/step_seconds`` of ``Trainer.train()``'s history (rollout + scoring + collate,
    then loss, backward, optimizer step and the engine's weight sync), split into
    ``perf/rollout_seconds`` and ``perf/update_seconds``.
  * TRL: a callback's ``on_step_begin`` -> ``on_step_end`` (generation + scoring of the 32
    completions, the 4 accumulated forward/backward passes, clipping and the optimizer step);
    the generation+scoring part is ``_generate_and_score_completions``, timed by wrapping it.
  * Both also get "wall" intervals between consecutive step ends (logging and callbacks included)
    as a cross-check. Model loading and trainer construction are reported, not counted.

Identical in both:
  * model weights (fp32 master weights), tokenizer and chat template; seed 0;
  * the prompts and their order: the tasks agentrl's seeded ``TaskCursor`` picks for steps 1..N,
    handed to TRL as a ``datasets.Dataset`` in that order with ``shuffle_dataset=False``; the user
    message is ``task["question"]`` (it already asks for ``\\boxed{}``, so agentrl's math env sends
    the same text);
  * 4 prompts x 8 generations = 32 completions per optimizer step, one optimizer step per
    generation batch (TRL: ``per_device_train_batch_size=8``, ``gradient_accumulation_steps=4``, so
    ``steps_per_generation=4`` and ``generation_batch_size=32``; the script checks TRL made exactly
    one 32-completion generation per optimizer step), micro-batches of 8 sequences for the update;
  * max 64 new tokens, temperature 1.0, no top-k/top-p; eos ends a completion;
  * reward = lenient correctness (``agentrl.answers.is_correct``) + 0.2 x format (the last
    ``\\boxed{}`` holds a plain number, the ``format`` reward plugin's rule), group-normalised
    advantages (``scale_rewards="group"``), ``loss_type="dapo"``, beta 0 (no reference model),
    one iteration per batch (no old-logprob pass), clip 0.2 low / 0.28 high;
  * AdamW lr 2e-5 constant, betas (0.9, 0.99), weight decay 0, grad-norm clip 1.0;
  * no evaluation, no checkpoint or model saving, no completion logging.

What differs (TRL keeps its own defaults here; each can bias the comparison):
  * TRL defaults ``gradient_checkpointing=True`` (recomputes the forward during backward) and
    ``bf16=True`` (even with ``use_cpu=True``: fp32 weights under bf16 autocast for training *and*
    generation). The script sets TRL's ``bf16`` to what agentrl's ``precision: auto`` picks on this
    machine (fp32 on a CPU without native bf16, where TRL's default would take many minutes a step;
    ``--trl-arg bf16=...`` overrides it), so both compute in the same precision; agentrl follows
    TRL's ``bf16`` (:func:`agentrl_precision`). agentrl in bf16: bf16 autocast for training, sampling
    from a bf16 copy of the weights; in fp32: fp32 training, sampling from an fp32 copy rounded to
    bf16, as ``precision: auto`` runs on a CPU without native bf16. ``--precision fp32`` runs both in
    fp32 on any CPU: the path an AVX2 machine takes, measured where bf16 is native (its matrix
    speed is that CPU's, not an AVX2 one's).
  * Generation: TRL calls ``model.generate`` on 32 left-padded rows (each prompt repeated 8 times,
    prefilled 8 times); agentrl's engine prefills each distinct prompt once and drops finished rows.
  * TRL computes per-token entropies in its loss pass and logs many metrics (``logging_steps=1``
    here, set so its logs prove one optimizer step per 32 completions); agentrl writes
    metrics.jsonl/TensorBoard once per step (outside ``perf/step_seconds``, inside "wall").
  * Both optimizers are fused AdamW (TRL's default ``adamw_torch_fused``; agentrl's on whole
    weights). TRL's advantages use the unbiased std + eps, agentrl's the population std.
  * Sampling is random: the two draw different completions, so the sampled token counts differ
    (shown per system; decode time scales with the longest completion of the batch).
  * ``use_cpu=True`` and ``report_to="none"`` for TRL.

``--interleave`` builds both trainers (one after the other), then alternates their optimizer steps
(agentrl's step 1, TRL's step 1, agentrl's step 2, ...), each system in the main thread of a process
of its own: on a machine whose speed drifts (a virtual machine whose neighbours come and go) both
systems then meet the same minutes, where one after the other they can meet a fast and a slow
period. Step, rollout, update and CPU seconds are as without it; the "wall" figure then includes the
other system's steps. (Before 2026-12-03 the two ran in two threads of one process; torch's OpenMP
runtime slows small operators there for both, see ``run_interleaved``, so those ratios are not
comparable with later ones.)

A shared machine: the script measures how many cores other processes kept busy while each system
trained (``/proc/stat`` minus its own CPU time) and flags a contended run. With every core taken by
torch threads, a second CPU-heavy process slows a step down by far more than 2x (threads wait on
each other at every parallel region): figures from a contended run are not comparable, even within
one invocation. ``--threads 1`` (both systems) degrades gracefully instead, at a lower speed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local; never wait on a hub

import torch  # noqa: E402

PROMPTS_PER_STEP = 4
NUM_GENERATIONS = 8
COMPLETIONS_PER_STEP = PROMPTS_PER_STEP * NUM_GENERATIONS
MICRO_BATCH = 8
MAX_NEW_TOKENS = 64
TEMPERATURE = 1.0
LEARNING_RATE = 2e-5
SEED = 0
FORMAT_WEIGHT = 0.2  # the math env's default_rewards = {"format": 0.2}
CONTENDED = 0.1  # other processes' busy cores above which a run is flagged (quiet runs measured 0.01-0.03)
RESULTS = Path(__file__).resolve().parent / "results" / "trl_vs_agentrl.json"


# -- shared inputs -----------------------------------------------------------------------------------
def agentrl_tasks(steps: int) -> list[dict[str, Any]]:
    """The tasks agentrl's trainer samples for steps 1..``steps``, in order (its seeded TaskCursor)."""
    from agentrl.training.rollout_phase import TaskCursor
    from agentrl_math import MathEnv

    tasks = MathEnv().train_tasks()
    cursor = TaskCursor(len(tasks), SEED)
    return [tasks[i] for i in cursor.take(PROMPTS_PER_STEP * steps)]


def correctness(text: str, answer: str) -> float:
    """The math env's reward: 1.0 if the reply's lenient answer matches ``answer``."""
    from agentrl.answers import is_correct

    return 1.0 if is_correct(text, str(answer)) else 0.0


def boxed_number(text: str) -> float:
    """The ``format`` reward plugin's rule: 1.0 if the last ``\\boxed{}`` holds a plain number."""
    from agentrl.answers import extract_boxed, is_number

    boxed = extract_boxed(text)
    return 1.0 if boxed is not None and is_number(boxed) else 0.0


def median_after(values: list[float], skip: int) -> float:
    """Median of ``values[skip:]`` (of all of them when nothing is left after the skip)."""
    rest = values[skip:] or values
    return float(statistics.median(rest)) if rest else float("nan")


def timing_summary(
    init_seconds: float,
    step_s: list[float],
    rollout_s: list[float],
    update_s: list[float],
    wall: list[float],
    cpu: list[float],
    skip: int,
) -> dict[str, Any]:
    """Per-step times and their medians after ``skip`` warm-up steps, the same keys for both systems."""
    med = median_after(step_s, skip)
    return {
        "init_seconds": init_seconds,
        "step_seconds": step_s,
        "rollout_seconds": rollout_s,
        "update_seconds": update_s,
        "wall_seconds": wall,
        "cpu_seconds": cpu,
        "median_step_seconds": med,
        "median_rollout_seconds": median_after(rollout_s, skip),
        "median_update_seconds": median_after(update_s, skip),
        "median_wall_seconds": median_after(wall, skip),
        "median_cpu_seconds": median_after(cpu, skip),
        "completions_per_second": COMPLETIONS_PER_STEP / med,
    }


def busy_cpu_seconds() -> float | None:
    """CPU seconds all processes have spent busy since boot (Linux ``/proc/stat``), else None."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class OtherLoad:
    """CPU time other processes used while a block ran: machine busy time minus this process's,
    leaving out the time spent waiting for the other system's turn (``turns``: its steps are not
    another load on this one's)."""

    def __init__(self, turns: Turns | None = None) -> None:
        self.turns = turns

    def _now(self) -> tuple[float | None, float, float]:
        busy, wall = busy_cpu_seconds(), time.perf_counter()
        if self.turns is not None and busy is not None:
            busy, wall = busy - self.turns.waited_busy, wall - self.turns.waited_wall
        return busy, time.process_time(), wall

    def __enter__(self) -> OtherLoad:
        self.busy, self.own, self.wall = self._now()
        return self

    def __exit__(self, *exc: Any) -> None:
        busy, own, wall = self._now()
        self.seconds = self.cores = None
        if busy is not None and self.busy is not None:
            self.seconds = max(0.0, (busy - self.busy) - (own - self.own))
            self.cores = self.seconds / max(wall - self.wall, 1e-9)


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


class Turns:
    """Two systems, each training in a process of its own, one step at a time (``--interleave``): each
    builds its trainer in turn, meets the other at :meth:`start`, then waits for its turn before every
    step and hands over after it, so both see the machine in the same minutes. A system that ends or
    fails stops taking turns and the other goes on alone. Built on ``multiprocessing`` primitives of
    ``context`` (spawn), so it travels to both processes."""

    def __init__(self, order: list[str], context: Any, timeout: float = 3600.0) -> None:
        self.order, self.timeout = order, timeout
        self.built = {name: context.Event() for name in order}  # set by each system once built
        self.all_built = context.Event()  # set by the parent: the first turn may begin
        self.changed = context.Condition()
        self._current = context.Value("i", 0, lock=False)  # index in ``order``; guarded by ``changed``
        self._done = context.Array("b", len(order), lock=False)
        self.waited_busy = self.waited_wall = 0.0  # this process's waits for its turn: machine busy s, wall s

    def start(self, name: str) -> None:
        """``name``'s trainer is built: wait until the other's is too, then for this system's first turn."""
        self.built[name].set()
        if not self.all_built.wait(self.timeout):
            raise TimeoutError(f"{name} waited {self.timeout:.0f} s for the other trainer to be built")
        self.wait(name)

    def wait(self, name: str) -> None:
        """Block until it is ``name``'s turn (or the other system has ended)."""
        mine = self.order.index(name)
        busy, wall = busy_cpu_seconds() or 0.0, time.perf_counter()
        with self.changed:
            if not self.changed.wait_for(lambda: self._current.value == mine, self.timeout):
                raise TimeoutError(f"{name} waited {self.timeout:.0f} s for its turn")
        self.waited_busy += (busy_cpu_seconds() or 0.0) - busy
        self.waited_wall += time.perf_counter() - wall

    def hand_over(self, name: str, finished: bool = False) -> None:
        """``name`` finished a step (or its run): the other system's turn, unless it has ended."""
        mine = self.order.index(name)
        with self.changed:
            if finished:
                self._done[mine] = 1
            others = [i for i in range(len(self.order)) if i != mine and not self._done[i]]
            self._current.value = others[0] if others else mine
            self.changed.notify_all()


# -- agentrl ------------------------------------------------------------------------------------------
def agentrl_precision(bf16: bool) -> dict[str, Any]:
    """agentrl's precision settings for TRL's ``bf16``: ``precision: auto`` where it picks the same;
    otherwise fp32 as ``auto`` runs it on a CPU without native bf16 (fp32 training, sampling from an
    fp32 copy of the weights rounded to bf16), or bf16 where TRL was asked for bf16 there."""
    from agentrl.model.precision import resolve_precision

    if resolve_precision("auto").bf16 == bf16:
        return {"precision": "auto"}
    if bf16:
        return {"precision": "bf16"}
    return {"precision": "fp32", "engine_args": {"dtype": "bfloat16_weights"}}


def run_agentrl(
    steps: int, skip: int, work: Path, turns: Turns | None = None, bf16: bool | None = None
) -> dict[str, Any]:
    """Train ``steps`` steps through agentrl's library API (in the precision TRL's ``bf16`` says;
    None: ``auto``); returns per-step figures."""
    from agentrl.config.train import TrainConfig
    from agentrl.model.precision import resolve_precision
    from agentrl.plugins import load_plugins
    from agentrl.training.trainer import Trainer

    precision = agentrl_precision(bf16) if bf16 is not None else {"precision": "auto"}
    config = TrainConfig(
        **precision,
        prompts_per_step=PROMPTS_PER_STEP,
        num_generations=NUM_GENERATIONS,
        max_new_tokens=MAX_NEW_TOKENS,
        temperature=TEMPERATURE,
        learning_rate=LEARNING_RATE,
        micro_batch_size=MICRO_BATCH,
        algorithm={
            "beta": 0.0,
            "loss_type": "dapo",
            "scale_rewards": "group",
            "epsilon_low": 0.2,
            "epsilon_high": 0.28,
            "num_iterations": 1,
        },
        eval_tasks=0,
        save_model=False,
        log_completions_every=0,
        seed=SEED,
        output_dir=str(work / "agentrl"),
        max_steps=steps,
    )
    load_before = load_average()
    t0 = time.perf_counter()
    trainer = Trainer(config, load_plugins())
    init_seconds = time.perf_counter() - t0
    ends: list[float] = []
    cpu_ends: list[float] = []

    def progress(step: int, metrics: dict[str, float]) -> None:
        ends.append(time.perf_counter())
        cpu_ends.append(time.process_time())
        print(
            f"agentrl step {step}: {metrics['perf/step_seconds']:.2f} s (rollout "
            f"{metrics['perf/rollout_seconds']:.2f}, update {metrics['perf/update_seconds']:.2f})",
            flush=True,
        )
        if turns is not None and step < steps:  # the other system's step, then this one's next
            turns.hand_over("agentrl")
            turns.wait("agentrl")

    if turns is not None:
        turns.start("agentrl")
    try:
        with OtherLoad(turns) as other:
            start, cpu_start = time.perf_counter(), time.process_time()
            result = trainer.train(progress=progress)
    finally:
        if turns is not None:
            turns.hand_over("agentrl", finished=True)
    history = result.history
    del trainer, result
    wall = [b - a for a, b in zip([start, *ends[:-1]], ends)]
    cpu = [b - a for a, b in zip([cpu_start, *cpu_ends[:-1]], cpu_ends)]
    step_s = [h["perf/step_seconds"] for h in history]
    rollout_s = [h["perf/rollout_seconds"] for h in history]
    update_s = [h["perf/update_seconds"] for h in history]
    return {
        **timing_summary(init_seconds, step_s, rollout_s, update_s, wall, cpu, skip),
        "sampled_tokens_mean": [h["rollout/sampled_tokens_mean"] for h in history],
        "sampled_tokens_max": [h["rollout/sampled_tokens_max"] for h in history],
        "prompt_tokens_mean": [h["rollout/sequence_length_mean"] - h["rollout/sampled_tokens_mean"] for h in history],
        "reward_mean": [h["reward/total_mean"] for h in history],
        "completions_per_step": [COMPLETIONS_PER_STEP] * len(history),
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "other_processes_cores": other.cores,
        "settings": {
            "precision": config.precision,
            "engine_dtype": config.engine_args.get("dtype")
            or ("bfloat16" if resolve_precision(config.precision).bf16 else "float32"),
            "gradient_checkpointing": False,
            "optimizer": "torch.optim.AdamW",
            "adam_betas": list(config.adam_betas),
            "lr_scheduler": config.lr_scheduler,
            "micro_batch_size": config.micro_batch_size,
        },
    }


# -- TRL ------------------------------------------------------------------------------------------------
def run_trl(
    steps: int, skip: int, work: Path, overrides: dict[str, Any] | None = None, turns: Turns | None = None
) -> dict[str, Any]:
    """Train ``steps`` optimizer steps with TRL's GRPOTrainer on the same prompts and reward.

    ``overrides`` are extra GRPOConfig keyword arguments (``--trl-arg``), applied last.
    """
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from agentrl.model.loading import resolve_model

    tasks = agentrl_tasks(steps)
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": t["question"]}], "answer": str(t["answer"])} for t in tasks]
    )

    def correctness_reward(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        return [correctness(c[0]["content"], a) for c, a in zip(completions, answer)]

    def format_reward(completions: list[Any], **_: Any) -> list[float]:
        return [boxed_number(c[0]["content"]) for c in completions]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # gradient_checkpointing -> activation_checkpointing
        args = GRPOConfig(
            output_dir=str(work / "trl"),
            use_cpu=True,
            report_to="none",
            seed=SEED,
            per_device_train_batch_size=MICRO_BATCH,
            gradient_accumulation_steps=COMPLETIONS_PER_STEP // MICRO_BATCH,
            num_generations=NUM_GENERATIONS,
            max_completion_length=MAX_NEW_TOKENS,
            temperature=TEMPERATURE,
            top_p=1.0,
            top_k=0,
            learning_rate=LEARNING_RATE,
            lr_scheduler_type="constant",
            warmup_steps=0,
            adam_beta1=0.9,
            adam_beta2=0.99,
            weight_decay=0.0,
            max_grad_norm=1.0,
            beta=0.0,
            loss_type="dapo",
            scale_rewards="group",
            epsilon=0.2,
            epsilon_high=0.28,
            num_iterations=1,
            reward_weights=[1.0, FORMAT_WEIGHT],
            max_steps=steps,
            shuffle_dataset=False,
            logging_steps=1,
            save_strategy="no",
            **(overrides or {}),
        )
    assert (
        args.generation_batch_size == COMPLETIONS_PER_STEP
        and args.steps_per_generation == args.gradient_accumulation_steps
    ), (args.generation_batch_size, args.steps_per_generation)

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.begin: list[float] = []
            self.end: list[float] = []
            self.cpu: list[float] = []

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.start = time.perf_counter()

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if turns is not None:
                turns.wait("trl")
            self.cpu_begin = time.process_time()
            self.begin.append(time.perf_counter())

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.end.append(time.perf_counter())
            self.cpu.append(time.process_time() - self.cpu_begin)
            print(f"trl step {state.global_step}: {self.end[-1] - self.begin[-1]:.2f} s", flush=True)
            if turns is not None:
                turns.hand_over("trl")

    timer = StepTimer()
    load_before = load_average()
    t0 = time.perf_counter()
    trainer = GRPOTrainer(
        model=resolve_model("smollm2-135m"),
        reward_funcs=[correctness_reward, format_reward],
        args=args,
        train_dataset=dataset,
        callbacks=[timer],
    )
    init_seconds = time.perf_counter() - t0

    generations: list[dict[str, Any]] = []  # one per _generate_and_score_completions call
    inner = trainer._generate_and_score_completions

    def timed_generate(inputs: Any) -> Any:
        a = time.perf_counter()
        out = inner(inputs)  # noqa: F821 (deleted after the run, not before)
        lengths = out["completion_mask"].sum(-1)
        generations.append(
            {
                "seconds": time.perf_counter() - a,
                "global_step": trainer.state.global_step,  # noqa: F821
                "completions": int(out["completion_ids"].shape[0]),
                "prompts": len({str(x["prompt"]) for x in inputs}),
                "sampled_tokens_mean": float(lengths.float().mean()),
                "sampled_tokens_max": float(lengths.max()),
                "prompt_tokens_mean": float(out["prompt_mask"].sum(-1).float().mean()),
            }
        )
        return out

    trainer._generate_and_score_completions = timed_generate
    effective = {
        "bf16": bool(args.bf16),
        "mixed_precision": str(trainer.accelerator.mixed_precision),
        "gradient_checkpointing": bool(args.gradient_checkpointing),
        "model_dtype": str(trainer.model.dtype),
        "optimizer": getattr(args.optim, "value", str(args.optim)),
        "lr_scheduler": getattr(args.lr_scheduler_type, "value", str(args.lr_scheduler_type)),
        "adam_betas": [args.adam_beta1, args.adam_beta2],
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "steps_per_generation": args.steps_per_generation,
        "generation_batch_size": args.generation_batch_size,
        "device": str(args.device),
        "use_cpu": bool(args.use_cpu),
        "report_to": args.report_to,
        "logging_steps": args.logging_steps,
    }
    if turns is not None:
        turns.start("trl")
    try:
        with OtherLoad(turns) as other:
            trainer.train()
    finally:
        if turns is not None:
            turns.hand_over("trl", finished=True)
    logs = [entry for entry in trainer.state.log_history if "loss" in entry or "reward" in entry]
    global_step = trainer.state.global_step
    del trainer, inner, timed_generate
    # Proof of one optimizer step per 32 completions: one generation call per optimizer step (made at
    # global_step 0..N-1), each of 4 prompts x 8 completions, and one log entry per step 1..N.
    calls_ok = [g["global_step"] for g in generations] == list(range(steps))
    sizes_ok = all(g["completions"] == COMPLETIONS_PER_STEP and g["prompts"] == PROMPTS_PER_STEP for g in generations)
    logs_ok = [int(e["step"]) for e in logs] == list(range(1, steps + 1))
    check = {
        "optimizer_steps": global_step,
        "generation_calls": len(generations),
        "completions_per_generation": [g["completions"] for g in generations],
        "prompts_per_generation": [g["prompts"] for g in generations],
        "logged_steps": [int(e["step"]) for e in logs],
        "ok": bool(calls_ok and sizes_ok and logs_ok and global_step == steps),
    }

    step_s = [b - a for a, b in zip(timer.begin, timer.end)]
    wall = [b - a for a, b in zip([timer.start, *timer.end[:-1]], timer.end)]
    gen_s = [g["seconds"] for g in generations]
    update_s = [s - g for s, g in zip(step_s, gen_s)]
    return {
        **timing_summary(init_seconds, step_s, gen_s, update_s, wall, timer.cpu, skip),
        "sampled_tokens_mean": [g["sampled_tokens_mean"] for g in generations],
        "sampled_tokens_max": [g["sampled_tokens_max"] for g in generations],
        "prompt_tokens_mean": [g["prompt_tokens_mean"] for g in generations],
        "reward_mean": [e.get("reward") for e in logs],
        "trl_step_time": [e.get("step_time") for e in logs],
        "completions_per_step": [g["completions"] for g in generations],
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "other_processes_cores": other.cores,
        "one_step_per_32_completions": check,
        "settings": effective,
        "log_history": logs,
    }


def run_system(name: str, steps: int, skip: int, work: Path, trl_overrides: dict[str, Any], turns=None) -> dict:
    """Train ``name`` (``agentrl`` or ``trl``) for ``steps`` steps; its per-step figures."""
    if name == "agentrl":
        return run_agentrl(steps, skip, work, turns, bool(trl_overrides.get("bf16", True)))
    return run_trl(steps, skip, work, trl_overrides, turns)


def _interleaved_child(name: str, args: tuple, threads: int | None, turns: Turns, out: Any) -> None:
    """One system of an interleaved run, in the main thread of its own process: its figures (or
    its failure, as text) go to ``out``."""
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        out.put((name, run_system(name, *args, turns=turns), None))
    except BaseException as error:  # reported by the parent
        turns.hand_over(name, finished=True)
        out.put((name, None, f"{type(error).__name__}: {error}"))


def run_interleaved(
    order: list[str], steps: int, skip: int, work: Path, trl_overrides: dict[str, Any], threads: int | None
) -> dict[str, Any]:
    """Both systems in processes of their own, one step each in turn (see :class:`Turns`). Each
    trains in its process's main thread, as a run does: two trainers in threads of one process
    would share torch's OpenMP runtime, whose worker pools then outnumber the cores and sleep
    between operators (slower small operators for both)."""
    import multiprocessing

    print(f"--- {' and '.join(order)} interleaved: {steps} steps each, one process each", flush=True)
    context = multiprocessing.get_context("spawn")
    turns, out = Turns(order, context), context.Queue()
    results: dict[str, Any] = {}
    errors: dict[str, str] = {}
    processes = {}
    for name in order:  # built one after the other, as they would be alone
        args = (steps, skip, work, trl_overrides)
        processes[name] = context.Process(target=_interleaved_child, args=(name, args, threads, turns, out), name=name)
        processes[name].start()
        while not turns.built[name].wait(0.5) and processes[name].is_alive():
            pass
    turns.all_built.set()
    for _ in order:
        name, result, error = out.get()
        if error is None:
            results[name] = result
        else:
            errors[name] = error
    for process in processes.values():
        process.join()
    if errors:
        name, error = next(iter(errors.items()))
        raise RuntimeError(f"{name} failed in the interleaved run: {error}")
    return results


# -- report -----------------------------------------------------------------------------------------------
def print_report(results: dict[str, dict[str, Any]], skip: int, steps: int) -> float | None:
    """Rich tables of per-step seconds and the summary; returns the agentrl/TRL ratio."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    names = list(results)
    steps_table = Table(
        title=f"GRPO steps: {PROMPTS_PER_STEP} prompts x {NUM_GENERATIONS} generations, "
        f"<= {MAX_NEW_TOKENS} new tokens, {torch.get_num_threads()} torch threads"
    )
    for col in ("step", "system", "s/step", "rollout*", "update", "CPU s", "tokens mean/max"):
        steps_table.add_column(col, justify="left" if col == "system" else "right")
    for i in range(steps):
        for name in names:
            r = results[name]
            if i >= len(r["step_seconds"]):
                continue
            steps_table.add_row(
                f"{i + 1}{' warm-up' if i < skip else ''}",
                name,
                f"{r['step_seconds'][i]:.2f}",
                f"{r['rollout_seconds'][i]:.2f}",
                f"{r['update_seconds'][i]:.2f}",
                f"{r['cpu_seconds'][i]:.1f}",
                f"{r['sampled_tokens_mean'][i]:.1f}/{r['sampled_tokens_max'][i]:.0f}",
            )
        if i < steps - 1 and len(names) > 1:
            steps_table.add_section()
    console.print(steps_table)
    console.print(
        "* rollout: agentrl's perf/rollout_seconds (sampling, rewards, collate); TRL's "
        "_generate_and_score_completions (generation, rewards, advantages)"
    )

    summary = Table(title=f"median over steps {min(skip, steps - 1) + 1}..{steps}")
    for col in ("system", "s/step", "compl./s", "rollout", "update", "wall s", "others"):
        summary.add_column(col, justify="left" if col == "system" else "right")
    for name in names:
        r = results[name]
        busy = r["other_processes_cores"]
        summary.add_row(
            name,
            f"{r['median_step_seconds']:.2f}",
            f"{r['completions_per_second']:.2f}",
            f"{r['median_rollout_seconds']:.2f}",
            f"{r['median_update_seconds']:.2f}",
            f"{r['median_wall_seconds']:.2f}",
            "?" if busy is None else f"{busy:.2f}",
        )
    console.print(summary)
    console.print(
        "compl./s: 32 completions / median s/step; wall s: between step ends (logging included); "
        "others: cores other processes kept busy meanwhile"
    )
    for name in names:
        busy = results[name]["other_processes_cores"]
        if busy is not None and busy > CONTENDED:
            console.print(
                f"[yellow]{name}: other processes kept {busy:.2f} of {os.cpu_count()} cores busy "
                f"during its training; its figures are inflated (rerun on a quiet machine, or "
                f"with --threads 1)[/yellow]"
            )
    if "trl" in results:
        check = results["trl"]["one_step_per_32_completions"]
        console.print(
            f"trl: {check['optimizer_steps']} optimizer steps, {check['generation_calls']} generation "
            f"calls of {check['completions_per_generation']} completions from "
            f"{check['prompts_per_generation']} prompts, logged steps {check['logged_steps']}: "
            f"{'one optimizer step per 32 completions' if check['ok'] else '[red]MISMATCH[/red]'}"
        )
        settings = results["trl"]["settings"]
        console.print(
            f"trl settings in effect: bf16={settings['bf16']} (accelerate mixed_precision="
            f"{settings['mixed_precision']}), gradient_checkpointing="
            f"{settings['gradient_checkpointing']}, optim={settings['optimizer']}, "
            f"device={settings['device']}"
        )
    ratio = None
    if "agentrl" in results and "trl" in results:
        ratio = results["agentrl"]["median_step_seconds"] / results["trl"]["median_step_seconds"]
        verdict = "meets" if ratio <= 0.3 else "misses"
        console.print(
            f"[bold]agentrl / TRL time per step: {ratio:.3f}[/bold] ({verdict} the <= 0.3 target; "
            f"agentrl x{1 / ratio:.2f} faster)"
        )
    if skip >= steps:
        console.print(f"[yellow]--skip-first {skip} >= --steps {steps}: medians include the warm-up step[/yellow]")
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps per system (default 5)")
    parser.add_argument(
        "--skip-first", type=int, default=1, help="leading steps left out of the medians (warm-up; default 1)"
    )
    parser.add_argument("--only", choices=("agentrl", "trl"), help="time one system only")
    parser.add_argument("--trl-first", action="store_true", help="run TRL before agentrl")
    parser.add_argument(
        "--trl-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra GRPOConfig argument for TRL, YAML value (e.g. gradient_checkpointing=false); repeatable",
    )
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="build both trainers, then alternate their steps (agentrl first unless --trl-first): "
        "both meet the machine in the same minutes; each in a process of its own (the wall column includes "
        "the other's steps)",
    )
    parser.add_argument(
        "--precision",
        choices=("auto", "fp32"),
        default="auto",
        help="auto: both in what agentrl's precision: auto picks here; fp32: both in fp32 as auto runs "
        "them on a CPU without native bf16 (measures that path on any CPU)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"JSON output (default {RESULTS})")
    parser.add_argument(
        "--threads",
        type=int,
        help="torch intra-op threads for both (default: torch's own, one per core); "
        "1 degrades gracefully when other processes share the cores",
    )
    args = parser.parse_args()
    if args.steps < 1 or args.skip_first < 0:
        parser.error("--steps must be >= 1 and --skip-first >= 0")
    if args.threads is not None:
        if args.threads < 1:
            parser.error("--threads must be >= 1")
        torch.set_num_threads(args.threads)

    import yaml

    trl_overrides: dict[str, Any] = {}
    for item in args.trl_arg:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            parser.error(f"--trl-arg expects KEY=VALUE, got {item!r}")
        trl_overrides[key.strip()] = yaml.safe_load(value)

    from agentrl.model.precision import resolve_precision

    # both in one precision: what auto picks here, or fp32 (agentrl follows TRL's bf16, see agentrl_precision)
    trl_overrides.setdefault("bf16", resolve_precision("auto").bf16 and args.precision == "auto")
    order = ["trl", "agentrl"] if args.trl_first else ["agentrl", "trl"]
    if args.only:
        order = [args.only]
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="trl_vs_agentrl-") as tmp:
        if args.interleave and len(order) == 2:
            results = run_interleaved(order, args.steps, args.skip_first, Path(tmp), trl_overrides, args.threads)
        for name in [n for n in order if n not in results]:
            print(f"--- {name}: {args.steps} steps", flush=True)
            results[name] = run_system(name, args.steps, args.skip_first, Path(tmp), trl_overrides)
            gc.collect()  # the trainer was deleted inside the runner; free it before the next system
    ratio = print_report(results, args.skip_first, args.steps)

    import transformers
    import trl

    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        "argv": sys.argv[1:],
        "steps": args.steps,
        "skip_first": args.skip_first,
        "order": order,
        "interleaved": bool(args.interleave and len(order) == 2),
        "trl_overrides": trl_overrides,
        "config": {
            "prompts_per_step": PROMPTS_PER_STEP,
            "num_generations": NUM_GENERATIONS,
            "completions_per_step": COMPLETIONS_PER_STEP,
            "micro_batch": MICRO_BATCH,
            "max_new_tokens": MAX_NEW_TOKENS,
            "temperature": TEMPERATURE,
            "learning_rate": LEARNING_RATE,
            "beta": 0.0,
            "seed": SEED,
            "reward": f"is_correct + {FORMAT_WEIGHT} * boxed_number",
        },
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "trl": trl.__version__,
            "torch_threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
        },
        "results": results,
        "ratio_agentrl_over_trl": ratio,
    }
    args.out.write_text(json.dumps(payload, indent=2, default=str))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
