"""Native tool-call formats: the call syntaxes models are tuned for, each a parser and its writer.

A ``ToolCallFormat`` is a ``ToolParser`` (call it on an assistant message's text) that also writes
calls in its own syntax (``format_calls``), so a ``ToolEnv`` can show the model the format the
parser reads: in the fallback tool description and in its demonstrations. The default format,
``xml_json`` (``agentrl.tools.calls.parse_xml_json``), stays a plain function. The formats here:

* ``LLAMA3_JSON``: ``{"name": ..., "parameters": {...}}`` (Llama 3.1-3.3 JSON tool calling),
  possibly after ``<|python_tag|>``, several separated by ``;``.
* ``MISTRAL``: ``[TOOL_CALLS]name[ARGS]{...}`` (tokenizer v11+, one marker per call, an optional
  ``[CALL_ID]id`` before ``[ARGS]``) and ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``
  (earlier tokenizers).
* ``QWEN3_CODER``: ``<tool_call><function=NAME><parameter=P>value</parameter></function></tool_call>``.
  Values are text; ``ToolCall.text_values`` is set and the caller that knows the tool's schema
  types them with ``type_arguments``.
* ``HARMONY`` (gpt-oss): a message whose header names a recipient,
  ``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>``.

Each parser returns ``[]`` for a message without a call, and a ``ToolCall`` with ``error`` set
(never an exception) for a call it cannot read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.tools.calls import ToolCall, ToolParser, object_call

CallFormatter = Callable[[Sequence[tuple[str, dict[str, Any]]]], str]
"""Writes ``[(name, arguments), ...]`` as one assistant message in a format's syntax."""


@dataclass(frozen=True)
class ToolCallFormat:
    """A tool-call syntax: ``parse`` reads calls from a message (the ``ToolParser`` contract; the
    format is called like its parser) and ``format_calls`` writes calls the way ``parse`` reads them."""

    name: str
    parse: ToolParser
    format_calls: CallFormatter

    def __call__(self, text: str) -> list[ToolCall]:
        """``parse(text)``."""
        return self.parse(text)


_DECODER = json.JSONDecoder()


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _bad_json(exc: ValueError, body: str) -> ToolCall:
    return ToolCall("", None, f"tool call is not valid JSON ({exc}): {body[:200]!r}", body)


# -- Llama 3.x JSON ------------------------------------------------------------------------------

PYTHON_TAG = "<|python_tag|>"
_LLAMA_CALL = re.compile(r'\{\s*"(?:name|type)"\s*:')


def parse_llama3_json(text: str) -> list[ToolCall]:
    """Parse Llama 3.x JSON calls: ``{"name": ..., "parameters": {...}}``, several separated by
    ``;``. The calls start after ``<|python_tag|>`` when the message has one, else at the first
    JSON object that opens with ``"name"`` (or ``"type"``, as Llama 3.2 writes); text before
    them is ignored, and so is text after the last one."""
    tag = text.find(PYTHON_TAG)
    if tag >= 0:
        pos = _skip_space(text, tag + len(PYTHON_TAG))
    else:
        match = _LLAMA_CALL.search(text)
        if match is None:
            return []
        pos = match.start()
    calls: list[ToolCall] = []
    while pos < len(text) and text[pos] == "{":
        try:
            data, end = _DECODER.raw_decode(text, pos)
        except ValueError as exc:
            return calls + [_bad_json(exc, text[pos:])]
        calls.append(object_call(data, text[pos:end], "parameters"))
        pos = _skip_space(text, end)
        if text.startswith(";", pos):
            pos = _skip_space(text, pos + 1)
    if not calls:  # <|python_tag|> and then no JSON object (a built-in tool's Python call)
        rest = text[tag + len(PYTHON_TAG) :].strip()
        calls.append(ToolCall("", None, f"expected a JSON object after {PYTHON_TAG}, got {rest[:200]!r}", rest))
    return calls


