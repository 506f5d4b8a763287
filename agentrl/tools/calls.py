"""Tool calls in an assistant message: ``ToolCall``, the default parser and the parser contract.

A parser (``ToolParser``) turns an assistant message into ``ToolCall``s; the default,
``parse_xml_json``, reads ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``. Other parsers
are plugins (``agentrl_register_tool_parsers``), chosen by name in ``env_args``; the caller that
holds the plugin manager turns the name into the function (``resolve_tool_parser``), so this module
and ``agentrl.tools.tool`` know no registry. All of it is re-exported by ``agentrl.tools.tool``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    """One tool call parsed from an assistant message: arguments, or the reason it is malformed."""

    name: str
    arguments: dict[str, Any] | None
    error: str | None
    raw: str
    text_values: bool = False
    """True when each argument value is the model's raw text (XML formats such as
    ``qwen3_coder``): whoever knows the tool's schema types them (``agentrl.type_arguments``;
    ``ToolEnv`` does). False for JSON formats, whose values are already typed."""


ToolParser = Callable[[str], list[ToolCall]]
"""A tool-call parser: an assistant message's text -> its ``ToolCall``s (malformed ones carry
``error``; a parser never raises for bad text)."""

_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")


def parse_xml_json(text: str) -> list[ToolCall]:
    """Parse every ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` in ``text``.

    An unclosed last ``<tool_call>`` runs to the end of the text. A call that is not valid JSON,
    or lacks a string ``name`` or an object ``arguments`` (a JSON string holding an object is
    accepted), gives a ``ToolCall`` with ``error`` set.
    """
    calls = []
    for match in _CALL.finditer(text):
        raw = match.group(1)
        body = _FENCE.sub("", raw.strip())
        try:
            data = json.loads(body)
        except ValueError as exc:
            calls.append(ToolCall("", None, f"tool call is not valid JSON ({exc}): {body[:200]!r}", raw))
            continue
        calls.append(object_call(data, raw, "arguments"))
    return calls


def object_call(data: Any, raw: str, key: str) -> ToolCall:
    """The ``ToolCall`` of a decoded ``{"name": ..., key: {...}}`` object (``arguments`` accepted for
    ``key`` too; a JSON string holding an object is accepted; none means no arguments)."""
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return ToolCall("", None, 'tool call must be a JSON object with a string "name"', raw)
    arguments = data.get(key, data.get("arguments", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    if not isinstance(arguments, dict):
        return ToolCall(data["name"], None, f'"{key}" must be a JSON object', raw)
    return ToolCall(data["name"], arguments, None, raw)


def format_tool_call(name: str, **arguments: Any) -> str:
    """The text of one call in the default format, as ``parse_xml_json`` reads it (for examples)."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def resolve_tool_parser(env_args: Mapping[str, Any], lookup: Callable[[str], ToolParser]) -> dict[str, Any]:
    """``env_args`` with a ``tool_parser`` given by name replaced by ``lookup(name)``, the parser
    registered under it; anything else is left for the env to accept or refuse.

    The caller that holds the plugin manager resolves the name (this module knows no registry)::

        resolve_tool_parser(config.env_args, lambda n: manager.registry.get("tool_parser", n).factory)

    ``registry.get`` raises PluginError for an unknown name, suggesting the nearest.
    """
    resolved = dict(env_args)
    if isinstance(resolved.get("tool_parser"), str):
        resolved["tool_parser"] = lookup(resolved["tool_parser"])
    return resolved
