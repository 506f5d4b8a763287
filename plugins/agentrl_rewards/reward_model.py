"""The ``rm`` reward scheme: a learned reward model scores each episode's whole conversation.

``--reward rm:path/to/model[:WEIGHT]`` names a local folder holding an
``AutoModelForSequenceClassification`` with ``num_labels: 1`` (one score per sequence) and its
tokenizer; ``--reward path/to/model`` (TRL's ``reward_funcs="path/to/model"``) is the same reward
when the folder holds one (``bare_folder`` in :mod:`agentrl.rewards.schemes`). The model is
loaded once per run (each ``rm:`` reward its own copy), in eval mode on the run's device; its
forward passes run without gradients, in float32 or under bf16 autocast as the run's precision says.

What it reads: every message of the episode (system, prompt, each reply and tool result: the
whole multi-turn conversation) rendered by the reward model's **own** tokenizer and chat template
(``apply_chat_template(messages, tokenize=False)``, tokenized without adding special tokens again).
A tokenizer with no chat template gets ``role: content`` blocks joined by blank lines, tokenized
with the tokenizer's special tokens (its BOS). Conversations longer than ``max_length`` tokens are
truncated from the left (the end of the episode, where the answer is, is kept) and counted in the
metric ``rm/truncated``. Options: the ``plugins.reward_model`` settings section.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
import torch
from pydantic import Field

from agentrl import ConfigError, OneOf, RewardContext, Trajectory, load_for_role, load_tokenizer_for_role

SECTION = "reward_model"


@dataclass(frozen=True)
class RewardModelConfig:
    """The ``plugins.reward_model`` section: how every ``rm:`` reward of the run scores."""

    batch_size: Annotated[int, Field(ge=1)] = 8
    """Conversations per forward pass (scores do not depend on it)."""
    max_length: Annotated[int, Field(ge=0)] = 0
    """Tokens the reward model reads per conversation; longer ones keep their last ``max_length``
    tokens (counted in ``rm/truncated``). 0: the model's own limit (the tokenizer's
    ``model_max_length`` or the config's ``max_position_embeddings``, the smaller)."""
    normalize: Annotated[str, OneOf("none", "batch")] = "none"
    """``none``: the raw score; ``batch``: standardised over the episodes scored together (mean 0,
    std 1; all 0 when they are equal), before ``scale`` and ``shift``."""
    scale: float = 1.0
    """Multiplies the (normalised) score."""
    shift: float = 0.0
    """Added after ``scale``: reward = score x scale + shift."""


class RewardModel:
    """A sequence-classification reward model as a reward function ``fn(trajectories)``."""

    def __init__(self, path: str, options: RewardModelConfig, device: Any = "cpu", bf16: bool = False) -> None:
        # Checked for the role first: a folder, a readable config, weights and a tokenizer, a
        # sequence-classification head of one output, no weight freshly initialised.
        # (a ModelFolderError, a ConfigError too: one line naming the folder).
        model = load_for_role("rm", path)
        self.tokenizer = load_tokenizer_for_role("rm", path)
        self.path, self.options, self.device, self.bf16 = path, options, torch.device(device), bf16
        self.model = model.to(device=self.device, dtype=torch.float32).eval()
        self.max_length = options.max_length or own_limit(self.tokenizer, self.model.config, path)
        self.truncated = 0

    def __call__(self, trajectories: list[Trajectory]) -> list[float | None]:
        """One score per episode (its whole conversation), normalised as the options say."""
        ids = [self.encode(t.messages) for t in trajectories]
        raw = np.full(len(ids), np.nan)  # (N,)
        present = [i for i, seq in enumerate(ids) if seq]
        size = self.options.batch_size
        for start in range(0, len(present), size):
            chunk = present[start : start + size]
            raw[chunk] = self.forward([ids[i] for i in chunk])
        scores = normalized(raw, self.options.normalize) * self.options.scale + self.options.shift
        return [None if np.isnan(x) else float(x) for x in scores]

    def encode(self, messages: list[dict[str, Any]]) -> list[int]:
        """The conversation's token ids as the reward model reads them, truncated from the left."""
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template(messages, tokenize=False)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            ids = self.tokenizer(plain_text(messages))["input_ids"]
        if len(ids) > self.max_length:
            self.truncated += 1
            ids = ids[-self.max_length :]
        return list(ids)

    @torch.no_grad()
    def forward(self, batch: list[list[int]]) -> list[float]:
        """Scores of token-id sequences in one right-padded forward pass."""
        # Pad with an id none of them holds: the model pools at the last non-pad token, so a pad id
        # that also occurs in the text (an end-of-turn token) cannot move the pooled position.
        present = {tok for seq in batch for tok in seq}
        pad = next(tok for tok in range(self.model.config.vocab_size - 1, -1, -1) if tok not in present)
        self.model.config.get_text_config().pad_token_id = pad
        width = max(len(seq) for seq in batch)
        input_ids = torch.full((len(batch), width), pad, dtype=torch.long)  # (B, L)
        attention = torch.zeros((len(batch), width), dtype=torch.long)  # (B, L)
        for row, seq in enumerate(batch):
            input_ids[row, : len(seq)] = torch.tensor(seq)
            attention[row, : len(seq)] = 1
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            logits = self.model(input_ids=input_ids.to(self.device), attention_mask=attention.to(self.device)).logits
        return [float(x) for x in logits[:, 0].float().cpu()]  # (B,)

    def pop_metrics(self) -> dict[str, float]:
        """Conversations truncated since the last call (logged as ``rm/truncated``)."""
        count, self.truncated = self.truncated, 0
        return {"truncated": float(count)}


def own_limit(tokenizer: Any, config: Any, path: str) -> int:
    """The reward model's own token limit; ConfigError when it states none."""
    limits = [
        value
        for value in (getattr(tokenizer, "model_max_length", None), getattr(config, "max_position_embeddings", None))
        if isinstance(value, int) and 0 < value < 10**7
    ]
    if not limits:
        raise ConfigError(f"reward model {path!r} states no length limit: set plugins.{SECTION}.max_length")
    return min(limits)


def plain_text(messages: list[dict[str, Any]]) -> str:
    """A conversation for a tokenizer without a chat template: ``role: content`` blocks."""
    return "\n\n".join(f"{m.get('role', '')}: {m.get('content') or ''}" for m in messages)


def normalized(raw: np.ndarray, how: str) -> np.ndarray:
    """``raw`` (NaN: not scored) standardised over its scored values for ``batch``; as is for ``none``."""
    if how == "none" or not np.isfinite(raw).any():
        return raw
    mean, std = np.nanmean(raw), np.nanstd(raw)
    return (raw - mean) / std if std > 0 else raw - mean


def reward_model_scheme(argument: str, context: RewardContext) -> RewardModel:
    """``rm:PATH``: the reward model at ``PATH`` on the run's device and in its precision."""
    options = context.settings.get(SECTION) or RewardModelConfig()
    precision = context.precision
    return RewardModel(argument, options, device=context.device, bf16=bool(precision is not None and precision.bf16))
