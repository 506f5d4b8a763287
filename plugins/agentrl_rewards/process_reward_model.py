"""The ``prm`` reward scheme: a process reward model (PRM) scores each reasoning step of an episode.

``--reward prm:path/to/prm[:WEIGHT]`` names a local ``AutoModelForTokenClassification`` folder
(``num_labels: 1``, a causal decoder such as ``LlamaForTokenClassification`` or
``Qwen2ForTokenClassification``) with its tokenizer. The reward returns one
:class:`agentrl.StepRewards` per episode: the steps are the model's turns split at ``separator``
(default a blank line, :func:`agentrl.step_ends`); the score of a step is the PRM's output at the
PRM token holding the step's last character. A causal model's output there depends on the text up
to that point only, so one forward of the whole episode scores every prefix ending at a step (what
a sequence-classification PRM would need one forward per step for). A bidirectional model (BERT)
would see later steps: use a decoder. With ``algorithm.advantage: process`` the steps become the
process-supervised advantage (:func:`agentrl.process_advantages`).

A PRM with the policy's vocabulary reads the episode's own tokens (prompt, replies, env messages),
and a step's score is its output at the step's last token: exactly what a forward of the prefix
alone gives. Otherwise the PRM reads the episode's text (each token decoded on its own by the
policy's tokenizer and concatenated: the text :func:`agentrl.step_ends` finds separators in),
re-tokenized by its own tokenizer with character offsets (a token spanning a step's end may then
differ from the prefix's own tokenization). Episodes longer than ``max_length`` PRM tokens keep
their last ``max_length`` tokens; a step ending in the cut part is left out (counted in the metric
``prm/truncated_steps``). The scheme loads the PRM once per run, in eval mode on the run's device,
and scores ``batch_size`` episodes per forward without gradients, in float32 or under bf16
autocast as the run's precision says; the policy's tokenizer is the run's
(:attr:`agentrl.RewardContext.tokenizer`, read at the first call). Options: the
``plugins.process_reward_model`` settings section.

In Python, ``ProcessRewardModel(path, policy_tokenizer=...)`` is the same reward without a run
(``--reward file.py:prm``); it loads on its first call.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import torch
from pydantic import Field

from agentrl import (
    Allowed,
    ConfigError,
    RewardContext,
    RewardError,
    StepRewards,
    Trajectory,
    check_declared,
    load_for_role,
    load_tokenizer_for_role,
    step_ends,
)

SECTION = "process_reward_model"


class ProcessRewardModelError(ConfigError, ValueError):
    """A process reward model's folder or options are unusable (a ValueError too, as it always was)."""


@dataclass(frozen=True)
class ProcessRewardModelConfig:
    """The ``plugins.process_reward_model`` section: how every ``prm:`` reward of the run scores."""

    separator: Annotated[str, Field(min_length=1), Allowed("a non-empty string such as '\\n\\n'")] = "\n\n"
    """Where a model turn splits into steps: each step ends with the token completing a separator
    (and the turn's last step with the turn)."""
    batch_size: Annotated[int, Field(ge=1)] = 8
    """Episodes per PRM forward pass (scores do not depend on it)."""
    max_length: Annotated[int, Field(ge=2)] = 4096
    """PRM tokens read per episode; longer episodes keep their last ``max_length`` tokens (steps
    ending before them are left out, counted in ``prm/truncated_steps``)."""

    def __post_init__(self) -> None:
        """Refuse a value outside its declared range, naming the key."""
        check_declared(self, f"plugins.{SECTION}", error=ProcessRewardModelError)


