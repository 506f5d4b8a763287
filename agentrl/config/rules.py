"""Declared rules of config fields and the one validation pass every config section goes through.

A field's type hint carries its rule, pydantic checks it:

    max_steps: Annotated[int, Field(ge=1)] = 40
    top_k: Annotated[int, Field(ge=0), Note("0: off")] = 0
    precision: Annotated[str, OneOf("auto", "bf16", "fp32")] = "auto"

:func:`first_failure` checks a mapping of a config dataclass's fields in one pydantic pass (strict:
``True`` and ``2.0`` are not ints, a float is finite; unknown keys are refused) and returns the first
:class:`Failure`; the functions after it put a failure in words (the type: :func:`type_words`; what
the rule allows: :func:`allowed_words`, or :class:`Allowed` where the words matter), so callers
raise the one-line ConfigError naming key, value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, get_type_hints

from annotated_types import Ge, Gt, Le, Lt
from pydantic import ConfigDict, TypeAdapter, ValidationError
from pydantic_core import PydanticCustomError, core_schema
from typing_extensions import TypedDict

from agentrl.errors import AgentRLError, ConfigError

SECTION = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, arbitrary_types_allowed=True)
"""How every config section is validated: strict types, finite floats, no unknown keys."""


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
        """Pydantic hook: the source type's schema, then the membership check."""
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def _check(self, value: Any) -> Any:
        if any(type(value) is type(c) and value == c for c in self.choices):
            return value
        raise PydanticCustomError("one_of", "not one of the choices")

    @property
    def words(self) -> str:
        """``one of a, b``."""
        return "one of " + ", ".join(str(c) for c in self.choices)


@dataclass(frozen=True)
class Failure:
    """The first value of a config mapping that breaks its field's type or rule (:func:`first_failure`)."""

    key: Any
    """The field at fault; for ``unknown``, the first unknown key."""
    value: Any
    """The field's value; for ``unknown``, every unknown key (a list)."""
    hint: Any = None
    """The field's type hint with its rule."""
    kind: str = "range"
    """``unknown`` (no such field), ``type`` (not of the field's type, or not finite) or ``range``."""
    words: str = ""
    """Which :class:`Allowed` words fit: ``wrong_type``, ``too_low``, ``too_high`` or ``""`` (the main text)."""
    loc: tuple[Any, ...] = ()
    """Where in the value pydantic found the fault (``("rewards", "format")``)."""


_TYPE_ERRORS = {"finite_number", "missing", "too_long", "is_instance_of", "invalid_key"}
_BOUNDS = {
    "greater_than": "too_low",
    "greater_than_equal": "too_low",
    "less_than": "too_high",
    "less_than_equal": "too_high",
}


def first_failure(config_class: type[Any], values: Mapping[Any, Any], *, declared_only: bool = False) -> Failure | None:
    """None if ``values`` (field name -> value) fit the dataclass ``config_class``'s fields, else the
    first that does not, unknown keys first; one pydantic pass. ``declared_only``: only the fields
    whose hint declares a rule are known."""
    try:
        _adapter(config_class, declared_only).validate_python(dict(values))
        return None
    except ValidationError as exc:
        errors = exc.errors()
    unknown = [e["loc"][0] for e in errors if e["type"] in ("extra_forbidden", "invalid_key") and len(e["loc"]) == 1]
    if unknown:
        return Failure(unknown[0], unknown, kind="unknown")
    key, value = errors[0]["loc"][0], values[errors[0]["loc"][0]]
    own = [e["type"] for e in errors if e["loc"][0] == key]  # a union's members each fail
    typed = all(kind.endswith("_type") or kind in _TYPE_ERRORS for kind in own)
    words = (
        ""  # a NaN or infinity: no bound words fit
        if isinstance(value, float) and not math.isfinite(value)
        else "wrong_type"
        if own[0].endswith("_type") or own[0] == "is_instance_of"
        else _BOUNDS.get(own[0], "")
    )
    hint = field_hints(config_class, declared_only)[key]
    return Failure(key, value, hint, "type" if typed else "range", words, errors[0]["loc"])


