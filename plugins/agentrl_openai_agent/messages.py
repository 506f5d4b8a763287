"""What the ``openai_agent`` endpoint needs around the engine: shaping messages and sampled text.

The calls themselves are batched by :func:`agentrl.request_queue` (the rollout's ``_generate``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from agentrl import ChatTokenizer, ToolCallFormat, one_line, type_arguments
from agentrl_openai_agent.request import RequestError

Message = dict[str, Any]
_CALL_OPENERS = ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "<function=")


def cut_at_stop(chat: ChatTokenizer, ids: list[int], stop: list[str]) -> tuple[int, str] | None:
    """Where a ``stop`` string first appears in the sampled text: (ids to keep, the text before
    it); None when none appears. The kept ids are the fewest whose text holds the stop string."""
    text = chat.decode(ids)
    hits = [text.find(s) for s in stop if s in text]
    if not hits:
        return None
    at = min(hits)
    for keep in range(1, len(ids) + 1):
        if any(s in chat.decode(ids[:keep]) for s in stop):
            return keep, text[:at]
    return len(ids), text[:at]


def check_roles(messages: list[Message], chat: ChatTokenizer) -> None:
    """RequestError naming the first message whose role the chat template does not know: the
    request model takes the API's roles; ``developer`` only where the template mentions it (most
    open models' templates know ``system`` and no ``developer``)."""
    template = getattr(chat.tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):  # named templates (default, tool_use...)
        template = "\n".join(str(t) for t in template.values())
    for i, message in enumerate(messages):
        if message.get("role") == "developer" and "developer" not in template:
            raise RequestError(
                f"messages[{i}].role 'developer' is not a role this model's chat template knows; use 'system'",
                param=f"messages[{i}].role",
            )


def render(chat: ChatTokenizer, messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    """The prompt text of ``messages`` (the generation prompt added), or a 400 when the chat
    template refuses them (a template's own check: alternating roles, a missing system message)."""
    try:
        return chat.render(messages, True, tools=tools)
    except Exception as exc:  # the template is the model's code; what it raises is about these messages
        raise RequestError(
            f"the model's chat template cannot render these messages: {one_line(exc)}", param="messages"
        ) from None


def normalized(messages: list[Message], raw_texts: dict[str, str]) -> list[Message]:
    """The conversation as the template renders it: text content parts joined, and an assistant
    message the endpoint returned (known by its tool-call ids) back to the exact sampled text."""
    out = []
    for message in messages:
        message = dict(message)
        if isinstance(message.get("content"), list):
            message["content"] = "".join(str(p.get("text", "")) for p in message["content"] if isinstance(p, dict))
        calls = message.get("tool_calls") or []
        raw = raw_texts.get(str(calls[0].get("id"))) if calls and isinstance(calls[0], dict) else None
        if message.get("role") == "assistant" and raw is not None:
            message = {"role": "assistant", "content": raw}
        if message.get("content") is None:
            message["content"] = ""
        out.append(message)
    return out


def with_tool_prompt(messages: list[Message], description: str) -> list[Message]:
    """``messages`` with agentrl's tool description appended to the system message (one is added
    first when there is none): for templates that do not render ``tools=``."""
    if messages and messages[0].get("role") == "system":
        first = messages[0]
        return [{**first, "content": f"{first.get('content') or ''}\n\n{description}".lstrip()}, *messages[1:]]
    return [{"role": "system", "content": description}, *messages]


def assistant_message(text: str, parser: Any, tools: list[dict[str, Any]] | None, raw_texts: dict[str, str]) -> Message:
    """The OpenAI assistant message for the sampled ``text``: well-formed calls the run's parser
    reads become ``tool_calls`` (their ids remembered in ``raw_texts``; each id new to the episode and
    derived from what it has seen, so a resumed run issues the ids a straight run does), the text
    before the first call the ``content``; malformed calls stay in the content. ``tools=None``: no call is parsed."""
    calls = [c for c in (parser(text) if tools else []) if c.error is None and c.arguments is not None]
    if not calls:
        return {"role": "assistant", "content": text}
    schemas = {t.get("function", t).get("name"): t.get("function", t) for t in tools or []}
    tool_calls = []
    for call in calls:
        arguments = call.arguments or {}
        if call.text_values and call.name in schemas:
            arguments = type_arguments(arguments, schemas[call.name].get("parameters", {}))
        call_id = f"call_{hashlib.sha256(f'{len(raw_texts)}:{text}'.encode()).hexdigest()[:24]}"
        raw_texts[call_id] = text
        tool_calls.append(
            {"id": call_id, "type": "function", "function": {"name": call.name, "arguments": json.dumps(arguments)}}
        )
    at = text.find(calls[0].raw) if calls[0].raw else -1
    before = text[:at] if at >= 0 else ""
    for opener in _CALL_OPENERS:
        before = before.rstrip().removesuffix(opener)
    return {"role": "assistant", "content": before.strip() or None, "tool_calls": tool_calls}


def call_format(parser: Any) -> ToolCallFormat | None:
    """The parser's format when it writes calls too (the tool description's example uses it)."""
    return parser if isinstance(parser, ToolCallFormat) else None
