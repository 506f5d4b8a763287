"""The ``hf`` engine's decode attention: ``sdpa`` against the engine's matmul path, in one run.

    OMP_NUM_THREADS=2 python bench/decode_attention.py [--dtypes bfloat16 bfloat16_weights]
                                                       [--rows 32] [--max-new-tokens 64] [--rounds 2]

Part 1, one attention call as a decode step makes it (the default model's shape: 9 query heads
over 3 KV heads of 64, ``--rows`` rows, a padding mask, the cache a view into a larger buffer):
milliseconds of transformers' ``sdpa`` function and of
:func:`agentrl_hf_engine.decode_attention.decode_attention`, each dtype, and each one's mean
|error| against a float64 reference.

Part 2, the engine: the default model sampling ``--rows`` rows of ``--max-new-tokens`` tokens
(stop ids ignored) from 4 chat prompts (a GRPO group shape), seeded, in each ``engine_args.dtype``,
its sampling copy switched between ``sdpa`` and the matmul path; rounds alternate. Printed: the
best seconds of each, the share of tokens both sampled alike and the mean |logprob difference|
over the tokens before each row's first difference.
"""

from __future__ import annotations

import argparse
import time

import torch
from generate_speed import chat_prompts
from prefix_cache import cpu_name
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import agentrl_hf_engine
from agentrl import SamplingParams
from agentrl.config.train import TrainConfig
from agentrl.model.loading import DEFAULT_MODEL, load_model, load_tokenizer
from agentrl.sampling.chat import ChatTokenizer
from agentrl_hf_engine.decode_attention import NAME, decode_attention


class _Layer(torch.nn.Module):
    """Stands in for an attention module: what the attention functions read from it."""

    num_key_value_groups = 3
    is_causal = True


def one_call(rows: int, cached: int, dtype: torch.dtype, calls: int = 100) -> dict[str, tuple[float, float]]:
    """Milliseconds per call and mean |error| vs float64 of ``sdpa`` and the matmul path."""
    generator = torch.Generator().manual_seed(0)
    store = torch.randn(2, rows, 3, cached + 64, 64, generator=generator).to(dtype)
    key, value = store[0, :, :, :cached], store[1, :, :, :cached]  # views, as the cache's
    query = (3 * torch.randn(rows, 9, 1, 64, generator=generator)).to(dtype)
    mask = torch.ones(rows, 1, 1, cached, dtype=torch.bool)
    mask[:, :, :, :16] = torch.rand(rows, 1, 1, 16, generator=generator) > 0.5  # left padding
    layer, scale = _Layer(), 64**-0.5
    exact = sdpa_attention_forward(layer, query.double(), key.double(), value.double(), mask, scaling=scale)[0]
    results = {}
    for name, function in (("sdpa", sdpa_attention_forward), ("matmul", decode_attention)):
        out = function(layer, query, key, value, mask, scaling=scale)[0]
        for _ in range(5):
            function(layer, query, key, value, mask, scaling=scale)
        start = time.perf_counter()
        for _ in range(calls):
            function(layer, query, key, value, mask, scaling=scale)
        milliseconds = 1000 * (time.perf_counter() - start) / calls
        results[name] = (milliseconds, float((out.double() - exact).abs().mean()))
    return results


def agreement(a: list, b: list) -> tuple[float, float]:
    """Share of tokens sampled alike and mean |logprob difference| before each row's first difference."""
    same = total = 0
    gaps: list[float] = []
    for x, y in zip(a, b):
        total += len(x.token_ids)
        for tx, ty, lx, ly in zip(x.token_ids, y.token_ids, x.logprobs, y.logprobs):
            if tx != ty:
                break
            same += 1
            gaps.append(abs(lx - ly))
    return same / total, sum(gaps) / max(len(gaps), 1)


def engine_rounds(options: argparse.Namespace, model, tokenizer) -> None:
    """Part 2: the engine in each dtype, sdpa and matmul alternating."""
    distinct = chat_prompts(ChatTokenizer(tokenizer), 4)
    prompts = [distinct[i % 4] for i in range(options.rows)]
    sampling = SamplingParams(max_new_tokens=options.max_new_tokens, prompt_seeds=tuple(range(options.rows)))
    for dtype in options.dtypes:
        config = TrainConfig(engine_args={"dtype": dtype, "batch_size": options.rows})
        engine = agentrl_hf_engine.HFEngine(model=model, tokenizer=tokenizer, config=config)
        engine.stop_ids = {-1}  # no id is -1: every row decodes max_new_tokens
        seconds: dict[str, list[float]] = {"sdpa": [], "matmul": []}
        outputs = {}
        for _ in range(options.rounds):
            for variant, implementation in (("sdpa", "sdpa"), ("matmul", NAME)):
                engine.model.set_attn_implementation(implementation)
                start = time.perf_counter()
                outputs[variant] = engine.generate(prompts, sampling)
                seconds[variant].append(time.perf_counter() - start)
        same, gap = agreement(outputs["sdpa"], outputs["matmul"])
        best = {v: min(s) for v, s in seconds.items()}
        print(
            f"engine {dtype}: sdpa {best['sdpa']:.2f} s, matmul {best['matmul']:.2f} s "
            f"({best['sdpa'] / best['matmul']:.2f}x); rounds sdpa {seconds['sdpa']}, matmul {seconds['matmul']}; "
            f"tokens alike {same:.1%}, mean |logprob diff| {gap:.2e}"
        )
        del engine


def main() -> None:
    """Print part 1's table, then part 2's lines."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "bfloat16_weights"])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    options = parser.parse_args()
    print(f"{cpu_name()}, {torch.get_num_threads()} threads")
    for dtype in (torch.bfloat16, torch.float32):
        for cached in (100, 200, 800):
            r = one_call(options.rows, cached, dtype)
            print(
                f"one call, {dtype}, {options.rows} rows x {cached} cached: sdpa {r['sdpa'][0]:.2f} ms "
                f"(err {r['sdpa'][1]:.1e}), matmul {r['matmul'][0]:.2f} ms (err {r['matmul'][1]:.1e}), "
                f"{r['sdpa'][0] / r['matmul'][0]:.2f}x"
            )
    tokenizer, model = load_tokenizer(DEFAULT_MODEL), load_model(DEFAULT_MODEL)
    engine_rounds(options, model, tokenizer)


if __name__ == "__main__":
    main()
