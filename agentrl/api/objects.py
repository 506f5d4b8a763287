"""Python objects where the CLI takes names: each registered in the run's plugin manager under a
name the config holds (a reward function under its ``__name__``, an env class under its class
name), an agent function named by its file, rows in memory written into the run dir."""

from __future__ import annotations

import copy
import functools
import inspect
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentrl.env.datasets import read_rows
from agentrl.errors import ConfigError
from agentrl.plugins import PluginManager

GIVEN = "python"
"""The plugin name objects given to the API are registered under (``agentrl plugins`` shows none)."""


class GivenObjects:
    """Names for the objects given to :class:`agentrl.Trainer`, registered in ``manager``."""

    def __init__(self, manager: PluginManager) -> None:
        self.manager = manager

    def name(self, kind: str, obj: Any, what: str) -> str:
        """``obj`` itself when it is a name, else the name it is registered under (its ``__name__``;
        refused when an installed plugin's component already has that name)."""
        if isinstance(obj, str):
            return obj
        if isinstance(obj, Path):
            return str(obj)
        name = getattr(obj, "__name__", None) or type(obj).__name__
        registry = self.manager.registry
        if name in registry.names(kind):
            owner = registry.get(kind, name)
            if owner.factory is obj or owner.meta.get("given") is obj:
                return name
            raise ConfigError(
                f"{what} {name!r}: an installed plugin ({owner.plugin!r}) already has a {kind} of that name; "
                "rename yours or pass the installed one by name"
            )
        factory = functools.partial(copy.deepcopy, obj) if kind == "env" and not callable(obj) else obj
        registry.add(kind, name, factory, GIVEN, given=obj)
        return name

    def env(self, env: Any) -> str | None:
        """A name, an ``agentrl.Env`` subclass, a factory, or an instance (each run slot gets a copy)."""
        return None if env is None else self.name("env", env, "env")

    def algorithm(self, algo: Any) -> str | None:
        """A name or an ``agentrl.Algorithm`` subclass."""
        return None if algo is None else self.name("algorithm", algo, "algo")

    def rewards(self, rewards: Any) -> dict[str, float] | None:
        """A reward (a name or a function, agentrl- or TRL-style), a list of them (each may be a
        ``(reward, weight)`` pair) or a mapping reward -> weight, as name -> weight."""
        if rewards is None:
            return None
        if isinstance(rewards, Mapping):
            pairs = list(rewards.items())
        elif isinstance(rewards, (str, Path)) or callable(rewards):
            pairs = [(rewards, 1.0)]
        else:
            pairs = [item if isinstance(item, tuple) else (item, 1.0) for item in rewards]
        out = {}
        for reward, weight in pairs:
            if not (isinstance(reward, (str, Path)) or callable(reward)):
                raise ConfigError(f"rewards: {reward!r} is neither a reward name nor a function")
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
                raise ConfigError(f"rewards: the weight of {reward!r} must be a finite number, got {weight!r}")
            out[self.name("reward", reward, "reward")] = float(weight)
        return out


def agent_spec(agent: Any) -> str:
    """``path/file.py:function`` for an agent function (its worker processes import it by that), or
    the spec given; a function they could not import (defined in ``__main__``, a notebook, or
    inside another function) is refused with the fix."""
    if isinstance(agent, str):
        return agent
    if not callable(agent):
        raise ConfigError(f"agent: {agent!r} is neither a function nor 'path/file.py:function'")
    module = inspect.getmodule(agent)
    source = getattr(module, "__file__", None)
    qualname = getattr(agent, "__qualname__", "")
    if module is None or module.__name__ == "__main__" or source is None or "." in qualname or "<" in qualname:
        raise ConfigError(
            f"agent {getattr(agent, '__name__', agent)!r}: its worker processes import the agent by file, so it must "
            "be a top-level function of a module or file (not __main__, a notebook cell or a nested function): "
            "put it in agent.py and pass agent='agent.py:run_agent' or the function imported from there"
        )
    return f"{source}:{qualname}"


def dataset_section(dataset: Any, eval_dataset: Any, folder: Path) -> dict[str, Any] | None:
    """The ``dataset`` section for ``dataset`` (a path, rows, or a ``datasets.Dataset``) and
    ``eval_dataset``: paths as they are, rows in memory written to ``folder`` as JSONL first."""
    if dataset is None:
        if eval_dataset is not None:
            raise ConfigError("eval_dataset needs a dataset: pass dataset= too")
        return None
    section = {"path": _stored(dataset, folder / "train.jsonl", "dataset")}
    if eval_dataset is not None:
        section["eval_path"] = _stored(eval_dataset, folder / "eval.jsonl", "eval_dataset")
    elif not isinstance(dataset, (str, Path)):
        held_out = read_rows(dataset, "dataset")[1]  # a DatasetDict's test split
        if held_out is not None:
            section["eval_path"] = _stored(held_out, folder / "eval.jsonl", "dataset (held-out split)")
    return section


def _stored(rows: Any, path: Path, what: str) -> str:
    """``rows``' path, or the file they were written to."""
    if isinstance(rows, (str, Path)):
        return str(rows)
    train = read_rows(rows, what)[0]
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for number, row in enumerate(train, 1):
        try:
            lines.append(json.dumps(row, ensure_ascii=False, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{what}, row {number}: cannot be stored as JSON ({exc})") from None
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def merged(base: Mapping[str, Any] | None, extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra``'s keys set (a nested mapping merged one level down)."""
    out = dict(base or {})
    for key, value in extra.items():
        out[key] = {**out[key], **value} if isinstance(value, Mapping) and isinstance(out.get(key), Mapping) else value
    return out
