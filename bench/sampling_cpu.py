"""The ``hf`` engine sampling a GRPO batch on a CPU: packed weights on/off, trainer's thread or another.

    OMP_NUM_THREADS=2 python bench/sampling_cpu.py [--rows 32] [--max-new-tokens 64] [--rounds 3]

Two things that decide how fast the default job samples on a CPU, measured in one process on the
default model in bf16 (the engine's own copy; the CPU must compute bf16 natively, AVX512-BF16 or
AMX), ``--rows`` rows from 4 chat prompts repeated (a GRPO group shape), seeded, stop ids kept:

* ``packed``: the engine now, its linear weights reordered for oneDNN once
  (``engine_args.packed_weights``, :mod:`agentrl_hf_engine.packed_linear`); ``unpacked``: every
  ``F.linear`` reorders them again, as before. The two must sample the same tokens and logprobs
  bit for bit (checked every round).
* ``other thread``: the packed engine called from a second thread of the process, as the request
  queue's worker thread called it before 2026-12-03 (:func:`agentrl.sample_here`): once the main
  thread has run torch operators, torch's OpenMP runtime holds more worker threads than cores and
  its workers sleep between operators instead of spinning.

Rounds alternate the three; every round's seconds are printed (the machine may drift: compare
within a round).
"""

from __future__ import annotations

import argparse
import threading
import time

import torch
from generate_speed import chat_prompts
from prefix_cache import cpu_name

from agentrl import SamplingParams
from agentrl.config.train import TrainConfig
from agentrl.model.loading import DEFAULT_MODEL, load_model, load_tokenizer
from agentrl.sampling.chat import ChatTokenizer
from agentrl_hf_engine import HFEngine
from agentrl_hf_engine.packed_linear import PackedLinear, can_pack


def in_thread(function):
    """``function()`` run in a new thread; its result."""
    result = {}
    thread = threading.Thread(target=lambda: result.update(value=function()))
    thread.start()
    thread.join()
    return result["value"]


def main() -> None:
    """Alternate the three variants; print seconds per round, the best of each and token identity."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    tokenizer, model = load_tokenizer(DEFAULT_MODEL), load_model(DEFAULT_MODEL)
    engine = HFEngine(model=model, tokenizer=tokenizer, config=TrainConfig(engine_args={"dtype": "bfloat16"}))
    if not can_pack(engine.model):
        raise SystemExit("oneDNN computes no bf16 on this CPU: the engine does not pack here, nothing to compare")
    layers = [m for m in engine.model.modules() if isinstance(m, PackedLinear)]
    packs = {id(m): (m.packed, m.packed_from) for m in layers}
    distinct = chat_prompts(ChatTokenizer(tokenizer), 4)
    prompts = [distinct[i % 4] for i in range(options.rows)]
    sampling = SamplingParams(max_new_tokens=options.max_new_tokens, prompt_seeds=tuple(range(options.rows)))

    def sample(packed: bool):
        for m in layers:
            m.packed, m.packed_from = packs[id(m)] if packed else (None, None)
        start = time.perf_counter()
        generations = engine.generate(prompts, sampling)
        return time.perf_counter() - start, [(g.token_ids, g.logprobs) for g in generations]

    variants = {
        "unpacked": lambda: sample(False),
        "packed": lambda: sample(True),
        "packed, other thread": lambda: in_thread(lambda: sample(True)),
    }
    sample(True)  # warm-up
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    same, tokens = True, 0
    for _ in range(options.rounds):
        outputs = {}
        for name, run in variants.items():
            elapsed, outputs[name] = run()
            seconds[name].append(elapsed)
        same &= outputs["packed"] == outputs["unpacked"] == outputs["packed, other thread"]
        tokens = sum(len(ids) for ids, _ in outputs["packed"])
    print(
        f"{cpu_name()}, {torch.get_num_threads()} threads, bf16, {options.rows} rows x <= "
        f"{options.max_new_tokens} new tokens ({tokens} sampled)"
    )
    base = min(seconds["unpacked"])
    for name, values in seconds.items():
        rounds = " ".join(f"{s:.2f}" for s in values)
        print(f"{name:>22}: best {min(values):.2f} s ({base / min(values):.2f}x unpacked); rounds {rounds}")
    print(f"packed and unpacked sampled the same tokens and logprobs bit for bit: {same}")


if __name__ == "__main__":
    main()
