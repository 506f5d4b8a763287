"""The keys of a config class as data, for the config reference page: each field's name, type,
default, what its declared rule allows and the docstring under it (the only help text)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any

from agentrl.config.rules import allowed_words, field_hints
from agentrl.config.train import TrainConfig


@dataclass(frozen=True)
class ConfigKey:
    """One key of a config section."""

    name: str
    """The key, e.g. ``max_steps``."""
    type: str
    """Its type as Python writes it: ``int``, ``float | None``, ``dict[str, float] | None``."""
    default: Any
    """Its default value."""
    allowed: str
    """What its declared rule allows, in the words of the error messages (``>= 1``, ``one of skip,
    fail``, ``> 0 or null``); "" where any value of its type goes."""
    doc: str
    """The docstring under the field."""


def config_reference(config_class: type[Any] = TrainConfig) -> list[ConfigKey]:
    """Every key of ``config_class`` (a config dataclass: ``TrainConfig``, or a plugin's section such
    as ``GRPOConfig``), in field order."""
    docs = field_docs(config_class)
    hints = field_hints(config_class)
    return [
        ConfigKey(
            name=f.name,
            type=type_name(hints[f.name]),
            default=f.default if f.default_factory is dataclasses.MISSING else f.default_factory(),
            allowed=allowed_words(hints[f.name]),
            doc=docs.get(f.name, ""),
        )
        for f in dataclasses.fields(config_class)
    ]


def type_name(hint: Any) -> str:
    """``hint`` as Python writes it, without its rules: ``Annotated[int, Field(ge=1)] | None`` is ``int | None``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Annotated:
        return type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if args:
        return f"{type_name(origin)}[{', '.join('...' if a is Ellipsis else type_name(a) for a in args)}]"
    return "None" if hint is type(None) else getattr(hint, "__name__", str(hint))


def field_docs(config_class: type[Any]) -> dict[str, str]:
    """Field name -> the string literal under it in the class body (of the class or a base class)."""
    docs: dict[str, str] = {}
    for cls in reversed(config_class.__mro__):
        try:
            body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
        except (OSError, TypeError):  # a built-in base, or no source
            continue
        statements = getattr(body, "body", [])
        for node, after in zip(statements, statements[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs
