"""The training forward's logprobs and entropies from the LM head's logits: tensor form vs blocks.

    OMP_NUM_THREADS=2 python bench/selected_logprobs.py [--rows 377] [--vocab 49152] [--rounds 3]

``tensors``: what ``TokenLogprobs`` computed before ``agentrl.model.selected_logprobs``: the logits
upcast to float32, ``log_softmax`` over the vocabulary, the chosen tokens gathered, entropies a few
rows at a time from the log-probabilities; backward through all of it. ``blocks``:
:func:`agentrl.model.selected_logprobs.selected_logprobs`. Both on the same bf16 and fp32 logits of
``--rows`` rows (a micro-batch's completion tokens on the default model: a GRPO group of 8 at ~40
tokens each is ~330), one chosen token per row, forward + backward, rounds alternating; the best
milliseconds of each and the largest difference between their logprobs and gradients.
"""

from __future__ import annotations

import argparse
import time

import torch
from prefix_cache import cpu_name  # the bench folder is not a package

from agentrl.model.selected_logprobs import selected_logprobs


def tensors(logits: torch.Tensor, where: torch.Tensor, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The tensor form: float32 log_softmax of every row, gathered; entropies 32 rows at a time."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)  # (U, V)
    with torch.no_grad():
        entropy = torch.cat([-(c.exp() * c).sum(-1) for c in log_probs.detach().split(32)])
    return log_probs[where, token_ids], entropy


def blocks(logits: torch.Tensor, where: torch.Tensor, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``selected_logprobs`` with entropies."""
    picked, entropy = selected_logprobs(logits, where, token_ids)
    assert entropy is not None
    return picked, entropy


def timed(function, logits: torch.Tensor, where: torch.Tensor, token_ids: torch.Tensor, upstream: torch.Tensor):
    """Seconds of one forward + backward; the logprobs and the gradient."""
    leaf = logits.detach().requires_grad_(True)
    start = time.perf_counter()
    picked, _ = function(leaf, where, token_ids)
    (picked * upstream).sum().backward()
    return time.perf_counter() - start, picked.detach(), leaf.grad


def main() -> None:
    """Print each dtype's best milliseconds and the two forms' largest differences."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=377)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    print(f"{cpu_name()}, {torch.get_num_threads()} threads, {options.rows} rows x {options.vocab} vocabulary")
    generator = torch.Generator().manual_seed(0)
    base = 4 * torch.randn(options.rows, options.vocab, generator=generator)
    token_ids = torch.randint(0, options.vocab, (options.rows,), generator=generator)
    where = torch.arange(options.rows)
    upstream = torch.randn(options.rows, generator=generator)
    for dtype in (torch.bfloat16, torch.float32):
        logits = base.to(dtype)
        seconds: dict[str, list[float]] = {"tensors": [], "blocks": []}
        results = {}
        for _ in range(options.rounds):
            for name, function in (("tensors", tensors), ("blocks", blocks)):
                took, picked, grad = timed(function, logits, where, token_ids, upstream)
                seconds[name].append(took)
                results[name] = (picked, grad)
        values = float((results["tensors"][0] - results["blocks"][0]).abs().max())
        grads = float((results["tensors"][1].float() - results["blocks"][1].float()).abs().max())
        best = {name: 1000 * min(s) for name, s in seconds.items()}
        print(
            f"{dtype}: tensors {best['tensors']:.0f} ms, blocks {best['blocks']:.0f} ms "
            f"({best['tensors'] / best['blocks']:.2f}x); max |logprob diff| {values:.1e}, max |grad diff| {grads:.1e}"
        )


if __name__ == "__main__":
    main()
