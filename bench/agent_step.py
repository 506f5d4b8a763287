"""A training step of an agent that rewrites its history (smolagents' shape) against a one-call agent.

    OMP_NUM_THREADS=2 python bench/agent_step.py [--tasks 2] [--generations 2] [--tokens 24] [--calls 5]

Both agents send the same ~800-token system prompt and the task on the default model, GRPO, one
synchronous step each:

* ``one call``: one request for ``calls x tokens`` new tokens;
* ``rewriting``: ``calls`` requests of ``tokens`` each, the history folded into one new user message
  at every call (as smolagents replays its memory), so no request extends the previous one and every
  call is a training segment of its own carrying the whole prompt.

Rows: ``rewriting`` with packing off (padded segments), then with the engine prefilling each
call's shared prompt start per row (``engine_args.share_prefix_min_tokens=0``), then with the
defaults (a packed forward whose micro-batches keep an episode's segments together, shared prefixes
computed once; each call's shared start prefilled once), then with
the hf engine's prefix cache on too (``engine_args.prefix_cache_mb``: a call prefills only what
follows the conversation's cached prefix); the one-call agent with the defaults. Per row
the rollout, update and step seconds, sampled and prefilled tokens, and the step's ratio to the one
call's per sampled token. Timings: one process, the variants alternated, best of ``--rounds``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import torch
from prefix_cache import SYSTEM, cpu_name  # the bench folder is not a package

import agentrl

AGENTS = """
SYSTEM = __SYSTEM__
CALLS = __CALLS__
TOKENS = __TOKENS__


def one_call(task, client):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task["question"]}]
    reply = client.chat.completions.create(model="m", messages=messages, max_tokens=CALLS * TOKENS)
    return messages + [{"role": "assistant", "content": reply.choices[0].message.content}]


def rewriting(task, client):
    notes = []
    for _ in range(CALLS):
        memory = "".join(f"\\nStep {i + 1}: {note}" for i, note in enumerate(notes))
        user = task["question"] + ("\\n\\nYour steps so far:" + memory if notes else "")
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
        reply = client.chat.completions.create(model="m", messages=messages, max_tokens=TOKENS)
        notes.append(reply.choices[0].message.content.strip())
    return messages + [{"role": "assistant", "content": notes[-1]}]
"""


def one_step(agent: str, folder: Path, args: argparse.Namespace, **options: Any) -> dict[str, float]:
    """The metrics of one GRPO step of ``agent`` on the default model."""
    with agentrl.Trainer(
        env="math",
        algo="grpo",
        agent=agent,
        max_steps=1,
        prompts_per_step=args.tasks,
        num_generations=args.generations,
        max_new_tokens=args.calls * args.tokens,
        eval_tasks=0,
        save_model=False,
        log_completions_every=0,
        output_dir=str(folder),
        verbose=False,
        seed=0,
        **options,
    ) as trainer:
        return trainer.train_step()


def main() -> None:
    """Run the three variants and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--generations", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    print(f"default model, {torch.get_num_threads()} threads, {cpu_name()}")
    print(f"{args.tasks} tasks x {args.generations} episodes, {args.calls} calls x {args.tokens} tokens")
    variants = {
        "rewriting, cache off, padded": ("rewriting", {"engine_args": {"prefix_cache_mb": 0}, "pack_sequences": False}),
        "rewriting, no shared start": ("rewriting", {"engine_args": {"share_prefix_min_tokens": 0}}),
        "rewriting, defaults": ("rewriting", {}),
        "rewriting, prefix cache": ("rewriting", {"engine_args": {"prefix_cache_mb": 1024}}),
        "one call, defaults": ("one_call", {}),
    }
    best: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "agents.py"
        source = AGENTS.replace("__SYSTEM__", repr(SYSTEM)).replace("__CALLS__", str(args.calls))
        path.write_text(source.replace("__TOKENS__", str(args.tokens)))
        for round_ in range(args.rounds):
            for name, (function, options) in variants.items():
                metrics = one_step(f"{path}:{function}", Path(tmp) / f"{name}-{round_}", args, **options)
                if name not in best or metrics["perf/step_seconds"] < best[name]["perf/step_seconds"]:
                    best[name] = metrics
    print(
        f"{'variant':<30}{'rollout s':>10}{'update s':>9}{'step s':>8}{'sampled':>8}{'prefilled':>10}{'vs one call':>12}"
    )
    reference = best["one call, defaults"]
    episodes = args.tasks * args.generations
    per_token = reference["perf/step_seconds"] / max(1.0, sampled(reference, episodes))
    for name, m in best.items():
        ratio = m["perf/step_seconds"] / max(1.0, sampled(m, episodes)) / per_token
        print(
            f"{name:<30}{m['perf/rollout_seconds']:>10.1f}{m['perf/update_seconds']:>9.1f}{m['perf/step_seconds']:>8.1f}"
            f"{sampled(m, episodes):>8.0f}{m.get('engine/prefilled_tokens', float('nan')):>10.0f}{ratio:>11.2f}x"
        )


def sampled(metrics: dict[str, float], episodes: int) -> float:
    """Tokens the step sampled over its ``episodes`` episodes, every call of each."""
    return metrics["rollout/sampled_tokens_mean"] * episodes


if __name__ == "__main__":
    main()
