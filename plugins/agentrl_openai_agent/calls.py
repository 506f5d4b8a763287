"""Each endpoint call of one agent episode as the episode store keeps it: the episode's ``calls``.

An agent's calls usually repeat their conversation: call k sends call k-1's messages, its reply
and the tool results. So each entry keeps only the messages after those its call shares with the
call before (``prefix_messages``: how many leading messages equal the previous call's, exactly as
sent), which keeps an episode's entries linear in its conversation's length, not quadratic. The
conversation call k sent is ``sent(k-1)[:prefix_messages] + messages`` (:func:`sent_messages`).

Each entry (in call order)::

    {"segment": 0, "prefix_messages": 0, "messages": [...], "reply": {"role": "assistant", ...},
     "prompt_tokens": 57, "sampled_tokens": 12, "cut": "first call"}

``segment`` is the conversation segment the call's tokens went into (:mod:`agentrl_openai_agent.record`;
the other choices of an ``n > 1`` call, rows of their own, are not numbered), ``reply`` the
assistant message the endpoint returned (the first choice's; ``n > 1``: the others in
``other_replies``), ``prompt_tokens`` the tokens the model was given (the segment so far and the
new prompt), ``sampled_tokens`` the tokens it sampled (all choices), ``cut`` None when the call
extended the segment, else why it began a new one: ``first call``, ``history rewritten: message
i differs``, ``history trimmed: ...``, ``tools changed`` or ``re-rendered differently (same
messages)``. Nothing in an entry depends on timing, so a resumed run's store equals a straight run's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Message = dict[str, Any]
REBUILT_SHARE = 0.5
"""The share of an agent's later calls (after each episode's first) beginning a new segment on a
rewritten history from which the rollout warns that the agent rebuilds it."""


@dataclass
class CallLog:
    """The ``calls`` of one episode, built call by call (:meth:`add`)."""

    calls: list[dict[str, Any]] = field(default_factory=list)
    sent: list[Message] = field(default_factory=list)
    """The last call's messages, as sent."""
    reply: Message | None = None
    """The last call's reply (its first choice)."""
    tools: list[dict[str, Any]] | None = None
    """The last call's tools (None: none offered)."""
    segments: int = 0
    """Conversation segments so far (calls that did not extend the one before, the first included)."""
    rewrites: int = 0
    """Of those, the calls that began one because the agent rewrote or trimmed its history."""

    def add(
        self,
        sent: list[Message],
        tools: list[dict[str, Any]] | None,
        extends: bool,
        replies: list[Message],
        tokens: tuple[int, int],
    ) -> None:
        """Log one answered call: the ``sent`` messages and ``tools``, whether its prompt ``extends``
        the segment, the assistant message of each choice and (prompt, sampled) token counts."""
        cut = None if extends and self.calls else self.cut_reason(sent, tools)
        self.segments += cut is not None
        self.rewrites += cut is not None and cut.startswith("history")
        prefix = 0
        for old, new in zip(self.sent, sent):
            if old != new:
                break
            prefix += 1
        entry: dict[str, Any] = {
            "segment": self.segments - 1,
            "prefix_messages": prefix,
            "messages": [dict(m) for m in sent[prefix:]],
            "reply": dict(replies[0]),
            "prompt_tokens": tokens[0],
            "sampled_tokens": tokens[1],
            "cut": cut,
        }
        if len(replies) > 1:
            entry["other_replies"] = [dict(m) for m in replies[1:]]
        self.calls.append(entry)
        self.sent, self.reply, self.tools = list(sent), dict(replies[0]), tools

    def cut_reason(self, sent: list[Message], tools: list[dict[str, Any]] | None) -> str:
        """Why a call whose prompt does not extend the segment began a new one, from what it sent
        beside the previous call's messages and reply."""
        if not self.calls:
            return "first call"
        before = [*self.sent, *([self.reply] if self.reply is not None else [])]
        for index, (old, new) in enumerate(zip(before, sent)):
            if _key(old) != _key(new):
                what = "the previous reply" if index == len(self.sent) else "the previous call's"
                return f"history rewritten: message {index} differs from {what}"
        if len(sent) < len(before):
            return f"history trimmed: {len(sent)} messages, the previous call's conversation had {len(before)}"
        if (tools or None) != (self.tools or None):
            return "tools changed"
        return "re-rendered differently (same messages)"


def _key(message: Message) -> tuple[Any, ...]:
    """What makes two messages the same conversation turn (an agent may send back a reply with an
    empty content as None, or with fields of its own)."""
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    calls = [
        (c.get("id"), (c.get("function") or {}).get("name"), (c.get("function") or {}).get("arguments"))
        for c in message.get("tool_calls") or []
        if isinstance(c, dict)
    ]
    return message.get("role"), content or "", calls, message.get("tool_call_id")


def sent_messages(calls: list[dict[str, Any]]) -> list[list[Message]]:
    """The whole conversation each call of ``calls`` (an episode's) sent."""
    out: list[list[Message]] = []
    for call in calls:
        before = out[-1] if out else []
        out.append(before[: call["prefix_messages"]] + call["messages"])
    return out


def rebuilt(logs: list[CallLog]) -> tuple[float, int, int] | None:
    """When the agent of ``logs`` (one step's episodes) rebuilds its history: (mean segments per
    episode, later calls that began a new segment on a rewritten history, later calls); None when it
    does not (less than :data:`REBUILT_SHARE` of the calls after each episode's first did; a segment
    a ``stop`` string began, its reply re-rendering differently, does not count)."""
    ran = [log for log in logs if log.calls]
    later = sum(len(log.calls) - 1 for log in ran)
    cuts = sum(log.rewrites for log in ran)
    if not later or cuts / later < REBUILT_SHARE:
        return None
    return sum(log.segments for log in ran) / len(ran), cuts, later


def step_metrics(infos: list[dict[str, Any]]) -> dict[str, float]:
    """``agent/calls_mean`` and ``agent/segments_mean`` over the agent episodes among ``infos``
    (trajectories' info: those with ``agent_calls``); {} when there are none."""
    agents = [info for info in infos if "agent_calls" in info]
    if not agents:
        return {}
    return {
        "agent/calls_mean": sum(float(info["agent_calls"]) for info in agents) / len(agents),
        "agent/segments_mean": sum(float(info["agent_segments"]) for info in agents) / len(agents),
    }
