"""Declarative ranges for config fields: a field's type hint carries its rule, pydantic checks it.

    max_steps: Annotated[int, Field(ge=1)] = 40
    top_k: Annotated[int, Field(ge=0), Note("0: off")] = 0
    precision: Annotated[str, OneOf("auto", "bf16", "fp32")] = "auto"

:func:`rule_failure` validates one value against its field's rule (pydantic's ``TypeAdapter``) and,
when it fails, says in words what is allowed (from the bounds, or :class:`Allowed` where the words
matter), so callers raise the one-line ConfigError naming key, value and what is allowed. Types
are checked before, by :func:`agentrl.config.checks.check_types`; these are the ranges.
"""

from __future__ import annotations

import functools
import math
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, get_type_hints

from annotated_types import Ge, Gt, Le, Lt
from pydantic import TypeAdapter, ValidationError
from pydantic_core import PydanticCustomError, core_schema

from agentrl.errors import AgentRLError, ConfigError


@dataclass(frozen=True)
class Allowed:
    """What the error message says is allowed, in place of the words made from the bounds; where
    given, ``wrong_type`` is said instead for a value not of the field's type (``an int`` where
    ``text`` is ``an int >= 0``), ``too_low`` / ``too_high`` for one past a lower / upper bound."""

    text: str
    wrong_type: str | None = None
    too_low: str | None = None
    too_high: str | None = None

    def words(self, failure: str = "") -> str:
        """The words for ``failure`` (``wrong_type``, ``too_low``, ``too_high``; else ``text``)."""
        return (getattr(self, failure, None) or self.text) if failure else self.text


@dataclass(frozen=True)
class Complaint:
    """The whole message of :func:`check_declared` for a field, in place of ``KEY must be WORDS,
    got VALUE``: a :meth:`str.format` template with ``key``, ``value`` and ``allowed`` (the words),
    e.g. ``Complaint("{key} {value!r} is not {allowed}")``."""

    template: str


@dataclass(frozen=True)
class Note:
    """A remark appended in parentheses to the words made from the bounds (``>= 0 (0: off)``)."""

    text: str


class OneOf:
    """The value must equal one of ``choices`` and have its type (``True`` is not ``1``)."""

    def __init__(self, *choices: Any) -> None:
        self.choices = choices

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        """Pydantic hook: the membership check on the raw value, then the source type's schema."""
        return core_schema.no_info_before_validator_function(self._check, handler(source))

    def _check(self, value: Any) -> Any:
        if any(type(value) is type(c) and value == c for c in self.choices):
            return value
        raise PydanticCustomError("one_of", "not one of the choices")

    @property
    def words(self) -> str:
        """``one of a, b``."""
        return "one of " + ", ".join(str(c) for c in self.choices)


@functools.cache
def _rules(config_class: type[Any]) -> dict[str, tuple[TypeAdapter[Any], Any]]:
    """Field name -> (its pydantic validator, its hint) for the fields whose hint carries a rule; a
    subclass that only changes a field's default (a plain hint) keeps its base class's rule."""
    rules: dict[str, tuple[TypeAdapter[Any], Any]] = {}
    for cls in reversed(config_class.__mro__):
        hints = get_type_hints(cls, include_extras=True)
        rules.update(
            {
                key: (TypeAdapter(hints[key]), hints[key])
                for key in vars(cls).get("__annotations__", {})
                if _annotated(hints[key])
            }
        )
    return rules


def _annotated(hint: Any) -> bool:
    return typing.get_origin(hint) is Annotated or any(_annotated(a) for a in typing.get_args(hint))


def check_declared(
    config: Any, section: str = "", *, strict: bool = True, prefix: str = "", error: type[AgentRLError] = ConfigError
) -> None:
    """Raise ``error`` ``KEY must be WORDS, got VALUE`` (``SECTION.KEY`` where given; ``; got``
    after ``one of``; ``prefix`` first, as given; a field's :class:`Complaint` in its place)
    for the first field of the dataclass instance ``config`` that breaks its declared rule.
    ``strict``: True and 2.0 are not ints, and a list is not a tuple."""
    for key, (_, hint) in _rules(type(config)).items():
        value = getattr(config, key)
        allowed = rule_failure(type(config), key, value, strict=strict)
        if allowed is not None:
            shown = list(value) if isinstance(value, tuple) else value
            name = f"{section}.{key}" if section else key
            complaint = next((m for m in _metadata(hint) if isinstance(m, Complaint)), None)
            message = (
                complaint.template.format(key=name, value=shown, allowed=allowed)
                if complaint
                else f"{name} must be {allowed}{';' if allowed.startswith('one of ') else ','} got {shown!r}"
            )
            raise error(prefix + message)


