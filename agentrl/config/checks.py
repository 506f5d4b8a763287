"""Building a config section from a mapping (:func:`build_plugin_config`: a plugin's section, or
``TrainConfig`` itself) through the one pydantic pass of :mod:`agentrl.config.rules`, and
:class:`ConfigCheck`, the wording of that pass for a config class's own ``__post_init__``. Every
failure is a one-line ConfigError naming the key."""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Mapping
from typing import Any, get_type_hints

from agentrl.config.rules import declared_failure, expected_words, first_failure, section_message
from agentrl.errors import AgentRLError, ConfigError, one_line


class ConfigCheck:
    """The checks of a plugin config's ``__post_init__``, each raising ConfigError
    ``SECTION.KEY=VALUE is invalid: expected ...``:

        check = ConfigCheck(self, "algorithm")
        check.declared()  # every field's declared rule (Field(ge=1), OneOf, Allowed, ...)
        if self.low > self.high:
            check.fail("low", f"expected a number <= high = {self.high}")
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
            self.fail(failure.key, expected_words(failure.hint, failure.value))


def with_int_floats(config_class: type[Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with integral floats (YAML reads ``1e9`` as a float) made ints for int fields."""
    hints = get_type_hints(config_class)
    out = dict(values)
    for key, value in values.items():
        hint = hints.get(key)
        if (hint is int or int in typing.get_args(hint)) and isinstance(value, float) and value.is_integer():
            out[key] = int(value)
    return out


def build_plugin_config(config_class: type[Any], values: Any, section: str) -> Any:
    """Instantiate a config dataclass from a mapping: a plugin's section, or ``TrainConfig`` with
    ``section`` "". Unknown keys, values not of their field's type and values outside a field's
    declared range are refused in one pass, naming the section and key; a range the class checks
    itself is worded by the class (:class:`ConfigCheck`)."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"{section} must be a mapping of options, got {values!r}")
    values = with_int_floats(config_class, values)
    failure = first_failure(config_class, values)
    if failure is not None and failure.kind == "unknown":
        raise ConfigError(_unknown_keys(config_class, failure.value, section))
    if failure is None or failure.kind == "range":
        try:
            built = config_class(**values)
        except AgentRLError:
            raise
        except Exception as exc:  # a third-party class whose own checks assumed other values
            raise ConfigError(f"{section}: {config_class.__name__} refused {values!r}: {one_line(exc)}") from exc
        if failure is None:
            return built
    raise ConfigError(section_message(failure, section))


def _unknown_keys(config_class: type[Any], keys: list[Any], section: str) -> str:
    known = sorted(f.name for f in dataclasses.fields(config_class))
    if section:
        unknown = ", ".join(sorted(repr(key) for key in keys))
        return f"unknown key(s) {unknown} in {section}; {config_class.__name__} accepts: {', '.join(known)}"
    close = difflib.get_close_matches(str(keys[0]), known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else " (`agentrl train --print-config` lists the keys)"
    return f"unknown config key {keys[0]!r}{hint}"
