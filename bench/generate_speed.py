"""Decode speed of the ``hf`` engine on the default model: float32 vs bfloat16, side by side.

    python bench/generate_speed.py [--prompts 32] [--max-new-tokens 64] [--rounds 3] [--hf-generate]

Both engines decode the same 32 distinct chat prompts (arithmetic questions) with the same seed at
T=1; ``min_new_tokens`` is not forced, so tokens/s counts the tokens actually sampled. Rounds
alternate between the engines (this machine is shared and its speed drifts), and the best round
of each is reported with the median. ``--hf-generate`` adds ``model.generate`` on the fp32 model
as a reference.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from rich.console import Console
from rich.table import Table

from agentrl import SamplingParams
from agentrl.config.train import TrainConfig
from agentrl.model.loading import DEFAULT_MODEL, load_model, load_tokenizer
from agentrl.sampling.chat import ChatTokenizer
from agentrl_hf_engine import HFEngine


def chat_prompts(chat: ChatTokenizer, count: int) -> list[list[int]]:
    """``count`` distinct single-turn chat prompts as token ids."""
    pairs = [(a, b) for a in range(10) for b in range(10)]
    questions = [f"What is {a} + {b}? Put the final answer in \\boxed{{}}." for a, b in pairs]
    return [
        chat.encode(chat.render([{"role": "user", "content": q}], add_generation_prompt=True))
        for q in questions[:count]
    ]


def hf_generate_runner(model: torch.nn.Module, prompts: list[list[int]], pad_id: int) -> Callable[[int], int]:
    """``model.generate`` on left-padded prompts; returns the tokens sampled before each eos."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])  # (B, P)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])  # (B, P)

    def run(max_new_tokens: int) -> int:
        torch.manual_seed(0)
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_new_tokens,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
            )
        total = 0
        for row in out[:, width:].tolist():
            total += row.index(pad_id) + 1 if pad_id in row else len(row)  # pad == eos here
        return total

    return run


def main() -> None:
    """Time each system ``--rounds`` times, interleaved, and print tokens/s and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hf-generate", action="store_true", help="also time model.generate (fp32)")
    args = parser.parse_args()

    console = Console()
    tokenizer = load_tokenizer(DEFAULT_MODEL)
    model = load_model(DEFAULT_MODEL)
    prompts = chat_prompts(ChatTokenizer(tokenizer), args.prompts)
    systems: dict[str, Callable[[int], int]] = {}
    for dtype in ("float32", "bfloat16"):
        engine = HFEngine(model=model, tokenizer=tokenizer, config=TrainConfig(engine_args={"dtype": dtype}))
        systems[f"hf engine {dtype}"] = lambda n, e=engine: sum(  # tokens actually sampled
            len(g.token_ids) for g in e.generate(prompts, SamplingParams(max_new_tokens=n, seed=0))
        )
    if args.hf_generate:
        systems["model.generate float32"] = hf_generate_runner(model, prompts, tokenizer.pad_token_id)

    console.print(
        f"{len(prompts)} prompts ({min(map(len, prompts))}-{max(map(len, prompts))} tokens), "
        f"max_new_tokens={args.max_new_tokens}, {torch.get_num_threads()} threads; warming up"
    )
    for run in systems.values():
        run(4)
    rates: dict[str, list[float]] = {name: [] for name in systems}
    tokens: dict[str, int] = {}
    for round_index in range(args.rounds):
        for name, run in systems.items():
            start = time.perf_counter()
            tokens[name] = run(args.max_new_tokens)
            seconds = time.perf_counter() - start
            rates[name].append(tokens[name] / seconds)
            console.print(f"  round {round_index + 1} {name}: {tokens[name]} tokens in {seconds:.1f} s")

    table = Table(title="decode speed (tokens/s, tokens actually sampled)")
    for column in ("system", "tokens", "best tok/s", "median tok/s", "best vs float32"):
        table.add_column(column, justify="right" if column != "system" else "left")
    base = max(rates["hf engine float32"])
    for name, values in rates.items():
        table.add_row(
            name,
            str(tokens[name]),
            f"{max(values):.1f}",
            f"{statistics.median(values):.1f}",
            f"{max(values) / base:.2f}x",
        )
    console.print(table)


if __name__ == "__main__":
    main()