def _metadata(hint: Any) -> list[Any]:
    """The metadata of ``hint`` and of the members of a union it is, pydantic's ``Field`` unpacked."""
    found = [m for item in getattr(hint, "__metadata__", ()) for m in getattr(item, "metadata", [item])]
    return found + [
        m
        for arg in typing.get_args(hint)
        if typing.get_origin(hint) in (typing.Union, types.UnionType)
        for m in _metadata(arg)
    ]


def rule_failure(config_class: type[Any], key: str, value: Any, *, strict: bool = False) -> str | None:
    """None if ``value`` keeps the rule declared on ``config_class``'s field ``key`` (or it declares
    none), else what is allowed, in words (``>= 1``, ``in (0, 1]``, ``one of a, b``, ``>= 1 or null``)."""
    rule = _rules(config_class).get(key)
    if rule is None:
        return None
    try:
        rule[0].validate_python(value, strict=strict)
    except ValidationError as exc:
        return allowed_words(rule[1], _failure(exc, value))
    return None


def _failure(exc: ValidationError, value: Any) -> str:
    """Which :class:`Allowed` words fit the failure: ``wrong_type``, ``too_low``, ``too_high`` or
    ``""`` (the main text: any other failure, and a NaN or infinity, which no bound words fit)."""
    kind = exc.errors()[0]["type"]
    if isinstance(value, float) and not math.isfinite(value):
        return ""
    if kind.endswith("_type") or kind == "is_instance_of":
        return "wrong_type"
    return {
        "greater_than": "too_low",
        "greater_than_equal": "too_low",
        "less_than": "too_high",
        "less_than_equal": "too_high",
    }.get(kind, "")


def allowed_words(hint: Any, failure: str = "") -> str:
    """The rule of ``hint`` in words: its :class:`Allowed` text (for ``failure``, see
    :meth:`Allowed.words`), else its bounds or choices (and ``or null`` where None is allowed),
    with its :class:`Note`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        words = " or ".join(allowed_words(a, failure) for a in args if a is not type(None))
        return f"{words} or null" if type(None) in args else words
    if origin is not Annotated:
        return ""
    metadata = [m for item in hint.__metadata__ for m in getattr(item, "metadata", [item])]
    for item in metadata:
        if isinstance(item, Allowed):
            return item.words(failure)
    words = next((m.words for m in metadata if isinstance(m, OneOf)), None) or _bounds(metadata)
    notes = [f" ({m.text})" for m in metadata if isinstance(m, Note)]
    return words + "".join(notes)


def _bounds(metadata: list[Any]) -> str:
    low = next((m for m in metadata if isinstance(m, (Ge, Gt))), None)
    high = next((m for m in metadata if isinstance(m, (Le, Lt))), None)
    if low is not None and high is not None:
        left = f"[{low.ge}" if isinstance(low, Ge) else f"({low.gt}"
        right = f"{high.le}]" if isinstance(high, Le) else f"{high.lt})"
        return f"in {left}, {right}"
    if low is not None:
        return f">= {low.ge}" if isinstance(low, Ge) else f"> {low.gt}"
    if high is not None:
        return f"<= {high.le}" if isinstance(high, Le) else f"< {high.lt}"
    return ""


def expected_words(hint: Any, value: Any) -> str:
    """The rule of ``hint`` as :class:`~agentrl.config.checks.ConfigCheck` words (``expected None or a
    number in (0, 1)``, ``expected one of 'a', 'b'``), or its :class:`Allowed` text as it is."""
    optional = type(None) in typing.get_args(hint) and typing.get_origin(hint) in (typing.Union, types.UnionType)
    inner = next((a for a in typing.get_args(hint) if a is not type(None)), hint) if optional else hint
    metadata = [
        m
        for item in (*getattr(hint, "__metadata__", ()), *getattr(inner, "__metadata__", ()))
        for m in getattr(item, "metadata", [item])
    ]
    allowed = next((m.text for m in metadata if isinstance(m, Allowed)), None)
    if allowed is not None:
        return allowed
    none = "None or " if optional else ""
    choices = next((m.choices for m in metadata if isinstance(m, OneOf)), None)
    if choices is not None:
        return f"expected {none}one of {', '.join(repr(c) for c in sorted(choices, key=str))}"
    base = typing.get_args(inner)[0] if typing.get_origin(inner) is Annotated else inner
    finite = not isinstance(value, float) or math.isfinite(value)
    kind = "an integer" if base is int else "a number" if finite else "a finite number"
    return f"expected {none}{kind} {_bounds(metadata)}".rstrip()


def declared_failure(config: Any) -> tuple[str, str] | None:
    """(key, :func:`expected_words`) of the first field of the dataclass instance ``config`` whose
    value breaks its declared rule (a float must also be finite), else None."""
    for key, (adapter, hint) in _rules(type(config)).items():
        value = getattr(config, key)
        try:
            adapter.validate_python(value, strict=True)  # strict: True and 2.0 are not ints
        except ValidationError:
            return key, expected_words(hint, value)
        if isinstance(value, float) and not math.isfinite(value):
            return key, expected_words(hint, value)
    return None
