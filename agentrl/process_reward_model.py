"""A process reward model (PRM) as a reward: each reasoning step scored by a local model.

:class:`ProcessRewardModel` is a reward function (``fn(trajectories)``) returning one
:class:`agentrl.StepRewards` per episode. The steps are the model's turns split at ``separator``
(default a blank line, :func:`agentrl.step_ends`); the score of a step is the output of a local
``AutoModelForTokenClassification`` folder (``num_labels=1``, a causal decoder such as
``LlamaForTokenClassification`` or ``Qwen2ForTokenClassification``) at the PRM token holding the
step's last character. A causal model's output there depends on the text up to that point only,
so one forward of the whole episode scores every prefix ending at a step (what a
sequence-classification PRM would need one forward per step for). A bidirectional model (BERT)
would see later steps: use a decoder.

A PRM with the policy's vocabulary reads the episode's own tokens (prompt, replies, env messages),
and a step's score is its output at the step's last token: exactly what a forward of the prefix
alone gives. Otherwise the PRM reads the episode's text (each token decoded on its own by the
policy's tokenizer and concatenated: the text :func:`agentrl.step_ends` finds separators in),
re-tokenized by its own tokenizer with character offsets (a token spanning a step's end may then
differ from the prefix's own tokenization). Episodes
longer than ``max_length`` PRM tokens keep their last ``max_length`` tokens; a step ending in the
cut part is left out (counted in ``truncated_steps``). The model is loaded once, on the first
call, in eval mode, and scores ``batch_size`` episodes per forward, without gradients.

Usage: ``prm = ProcessRewardModel("path/to/prm")`` in a file, then ``--reward file.py:prm``.
"""

from __future__ import annotations

from typing import Any

import torch

from agentrl.process_rewards import StepRewards, step_ends
from agentrl.trajectory import Trajectory


class ProcessRewardModel:
    """Step rewards from a local token-classification PRM (module docstring). ``policy_tokenizer``:
    the policy's tokenizer, or its model name or folder (default: agentrl's default model)."""

    def __init__(self, path: str, policy_tokenizer: str | Any | None = None, separator: str = "\n\n",
                 batch_size: int = 8, max_length: int = 4096, device: str | None = None) -> None:
        if not separator:
            raise ValueError("ProcessRewardModel separator '' is invalid: expected a non-empty string such as '\\n\\n'")
        if batch_size < 1 or max_length < 2:
            raise ValueError(f"ProcessRewardModel batch_size={batch_size}, max_length={max_length} are invalid: "
                             "expected batch_size >= 1 and max_length >= 2")
        self.path, self.separator, self.batch_size, self.max_length = str(path), separator, batch_size, max_length
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self._policy_tokenizer = policy_tokenizer
        self.model: Any = None
        self.tokenizer: Any = None
        self.same_vocab = False
        """Whether the PRM's vocabulary is the policy's (then it reads the episode's tokens as they are)."""
        self.truncated_steps = 0
        """Steps left out so far because they ended before an episode's last ``max_length`` PRM tokens."""

    def load(self) -> None:
        """Load the PRM, its tokenizer and the policy's tokenizer (once)."""
        if self.model is not None:
            return
        from transformers import AutoModelForTokenClassification, AutoTokenizer

        from agentrl.models import DEFAULT_MODEL, load_tokenizer

        if self._policy_tokenizer is None or isinstance(self._policy_tokenizer, str):  # a name, a folder
            self._policy_tokenizer = load_tokenizer(self._policy_tokenizer or DEFAULT_MODEL)
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        if not self.tokenizer.is_fast:
            raise ValueError(f"PRM {self.path!r} has a slow tokenizer: character offsets need a fast one")
        self.same_vocab = self.tokenizer.get_vocab() == self._policy_tokenizer.get_vocab()
        model = AutoModelForTokenClassification.from_pretrained(self.path)
        if model.config.num_labels != 1:
            raise ValueError(f"PRM {self.path!r} has num_labels={model.config.num_labels}: expected 1 (a score per token)")
        self.model = model.to(self.device).eval()

    def __call__(self, trajectories: list[Trajectory]) -> list[StepRewards]:
        """One StepRewards per episode (no step: an empty one, i.e. not scored)."""
        self.load()
        out: list[StepRewards] = []
        for first in range(0, len(trajectories), self.batch_size):
            out += self._score(trajectories[first:first + self.batch_size])
        return out

    def text_and_ends(self, trajectory: Trajectory) -> tuple[str, list[int], list[int]]:
        """The episode's text, its step-end token positions and each step's last character index."""
        pieces = [self._policy_tokenizer.decode([tid]) for tid in trajectory.token_ids]
        ends = step_ends(trajectory, self._policy_tokenizer, self.separator)
        stops, length = [], 0
        for position, piece in enumerate(pieces):
            length += len(piece)
            stops.append(length - 1)
        return "".join(pieces), ends, [stops[p] for p in ends]

    @torch.no_grad()
    def _score(self, trajectories: list[Trajectory]) -> list[StepRewards]:
        """One padded forward of ``trajectories``: the score at each step's last character."""
        texts, ends, chars = zip(*(self.text_and_ends(t) for t in trajectories))
        if self.same_vocab:  # the policy's own tokens: a step's score is the PRM's output at its last token
            encoded = {"input_ids": [t.token_ids for t in trajectories],
                       "offset_mapping": [[(p, p + 1) for p in range(len(t.token_ids))] for t in trajectories]}
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
        input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows], dtype=torch.long, device=self.device)
        attention = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], dtype=torch.long,
                                 device=self.device)
        logits = self.model(input_ids=input_ids, attention_mask=attention).logits[..., 0].float().cpu()  # (B, L)
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
