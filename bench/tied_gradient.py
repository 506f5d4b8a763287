"""The tied embedding's gradient: dense lookup, sparse lookup, and the split weight (the default).

    OMP_NUM_THREADS=2 python bench/tied_gradient.py [--rounds 3] [--micro-batches 2] [--precision fp32 bf16]

On the default model (SmolLM2-135M, its real weights; its input embedding is its output head),
``--micro-batches`` GRPO-group micro-batches of the main job's shape (a 48-token prompt, 8
completions of 32 tokens), packed as the trainer packs them, run forward + backward into one
``.grad``, three ways:

* ``dense``: the model's own embedding lookup; its gradient is a (vocab x hidden) tensor of zeros
  with the looked-up rows filled, added to the head's gradient into another fresh one;
* ``sparse``: the lookup's gradient sparse, added by autograd into a copy of the head's gradient;
* ``split``: :func:`agentrl.model.tied_embedding.split_tied`, the sparse rows added into the
  head's gradient in place (what the trainer does).

Alternated, best of ``--rounds``; printed: seconds, the ratio to ``dense``, and the largest
difference of the weight's ``.grad`` from the dense one's.
"""

from __future__ import annotations

import argparse
import time

import torch
from prefix_cache import cpu_name  # the bench folder is not a package
from rich.console import Console
from rich.table import Table
from tree_attention import padded

from agentrl.model.loading import load_model
from agentrl.model.policy import TokenLogprobs

VARIANTS = ("dense", "sparse", "split")


class SparseLookupOnly(TokenLogprobs):
    """The sparse lookup with the head's own module: the two gradients meet out of place."""

    def _weights(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return self.model.get_input_embeddings().weight, None


def micro_batches(count: int, vocab: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``count`` groups of the main job's shape, random ids."""
    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(count):
        prompt = torch.randint(5, vocab, (48,), generator=g).tolist()
        rows = [prompt + torch.randint(5, vocab, (32,), generator=g).tolist() for _ in range(8)]
        batches.append(padded(rows, 48))
    return batches


def timed(policy: TokenLogprobs, batches: list, precision: str) -> tuple[float, torch.Tensor]:
    """Seconds of every micro-batch's forward + backward into one ``.grad``, and that gradient."""
    policy.model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    for batch in batches:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            logprobs, _ = policy(*batch)
        logprobs.sum().backward()
    seconds = time.perf_counter() - start
    return seconds, policy.model.get_input_embeddings().weight.grad.clone()


def main() -> None:
    """Time the three variants per precision, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--micro-batches", type=int, default=2)
    parser.add_argument("--precision", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    args = parser.parse_args()
    model = load_model("smollm2-135m").train()
    policies = {
        "dense": TokenLogprobs(model, pack=True),
        "sparse": SparseLookupOnly(model, pack=True, sparse_embedding=True),
        "split": TokenLogprobs(model, pack=True, sparse_embedding=True),
    }
    batches = micro_batches(args.micro_batches, model.config.vocab_size)
    title = f"{args.micro_batches} micro-batches forward + backward, {cpu_name()}, {torch.get_num_threads()} threads"
    table = Table(title=title)
    for column in ("precision", "variant", "seconds", "vs dense", "max |grad - dense grad|"):
        table.add_column(column)
    for precision in args.precision:
        best = dict.fromkeys(VARIANTS, float("inf"))
        grads: dict[str, torch.Tensor] = {}
        for _ in range(args.rounds):
            for name in VARIANTS:
                seconds, grads[name] = timed(policies[name], batches, precision)
                best[name] = min(best[name], seconds)
        for name in VARIANTS:
            gap = float((grads[name] - grads["dense"]).abs().max())
            table.add_row(precision, name, f"{best[name]:.2f}", f"{best[name] / best['dense']:.2f}", f"{gap:.1e}")
    Console().print(table)


if __name__ == "__main__":
    main()
