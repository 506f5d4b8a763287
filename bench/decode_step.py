"""The ``hf`` engine's decode step on a CPU with and without its two fp32 shortcuts, in one run.

    OMP_NUM_THREADS=2 python bench/decode_step.py [--rows 32 8] [--max-new-tokens 24] [--rounds 2]

``before``: the LM head as ``nn.Linear`` computes it (``h @ W^T`` inside the model's forward) and
seeded draws by one float64 cumulative sum over the whole vocabulary per row (the reference
:func:`one_level_sample` below). ``after``: the engine now, the decoder alone then ``W @ h^T``
(``agentrl_hf_engine.head_logits``) and the two-level search of
:func:`agentrl_hf_engine.inverse_cdf_sample`. The default model in float32, every row decoding
``--max-new-tokens`` (stop ids ignored) from one of 4 chat prompts repeated (a GRPO group shape),
seeded; rounds alternate between the two and every round's seconds are printed (the machine may
be shared: compare within a round).
"""

from __future__ import annotations

import argparse
import time

import torch
from generate_speed import chat_prompts
from prefix_cache import cpu_name

import agentrl_hf_engine
from agentrl import SamplingParams
from agentrl.config.train import TrainConfig
from agentrl.model.loading import DEFAULT_MODEL, load_model, load_tokenizer
from agentrl.sampling.chat import ChatTokenizer

SAMPLERS = {"after": agentrl_hf_engine.inverse_cdf_sample}


def one_level_sample(log_probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The first index whose float64 cumulative probability exceeds u x total, by one cumsum."""
    probs = log_probs.double().exp()  # (A, V)
    cdf = probs.cumsum(dim=-1)
    picked = torch.searchsorted(cdf, (uniforms * cdf[:, -1])[:, None], right=True).squeeze(-1)
    picked = picked.clamp(max=probs.shape[-1] - 1)
    possible = probs.gather(-1, picked[:, None]).squeeze(-1) > 0
    return torch.where(possible, picked, cdf.argmax(dim=-1))


def main() -> None:
    """Alternate before/after rounds per row count; print seconds and ms per decode step."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[32, 8])
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=2)
    options = parser.parse_args()
    tokenizer, model = load_tokenizer(DEFAULT_MODEL), load_model(DEFAULT_MODEL)
    config = TrainConfig(engine_args={"dtype": "float32", "batch_size": max(options.rows)})
    engine = agentrl_hf_engine.HFEngine(model=model, tokenizer=tokenizer, config=config)
    engine.stop_ids = {-1}  # no id is -1: every row decodes max_new_tokens
    own_head = engine._own_head
    if not own_head:
        raise SystemExit("the engine keeps the model's own forward here (not a CPU in fp32): nothing to compare")
    distinct = chat_prompts(ChatTokenizer(tokenizer), 4)
    seconds: dict[tuple[int, str], list[float]] = {}
    for _ in range(options.rounds):
        for rows in options.rows:
            prompts = [distinct[i % 4] for i in range(rows)]
            sampling = SamplingParams(max_new_tokens=options.max_new_tokens, prompt_seeds=tuple(range(rows)))
            for variant in ("before", "after"):
                engine._own_head = variant == "after"
                agentrl_hf_engine.inverse_cdf_sample = SAMPLERS["after"] if variant == "after" else one_level_sample
                start = time.perf_counter()
                engine.generate(prompts, sampling)
                seconds.setdefault((rows, variant), []).append(time.perf_counter() - start)
    agentrl_hf_engine.inverse_cdf_sample = SAMPLERS["after"]
    print(f"{cpu_name()}, {torch.get_num_threads()} threads, float32, {options.max_new_tokens} new tokens a row")
    for rows in options.rows:
        best = {v: min(seconds[(rows, v)]) for v in ("before", "after")}
        rounds = "  ".join(f"{v} " + " ".join(f"{s:.2f}" for s in seconds[(rows, v)]) for v in ("before", "after"))
        per_step = {v: 1000 * best[v] / options.max_new_tokens for v in best}
        print(
            f"{rows:3d} rows: best {best['before']:.2f} s -> {best['after']:.2f} s "
            f"({per_step['before']:.0f} -> {per_step['after']:.0f} ms a step, {best['before'] / best['after']:.2f}x); "
            f"rounds (s): {rounds}"
        )


if __name__ == "__main__":
    main()
