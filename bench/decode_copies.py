"""The ``hf`` engine's decode with its KV cache growing by ``torch.cat`` and in place, in one run:
generate tokens/s and a torch.profiler table of each.

    OMP_NUM_THREADS=1 python bench/decode_copies.py [--prompts 16] [--max-new-tokens 96] [--rounds 3]

``copying``: the engine as it was, transformers' ``DynamicCache`` (every step copies the whole
cache into new memory). ``in place``: the engine now, its
:class:`agentrl_hf_engine.kv_cache.GrowingCache`. Both sample the default model in float32 with the
same seeds, so they must sample the same tokens (checked). ``--no-stop`` (the default) ignores the
stop ids so every row decodes ``--max-new-tokens`` (a fixed decode length; ``--stop`` keeps them:
rows leave as they finish). Rounds alternate between the two and the best of each is reported (the
machine is shared).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from generate_speed import chat_prompts
from torch.profiler import ProfilerActivity, profile

from agentrl import SamplingParams
from agentrl.config.train import TrainConfig
from agentrl.model.loading import DEFAULT_MODEL, load_model, load_tokenizer
from agentrl.sampling.chat import ChatTokenizer
from agentrl_hf_engine import HFEngine


class CopyingEngine(HFEngine):
    """The engine with transformers' ``DynamicCache``."""

    def _new_cache(self, reserve: int) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)


def timed(engine: HFEngine, prompts: list[list[int]], sampling: SamplingParams) -> tuple[float, list[list[int]]]:
    """Seconds for one ``generate`` and the tokens it sampled."""
    start = time.perf_counter()
    generations = engine.generate(prompts, sampling)
    return time.perf_counter() - start, [g.token_ids for g in generations]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--no-profile", action="store_true", help="skip the profiler tables")
    parser.add_argument("--stop", action="store_true", help="rows stop at a stop id (default: all decode to the cap)")
    options = parser.parse_args()
    tokenizer, model = load_tokenizer(options.model), load_model(options.model)
    prompts = chat_prompts(ChatTokenizer(tokenizer), options.prompts)
    config = TrainConfig(engine_args={"dtype": "float32", "batch_size": options.prompts}, max_total_tokens=4096)
    engines = {
        "copying": CopyingEngine(model=model, tokenizer=tokenizer, config=config),
        "in place": HFEngine(model=model, tokenizer=tokenizer, config=config),
    }
    # min_new_tokens is not forced: both engines sample the same tokens, so the same count
    sampling = SamplingParams(max_new_tokens=options.max_new_tokens, temperature=1.0, seed=0)
    speeds: dict[str, list[float]] = {name: [] for name in engines}
    tokens: dict[str, list[list[int]]] = {}
    for engine in engines.values():
        if not options.stop:
            engine.stop_ids = {-1}  # no id is -1: every row decodes max_new_tokens
        engine.generate(prompts[:2], SamplingParams(max_new_tokens=4, seed=1))  # warm-up
    for _ in range(options.rounds):
        for name, engine in engines.items():
            seconds, tokens[name] = timed(engine, prompts, sampling)
            speeds[name].append(sum(map(len, tokens[name])) / seconds)
    if tokens["copying"] != tokens["in place"]:
        raise SystemExit("the two engines sampled different tokens")
    width = max(len(p) for p in prompts)
    print(
        f"{options.model}, {torch.get_num_threads()} threads, {options.prompts} prompts (<= {width} tokens) "
        f"x <= {options.max_new_tokens} new tokens ({sum(map(len, tokens['copying']))} sampled), float32, "
        f"{'rows stop at a stop id' if options.stop else 'no stop ids'}"
    )
    for name in engines:
        print(f"{name:9s} best {max(speeds[name]):7.1f} tok/s  rounds {' '.join(f'{s:.1f}' for s in speeds[name])}")
    print(f"in place / copying: {max(speeds['in place']) / max(speeds['copying']):.2f}x tokens/s (best of each)")
    if options.no_profile:
        return
    for name, engine in engines.items():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            engine.generate(prompts, sampling)
        print(f"\n{name}: top ops by self CPU time")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=44))


if __name__ == "__main__":
    main()
