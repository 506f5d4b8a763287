"""Checks of config values shared by ``TrainConfig``, plugin config classes and ``lora``: each
value against its field's type hint (:func:`check_types`), range checks for a config's
``__post_init__`` (:class:`ConfigCheck`), and a plugin's config dataclass built from a mapping
(:func:`build_plugin_config`). Every failure is a one-line ConfigError naming the key."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, get_type_hints

from agentrl.config.rules import check_declared, declared_failure
from agentrl.errors import AgentRLError, ConfigError, one_line


# -- type checks shared by TrainConfig and every plugin config class ----------------------------------
def check_types(config_class: type[Any], values: Mapping[str, Any], section: str = "") -> None:
    """Raise ConfigError unless each of ``values`` fits the type hint of the field it names in the
    dataclass ``config_class``: bool is not a number, an int is a float, floats are finite, mappings
    and pairs are checked item by item. ``section`` prefixes the key in the message."""
    hints = get_type_hints(config_class)
    for key, value in values.items():
        if key in hints:
            misfit = _misfit(value, hints[key], f"{section}.{key}" if section else key)
            if misfit is not None:
                name, expected, got = misfit
                raise ConfigError(f"{name} must be {expected}, got {got!r}")


def _misfit(value: Any, hint: Any, key: str) -> tuple[str, str, Any] | None:
    """None if ``value`` fits ``hint``, else (key, what was expected, the value) of the innermost misfit."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return None
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        misfits = [_misfit(value, a, key) for a in args if a is not type(None)]
        if any(m is None for m in misfits):
            return None
        items = [m for m in misfits if m is not None and m[0] != key]  # a mapping's bad item: name the item
        return items[0] if items else (key, _describe(hint), value)
    if origin is dict:
        if not isinstance(value, dict):
            return key, _describe(hint), value
        for name, item in value.items():
            if _misfit(name, args[0], key) is not None:
                return key, _describe(hint), value
            inner = _misfit(item, args[1], f"{key}.{name}")
            if inner is not None:
                return inner
        return None
    if origin is tuple:
        fits = isinstance(value, (tuple, list)) and len(value) == len(args)
        return (
            None
            if fits and all(_misfit(v, a, key) is None for v, a in zip(value, args))
            else (key, _describe(hint), value)
        )
    if hint is float:
        fits = _is_number(value) and (isinstance(value, int) or math.isfinite(value))
    elif hint is int:
        fits = isinstance(value, int) and not isinstance(value, bool)
    else:
        fits = not isinstance(hint, type) or isinstance(value, hint)
    return None if fits else (key, _describe(hint), value)


_NAMES = {
    float: "a finite number",
    int: "an integer",
    bool: "true or false",
    str: "a string",
    type(None): "null",
    Any: "anything",
}


def _describe(hint: Any) -> str:
    """``hint`` in words: ``dict[str, float]`` is 'a mapping of names to finite numbers'."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin is dict:
        return f"a mapping of names to {_plural(_describe(args[1]))}"
    if origin is tuple:
        return f"a list of {len(args)} {_plural(_describe(args[0]))}"
    return _NAMES.get(hint, getattr(hint, "__name__", str(hint)))


def _plural(words: str) -> str:
    words = words.removeprefix("a ").removeprefix("an ")
    if words.startswith("mapping"):
        return "mappings"
    return {"true or false": "booleans", "anything": "values"}.get(words, words + "s")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def with_int_floats(config_class: type[Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with integral floats (YAML reads ``1e9`` as a float) made ints for int fields."""
    hints = get_type_hints(config_class)
    out = dict(values)
    for key, value in values.items():
        hint = hints.get(key)
        if (hint is int or int in typing.get_args(hint)) and isinstance(value, float) and value.is_integer():
            out[key] = int(value)
    return out


