"""Which tool-call parser the ``openai_agent`` endpoint reads replies with, and how it honours
``tool_choice``.

``plugins.openai_agent.tool_parser: auto`` (the default) picks the built-in parser from the
model's tokenizer (:func:`detect_tool_parser`): the first call syntax its chat template writes,
else the first its special tokens hold, else ``xml_json`` (agentrl's own tool prompt; SmolLM2,
whose template renders no tools, lands here).

``tool_choice: required`` and ``{"type": "function", "function": {"name": NAME}}`` steer the
model by prefilling the start of a call (:func:`call_opener`) after the assistant header: the
opener is part of the prompt (loss mask 0, never sampled), the model samples the rest, and the
reply is the opener followed by the sampled text. The recorded row stays token-exact (the
sampled ids were drawn after exactly those prompt ids) and a reply is never resampled. A model
may still write a call the parser cannot read: the reply then comes back with that text as its
``content`` and finish reason ``stop`` (or ``length``), as under ``auto``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from agentrl import HARMONY, LLAMA3_JSON, MISTRAL, QWEN3_CODER, parse_xml_json
from agentrl_openai_agent.server import RequestError

PARSERS: dict[str, Any] = {
    "xml_json": parse_xml_json,
    "llama3_json": LLAMA3_JSON,
    "mistral": MISTRAL,
    "qwen3_coder": QWEN3_CODER,
    "harmony": HARMONY,
}
"""The built-in parsers by name (others come from the plugin registry)."""

AUTO = "auto"
SIGNS = (
    ("harmony", "<|call|>"),
    ("mistral", "[TOOL_CALLS]"),
    ("qwen3_coder", "<function="),
    ("llama3_json", "<|python_tag|>"),
    ("xml_json", "<tool_call>"),
    ("llama3_json", "<|start_header_id|>"),
)
"""(parser, the text that marks it), in the order they are looked for: a Qwen3-Coder template
writes ``<tool_call>`` around ``<function=``, so the more specific marks come first."""

OPENERS = {
    "xml_json": ("<tool_call>\n", '<tool_call>\n{{"name": {name}, "arguments": '),
    "llama3_json": ('{"name": "', '{{"name": {name}, "parameters": '),
    "mistral": ("[TOOL_CALLS]", "[TOOL_CALLS]{bare}[ARGS]"),
    "qwen3_coder": ("<tool_call>\n<function=", "<tool_call>\n<function={bare}>\n"),
    "harmony": (
        "<|channel|>commentary to=functions.",
        "<|channel|>commentary to=functions.{bare} <|constrain|>json<|message|>",
    ),
}
"""Per parser: (the text that opens any call, the text that opens a call of one named tool)."""

_announced: set[tuple[str, str]] = set()


def detect_tool_parser(tokenizer: Any) -> tuple[str, str]:
    """(parser name, why): the first of :data:`SIGNS` in the chat template, else in the special
    tokens, else ``xml_json``."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):  # named templates (default, tool_use...)
        template = "\n".join(str(t) for t in template.values())
    for name, sign in SIGNS:
        if sign in template:
            return name, f"the chat template writes {sign}"
    special = set(getattr(tokenizer, "all_special_tokens", []))
    if hasattr(tokenizer, "get_added_vocab"):
        special |= set(tokenizer.get_added_vocab())
    for name, sign in SIGNS:
        if sign in special:
            return name, f"the tokenizer has the special token {sign}"
    return "xml_json", "no native call syntax in the chat template or special tokens: agentrl's tool prompt"


def resolve_tool_parser_name(name: str, tokenizer: Any) -> tuple[str, Any]:
    """(name, parser) for ``plugins.openai_agent.tool_parser``: ``auto`` detected (said once per
    model on stderr), a built-in by name, or one another plugin registers (PluginError if none)."""
    if name == AUTO:
        name, why = detect_tool_parser(tokenizer)
        said = (str(getattr(tokenizer, "name_or_path", "")), name)
        if said not in _announced:
            _announced.add(said)
            print(f"openai_agent: tool_parser auto -> {name} ({why})", file=sys.stderr, flush=True)
    if name not in PARSERS:
        from agentrl import load_plugins  # a parser another plugin registers

        return name, load_plugins().registry.get("tool_parser", name).factory
    return name, PARSERS[name]


def chosen_tool(tool_choice: Any) -> str | None:
    """The tool a named ``tool_choice`` forces (None for the string forms)."""
    return tool_choice["function"]["name"] if isinstance(tool_choice, dict) else None


def call_opener(parser_name: str, tool_choice: Any) -> str:
    """The text prefilled after the assistant header for ``tool_choice`` ('' for auto and none);
    RequestError when the parser's call syntax is not one agentrl knows the opening of."""
    if tool_choice in ("auto", "none"):
        return ""
    if parser_name not in OPENERS:
        raise RequestError(
            f"'tool_choice' other than 'auto' or 'none' needs a tool parser whose call opening "
            f"agentrl knows ({', '.join(OPENERS)}); this run's is {parser_name!r}",
            param="tool_choice",
        )
    any_call, named_call = OPENERS[parser_name]
    name = chosen_tool(tool_choice)
    return any_call if name is None else named_call.format(name=json.dumps(name), bare=name)
