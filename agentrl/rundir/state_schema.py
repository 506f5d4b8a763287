"""Every value a checkpoint holds is checked before a resume uses it (docs/concepts/guards.md#checkpoints).

A checkpoint may come from someone else, and its manifest only proves the files are as written,
not that the values in them make sense. The JSON state files are checked against pydantic models
and the RNG states by restoring them into scratch generators (:func:`state_problem`, part of
:func:`agentrl.rundir.checkpoints.damage`); tensors and plugin-shaped state against the live
objects they are loaded into (:func:`optimizer_problem`, :func:`module_problem`,
:func:`structure_problem`). Each problem is one line naming the file and the key.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentrl.errors import CheckpointError, one_line
from agentrl.rundir.state_files import from_json

Count = Annotated[int, Field(ge=0)]


class TrainerState(BaseModel):
    """``trainer_state.json``: where the loop was (see :meth:`agentrl.training.saving.RunCheckpoints.save`)."""

    model_config = ConfigDict(strict=True, extra="allow")
    step: Count
    task_cursor: Count
    metrics_bytes: Count
    completions_bytes: Count
    eval_completions_bytes: Count | None = None
    nonfinite_skips: Count
    skipped_in_a_row: Count
    eval_before: dict[str, float | None]
    sharded: bool = False
    config: dict[str, Any]


class Ready(BaseModel):
    """One batch an asynchronous run collected ahead."""

    model_config = ConfigDict(strict=True, extra="allow", arbitrary_types_allowed=True)
    step: Annotated[int, Field(ge=1)]
    version: Count
    batch: dict[str, torch.Tensor]
    extras: dict[str, Any]
    episodes: list[dict[str, Any]]
    metrics: dict[str, float | None]
    rewards: list[float | None]


class AsyncState(BaseModel):
    """What an asynchronous run had collected ahead, and the next step to collect."""

    model_config = ConfigDict(strict=True)
    next_step: Annotated[int, Field(ge=1)]
    ready: list[Ready]


class Process(BaseModel):
    """One process's RNG, engine and asynchronous state."""

    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)
    rng: dict[str, Any]
    engine: dict[str, Any]
    async_: AsyncState | None = Field(default=None, alias="async")


class Extra(BaseModel):
    """``state.json``: schedules, each process's state, the algorithm's and the plugins'."""

    model_config = ConfigDict(strict=True, extra="forbid")
    schedules: dict[str, dict[str, Any]]
    processes: Annotated[list[Process], Field(min_length=1)]
    algorithm: dict[str, Any]
    plugins: dict[str, Any]


def validation_line(file: str, exc: ValidationError) -> str:
    """The first error of ``exc`` as one line naming ``file`` and the key."""
    error = exc.errors()[0]
    key = ".".join(str(part) for part in error["loc"]) or "(the whole file)"
    got = "" if error["type"] == "missing" else f", got {one_line(ValueError(repr(error['input'])), 60)}"
    return f"{file} key {key!r}: {error['msg'][:1].lower()}{error['msg'][1:]}{got}"


def state_problem(folder: Path, step: int | None) -> str | None:
    """What is wrong with the values of checkpoint ``folder``'s JSON state files (``step``: the
    step its name and manifest give), None when nothing: types, ranges, RNG states."""
    try:
        trainer = TrainerState.model_validate(json.loads((folder / "trainer_state.json").read_text()))
    except ValidationError as exc:
        return validation_line("trainer_state.json", exc)
    except (OSError, ValueError) as exc:
        return f"trainer_state.json is unreadable ({one_line(exc)})"
    if step is not None and trainer.step != step:
        return f"trainer_state.json key 'step': {trainer.step}, but the checkpoint is of step {step}"
    if not (folder / "state.json").is_file():
        return None  # an earlier agentrl's (state.pt): checked as it loads
    try:
        extra = Extra.model_validate(from_json(json.loads((folder / "state.json").read_text())))
    except ValidationError as exc:
        return validation_line("state.json", exc)
    except (OSError, ValueError, CheckpointError) as exc:
        return f"state.json is unreadable ({one_line(exc)})"
    for i, process in enumerate(extra.processes):
        if problem := rng_problem(process.rng):
            return f"state.json key 'processes.{i}.rng.{problem}"
    return None


def rng_problem(states: dict[str, Any]) -> str | None:
    """``key': what is wrong`` for the first RNG state in ``states`` that a scratch generator of
    its kind refuses, None when each restores (the global generators are not touched)."""
    checks = {
        "python": lambda s: random.Random().setstate((s[0], tuple(s[1]), s[2])),
        "numpy": lambda s: np.random.RandomState().set_state((s[0], np.asarray(s[1], dtype=np.uint32), *s[2:])),
        "torch": lambda s: torch.Generator().set_state(s),
        "cuda": lambda s: [_cuda_state(t) for t in s],
    }
    for key in ("python", "numpy", "torch"):
        if key not in states:
            return f"{key}': missing"
    for key, value in states.items():
        if key not in checks:
            return f"{key}': not a random generator agentrl keeps"
        try:
            checks[key](value)
        except (TypeError, ValueError, OverflowError, RuntimeError, IndexError, KeyError) as exc:
            return f"{key}': not a state this generator takes ({one_line(exc, 120)})"
    return None


def _cuda_state(value: Any) -> None:
    if not (isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and value.dim() == 1):
        raise TypeError(f"a CUDA generator state is a 1-D uint8 tensor, got {type(value).__name__}")


