"""A tool's parameters as its Python function gives them: their descriptions from its Google-style
docstring, a strict check of JSON-decoded arguments against each type hint, and a parameter's
JSON schema said in words (for the model's error messages and the fallback tool prompt)."""

from __future__ import annotations

import inspect
import json
import re
from typing import Any

from pydantic import ConfigDict, TypeAdapter, ValidationError

_SECTIONS = {
    "args",
    "arguments",
    "parameters",
    "returns",
    "return",
    "raises",
    "yields",
    "examples",
    "example",
    "note",
    "notes",
}


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(description, {parameter: description}) from a Google-style docstring."""
    summary: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current, indent = None, 0
    for line in inspect.cleandoc(doc).splitlines():
        header = line.rstrip().rstrip(":")
        if not line.startswith(" ") and line.rstrip().endswith(":") and header.lower() in _SECTIONS:
            section, current = header.lower(), None
        elif section is None:
            summary.append(line)
        elif section in ("args", "arguments", "parameters") and line.strip():
            item = re.fullmatch(r"(\s+)\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)", line)
            if item and (current is None or len(item.group(1)) <= indent):
                current, indent = item.group(2), len(item.group(1))
                params[current] = item.group(3).strip()
            elif current is not None:
                params[current] = f"{params[current]} {line.strip()}".strip()
    return " ".join(" ".join(summary).split()), params


def strict_validator(hint: Any) -> TypeAdapter[Any]:
    """A strict pydantic check of a JSON-decoded value against ``hint``: no coercion, so ``"1"`` is
    not an int and a bool is neither int nor float; an int is a valid float (a JSON number)."""
    return TypeAdapter(hint, config=ConfigDict(strict=True))


def fits(validator: TypeAdapter[Any], value: Any) -> bool:
    """True if ``value`` passes ``validator``."""
    try:
        validator.validate_python(value)
    except ValidationError:
        return False
    return True


def describe_schema(schema: dict[str, Any]) -> str:
    """A JSON schema in words: ``"array of integer"``, ``"string or null"``."""
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"])
    if "anyOf" in schema:
        return " or ".join(describe_schema(option) for option in schema["anyOf"])
    kind = schema["type"]
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind == "array" and "items" in schema:
        return f"array of {describe_schema(schema['items'])}"
    if kind == "object" and "additionalProperties" in schema:
        return f"object of {describe_schema(schema['additionalProperties'])}"
    return kind
