"""The ``hf`` engine's prefix cache off vs on, in one run: rollout seconds, prefilled tokens, hit
tokens and peak memory on three multi-call workloads.

    OMP_NUM_THREADS=2 python bench/prefix_cache.py [--episodes 8] [--dtype float32] [--rounds 2]
                                                   [--workloads guess,calculator,agent]

1. ``guess``: multi-turn env episodes through the registered ``multi_turn`` rollout (16 tokens a turn);
2. ``calculator``: the tool env, the same rollout (48 tokens a turn);
3. ``agent``: an OpenAI-client agent program with a ~800-token system prompt making 5 calls
   (the ``openai_agent`` rollout), every episode a different question.

Four engines sample the default model with the same seeds, so they sample the same tokens (fp32):
``off`` (each row prefilled whole), ``shared`` (a call's distinct prompts prefill their common start
once, ``engine_args.share_prefix_min_tokens``, on by default), ``cache`` (the prefix cache alone) and
``both``; each workload runs every engine in turn, ``--rounds`` times, and the fastest round of each
is reported.
Peak memory: the highest RSS a 10 ms sampler saw during the rollout, above the RSS before it;
``cache MiB``: what the cache holds at the end (its budget is ``engine_args.prefix_cache_mb``).
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import torch

from agentrl import SamplingParams
from agentrl.config.train import TrainConfig
from agentrl.model.loading import DEFAULT_MODEL, load_model, load_tokenizer
from agentrl.plugins import load_plugins
from agentrl.training.build import make_env

SYSTEM = " ".join(
    f"Rule {i}: answer the question asked, show the arithmetic step by step, and keep the final answer short."
    for i in range(40)
)
VARIANTS = {"off": (0, 0), "shared": (0, 64), "cache": (1024, 0), "both": (1024, 64)}
"""Engine variants: (``prefix_cache_mb``, ``share_prefix_min_tokens``)."""
AGENT = f"""
SYSTEM = {SYSTEM!r}


def solve(task, client):
    messages = [{{"role": "system", "content": SYSTEM}}, {{"role": "user", "content": task["question"]}}]
    for _ in range(5):
        reply = client.chat.completions.create(model="m", messages=messages)
        messages.append({{"role": "assistant", "content": reply.choices[0].message.content}})
        messages.append({{"role": "user", "content": "Check that and go on."}})
    return messages[:-1]
"""


def cpu_name() -> str:
    """The CPU's model name as ``lscpu`` gives it (``?`` when it does not)."""
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if "Model name" in line), "?")


class PeakRss:
    """The highest RSS above the starting one, sampled every 10 ms while the block runs."""

    def __enter__(self) -> PeakRss:
        self.process, self.done = psutil.Process(), threading.Event()
        self.base = self.peak = self.process.memory_info().rss
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()
        return self

    def _watch(self) -> None:
        while not self.done.wait(0.01):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)


def run_workload(name: str, engine: Any, tokenizer: Any, episodes: int, agent: str) -> list[Any]:
    """One rollout of ``episodes`` episodes of workload ``name`` on ``engine``."""
    plugins = load_plugins()
    seeds = list(range(episodes))
    if name == "agent":
        config = TrainConfig(max_new_tokens=24, plugins={"openai_agent": {"agent": agent}})
        rollout = plugins.registry.get("rollout", "openai_agent").factory(
            engine=engine, tokenizer=tokenizer, config=config
        )
        tasks = [{"question": f"What is {i} * 7 + 3?"} for i in range(episodes)]
        return rollout.run([None] * episodes, tasks, seeds, SamplingParams(max_new_tokens=24, seed=0), seeds=seeds)
    tokens = 16 if name == "guess" else 48
    config = TrainConfig(env=name, max_new_tokens=tokens)
    rollout = plugins.registry.get("rollout", "multi_turn").factory(engine=engine, tokenizer=tokenizer, config=config)
    envs = [make_env(plugins, config) for _ in range(episodes)]
    tasks = [dict(envs[0].train_tasks()[i]) for i in range(episodes)]  # indexed: the split is lazy
    return rollout.run(envs, tasks, seeds, SamplingParams(max_new_tokens=tokens, seed=0), seeds=seeds)


def measure(name: str, engine: Any, tokenizer: Any, episodes: int, agent: str) -> dict[str, float]:
    """Seconds, prefilled and hit tokens, peak RSS growth and cache size of one rollout."""
    if engine.prefix_cache is not None:
        engine.prefix_cache.clear()  # each round starts cold, as a training step does after its sync
    engine._counts = dict.fromkeys(engine._counts, 0)
    with PeakRss() as rss:
        start = time.perf_counter()
        trajectories = run_workload(name, engine, tokenizer, episodes, agent)
        seconds = time.perf_counter() - start
    counts = dict(engine._counts)
    cache = engine.prefix_cache.nbytes if engine.prefix_cache is not None else 0
    return {
        "seconds": seconds,
        "prefilled": counts["prefilled_tokens"],
        "hits": counts["prefix_hit_tokens"],
        "sampled": sum(t.num_sampled_tokens for t in trajectories),
        "peak_mib": (rss.peak - rss.base) / 2**20,
        "cache_mib": cache / 2**20,
        "ids": [t.token_ids for t in trajectories],
    }


def main() -> None:
    """Run every workload off and on and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--workloads", default="guess,calculator,agent")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="engines to compare, the first the baseline")
    args = parser.parse_args()
    tokenizer, model = load_tokenizer(DEFAULT_MODEL), load_model(DEFAULT_MODEL)
    factory = load_plugins().registry.get("engine", "hf").factory
    engines = {
        name: factory(
            model=model,
            tokenizer=tokenizer,
            config=TrainConfig(
                engine_args={"dtype": args.dtype, "prefix_cache_mb": mb, "share_prefix_min_tokens": least},
                max_total_tokens=2048,
            ),
        )
        for name, (mb, least) in VARIANTS.items()
        if name in args.variants.split(",")
    }
    print(f"{DEFAULT_MODEL}, dtype {args.dtype}, {torch.get_num_threads()} threads, {cpu_name()}")
    print(f"agent system prompt: {len(tokenizer(SYSTEM)['input_ids'])} tokens")
    header = f"{'workload':<11}{'engine':<7}{'seconds':>8}{'prefilled':>10}{'hit':>8}{'sampled':>8}{'peak MiB':>9}"
    print(header + f"{'cache MiB':>10}{'vs first':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "long_prompt_agent.py"
        path.write_text(AGENT)
        agent = f"{path}:solve"
        for name in args.workloads.split(","):
            best: dict[str, dict[str, Any]] = {}
            for _ in range(args.rounds):
                for variant, engine in engines.items():
                    row = measure(name, engine, tokenizer, args.episodes, agent)
                    if variant not in best or row["seconds"] < best[variant]["seconds"]:
                        best[variant] = row
            base = next(iter(best.values()))["ids"]  # the first variant's token ids
            for variant, row in best.items():
                print(
                    f"{name:<11}{variant:<7}{row['seconds']:>8.2f}{row['prefilled']:>10}{row['hits']:>8}"
                    f"{row['sampled']:>8}{row['peak_mib']:>9.0f}{row['cache_mib']:>10.1f}"
                    f"{next(iter(best.values()))['seconds'] / row['seconds']:>9.2f}x"
                )
            for variant, row in list(best.items())[1:]:
                same = sum(a == b for a, b in zip(row["ids"], base))
                print(f"{name:<11}{variant}: the same token ids as {next(iter(best))} in {same}/{len(base)} episodes")


if __name__ == "__main__":
    main()
