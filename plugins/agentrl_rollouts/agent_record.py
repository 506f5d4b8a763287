"""The token-exact record of one agent-program episode: its endpoint calls merged into segments.

Each ``chat.completions`` call brings a prompt (the conversation the agent sends, rendered with
the chat template) and leaves a completion (the ids the engine sampled, with their logprobs). A
call whose rendered prompt extends the current segment (the segment's tokens decoded, then new
text: the template's closing of the assistant turn, tool results, the next assistant header) is
merged into it: the new text is encoded on its own and masked (loss mask 0), the sampled ids are
appended as sampled (loss mask 1). The model's sampled ids are never re-tokenized (TRAPS 1).

A call that does not extend it (the agent rewrote, trimmed or summarised its history, or a
``stop`` string cut the model's text) starts a new segment of the same episode: its whole prompt is
masked and its sampled ids follow. Every segment becomes a training row; the rows of one episode
share its reward and its group (:func:`agentrl.trajectory.with_segments`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentrl import ChatTokenizer, Turn

Message = dict[str, Any]


@dataclass
class Segment:
    """A run of calls whose prompts each extend the one before: one token-exact row."""

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    turns: list[Turn] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    """The last call's conversation and the assistant message it got back (raw sampled text)."""
    tools: list[dict[str, Any]] | None = None
    """Schemas the template rendered with ``tools=`` (None: described in the system message)."""


@dataclass
class EpisodeRecord:
    """Every call of one episode, as segments; ``raw_texts`` maps each tool-call id the endpoint
    issued to the exact text the model sampled, so a returned assistant message re-renders as it
    was sampled."""

    segments: list[Segment] = field(default_factory=list)
    raw_texts: dict[str, str] = field(default_factory=dict)
    calls: int = 0

    @property
    def length(self) -> int:
        """Tokens of the current segment (0 before the first call)."""
        return len(self.segments[-1].token_ids) if self.segments else 0

    def prompt_ids(self, chat: ChatTokenizer, text: str) -> tuple[list[int], bool]:
        """The ids this call's prompt adds to the current segment and whether it extends it
        (False: the ids are the whole prompt of a new segment)."""
        if self.segments:
            segment = self.segments[-1]
            stopped = bool(segment.turns) and segment.turns[-1].finish_reason == "stop"
            ends = [segment.token_ids] + ([segment.token_ids[:-1]] if stopped else [])
            for ids in ends:  # the sampled stop token may stand for the template's own closing text
                done = chat.decode(ids)
                if text.startswith(done):
                    return chat.encode(text[len(done):]), True
        return chat.encode(text), False

    def add(self, prompt: list[int], extends: bool, sampled: list[int], logprobs: list[float],
            reason: str, messages: list[Message], tools: list[dict[str, Any]] | None,
            tool_calls: tuple[int, int] = (0, 0)) -> None:
        """Record one call: ``prompt`` from :meth:`prompt_ids`, then the sampled ids; ``tool_calls``
        is (calls the reply wrote, of which malformed or to an unknown tool): :func:`count_calls`."""
        if not extends or not self.segments:
            self.segments.append(Segment([], [], [], tools=tools))
        segment = self.segments[-1]
        segment.token_ids += prompt
        segment.loss_mask += [0] * len(prompt)
        segment.logprobs += [0.0] * len(prompt)
        start = len(segment.token_ids)
        segment.token_ids += sampled
        segment.loss_mask += [1] * len(sampled)
        segment.logprobs += [float(x) for x in logprobs]
        segment.turns.append(Turn(start=start, end=len(segment.token_ids), finish_reason=reason,
                                  tool_calls=tool_calls[0], tool_errors=tool_calls[1]))
        segment.messages = list(messages)
        self.calls += 1


def count_calls(text: str, parser: Any, tools: list[dict[str, Any]] | None) -> tuple[int, int]:
    """(tool calls ``text`` writes, of which malformed or naming a tool not offered): what the
    episode's turns count, so ``tool_use`` and the tool metrics read agent episodes as env ones
    (whether the agent then ran a call is its own business: a well-formed call counts as ran)."""
    if not tools:
        return 0, 0
    names = {t.get("function", t).get("name") for t in tools}
    calls = parser(text)
    return len(calls), sum(c.error is not None or c.arguments is None or c.name not in names for c in calls)
