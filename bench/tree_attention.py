"""The packed training forward + backward with attention block by block (tree) against a dense mask.

    OMP_NUM_THREADS=2 python bench/tree_attention.py [--rounds 2] [--shapes group agent] [--precision fp32 bf16]

On the default model (SmolLM2-135M, its real weights), one micro-batch of each shape, packed into
one prefix-tree sequence as the trainer packs it:

* ``group``: a GRPO group, a 100-token prompt and 8 completions of 100 tokens;
* ``agent``: two episodes of an agent that rewrites its history over 5 calls (a 950-token system
  prompt shared by all 10 segments, each segment's own part 99-399 tokens).

For each shape and precision (``fp32``; ``bf16``: autocast as ``precision: bf16`` trains) the
logprob forward and its backward run with ``sdpa`` over the dense ancestor mask and with
:mod:`agentrl.model.tree_attention`, alternated, best of ``--rounds``; printed: packed positions,
query-key pairs each computes, seconds, the ratio, and how far each variant's logprobs (largest
difference over the completions) and gradients (median over the weights of the relative
difference) are from the fp32 dense forward's. The rows are random tokens, whose logprobs
(around -13) are far from those of sampled text: bf16 is much further from fp32 here than in a
run, for either variant.
"""

from __future__ import annotations

import argparse
import time

import torch
from prefix_cache import cpu_name  # the bench folder is not a package
from rich.console import Console
from rich.table import Table

from agentrl.model.loading import load_model
from agentrl.model.packing import pack_prefix_tree
from agentrl.model.policy import TokenLogprobs
from agentrl.model.tree_attention import TreeBlocks


def rows_of(shape: str, vocab: int) -> tuple[list[list[int]], int]:
    """The micro-batch's rows (token ids) and its prompt length."""
    g = torch.Generator().manual_seed(0)

    def ids(n: int) -> list[int]:
        return torch.randint(5, vocab, (n,), generator=g).tolist()

    if shape == "group":
        prompt = ids(100)
        return [prompt + ids(100) for _ in range(8)], 100
    system = ids(950)
    return [system + ids(150 * (call + 1) // 2 + 24) for _ in range(2) for call in range(5)], 950


def padded(rows: list[list[int]], prompt: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask and loss mask (the completions)."""
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
    loss_mask = mask.float()
    loss_mask[:, :prompt] = 0
    return ids, mask, loss_mask


def timed(policy: TokenLogprobs, batch: tuple, tree: bool, precision: str) -> tuple[float, torch.Tensor, list]:
    """Seconds of one forward + backward, the logprobs and the gradients."""
    policy.tree_attention = tree
    policy.model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        logprobs, _ = policy(*batch)
    logprobs.sum().backward()
    seconds = time.perf_counter() - start
    return seconds, logprobs.detach(), [p.grad.clone() for p in policy.model.parameters() if p.grad is not None]


def main() -> None:
    """Time every shape and precision, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--shapes", nargs="+", default=["group", "agent"], choices=["group", "agent"])
    parser.add_argument("--precision", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    args = parser.parse_args()
    model = load_model("smollm2-135m").train()
    policy = TokenLogprobs(model, pack=True)
    assert policy.tree_attention, "the default model should take tree attention"
    table = Table(title=f"packed forward + backward, {cpu_name()}, {torch.get_num_threads()} threads")
    for column in ("shape", "precision", "positions", "pairs dense", "pairs tree", "dense s", "tree s", "ratio",
                   "logprobs vs fp32 dense (dense / tree)", "gradients vs fp32 dense (dense / tree)"):  # fmt: skip
        table.add_column(column)
    for shape in args.shapes:
        rows, prompt = rows_of(shape, model.config.vocab_size)
        batch = padded(rows, prompt)
        packed = pack_prefix_tree(*batch[:2])
        pairs = TreeBlocks.from_parents(list(packed.parents)).pairs
        _, reference, reference_grads = timed(policy, batch, False, "fp32")
        completions = batch[2] > 0
        for precision in args.precision:
            best = {False: float("inf"), True: float("inf")}
            gaps = {}
            for _ in range(args.rounds):
                for tree in (False, True):
                    seconds, logprobs, grads = timed(policy, batch, tree, precision)
                    best[tree] = min(best[tree], seconds)
                    relative = sorted(float((a - b).norm() / b.norm()) for a, b in zip(grads, reference_grads))
                    gaps[tree] = (float((logprobs - reference)[completions].abs().max()), relative[len(relative) // 2])
            table.add_row(shape, precision, str(packed.length), f"{packed.length**2:,}", f"{pairs:,}",
                          f"{best[False]:.2f}", f"{best[True]:.2f}", f"{best[True] / best[False]:.2f}",
                          f"{gaps[False][0]:.1e} / {gaps[True][0]:.1e}",
                          f"{gaps[False][1]:.1e} / {gaps[True][1]:.1e}")  # fmt: skip
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