def structure_problem(saved: Any, live: Any, where: str) -> str | None:
    """What keeps ``saved`` from standing in for ``live`` (the state an object has now): a key it
    lacks or a value of another kind, a list of another length, a tensor of another shape or
    dtype; ``where``: the file and key, for the message. None when it fits."""
    if live is None:
        return None
    if isinstance(live, torch.Tensor):
        if not isinstance(saved, torch.Tensor):
            return f"{where}: a {type(saved).__name__}, not a tensor"
        if saved.shape != live.shape or saved.dtype != live.dtype:
            return f"{where}: a {saved.dtype} tensor of shape {list(saved.shape)}, not {live.dtype} {list(live.shape)}"
        return None
    if isinstance(live, dict):
        if not isinstance(saved, dict):
            return f"{where}: a {type(saved).__name__}, not a mapping"
        for key, value in live.items():
            if key in saved and (problem := structure_problem(saved[key], value, f"{where}.{key}")):
                return problem
        return None
    if isinstance(live, (list, tuple)):
        if not isinstance(saved, (list, tuple)) or len(saved) != len(live):
            return f"{where}: {_kind(saved)}, not a list of {len(live)}"
        return next(
            (p for i, (s, v) in enumerate(zip(saved, live)) if (p := structure_problem(s, v, f"{where}.{i}"))), None
        )
    if isinstance(live, bool) or isinstance(saved, bool):
        return None if type(saved) is type(live) else f"{where}: {saved!r}, not a {type(live).__name__}"
    if isinstance(live, (int, float)):
        ok = isinstance(saved, int) if isinstance(live, int) else isinstance(saved, (int, float))
        return None if ok else f"{where}: {saved!r}, not a {type(live).__name__}"
    return None if isinstance(saved, type(live)) else f"{where}: {saved!r}, not a {type(live).__name__}"


def _kind(value: Any) -> str:
    return f"a list of {len(value)}" if isinstance(value, (list, tuple)) else f"a {type(value).__name__}"


OPTIMIZER_IMPLEMENTATION_KEYS = ("fused", "foreach", "capturable", "differentiable")
"""Param-group settings that choose how an optimizer computes, not what: not compared on resume."""


def optimizer_problem(saved: Any, optimizer: torch.optim.Optimizer, where: str, shapes: bool = True) -> str | None:
    """What keeps optimizer state ``saved`` from fitting ``optimizer``: its param groups (count,
    parameters, settings) and each parameter's state (``step`` a number, moments of the
    parameter's shape unless not ``shapes``: a sharded run keeps whole states)."""
    if not isinstance(saved, dict) or not isinstance(saved.get("param_groups"), list):
        return f"{where}: not an optimizer state (no param_groups)"
    groups, live = saved["param_groups"], optimizer.param_groups
    if len(groups) != len(live):
        return f"{where}.param_groups: {len(groups)} groups, but the optimizer has {len(live)}"
    params: dict[Any, torch.Tensor] = {}
    for i, (group, own) in enumerate(zip(groups, live)):
        ids = group.get("params") if isinstance(group, dict) else None
        kinds = (int,) if shapes else (int, str)  # a sharded run's whole state names its parameters
        if not isinstance(ids, list) or len(ids) != len(own["params"]) or not all(type(n) in kinds for n in ids):
            return f"{where}.param_groups.{i}.params: not the ids of the group's {len(own['params'])} parameters"
        settings = {k: v for k, v in own.items() if k != "params" and k not in OPTIMIZER_IMPLEMENTATION_KEYS}
        if problem := structure_problem(group, settings, f"{where}.param_groups.{i}"):
            return problem
        params.update(zip(ids, own["params"]))
    if len(params) != sum(len(g["params"]) for g in live):
        return f"{where}.param_groups: a parameter id appears twice"
    state = saved.get("state")
    if not isinstance(state, dict):
        return f"{where}.state: not a mapping"
    for key, values in state.items():
        if key not in params or not isinstance(values, dict):
            return f"{where}.state.{key}: no parameter of that id, or not a mapping"
        for name, value in values.items():
            if problem := _moment_problem(name, value, params[key], shapes, f"{where}.state.{key}.{name}"):
                return problem
    return None


def _moment_problem(name: str, value: Any, param: torch.Tensor, shapes: bool, where: str) -> str | None:
    if name == "step":
        scalar = isinstance(value, torch.Tensor) and value.numel() == 1 and value.is_floating_point()
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if scalar or number else f"{where}: {_kind(value)}, not a step count (a float scalar)"
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        return f"{where}: {_kind(value)}, not a floating-point tensor"
    if shapes and value.shape != param.shape:
        return f"{where}: shape {list(value.shape)}, but the parameter's is {list(param.shape)}"
    return None


def module_problem(saved: Any, module: torch.nn.Module, where: str) -> str | None:
    """What keeps state dict ``saved`` from loading into ``module``: keys missing or extra, a
    value that is not a tensor of the module's shape."""
    live = module.state_dict()
    if not isinstance(saved, dict):
        return f"{where}: {_kind(saved)}, not a state dict"
    if missing := sorted(set(live) - set(saved)):
        return f"{where}: lacks {missing[:3]}"
    if extra := sorted(set(saved) - set(live)):
        return f"{where}: holds keys the module has not: {extra[:3]}"
    for key, value in saved.items():
        if not isinstance(value, torch.Tensor) or value.shape != live[key].shape:
            got = list(value.shape) if isinstance(value, torch.Tensor) else _kind(value)
            return f"{where}.{key}: {got}, not a tensor of shape {list(live[key].shape)}"
    return None