@functools.cache
def field_hints(config_class: type[Any], declared_only: bool = False) -> dict[str, Any]:
    """Field name -> its type hint with its rule, for the fields of the dataclass ``config_class`` in
    order (``declared_only``: those whose hint declares a rule); a subclass that only changes a
    field's default (a plain hint) keeps its base class's rule."""
    hints: dict[str, Any] = {}
    for cls in reversed(config_class.__mro__):
        resolved = get_type_hints(cls, include_extras=True)
        for key in vars(cls).get("__annotations__", {}):
            if _annotated(resolved[key]) or not _annotated(hints.get(key)):
                hints[key] = resolved[key]
    fields = [f.name for f in dataclasses.fields(config_class)]
    return {key: hints[key] for key in fields if not declared_only or _annotated(hints[key])}


@functools.cache
def _adapter(config_class: type[Any], declared_only: bool) -> TypeAdapter[Any]:
    """A validator of the fields as a TypedDict: it checks without building the class (whose own
    ``__post_init__`` may run this pass), so the class gets the values as given (1 stays an int)."""
    schema = TypedDict(config_class.__name__, field_hints(config_class, declared_only), total=False)
    schema.__pydantic_config__ = SECTION
    return TypeAdapter(schema)


def _annotated(hint: Any) -> bool:
    return typing.get_origin(hint) is Annotated or any(_annotated(a) for a in typing.get_args(hint))


def declared_failure(config: Any) -> Failure | None:
    """The first field of the dataclass instance ``config`` whose value breaks its declared rule."""
    names = field_hints(type(config), True)
    return first_failure(type(config), {key: getattr(config, key) for key in names}, declared_only=True)


def check_declared(
    config: Any, section: str = "", *, prefix: str = "", error: type[AgentRLError] = ConfigError
) -> None:
    """Raise ``error`` ``KEY must be WORDS, got VALUE`` (``SECTION.KEY`` where given; ``; got``
    after ``one of``; ``prefix`` first, as given; a field's :class:`Complaint` in its place)
    for the first field of the dataclass instance ``config`` that breaks its declared rule
    (True and 2.0 are not ints, a list is not a tuple)."""
    failure = declared_failure(config)
    if failure is not None:
        raise error(prefix + declared_message(failure, section))


def declared_message(failure: Failure, section: str = "") -> str:
    """``SECTION.KEY must be WORDS, got VALUE`` with the words of the field's rule (its :class:`Complaint`)."""
    allowed = allowed_words(failure.hint, failure.words)
    shown = list(failure.value) if isinstance(failure.value, tuple) else failure.value
    name = f"{section}.{failure.key}" if section else failure.key
    complaint = next((m for m in _metadata(failure.hint) if isinstance(m, Complaint)), None)
    if complaint:
        return complaint.template.format(key=name, value=shown, allowed=allowed)
    return f"{name} must be {allowed}{';' if allowed.startswith('one of ') else ','} got {shown!r}"


def section_message(failure: Failure, section: str = "") -> str:
    """The message of a failure building a section: ``KEY must be TYPE, got VALUE`` for a value not
    of its field's type (``KEY.ITEM`` where one item of a mapping is at fault), else :func:`declared_message`."""
    if failure.kind != "type":
        return declared_message(failure, section)
    name, value, hint = f"{section}.{failure.key}" if section else failure.key, failure.value, failure.hint
    mapping = _mapping_item_hint(hint)
    loc = failure.loc
    if mapping is not None and len(loc) > 1 and loc[2:3] != ("[key]",) and loc[1] in value:
        name, value, hint = f"{name}.{loc[1]}", value[loc[1]], mapping
    return f"{name} must be {type_words(hint)}, got {value!r}"


