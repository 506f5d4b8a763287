"""PPO's critic, forward + backward of one micro-batch, packed (the default) against padded rows.

    OMP_NUM_THREADS=2 python bench/critic_packing.py [--rounds 2] [--shapes group agent]

The critic is built as ``--algo ppo`` builds it (a copy of the default model's decoder, its real
weights, and a value head, here random so the values are not all 0), on the micro-batch shapes of
``bench/tree_attention.py`` (a GRPO group: a 100-token prompt and 8 x 100 sampled tokens; an agent:
a 950-token system prompt under 10 segments). Packed and padded alternate, best of ``--rounds``;
printed: the padded and packed positions, the seconds of each, their ratio and the largest value
difference.
"""

from __future__ import annotations

import argparse
import time

import torch
from prefix_cache import cpu_name  # the bench folder is not a package
from rich.console import Console
from rich.table import Table
from tree_attention import padded, rows_of

from agentrl.model.loading import load_model
from agentrl.model.packing import pack_prefix_tree
from agentrl_ppo import ValueModel


def main() -> None:
    """Time both variants per shape, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--shapes", nargs="+", default=["group", "agent"], choices=["group", "agent"])
    args = parser.parse_args()
    policy = load_model("smollm2-135m")
    critic = ValueModel.from_policy(policy, pack=True).train()
    torch.nn.init.normal_(critic.head.weight, std=0.02)
    table = Table(title=f"PPO critic forward + backward, {cpu_name()}, {torch.get_num_threads()} threads")
    for column in (
        "shape",
        "padded positions",
        "packed positions",
        "padded s",
        "packed s",
        "ratio",
        "max |value diff|",
    ):
        table.add_column(column)
    for shape in args.shapes:
        rows, prompt = rows_of(shape, policy.config.vocab_size)
        ids, attention, loss_mask = padded(rows, prompt)
        best = {False: float("inf"), True: float("inf")}
        values = {}
        for _ in range(args.rounds):
            for pack in (False, True):
                critic.pack = pack
                critic.zero_grad(set_to_none=True)
                start = time.perf_counter()
                out = critic(ids, attention, loss_mask)
                out.sum().backward()
                best[pack] = min(best[pack], time.perf_counter() - start)
                values[pack] = out.detach()
        table.add_row(
            shape,
            f"{ids.numel():,}",
            f"{pack_prefix_tree(ids, attention).length:,}",
            f"{best[False]:.2f}",
            f"{best[True]:.2f}",
            f"{best[True] / best[False]:.2f}",
            f"{float((values[True] - values[False]).abs().max()):.1e}",
        )
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