class ConfigCheck:
    """Range checks for a plugin config's ``__post_init__``; each raises ConfigError
    ``SECTION.KEY=VALUE is invalid: expected ...`` (``allowed`` replaces the 'expected ...' text).
    Type-safe on their own; :func:`build_plugin_config` also checks every value's type first.

        check = ConfigCheck(self, "algorithm")
        check.number("epsilon_low", low=0, high=1, high_open=True)
        check.choice("loss_type", AGGREGATIONS)
    """

    def __init__(self, config: Any, section: str) -> None:
        self.config, self.section = config, section

    def fail(self, key: str, allowed: str) -> typing.NoReturn:
        """Raise the ConfigError for ``key``'s current value."""
        raise ConfigError(f"{self.section}.{key}={getattr(self.config, key)!r} is invalid: {allowed}")

    def declared(self) -> None:
        """Every field whose type hint declares a rule (:mod:`agentrl.config.rules`: pydantic's
        ``Field(ge=...)``, :class:`~agentrl.config.rules.OneOf`, ...), in field order."""
        failure = declared_failure(self.config)
        if failure is not None:
            self.fail(*failure)

    def number(
        self,
        key: str,
        low: float | None = None,
        high: float | None = None,
        *,
        low_open: bool = False,
        high_open: bool = False,
        optional: bool = False,
        allowed: str | None = None,
    ) -> None:
        """A finite number within the bounds (``*_open``: the bound itself is excluded); None if ``optional``."""
        value = getattr(self.config, key)
        if value is None and optional:
            return
        finite = _is_number(value) and (isinstance(value, int) or math.isfinite(value))
        if (
            finite
            and (low is None or value > low or (value == low and not low_open))
            and (high is None or value < high or (value == high and not high_open))
        ):
            return
        if low is not None and high is not None:
            bounds = f" in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        elif low is not None:
            bounds = f" {'>' if low_open else '>='} {low}"
        else:
            bounds = "" if high is None else f" {'<' if high_open else '<='} {high}"
        kind = "a finite number" if _is_number(value) and not finite else "a number"
        self.fail(key, allowed or f"expected {'None or ' if optional else ''}{kind}{bounds}")

    def integer(self, key: str, low: int, *, optional: bool = False, allowed: str | None = None) -> None:
        """An int (not a bool) >= ``low``; None if ``optional``."""
        value = getattr(self.config, key)
        if (value is None and optional) or (isinstance(value, int) and not isinstance(value, bool) and value >= low):
            return
        self.fail(key, allowed or f"expected {'None or ' if optional else ''}an integer >= {low}")

    def clipping(self) -> None:
        """The clipped-surrogate options a PPO-family config shares: ``epsilon_low`` in [0, 1),
        ``epsilon_high`` >= 0, ``delta`` None or > 1 + epsilon_high (dual clip), ``beta`` >= 0."""
        high = self.config.epsilon_high
        self.number("epsilon_low", low=0, high=1, high_open=True)
        self.number("epsilon_high", low=0)
        self.number(
            "delta",
            low=1 + high,
            low_open=True,
            optional=True,
            allowed=f"expected None or a number > 1 + epsilon_high = {1 + high}",
        )
        self.number("beta", low=0)

    def choice(self, key: str, choices: Iterable[Any], *, optional: bool = False, allowed: str | None = None) -> None:
        """One of ``choices`` (same type too: ``True`` is not ``1``, a list is never a name); None if ``optional``."""
        value, choices = getattr(self.config, key), list(choices)
        if (value is None and optional) or any(type(value) is type(c) and value == c for c in choices):
            return
        listed = ", ".join(repr(c) for c in sorted(choices, key=str))
        self.fail(key, allowed or f"expected {'None or ' if optional else ''}one of {listed}")

    def flag(self, key: str) -> None:
        """True or false."""
        if not isinstance(getattr(self.config, key), bool):
            self.fail(key, "expected true or false")


def build_plugin_config(config_class: type[Any], values: Any, section: str) -> Any:
    """Instantiate a plugin's config dataclass from a mapping: unknown keys, values of the wrong type
    (see :func:`check_types`) and values outside a field's declared range are refused naming the
    section and key, whatever the class checks itself."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"{section} must be a mapping of options, got {values!r}")
    known = {f.name for f in dataclasses.fields(config_class)}
    unknown = sorted(repr(key) for key in values if key not in known)
    if unknown:
        raise ConfigError(
            f"unknown key(s) {', '.join(unknown)} in {section}; "
            f"{config_class.__name__} accepts: {', '.join(sorted(known))}"
        )
    values = with_int_floats(config_class, values)
    check_types(config_class, values, section)
    try:
        built = config_class(**values)
    except AgentRLError:
        raise
    except Exception as exc:  # a third-party class whose own checks assumed other types
        raise ConfigError(f"{section}: {config_class.__name__} refused {values!r}: {one_line(exc)}") from exc
    check_declared(built, section)  # the declared ranges (``Field(ge=1)``), whether or not the class checks them
    return built