def _mapping_item_hint(hint: Any) -> Any:
    """The value type of the mapping ``hint`` is (``X | None`` included), else None."""
    hint = _bare(hint)
    options = [a for a in typing.get_args(hint) if a is not type(None)] if _is_union(hint) else [hint]
    return typing.get_args(options[0])[1] if len(options) == 1 and typing.get_origin(options[0]) is dict else None


def rule_failure(config_class: type[Any], key: str, value: Any) -> str | None:
    """None if ``value`` keeps the rule declared on ``config_class``'s field ``key`` (or it declares
    none), else what is allowed, in words (``>= 1``, ``in (0, 1]``, ``one of a, b``, ``>= 1 or null``)."""
    if key not in field_hints(config_class, True):
        return None
    failure = first_failure(config_class, {key: value}, declared_only=True)
    return None if failure is None else allowed_words(failure.hint, failure.words)


# -- words -------------------------------------------------------------------------------------------
def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _bare(hint: Any) -> Any:
    """``hint`` without its rules (``Annotated`` metadata), at any depth."""
    if typing.get_origin(hint) is Annotated:
        return _bare(typing.get_args(hint)[0])
    if _is_union(hint):
        return functools.reduce(lambda a, b: a | b, [_bare(a) for a in typing.get_args(hint)])
    return hint


def _metadata(hint: Any) -> list[Any]:
    """The metadata of ``hint`` and of the members of a union it is, pydantic's ``Field`` unpacked."""
    found = [m for item in getattr(hint, "__metadata__", ()) for m in getattr(item, "metadata", [item])]
    return found + [m for arg in typing.get_args(hint) if _is_union(hint) for m in _metadata(arg)]


_NAMES = {float: "a finite number", int: "an integer", bool: "true or false", str: "a string", type(None): "null"}


def type_words(hint: Any) -> str:
    """The type of ``hint`` in words: ``dict[str, float]`` is 'a mapping of names to finite numbers'."""
    hint = _bare(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if _is_union(hint):
        return " or ".join(type_words(a) for a in args)
    if origin is dict:
        return f"a mapping of names to {_plural(type_words(args[1]))}"
    if origin is tuple:
        return f"a list of {len(args)} {_plural(type_words(args[0]))}"
    return "anything" if hint is Any else _NAMES.get(hint, getattr(hint, "__name__", str(hint)))


def _plural(words: str) -> str:
    words = words.removeprefix("a ").removeprefix("an ")
    if words.startswith("mapping"):
        return "mappings"
    return {"true or false": "booleans", "anything": "values"}.get(words, words + "s")


def allowed_words(hint: Any, failure: str = "") -> str:
    """The rule of ``hint`` in words: its :class:`Allowed` text (for ``failure``, see
    :meth:`Allowed.words`), else its bounds or choices (and ``or null`` where None is allowed),
    with its :class:`Note`; "" where it declares no rule."""
    args = typing.get_args(hint)
    if _is_union(hint):
        words = " or ".join(allowed_words(a, failure) for a in args if a is not type(None))
        return f"{words} or null" if words and type(None) in args else words
    if typing.get_origin(hint) is not Annotated:
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
    optional = type(None) in typing.get_args(hint) and _is_union(hint)
    inner = next((a for a in typing.get_args(hint) if a is not type(None)), hint) if optional else hint
    metadata = _metadata(inner) + [
        m for item in getattr(hint, "__metadata__", ()) for m in getattr(item, "metadata", [item])
    ]
    allowed = next((m.text for m in metadata if isinstance(m, Allowed)), None)
    if allowed is not None:
        return allowed
    none = "None or " if optional else ""
    choices = next((m.choices for m in metadata if isinstance(m, OneOf)), None)
    if choices is not None:
        return f"expected {none}one of {', '.join(repr(c) for c in sorted(choices, key=str))}"
    finite = not isinstance(value, float) or math.isfinite(value)
    kind = "an integer" if _bare(inner) is int else "a number" if finite else "a finite number"
    return f"expected {none}{kind} {_bounds(metadata)}".rstrip()
