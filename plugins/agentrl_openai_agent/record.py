"""The token-exact record of one agent-program episode: its endpoint calls merged into segments.

Each ``chat.completions`` call brings a prompt (the conversation the agent sends, rendered with
the chat template) and leaves a completion (the ids the engine sampled, with their logprobs). A
call whose rendered prompt extends the current segment (the segment's tokens decoded, then new
text: the template's closing of the assistant turn, tool results, the next assistant header) is
merged into it: the new text is encoded on its own and masked (loss mask 0), the sampled ids are
appended as sampled (loss mask 1). The model's sampled ids are never re-tokenized
(docs/concepts/guards.md#multi-turn-tokens).

A call that does not extend it (the agent rewrote, trimmed or summarised its history, or a
``stop`` string cut the model's text) starts a new segment of the same episode: its whole prompt is
masked and its sampled ids follow. Every segment becomes a training row; the rows of one episode
share its reward and its group (:func:`agentrl.trajectory.with_segments`).

A call with ``n > 1`` samples n choices of one prompt (:meth:`EpisodeRecord.add_choices`). The
choice the agent continues with (the one the next call's prompt extends; the first when none
does) is merged as above; each other choice is a segment of its own, recorded as a separate call
with the same prompt would be: the whole prompt masked, its sampled ids after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentrl import ChatTokenizer, Turn
from agentrl_openai_agent.calls import CallLog

Message = dict[str, Any]
REFUSALS = ("bad_requests", "refused_calls", "server_errors")
"""Kinds of refused requests an episode counts: invalid bodies (400, 413); calls its URL may not
take (401 another episode's api key, 410 after its agent returned); errors answering (500)."""


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
    choices: list[tuple[Segment, Segment]] = field(default_factory=list)
    """The last call's choices when it had ``n > 1``, each (merged, as a segment of its own): the
    last segments are the others' own segments and then the chosen one merged."""
    refused: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REFUSALS, 0))
    """Requests to this episode's URL the endpoint refused, by kind (:data:`REFUSALS`)."""
    log: CallLog = field(default_factory=CallLog)
    """Each call as the episode store keeps it (the episode's ``calls``: :mod:`agentrl_openai_agent.calls`)."""

    def count_refused(self, status: int) -> None:
        """Count a request answered with HTTP ``status`` (4xx or 5xx)."""
        kind = "bad_requests" if status in (400, 413) else "server_errors" if status >= 500 else "refused_calls"
        self.refused[kind] += 1

    def metrics(self) -> dict[str, float]:
        """The episode's ``info["metrics"]``: its refused requests by kind (``env/agent/...`` in the step's log)."""
        return {f"agent/{kind}": float(n) for kind, n in self.refused.items()}

    @property
    def length(self) -> int:
        """Tokens of the current segment (0 before the first call)."""
        return len(self.segments[-1].token_ids) if self.segments else 0

    def prompt_ids(self, chat: ChatTokenizer, text: str) -> tuple[list[int], bool]:
        """The ids this call's prompt adds to the current segment and whether it extends it
        (False: the ids are the whole prompt of a new segment)."""
        candidates = [merged for merged, _ in self.choices] or self.segments[-1:]
        for number, segment in enumerate(candidates):
            stopped = bool(segment.turns) and segment.turns[-1].finish_reason == "stop"
            ends = [segment.token_ids] + ([segment.token_ids[:-1]] if stopped else [])
            for ids in ends:  # the sampled stop token may stand for the template's own closing text
                done = chat.decode(ids)
                if text.startswith(done):
                    self._continue_with(number)
                    return chat.encode(text[len(done) :]), True
        self._continue_with(0)
        return chat.encode(text), False

    def _continue_with(self, number: int) -> None:
        """Make choice ``number`` of the last ``n > 1`` call the merged one (the last segment)."""
        if self.choices:
            del self.segments[-len(self.choices) :]
            self.segments += [alone for i, (_, alone) in enumerate(self.choices) if i != number]
            self.segments.append(self.choices[number][0])
            self.choices = []

    def add_call(
        self,
        prompt: list[int],
        extends: bool,
        sampled: list[tuple[list[int], list[float], str, list[Message]]],
        tools: list[dict[str, Any]] | None,
        counts: list[tuple[int, int]],
        generations: list[Any],
    ) -> None:
        """Record one answered call: :meth:`add` for one choice, :meth:`add_choices` for several;
        each choice's turn gets its generation's policy versions (of the ids kept)."""
        if len(sampled) == 1:
            self.add(prompt, extends, *sampled[0], tools, counts[0])
            turns = [self.segments[-1].turns[-1]]
        else:  # n > 1: the choice the agent continues with is merged, the others are segments of their own
            self.add_choices(prompt, extends, sampled, tools, counts)
            turns = [alone.turns[-1] for _, alone in self.choices]
        for turn, generation in zip(turns, generations):  # the kept ids are the first ones sampled
            turn.policy_version = generation.policy_version
            if generation.token_versions is not None:
                turn.token_versions = list(generation.token_versions[: turn.end - turn.start])

    def add(
        self,
        prompt: list[int],
        extends: bool,
        sampled: list[int],
        logprobs: list[float],
        reason: str,
        messages: list[Message],
        tools: list[dict[str, Any]] | None,
        tool_calls: tuple[int, int] = (0, 0),
    ) -> None:
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
        segment.turns.append(
            Turn(
                start=start,
                end=len(segment.token_ids),
                finish_reason=reason,
                tool_calls=tool_calls[0],
                tool_errors=tool_calls[1],
            )
        )
        segment.messages = list(messages)
        self.calls += 1

    def add_choices(
        self,
        prompt: list[int],
        extends: bool,
        choices: list[tuple[list[int], list[float], str, list[Message]]],
        tools: list[dict[str, Any]] | None,
        counts: list[tuple[int, int]] | None = None,
    ) -> None:
        """Record one call with several choices, each (sampled ids, logprobs, finish reason,
        conversation): the first merged for now; the next :meth:`prompt_ids` keeps the one it extends.
        ``counts``: each choice's tool calls (:func:`count_calls`)."""
        base = self.segments.pop() if extends and self.segments else Segment([], [], [], tools=tools)
        context = base.token_ids + prompt
        self.choices = []
        for (ids, logprobs, reason, messages), (calls, errors) in zip(choices, counts or [(0, 0)] * len(choices)):
            turn = Turn(
                start=len(context),
                end=len(context) + len(ids),
                finish_reason=reason,
                tool_calls=calls,
                tool_errors=errors,
            )
            sampled = ([1] * len(ids), [float(x) for x in logprobs])
            merged = Segment(
                context + ids,
                base.loss_mask + [0] * len(prompt) + sampled[0],
                base.logprobs + [0.0] * len(prompt) + sampled[1],
                base.turns + [turn],
                list(messages),
                base.tools,
            )
            alone = Segment(
                context + ids,
                [0] * len(context) + sampled[0],
                [0.0] * len(context) + sampled[1],
                [turn],
                list(messages),
                base.tools,
            )
            self.choices.append((merged, alone))
        self.segments += [alone for _, alone in self.choices[1:]] + [self.choices[0][0]]
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
