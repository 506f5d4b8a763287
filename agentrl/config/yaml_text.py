"""Reading YAML text (config files, ``--set`` values, a run dir's ``config.yaml``): safe, with
``1e-5`` read as a float, and anything unreadable a ConfigError naming where it came from."""

from __future__ import annotations

import re
from typing import Any

import yaml

from agentrl.errors import ConfigError, one_line


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-5`` as a float (YAML 1.1 wants ``1.0e-5``)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
    list("-+0123456789."),
)


def load_yaml(text: str, where: str = "YAML text") -> Any:
    """Parse YAML text with the float rule above; anything unparsable (syntax, a bad tag, a date that
    does not exist, an anchor that contains itself) is a ConfigError naming ``where``."""
    try:
        data = yaml.load(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(f"{where} is not valid YAML: {exc.problem or exc.context}{at}") from None
    except Exception as exc:  # other yaml.YAMLErrors, and ValueError/RecursionError from its constructors
        raise ConfigError(f"{where} is not valid YAML: {one_line(exc)}") from None
    if _cyclic(data, set()):
        raise ConfigError(f"{where}: an anchor that refers to itself (&a ... *a) is not supported")
    return data


def _cyclic(data: Any, open_ids: set[int]) -> bool:
    if not isinstance(data, (dict, list)):
        return False
    if id(data) in open_ids:
        return True
    open_ids.add(id(data))
    found = any(_cyclic(item, open_ids) for item in (data.values() if isinstance(data, dict) else data))
    open_ids.discard(id(data))
    return found