def format_llama3_json(calls: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """``{"name": ..., "parameters": {...}}`` per call, joined by ``; ``."""
    return "; ".join(json.dumps({"name": name, "parameters": arguments}) for name, arguments in calls)


# -- Mistral -------------------------------------------------------------------------------------

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"


def _mistral_array(body: str) -> list[ToolCall]:
    """Calls of the pre-v11 form: a JSON array (or one object) right after ``[TOOL_CALLS]``."""
    try:
        data, end = _DECODER.raw_decode(body)
    except ValueError as exc:
        return [_bad_json(exc, body)]
    items = data if isinstance(data, list) else [data]
    if not items:
        return [ToolCall("", None, f"{TOOL_CALLS} is followed by an empty list of calls", body[:end])]
    return [object_call(item, json.dumps(item), "arguments") for item in items]


def _mistral_named(segment: str) -> ToolCall:
    """One call of the v11+ form: ``name[ARGS]{...}`` or ``name[CALL_ID]id[ARGS]{...}``."""
    body = segment.strip()
    if ARGS in body:
        head, arguments = body.split(ARGS, 1)
        name = head.split(CALL_ID, 1)[0].strip()
    elif "{" in body:
        name, arguments = body[: body.index("{")].strip(), body[body.index("{") :]
    else:
        return ToolCall("", None, f"expected {TOOL_CALLS}NAME{ARGS}{{...}}, got {body[:200]!r}", segment)
    if not re.fullmatch(r"[\w.-]+", name):
        return ToolCall("", None, f"expected a tool name after {TOOL_CALLS}, got {name[:100]!r}", segment)
    try:
        value, _ = _DECODER.raw_decode(arguments.strip() or "{}")
    except ValueError as exc:
        return ToolCall(name, None, f"tool call is not valid JSON ({exc}): {arguments.strip()[:200]!r}", segment)
    if not isinstance(value, dict):
        return ToolCall(name, None, '"arguments" must be a JSON object', segment)
    return ToolCall(name, value, None, segment)


def parse_mistral(text: str) -> list[ToolCall]:
    """Parse Mistral calls: each ``[TOOL_CALLS]`` opens ``name[ARGS]{...}`` (v11+ tokenizers) or a
    JSON array of ``{"name": ..., "arguments": {...}}`` (earlier ones). Text before the first
    marker is ignored; repeated markers with nothing between count once."""
    if TOOL_CALLS not in text:
        return []
    calls: list[ToolCall] = []
    for segment in text.split(TOOL_CALLS)[1:]:
        body = segment.strip()
        if not body:
            continue
        if body[0] in "[{" and not body.startswith((ARGS, CALL_ID)):
            calls += _mistral_array(body)
        else:
            calls.append(_mistral_named(segment))
    return calls


def format_mistral(calls: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """``[TOOL_CALLS]name[ARGS]{...}`` per call (the v11+ form)."""
    return "".join(f"{TOOL_CALLS}{name}{ARGS}{json.dumps(arguments)}" for name, arguments in calls)


# -- Qwen3-Coder XML -----------------------------------------------------------------------------

_FUNCTION = re.compile(r"<function=(.*?)(?:</function>|\Z)", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)


def _trim_newline(value: str) -> str:
    """``value`` without one leading and one trailing newline (the template puts them there)."""
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


def _xml_function(block: str, raw: str) -> ToolCall:
    """The call of one ``<function=...`` block (``block`` is what follows ``<function=``)."""
    name, closed, body = block.partition(">")
    name = name.strip()
    if not closed or not re.fullmatch(r"[\w.-]+", name):
        return ToolCall("", None, f"expected <function=NAME>, got {raw[:200]!r}", raw)
    arguments: dict[str, Any] = {}
    for match in _PARAMETER.finditer(body):
        key, closed, value = match.group(1).partition(">")
        if not closed or not re.fullmatch(r"[\w.-]+", key.strip()):
            return ToolCall(name, None, f"expected <parameter=NAME>, got {match.group(0)[:200]!r}", raw)
        arguments[key.strip()] = _trim_newline(value)
    return ToolCall(name, arguments, None, raw, text_values=True)


def parse_qwen3_coder(text: str) -> list[ToolCall]:
    """Parse Qwen3-Coder XML calls: ``<function=NAME><parameter=P>value</parameter></function>``,
    usually inside ``<tool_call>...</tool_call>``. An unclosed last function or parameter runs to
    the end of the text. Values stay text (one wrapping newline trimmed), with ``text_values``
    set: the caller types them by the tool's schema (``type_arguments``)."""
    return [_xml_function(m.group(1), m.group(0)) for m in _FUNCTION.finditer(text)]


def _xml_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def format_qwen3_coder(calls: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """One ``<tool_call>`` block per call, laid out as Qwen3-Coder's chat template writes it."""
    return "\n".join(
        f"<tool_call>\n<function={name}>\n"
        + "".join(f"<parameter={key}>\n{_xml_value(value)}\n</parameter>\n" for key, value in arguments.items())
        + "</function>\n</tool_call>"
        for name, arguments in calls
    )


# -- gpt-oss harmony -----------------------------------------------------------------------------

_HARMONY_END = re.compile(r"<\|(?:end|call|return)\|>")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")


def parse_harmony(text: str) -> list[ToolCall]:
    """Parse gpt-oss harmony calls: every message whose header (before ``<|message|>``, in its role
    or channel part) names a recipient ``to=functions.NAME`` is a call of ``NAME`` with the JSON
    body up to ``<|call|>``. Messages are split at ``<|start|>``; the first one's
    ``<|start|>assistant`` is the generation prompt's. Another recipient (``to=python``,
    ``to=browser.search``) is a call of that name, which the env reports as unknown."""
    calls = []
    for chunk in text.split("<|start|>"):
        header, has_body, body = chunk.partition("<|message|>")
        recipient = _RECIPIENT.search(header)
        if recipient is None or recipient.group(1) == "assistant":
            continue  # an answer, analysis or preamble, or a tool's reply echoed by the model
        name = recipient.group(1).removeprefix("functions.")
        body = _HARMONY_END.split(body, 1)[0].strip()
        if not has_body:
            calls.append(ToolCall(name, None, f"call header has no <|message|>: {chunk[:200]!r}", chunk))
            continue
        try:
            data = json.loads(body or "{}")
        except ValueError as exc:
            calls.append(ToolCall(name, None, f"tool call is not valid JSON ({exc}): {body[:200]!r}", chunk))
            continue
        calls.append(object_call({"name": name, "arguments": data}, chunk, "arguments"))
    return calls


def format_harmony(calls: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """Each call as a commentary message to ``functions.NAME``, ending with ``<|call|>``."""
    return "<|start|>assistant".join(
        f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{json.dumps(arguments)}<|call|>"
        for name, arguments in calls
    )


LLAMA3_JSON = ToolCallFormat("llama3_json", parse_llama3_json, format_llama3_json)
MISTRAL = ToolCallFormat("mistral", parse_mistral, format_mistral)
QWEN3_CODER = ToolCallFormat("qwen3_coder", parse_qwen3_coder, format_qwen3_coder)
HARMONY = ToolCallFormat("harmony", parse_harmony, format_harmony)


# -- typing text values by a schema --------------------------------------------------------------

_KINDS = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    list: "array",
    dict: "object",
    type(None): "null",
}


def _allowed_kinds(schema: Any) -> set[str] | None:
    """The JSON types ``schema`` allows (from ``type``, ``anyOf``/``oneOf``, ``enum``); None: any."""
    if not isinstance(schema, dict):
        return None
    kinds: set[str] = set()
    declared = schema.get("type")
    kinds |= {declared} if isinstance(declared, str) else set(declared) if isinstance(declared, list) else set()
    for option in [*schema.get("anyOf", []), *schema.get("oneOf", [])]:
        more = _allowed_kinds(option)
        if more is None:
            return None
        kinds |= more
    kinds |= {_KINDS.get(type(v), "?") for v in schema.get("enum", [])}
    return kinds or None


def _typed_value(value: str, schema: Any) -> Any:
    """``value`` decoded as JSON when the schema allows the decoded type and no string (or the
    string is not one of its enum values); else the text itself, for the tool's validation to judge."""
    kinds = _allowed_kinds(schema)
    if kinds is None or kinds == {"string"} or value in schema.get("enum", ()):
        return value
    text = value.strip()
    if "boolean" in kinds and text.lower() in ("true", "false"):
        text = text.lower()
    try:
        decoded = json.loads(text)
    except ValueError:
        return value
    kind = _KINDS.get(type(decoded), "?")
    fits = kind in kinds or (kind == "integer" and "number" in kinds)
    return decoded if fits and kind != "string" else value


def type_arguments(arguments: dict[str, Any], parameters: dict[str, Any]) -> dict[str, Any]:
    """The text values of ``arguments`` (a ``ToolCall`` with ``text_values``) typed by the
    function's JSON-schema ``parameters``: ``"3"`` becomes 3 for an integer, ``"true"`` (any case)
    True for a boolean, ``"[1, 2]"`` a list for an array, ``"null"`` None where null is allowed; a
    string parameter keeps its text. A value that does not decode to an allowed type stays text,
    so the tool's validation names it; a parameter the schema lacks stays text too."""
    properties = parameters.get("properties", {}) if isinstance(parameters, dict) else {}
    return {
        key: _typed_value(value, properties.get(key)) if isinstance(value, str) else value
        for key, value in arguments.items()
    }
