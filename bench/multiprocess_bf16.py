"""One process against two (``--num-processes 2``), in fp32 and in bf16: how far apart they train.

    python bench/multiprocess_bf16.py [--steps 3] [--model DIR] [--precisions fp32 bf16]

Runs ``agentrl train`` (GRPO on math, 4 tasks x 4 episodes a step, a reward that varies between
the episodes of a random model: its share of vowels; the settings of tests/e2e/test_multiprocess.py)
once in one process and once in two, for each precision (bf16: ``precision=bf16``, the hf engine
sampling from a bf16 copy; fp32: ``precision=fp32``, the engine in float32). Prints per precision:
each step's gradient norm and loss with one and with two processes and their relative difference,
the first step whose sampled completions differ, and the largest weight difference at the end.

Then where a difference would come from: two processes each run their half of the batch, so a
row's forward runs in another batch shape (fewer rows, padded to another length). The probe runs
the model's forward under the run's bf16 autocast on 4 padded sequences and on each half of them
(padded to its own longest, as a process does), and prints the largest difference of a row's
log-probabilities between the two: 0.0 where this CPU's bf16 kernels give a row the same result
in any batch shape (then 1 and 2 processes train the same, as in fp32), above 0 where they do not.
Gradients are summed across processes in fp32 (the master weights' dtype) either way.

Without ``--model`` it builds the tiny random model of the tests (2 layers, hidden size 32) with
the default model's tokenizer.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

REWARD = '''
def vowels(completions, **kwargs):
    """A reward that varies between episodes of a tiny random model: its share of vowels."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(ch in "aeiou" for ch in t) / max(len(t), 1) for t in texts]
'''


def tiny_model(folder: Path) -> Path:
    """The tests' tiny random model with the default model's tokenizer, saved in ``folder``."""
    from agentrl.model.loading import DEFAULT_MODEL, load_tokenizer
    from agentrl.testing import build_tiny_model

    tokenizer = load_tokenizer(DEFAULT_MODEL)
    build_tiny_model(len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def train(model: Path, work: Path, precision: str, processes: int, steps: int) -> Path:
    """One ``agentrl train`` run; its run dir."""
    reward = work / "vowels.py"
    reward.write_text(REWARD)
    run_dir = work / f"{precision}-{processes}p"
    args = ["--env", "math", "--algo", "grpo", "--model", str(model), "--prompts-per-step", "4"]
    args += ["--num-generations", "4", "--reward", f"{reward}:vowels", "--max-steps", str(steps)]
    args += ["--output-dir", str(run_dir)]
    sets = ["eval_tasks=0", "max_new_tokens=12", "learning_rate=1e-3", f"precision={precision}"]
    sets += ["log_completions_every=1", "checkpoint_every=0"]
    if precision == "fp32":
        sets.append("engine_args.dtype=float32")
    for item in sets:
        args += ["--set", item]
    if processes > 1:
        args += ["--num-processes", str(processes)]
    env = {**os.environ, "AGENTRL_LAUNCHED": ""}
    result = subprocess.run([sys.executable, "-m", "agentrl", "train", *args], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"{precision} {processes}p failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    return run_dir


def metrics(run_dir: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def completions_by_step(run_dir: Path) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for line in (run_dir / "completions.jsonl").read_text().splitlines():
        row = json.loads(line)
        out.setdefault(row["step"], []).append(json.dumps(row["messages"]))
    return out


def max_weight_difference(one: Path, two: Path) -> float:
    from safetensors.torch import load_file

    a, b = load_file(one / "model" / "model.safetensors"), load_file(two / "model" / "model.safetensors")
    return max(float((a[key].float() - b[key].float()).abs().max()) for key in a)


def compare(precision: str, one: Path, two: Path) -> None:
    """Per step: gradient norm and loss with 1 and 2 processes; the first step sampling differs."""
    print(f"\n{precision}: 1 process vs 2")
    print(f"{'step':>4} {'grad_norm 1p':>13} {'2p':>10} {'rel diff':>9} {'loss 1p':>11} {'2p':>11}")
    for row_one, row_two in zip(metrics(one), metrics(two)):
        g1, g2 = row_one["train/grad_norm"], row_two["train/grad_norm"]
        rel = abs(g1 - g2) / max(abs(g1), 1e-12)
        print(
            f"{row_one['step']:>4} {g1:>13.6f} {g2:>10.6f} {rel:>9.2e} "
            f"{row_one['loss/total']:>11.3e} {row_two['loss/total']:>11.3e}"
        )
    texts_one, texts_two = completions_by_step(one), completions_by_step(two)
    differ = [step for step in sorted(texts_one) if texts_one[step] != texts_two.get(step)]
    print(f"completions: {'first differ at step ' + str(differ[0]) if differ else 'equal at every step'}")
    print(f"weights at the end: max |difference| {max_weight_difference(one, two):.3g}")


def row_probe(model_dir: Path) -> float:
    """The largest difference of a row's log-probabilities between a batch of 4 padded sequences
    and the halves of it, each padded to its own longest, under bf16 autocast."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "right"
    texts = ["What is 4 - 5?", "What is 17 + 8 and then times 3?", "Say hi.", "What is 12 times 12, roughly?"]

    def logprobs(batch: list[str]) -> list[torch.Tensor]:
        enc = tokenizer(batch, return_tensors="pt", padding=True)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(**enc).logits.float()
        lengths = enc["attention_mask"].sum(dim=1)
        return [torch.log_softmax(logits[i, : int(lengths[i])], dim=-1) for i in range(len(batch))]

    whole = logprobs(texts)
    halves = logprobs(texts[:2]) + logprobs(texts[2:])
    return max(float((a - b).abs().max()) for a, b in zip(whole, halves))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--model", default=None, help="a model folder (default: the tests' tiny random model)")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    args = parser.parse_args()
    from agentrl.model.precision import resolve_precision

    print(f"this CPU: precision auto -> {resolve_precision('auto').name} ({resolve_precision('auto').reason})")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = Path(args.model) if args.model else tiny_model(work / "tiny")
        print(f"row probe (bf16 autocast, 4 rows vs 2 + 2): max |log-prob difference| {row_probe(model):.3g}")
        for precision in args.precisions:
            one = train(model, work, precision, 1, args.steps)
            two = train(model, work, precision, 2, args.steps)
            compare(precision, one, two)


if __name__ == "__main__":
    main()