class ProcessRewardModel:
    """Step rewards from a local token-classification PRM (module docstring) as a reward function
    ``fn(trajectories) -> list[StepRewards]``. ``policy_tokenizer``: the policy's tokenizer, or its
    model name or folder; ``context``: a run's :class:`agentrl.RewardContext`, whose tokenizer is
    used when ``policy_tokenizer`` is None. ``device`` None: CUDA when there is one."""

    def __init__(
        self,
        path: str,
        policy_tokenizer: str | Any | None = None,
        separator: str = "\n\n",
        batch_size: int = 8,
        max_length: int = 4096,
        device: Any = None,
        bf16: bool = False,
        context: RewardContext | None = None,
    ) -> None:
        if not separator:
            raise ProcessRewardModelError(
                "ProcessRewardModel separator '' is invalid: expected a non-empty string such as '\\n\\n'"
            )
        if batch_size < 1 or max_length < 2:
            raise ProcessRewardModelError(
                f"ProcessRewardModel batch_size={batch_size}, max_length={max_length} are "
                "invalid: expected batch_size >= 1 and max_length >= 2"
            )
        self.path, self.separator, self.batch_size, self.max_length = str(path), separator, batch_size, max_length
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.bf16, self.context = bf16, context
        self._policy_tokenizer = policy_tokenizer
        self.model: Any = None
        self.tokenizer: Any = None
        self.same_vocab = False
        """Whether the PRM's vocabulary is the policy's (then it reads the episode's tokens as they are)."""
        self.truncated_steps = 0
        """Steps left out so far because they ended before an episode's last ``max_length`` PRM tokens."""
        self._reported = 0
        self._ready = False

    def load_model(self) -> None:
        """Load the PRM and its tokenizer (once); a one-line error naming the folder when it holds none."""
        if self.model is not None:
            return
        # Checked for the role first (agentrl.model.roles): a folder, a readable config, weights and a
        # tokenizer, a token-classification head of one output, no weight freshly initialised.
        model = load_for_role("prm", self.path, error=ProcessRewardModelError)
        tokenizer = load_tokenizer_for_role("prm", self.path, error=ProcessRewardModelError)
        if not tokenizer.is_fast:
            raise ProcessRewardModelError(
                f"prm: {self.path} has a slow tokenizer: character offsets need a fast one (tokenizer.json)"
            )
        self.tokenizer, self.model = tokenizer, model.to(device=self.device, dtype=torch.float32).eval()

    def load(self) -> None:
        """Load the PRM (:meth:`load_model`) and find the policy's tokenizer (once)."""
        if self._ready:
            return
        self.load_model()
        if self._policy_tokenizer is None and self.context is not None:
            self._policy_tokenizer = self.context.tokenizer
        if self._policy_tokenizer is None:
            raise RewardError(
                f"ProcessRewardModel({self.path!r}) has no policy tokenizer: pass policy_tokenizer= "
                "(a tokenizer, a model name or folder), or use --reward prm:PATH, which reads the run's"
            )
        if isinstance(self._policy_tokenizer, (str, Path)):  # a name, a folder
            from transformers import AutoTokenizer

            self._policy_tokenizer = AutoTokenizer.from_pretrained(self._policy_tokenizer)
        self.same_vocab = self.tokenizer.get_vocab() == self._policy_tokenizer.get_vocab()
        self._ready = True

    def __call__(self, trajectories: list[Trajectory]) -> list[StepRewards]:
        """One StepRewards per episode (no step: an empty one, i.e. not scored)."""
        self.load()
        out: list[StepRewards] = []
        for first in range(0, len(trajectories), self.batch_size):
            out += self._score(trajectories[first : first + self.batch_size])
        return out

    def pop_metrics(self) -> dict[str, float]:
        """Steps left out since the last call (logged as ``prm/truncated_steps``)."""
        count, self._reported = self.truncated_steps - self._reported, self.truncated_steps
        return {"truncated_steps": float(count)}

    def text_and_ends(self, trajectory: Trajectory) -> tuple[str, list[int], list[int]]:
        """The episode's text, its step-end token positions and each step's last character index."""
        pieces = [self._policy_tokenizer.decode([tid]) for tid in trajectory.token_ids]
        ends = step_ends(trajectory, self._policy_tokenizer, self.separator)
        stops, length = [], 0
        for piece in pieces:
            length += len(piece)
            stops.append(length - 1)
        return "".join(pieces), ends, [stops[p] for p in ends]

    @torch.no_grad()
    def _score(self, trajectories: list[Trajectory]) -> list[StepRewards]:
        """One padded forward of ``trajectories``: the score at each step's last character."""
        texts, ends, chars = zip(*(self.text_and_ends(t) for t in trajectories))
        if self.same_vocab:  # the policy's own tokens: a step's score is the PRM's output at its last token
            encoded = {
                "input_ids": [t.token_ids for t in trajectories],
                "offset_mapping": [[(p, p + 1) for p in range(len(t.token_ids))] for t in trajectories],
            }
            chars = tuple(list(e) for e in ends)
        else:
            encoded = self.tokenizer(list(texts), return_offsets_mapping=True, add_special_tokens=False)
        rows, owners = [], []
        for ids, offsets in zip(encoded["input_ids"], encoded["offset_mapping"]):
            cut = max(len(ids) - self.max_length, 0)  # keep the last max_length tokens
            rows.append(list(ids[cut:]))
            owners.append([(start, stop, index - cut) for index, (start, stop) in enumerate(offsets)])
        width = max((len(r) for r in rows), default=0)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows], dtype=torch.long)  # (B, L)
        attention = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], dtype=torch.long)  # (B, L)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            logits = self.model(input_ids=input_ids.to(self.device), attention_mask=attention.to(self.device)).logits
        logits = logits[..., 0].float().cpu()  # (B, L)
        out = []
        for i in range(len(trajectories)):
            positions, values = [], []
            for position, char in zip(ends[i], chars[i]):
                token = _token_at(owners[i], char)
                if token is None or token < 0:
                    self.truncated_steps += token is not None
                    continue
                positions.append(position)
                values.append(float(logits[i, token]))
            out.append(StepRewards.at(positions, values))
        return out


def _token_at(owners: list[tuple[int, int, int]], char: int) -> int | None:
    """The (kept) index of the PRM token whose characters include ``char``: the last token starting
    at or before it (a character no token covers, e.g. whitespace a tokenizer folds, goes to the
    token before); None when none starts before it."""
    found = None
    for start, stop, index in owners:
        if start > char:
            break
        if stop > start:
            found = index
    return found


def process_reward_model_scheme(argument: str, context: RewardContext) -> ProcessRewardModel:
    """``prm:PATH``: the PRM at ``PATH``, loaded now, on the run's device and in its precision, with
    the run's ``plugins.process_reward_model`` options; the policy's tokenizer is the run's."""
    options = context.settings.get(SECTION) or ProcessRewardModelConfig()
    precision = context.precision
    prm = ProcessRewardModel(
        argument,
        separator=options.separator,
        batch_size=options.batch_size,
        max_length=options.max_length,
        device=context.device,
        bf16=bool(precision is not None and precision.bf16),
        context=context,
    )
    prm.load_model()
    return prm
