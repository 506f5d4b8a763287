"""Train a reward model on the ``math`` env's own correctness labels, for ``--reward rm:DIR``.

    python bench/train_reward_model.py --out DIR [--prompts N] [--samples K] [--epochs E] [--tiny]

What it learns from (all from the math env's TRAIN split; its held-out eval tasks are never read):

* **sampled**: ``--samples`` episodes per prompt for ``--prompts`` distinct training questions,
  sampled by the default model exactly as ``agentrl train --env math`` samples at step 0 (the same
  env plugin, ``multi_turn`` rollout, ``hf`` engine, chat template, T=1, 64 new tokens: the
  :class:`~agentrl.config.train.TrainConfig` defaults). Each is labelled by the env's own check, the one
  ``eval/accuracy`` uses (:func:`agentrl.training.evaluate.episode_success` on the env's ``info``).
* **reference positives**: the base model is seldom right (about a fifth of its samples, counting
  an unboxed last number), so each prompt
  also gets replies written from the task's reference answer in the style the env asks for and the
  policy should learn: the env's own gold reply (``\\boxed{ANSWER}``) and the env's worked-example
  style (``A + B = ANSWER. The final answer is \\boxed{ANSWER}.``; tasks without operands:
  ``The final answer is \\boxed{ANSWER}.``).
* **reference negatives**: the same two replies with a wrong number (ANSWER +- 1 or 2), so that the
  style alone does not predict the label and the model must read the number.

Every reply, sampled or written, is labelled by stepping the env with it (the label is the env's
verdict, never assumed). A seeded 20% of the prompts (``--holdout``), with all their replies, is
held out: the reward model never trains on a held-out question.

The model: ``LlamaForSequenceClassification`` (``num_labels=1``) built from the default model's
config and weights, with a fresh score head, trained in fp32 (AdamW, BCE with the positives weighted
to balance the classes). It reads each conversation as ``rm:DIR`` does: the chat template of its own
tokenizer over the whole episode (the model's default system prompt included), scored at the last
token. On a shared 2-core CPU a forward pass of the default model runs at about 100 tokens/s, too
slow to fine-tune it whole in minutes; so the frozen part runs once and is cached, and only the score
head (default, ``--train-layers 0``: a linear probe of the last token's final hidden state) or the
top ``--train-layers`` decoder layers, the final norm and the head are trained.

Measured with the defaults (128 questions x 3 samples + 4 written replies each: 896 conversations,
26 questions held out; 2026-11-27, the 2-core CPU shared with learning runs): 10.5 min (sampling
384 episodes 109 s, the frozen forward 481 s, the head 17 s). Held-out AUC 0.73: sampled replies
alone 0.68, written replies alone 0.52 (a right and a wrong number in the same style are not told
apart: the model mostly prefers clean boxed replies to rambling ones); same-question pair accuracy
0.76. Under the bf16 autocast of a training run on this CPU scores move by up to 0.15 (held-out
scores' std 1.0).

Written to DIR: the model and tokenizer (``save_pretrained``, chat template included),
``rm_report.json`` (counts, label balance, held-out AUC, seconds) and ``rm_examples.jsonl`` (every
example: split, source, label, messages; held-out ones with the trained model's score). The
held-out figures are the trained model's fp32 scores; ``--check`` held-out examples are scored
again by DIR loaded through the ``rm:`` reward scheme's own class, in fp32 and under the bf16
autocast a training run on a bf16 CPU uses, and the largest differences reported. ``--tiny``: a
random 2-layer model, 6 prompts x 2 samples of 8 tokens, 2 epochs (proves the script runs; figures
meaningless).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from transformers import LlamaForSequenceClassification, LlamaModel

from agentrl import Env, SamplingParams
from agentrl.config.train import TrainConfig
from agentrl.model.loading import DEFAULT_MODEL, load_model, load_tokenizer
from agentrl.plugins import load_plugins
from agentrl.testing import build_tiny_model, make_trajectory
from agentrl.training.build import engine_and_rollout, make_env
from agentrl.training.evaluate import episode_success
from agentrl_rewards.reward_model import RewardModel, RewardModelConfig

ENV = "math"
EQUATION = "{a} {op} {b} = {x}. The final answer is \\boxed{{{x}}}."
"""The worked-example style (the env's ``DEMONSTRATION`` reply) for tasks with operands."""
PLAIN = "The final answer is \\boxed{{{x}}}."
"""The same style for tasks without operands."""


@dataclass
class Example:
    """One labelled conversation: the prompt's messages and one assistant reply."""

    question: str
    messages: list[dict[str, Any]]
    label: bool
    source: str  # "sampled" | "reference" (a positive or a wrong-number negative written from the answer)
    split: str = "train"
    ids: list[int] = field(default_factory=list)
    score: float | None = None


# -- data --------------------------------------------------------------------------------------------
def distinct_train_tasks(env: Env, n: int) -> list[dict[str, Any]]:
    """The first ``n`` distinct questions of the env's training sequence (fewer if it has fewer)."""
    tasks, seen = [], set()
    train = env.train_tasks()
    for i in range(len(train)):
        task = train[i]
        if task["question"] not in seen:
            seen.add(task["question"])
            tasks.append(task)
            if len(tasks) == n:
                break
    return tasks


def env_verdict(env: Env, task: dict[str, Any], reply: str) -> tuple[list[dict[str, Any]], bool]:
    """(the prompt messages, solved?): ``env`` reset on ``task`` and stepped with ``reply``, judged
    as held-out accuracy judges an episode."""
    messages, _ = env.reset(options={"task": task})
    _, reward, _, _, info = env.step(reply)
    trajectory = make_trajectory([*messages, {"role": "assistant", "content": reply}], task, info=info)
    trajectory.turns[0].reward = float(reward)
    return messages, episode_success(trajectory, env.success_threshold)


def reference_replies(task: dict[str, Any], rng: np.random.Generator) -> list[str]:
    """The styled replies of ``task``'s reference answer, then the same with a wrong number."""
    answer = str(task["answer"])
    styled = EQUATION if {"a", "op", "b"} <= set(task) else PLAIN
    right = [f"\\boxed{{{answer}}}", styled.format(x=answer, **task)]
    try:
        wrong = str(int(answer) + int(rng.choice([-2, -1, 1, 2])))
    except ValueError:  # a non-integer answer: no wrong-number negative
        return right
    return right + [f"\\boxed{{{wrong}}}", styled.format(x=wrong, **task)]


def reference_examples(env: Env, tasks: list[dict[str, Any]], seed: int) -> list[Example]:
    """Reference positives and wrong-number negatives for every task, labelled by the env."""
    rng = np.random.default_rng(seed)
    out = []
    for task in tasks:
        for reply in reference_replies(task, rng):
            messages, solved = env_verdict(env, task, reply)
            out.append(
                Example(task["question"], [*messages, {"role": "assistant", "content": reply}], solved, "reference")
            )
    return out


def sampled_examples(
    manager: Any,
    config: TrainConfig,
    model: Any,
    tokenizer: Any,
    tasks: list[dict[str, Any]],
    samples: int,
    seed: int,
    progress: Progress,
) -> list[Example]:
    """``samples`` episodes per task from ``model`` as a training run samples them, labelled by the env."""
    _, rollout = engine_and_rollout(manager, config, model, tokenizer)
    chunk = max(1, 32 // samples)  # tasks per rollout call
    envs = [make_env(manager, config) for _ in range(chunk * samples)]
    bar = progress.add_task("sampling episodes", total=len(tasks) * samples)
    out = []
    for start in range(0, len(tasks), chunk):
        part = tasks[start : start + chunk]
        episodes = [part[i // samples] for i in range(len(part) * samples)]
        seeds = [seed * 1_000_003 + start * samples + i for i in range(len(episodes))]
        sampling = SamplingParams(
            max_new_tokens=config.max_new_tokens,
            temperature=config.temperature,
            top_p=config.top_p,
            top_k=config.top_k,
            seed=seeds[0],
        )
        trajectories = rollout.run(
            envs[: len(episodes)], episodes, [i // samples for i in range(len(episodes))], sampling, seeds=seeds
        )
        out += [
            Example(
                t.task["question"],
                [dict(m) for m in t.messages],
                episode_success(t, envs[0].success_threshold),
                "sampled",
            )
            for t in trajectories
        ]
        progress.advance(bar, len(episodes))
    return out


def hold_out(examples: list[Example], fraction: float, seed: int) -> None:
    """Mark every example of a seeded ``fraction`` of the questions (at least one) as held out."""
    questions = sorted({e.question for e in examples})
    count = min(len(questions) - 1, max(1, round(fraction * len(questions))))
    held = {questions[i] for i in np.random.default_rng(seed).permutation(len(questions))[:count]}
    for example in examples:
        example.split = "heldout" if example.question in held else "train"


def encode(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    """The conversation's ids as ``rm:DIR`` reads them: the chat template's text, no special tokens added."""
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


# -- the model ---------------------------------------------------------------------------------------
def reward_model_from(causal: Any, pad_token_id: int, seed: int) -> LlamaForSequenceClassification:
    """A one-score sequence classifier with ``causal``'s config and weights and a fresh score head."""
    config = causal.config.__class__.from_dict(
        {
            **causal.config.to_dict(),
            "num_labels": 1,
            "pad_token_id": pad_token_id,
            "architectures": None,
            "id2label": {0: "LABEL_0"},
            "label2id": {"LABEL_0": 0},
        }
    )
    torch.manual_seed(seed)
    model = LlamaForSequenceClassification(config)
    model.model.load_state_dict(causal.model.state_dict())
    return model.float().eval()


def top_stack(model: LlamaForSequenceClassification, layers: int) -> LlamaModel:
    """A LlamaModel over ``model``'s own top ``layers`` decoder layers and final norm (shared
    modules: training it trains ``model``), fed the hidden states entering those layers."""
    config = model.config.__class__.from_dict(
        {
            **model.config.to_dict(),
            "num_hidden_layers": layers,
            "vocab_size": 1,
            "pad_token_id": None,
            "bos_token_id": None,
            "eos_token_id": None,
        }
    )  # no embedding to build
    top = LlamaModel(config)
    top.layers = model.model.layers[-layers:]
    top.norm = model.model.norm
    top.embed_tokens = None  # never used: inputs_embeds are given
    return top


def right_padded(seqs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(padded (B, L, ...) tensor with zeros, attention mask (B, L), lengths (B,))."""
    lengths = torch.tensor([len(s) for s in seqs])  # (B,)
    padded = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True)  # (B, L, ...)
    mask = (torch.arange(padded.shape[1])[None, :] < lengths[:, None]).long()  # (B, L)
    return padded, mask, lengths


@torch.no_grad()
def frozen_features(
    model: LlamaForSequenceClassification, examples: list[Example], layers: int, batch_size: int, progress: Progress
) -> dict[int, torch.Tensor]:
    """Per example (by ``id``), the hidden states (T, H) entering the top ``layers`` decoder layers;
    with ``layers`` 0 only the last token's final (normed) hidden state (1, H), what the head reads.
    Batches hold conversations of similar length (less padding; right padding, so the states equal
    an unpadded forward's)."""
    bar = progress.add_task("frozen layers (once)", total=len(examples))
    cut = model.config.num_hidden_layers - layers
    order = sorted(examples, key=lambda e: len(e.ids))
    out = {}
    for start in range(0, len(order), batch_size):
        part = order[start : start + batch_size]
        ids, mask, lengths = right_padded([torch.tensor(e.ids) for e in part])  # (B, L), (B, L), (B,)
        states = model.model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        hidden = states[cut]  # (B, L, H): entering layer ``cut``; the last entry is after the final norm
        for row, (example, n) in enumerate(zip(part, lengths.tolist())):
            out[id(example)] = hidden[row, n - 1 : n].clone() if layers == 0 else hidden[row, :n].clone()
        progress.advance(bar, len(part))
    return out


def top_scores(top: LlamaModel | None, head: torch.nn.Module, features: list[torch.Tensor]) -> torch.Tensor:
    """Scores (B,) of cached features through the top layers (None: none, the features are the
    last token's final states), pooled at each last token."""
    if top is None:
        return head(torch.cat(features))[:, 0]  # (B,)
    hidden, mask, lengths = right_padded(features)  # (B, L, H), (B, L), (B,)
    last = top(inputs_embeds=hidden, attention_mask=mask, use_cache=False).last_hidden_state  # (B, L, H)
    return head(last[torch.arange(len(features)), lengths - 1])[:, 0]  # (B,)


def train(
    model: LlamaForSequenceClassification,
    train_set: list[Example],
    held: list[Example],
    features: dict[int, torch.Tensor],
    args: argparse.Namespace,
    console: Console,
    progress: Progress,
) -> tuple[list[dict[str, Any]], np.ndarray]:
    """Train the top layers, norm and head with class-balanced BCE; the held-out AUC after each
    epoch, and the last epoch's held-out scores (from the cached features)."""
    top = top_stack(model, args.train_layers) if args.train_layers else None
    params = [*(top.parameters() if top is not None else ()), *model.score.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay)
    positives = sum(e.label for e in train_set)
    pos_weight = torch.tensor((len(train_set) - positives) / max(positives, 1))
    rng, history = np.random.default_rng(args.seed), []
    steps = math.ceil(len(train_set) / args.batch_size)
    bar = progress.add_task("training", total=args.epochs * steps)
    for epoch in range(1, args.epochs + 1):
        model.train()
        order, losses = rng.permutation(len(train_set)), []
        for start in range(0, len(order), args.batch_size):
            part = [train_set[i] for i in order[start : start + args.batch_size]]
            logits = top_scores(top, model.score, [features[id(e)] for e in part])  # (B,)
            labels = torch.tensor([float(e.label) for e in part])  # (B,)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, pos_weight=pos_weight)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            progress.advance(bar)
        model.eval()
        with torch.no_grad():
            scores = np.concatenate(
                [
                    top_scores(top, model.score, [features[id(e)] for e in held[i : i + 64]]).numpy()
                    for i in range(0, len(held), 64)
                ]
            )
        history.append(
            {"epoch": epoch, "train_loss": float(np.mean(losses)), "heldout_auc": auc(scores, [e.label for e in held])}
        )
        if epoch % max(1, args.epochs // 10) == 0 or epoch == args.epochs:
            console.print(
                f"epoch {epoch}: train loss {history[-1]['train_loss']:.4f}, held-out AUC "
                f"{fmt(history[-1]['heldout_auc'])} (cached frozen layers)"
            )
    for p in model.parameters():
        p.requires_grad_(True)
    model.eval()
    return history, scores


# -- figures -----------------------------------------------------------------------------------------
def auc(scores: Any, labels: list[bool]) -> float | None:
    """ROC AUC (ties count half): P(a random positive outscores a random negative); None without both."""
    scores, labels = np.asarray(scores, dtype=np.float64), np.asarray(labels, dtype=bool)
    pos, neg = scores[labels], scores[~labels]
    if not len(pos) or not len(neg):
        return None
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(wins / (len(pos) * len(neg)))


def pair_accuracy(examples: list[Example], scores: Any) -> float | None:
    """Share of (right, wrong) reply pairs of the same question the scores rank right (what a
    group-relative algorithm sees); None without any pair."""
    wins, pairs = 0.0, 0
    for question in {e.question for e in examples}:
        mine = [(s, e.label) for e, s in zip(examples, scores) if e.question == question]
        for s_pos in (s for s, lab in mine if lab):
            for s_neg in (s for s, lab in mine if not lab):
                wins, pairs = wins + (s_pos > s_neg) + 0.5 * (s_pos == s_neg), pairs + 1
    return wins / pairs if pairs else None


def fmt(value: float | None) -> str:
    """A figure to 3 decimals, ``-`` when there is none."""
    return "-" if value is None else f"{value:.3f}"


def figures(held: list[Example], scores: np.ndarray) -> dict[str, Any]:
    """Held-out AUC (all, sampled replies only, written replies only), accuracy at score 0 and
    within-question pair accuracy."""
    labels = [e.label for e in held]
    sampled = [i for i, e in enumerate(held) if e.source == "sampled"]
    written = [i for i, e in enumerate(held) if e.source == "reference"]
    return {
        "auc": auc(scores, labels),
        "auc_sampled": auc(scores[sampled], [labels[i] for i in sampled]),
        "auc_reference": auc(scores[written], [labels[i] for i in written]),
        "accuracy_at_0": float(np.mean((scores > 0) == np.array(labels))),
        "pair_accuracy": pair_accuracy(held, scores),
    }


def saved_scores(folder: Path, examples: list[Example], bf16: bool) -> np.ndarray:
    """Scores of ``examples`` by ``folder`` loaded through the ``rm:`` reward scheme's own class."""
    rm = RewardModel(str(folder), RewardModelConfig(batch_size=16), bf16=bf16)
    return np.array(rm([make_trajectory(e.messages, {"question": e.question}) for e in examples]), dtype=np.float64)


def counts(examples: list[Example]) -> dict[str, Any]:
    """Positives / negatives per source."""
    out: dict[str, Any] = {"examples": len(examples), "questions": len({e.question for e in examples})}
    for source in ("sampled", "reference"):
        mine = [e for e in examples if e.source == source]
        out[source] = {"positives": sum(e.label for e in mine), "negatives": sum(not e.label for e in mine)}
    out["positives"] = sum(e.label for e in examples)
    out["negatives"] = len(examples) - out["positives"]
    return out


def report_table(report: dict[str, Any]) -> Table:
    """Counts and held-out figures, one row per split."""
    table = Table(title="reward model on the math env's correctness labels")
    for column in (
        "split",
        "questions",
        "sampled +/-",
        "reference +/-",
        "AUC",
        "AUC sampled",
        "AUC reference",
        "acc @0",
        "pair acc",
    ):
        table.add_column(column, justify="right")
    for split in ("train", "heldout"):
        c = report["counts"][split]
        row = [
            split,
            str(c["questions"]),
            f"{c['sampled']['positives']}/{c['sampled']['negatives']}",
            f"{c['reference']['positives']}/{c['reference']['negatives']}",
        ]
        shown = report["heldout"] if split == "heldout" else {}
        row += [fmt(shown.get(k)) for k in ("auc", "auc_sampled", "auc_reference", "accuracy_at_0", "pair_accuracy")]
        table.add_row(*row)
    return table


# -- main --------------------------------------------------------------------------------------------
def parse_args() -> argparse.Namespace:
    """The command line (``--tiny`` shrinks every size)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder to write the reward model to (rm:OUT)")
    parser.add_argument("--prompts", type=int, default=128, help="distinct training questions")
    parser.add_argument("--samples", type=int, default=3, help="sampled episodes per question")
    parser.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="passes over the training examples (default: 30 with --train-layers 0, else 3)",
    )
    parser.add_argument(
        "--train-layers",
        type=int,
        default=0,
        help="top decoder layers trained besides the score head (0: the head only)",
    )
    parser.add_argument(
        "--lr", type=float, default=None, help="AdamW learning rate (default: 1e-3 for the head only, else 1e-4)"
    )
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--holdout", type=float, default=0.2, help="share of the questions held out")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--check", type=int, default=16, help="held-out examples the saved folder re-scores through rm: (fp32 and bf16)"
    )
    parser.add_argument("--tiny", action="store_true", help="random 2-layer model, 6 prompts x 2 samples, 2 epochs")
    args = parser.parse_args()
    if args.tiny:
        args.prompts, args.samples, args.epochs, args.check = 6, 2, 2, 10**6
    args.epochs = args.epochs if args.epochs is not None else 3 if args.train_layers else 30
    args.lr = args.lr if args.lr is not None else 1e-4 if args.train_layers else 1e-3
    for key in ("prompts", "samples", "epochs", "batch_size", "check"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
    if args.train_layers < 0:
        parser.error(f"--train-layers must be >= 0, got {args.train_layers}")
    if not 0 < args.holdout < 1:
        parser.error(f"--holdout must be in (0, 1), got {args.holdout}")
    return args


def main() -> None:
    args = parse_args()
    console, began = Console(width=160), time.perf_counter()
    out = Path(args.out)
    config = TrainConfig(env=ENV, seed=args.seed, max_new_tokens=8 if args.tiny else TrainConfig.max_new_tokens)
    manager = load_plugins()
    tokenizer = load_tokenizer(DEFAULT_MODEL)
    causal = build_tiny_model(len(tokenizer)) if args.tiny else load_model(DEFAULT_MODEL)
    args.train_layers = min(args.train_layers, causal.config.num_hidden_layers)
    env = make_env(manager, config)
    tasks = distinct_train_tasks(env, args.prompts)
    console.print(
        f"{len(tasks)} distinct training questions of env {ENV!r}; sampling {args.samples} episodes each "
        f"({config.max_new_tokens} new tokens, T={config.temperature:g})"
    )
    timings: dict[str, float] = {}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        clock = time.perf_counter()
        examples = sampled_examples(manager, config, causal, tokenizer, tasks, args.samples, args.seed, progress)
        examples += reference_examples(env, tasks, args.seed)
        timings["sampling_s"] = time.perf_counter() - clock
        hold_out(examples, args.holdout, args.seed)
        for example in examples:
            example.ids = encode(tokenizer, example.messages)
        model = reward_model_from(causal, tokenizer.pad_token_id, args.seed)
        del causal
        clock = time.perf_counter()
        features = frozen_features(model, examples, args.train_layers, args.batch_size, progress)
        timings["frozen_features_s"] = time.perf_counter() - clock
        train_set = [e for e in examples if e.split == "train"]
        held = [e for e in examples if e.split == "heldout"]
        clock = time.perf_counter()
        history, cached_scores = train(model, train_set, held, features, args, console, progress)
        timings["training_s"] = time.perf_counter() - clock
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    for example, score in zip(held, cached_scores):
        example.score = float(score)
    # The held-out figures come from the trained model's scores (the cached path: frozen layers once,
    # top layers on their output); the saved folder, loaded as rm:OUT loads it, must give the same.
    clock = time.perf_counter()
    spot = held[:: max(1, len(held) // args.check)][: args.check]
    check = {"examples": len(spot)}
    for precision in ("fp32", "bf16"):
        diff = saved_scores(out, spot, bf16=precision == "bf16") - np.array([e.score for e in spot])
        check[f"{precision}_max_abs_diff"] = float(np.max(np.abs(diff)))
    timings["saved_check_s"] = time.perf_counter() - clock
    timings["total_s"] = time.perf_counter() - began
    report = {
        "env": ENV,
        "base_model": "tiny random" if args.tiny else DEFAULT_MODEL,
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "max_new_tokens": config.max_new_tokens,
        "temperature": config.temperature,
        "positives": "sampled replies the env judges correct, and replies written from the reference answer: "
        "\\boxed{ANSWER} and 'A op B = ANSWER. The final answer is \\boxed{ANSWER}.'",
        "negatives": "sampled replies the env judges wrong, and the written replies with ANSWER +- 1 or 2",
        "counts": {"all": counts(examples), "train": counts(train_set), "heldout": counts(held)},
        "heldout_share": len(held) / len(examples),
        "heldout": figures(held, cached_scores),
        "saved_model_check": check,
        "epochs": history,
        "seconds": timings,
    }
    (out / "rm_report.json").write_text(json.dumps(report, indent=2) + "\n")
    with (out / "rm_examples.jsonl").open("w") as f:
        for e in examples:
            f.write(
                json.dumps(
                    {
                        "split": e.split,
                        "source": e.source,
                        "label": e.label,
                        "question": e.question,
                        "messages": e.messages,
                        "score": e.score,
                    }
                )
                + "\n"
            )
    console.print(report_table(report))
    console.print(
        f"positives: {report['positives']}\nnegatives: {report['negatives']}\nthe saved folder loaded as "
        f"rm:{out} on {check['examples']} held-out examples: max |score - trained model's| "
        f"{check['fp32_max_abs_diff']:.1e} in fp32, {check['bf16_max_abs_diff']:.1e} under bf16 autocast"
    )
    console.print(
        f"wrote {out} in {timings['total_s'] / 60:.1f} min (sampling {timings['sampling_s']:.0f} s, "
        f"frozen layers {timings['frozen_features_s']:.0f} s, training {timings['training_s']:.0f} s)"
    )
    console.print(
        f"the reward model as the only reward: agentrl train --env {ENV} --reward rm:{out} --set env_reward_weight=0",
        soft_wrap=True,
        highlight=False,
    )


if __name__ == "__main__":
    main()
