"""Command-line options that set a :class:`~agentrl.config.train.TrainConfig` field, generated from the
field: the option's name (``max_steps`` -> ``--max-steps``), its type, its help (the docstring under
the field, the config's only help text) and the default ``--help`` shows. A command lists the fields
it offers in a :class:`ConfigOptions` and is decorated by it; its other options stay hand-written.
Every generated option defaults to None: "not given", so the config file, ``--set`` or the
field's default decides."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import re
import types
import typing
from collections.abc import Callable
from typing import Any, Optional

import typer

from agentrl.config.train import TrainConfig


@dataclasses.dataclass(frozen=True)
class ConfigOption:
    """One TrainConfig field offered as a command-line option; what is left empty comes from the field."""

    key: str
    """The TrainConfig field it sets."""
    flag: str = ""
    """The option's name ('': ``--`` and the key with hyphens)."""
    type: Any = None
    """What the option parses to (None: the field's type without None)."""
    help: str = ""
    """Help text ('': the field's docstring), shown with the default."""
    default_text: str = ""
    """The default ``--help`` shows ('': the field's default)."""
    parse: Callable[[Any], Any] | None = None
    """Turns a given value into the field's value (None: it is the field's value as it is)."""

    @property
    def name(self) -> str:
        """The option's flag: ``flag`` or ``--`` and the key with hyphens."""
        return self.flag or "--" + self.key.replace("_", "-")


class ConfigOptions:
    """The TrainConfig fields a command offers as options, in ``--help`` order: field names, or
    :class:`ConfigOption` where the option differs from the field."""

    def __init__(self, *options: str | ConfigOption) -> None:
        self.options = tuple(ConfigOption(o) if isinstance(o, str) else o for o in options)
        unknown = [o.key for o in self.options if o.key not in TrainConfig.__dataclass_fields__]
        if unknown:
            raise ValueError(f"not TrainConfig fields: {', '.join(unknown)}")

    @property
    def flags(self) -> dict[str, str]:
        """TrainConfig key -> the option that sets it."""
        return {o.key: o.name for o in self.options}

    def values(self, given: dict[str, Any]) -> dict[str, tuple[str, Any]]:
        """TrainConfig key -> (its option, the field's value it gives: ``given[option]`` through the
        option's ``parse``; None when not given), as ``refuse_flag_conflicts`` takes them. ``given``:
        option -> value as typer parsed it, None where not given."""
        out = {}
        for option in self.options:
            value = given[option.name]
            if option.parse is not None and value is not None:
                value = option.parse(value) if value else None  # an empty list gives nothing
            out[option.key] = (option.name, value)
        return out

    def command(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` as a typer command whose options are these, then ``fn``'s own but its first
        parameter, which receives these as {option: value, None where not given} in their order."""
        own = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY)  # typer passes every option by name
            for p in list(inspect.signature(fn, eval_str=True).parameters.values())[1:]
        ]
        generated = [self._parameter(option) for option in self.options]
        clash = {p.name for p in generated} & {p.name for p in own}
        if clash:
            raise ValueError(f"{fn.__name__} has parameters named as TrainConfig options: {', '.join(sorted(clash))}")

        def command(**kwargs: Any) -> Any:
            given = {option.name: kwargs.pop(option.key) for option in self.options}
            return fn(given, **kwargs)

        functools.update_wrapper(
            command, fn, assigned=("__module__", "__name__", "__qualname__", "__doc__"), updated=()
        )
        command.__signature__ = inspect.Signature([*generated, *own])  # type: ignore[attr-defined]
        return command

    @staticmethod
    def _parameter(option: ConfigOption) -> inspect.Parameter:
        """The typer parameter of ``option``: its type made Optional, None by default."""
        kind = option.type or _without_none(typing.get_type_hints(TrainConfig)[option.key])
        shown = option.default_text or str(TrainConfig.__dataclass_fields__[option.key].default)
        text = f"{option.help or field_docs(TrainConfig)[option.key]} [default: {shown}]"
        return inspect.Parameter(
            option.key,
            inspect.Parameter.KEYWORD_ONLY,
            annotation=Optional[kind],  # noqa: UP045 (typer reads typing.Optional of a runtime type)
            default=typer.Option(None, option.name, help=text),
        )


def _without_none(kind: Any) -> Any:
    """``int | None`` -> ``int``; any other type as it is."""
    args = [arg for arg in typing.get_args(kind) if arg is not type(None)]
    return args[0] if typing.get_origin(kind) in (typing.Union, types.UnionType) and len(args) == 1 else kind


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring under it in ``cls``'s source, on one line, reST markup
    (````code````, ``:mod:`x```) removed."""
    body = ast.parse(inspect.getsource(cls)).body[0].body  # type: ignore[attr-defined]
    docs = {}
    for field, doc in zip(body, body[1:]):
        if (
            isinstance(field, ast.AnnAssign)
            and isinstance(field.target, ast.Name)
            and isinstance(doc, ast.Expr)
            and isinstance(doc.value, ast.Constant)
            and isinstance(doc.value.value, str)
        ):
            text = re.sub(r":\w+:`~?([^`]*)`", r"\1", inspect.cleandoc(doc.value.value)).replace("``", "")
            docs[field.target.id] = " ".join(text.split())
    return docs
