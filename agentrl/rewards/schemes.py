"""Reward schemes: ``SCHEME:ARGUMENT`` rewards that a plugin builds with the run's context.

A plugin registers a scheme with ``agentrl_register_reward_schemes``: ``register("rm", factory)``;
``--reward rm:path/to/model[:WEIGHT]`` (or ``rewards: {"rm:path/to/model": 1.0}``) then calls
``factory(argument="path/to/model", context=RewardContext(...))`` once per run, which returns a
reward function ``fn(trajectories) -> list[float | None]``. The built-ins are ``rm`` (a learned
reward model) and ``judge`` (an LLM judge); a third party adds ``api:`` the same way.

A scheme whose argument is a local path says so when it registers: ``register("rm", factory,
path_argument=True)``, or a predicate ``path_argument=fn(argument) -> bool`` when only some of its
arguments are paths (``judge:PATH`` but not ``judge:policy``). A new run then stores such an
argument, when it names an existing relative path, as an absolute one (:func:`with_absolute_paths`),
so its ``config.yaml`` resumes from any directory.

Two more declarations make a scheme's folders usable by name alone and its form shown in errors:
``argument="MODEL_DIR"`` (how its argument is written in the message for an unknown reward;
``ARGUMENT`` when not declared), ``takes_folder`` (the model role a folder must fit,
``"rm"``, ``"prm"``, ``"judge"`` of :data:`agentrl.model.roles.ROLES`, or a predicate
``fn(folder) -> bool``) and ``bare_folder=True``: a reward given as a bare folder path
(``--reward ./my_rm``, as TRL's ``reward_funcs="path/to/rm"``) that this scheme takes is used as
``SCHEME:/abs/folder`` (:func:`bare_folder`, stored so in ``config.yaml``, labelled as the scheme);
a folder no such scheme takes is refused naming the schemes that do take it (``judge:./my_lm``).

A reward function may also have a ``pop_metrics() -> dict[str, float]`` method: the trainer logs
what it returns after each rollout as ``<label>/<key>`` (counts since the last call, e.g.
``judge/parse_failures``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError, unknown_name_message
from agentrl.model.aliases import is_alias
from agentrl.model.roles import ROLES, ModelFolderError, architecture_kind, check_folder

_NOTED: set[tuple[str, str]] = set()
"""Bare folder rewards this process has already said how it uses (said once, not per call)."""


@dataclass
class RewardContext:
    """What a reward scheme's factory may use from the run it scores for."""

    config: Any
    """The run's :class:`agentrl.config.train.TrainConfig` (``on_call_error``, ``call_timeout_s``, ...)."""
    settings: dict[str, Any]
    """Every plugin settings section, resolved (``settings["reward_model"]``)."""
    device: Any = "cpu"
    """The device the run computes on (a ``torch.device`` or its name)."""
    precision: Any = None
    """The run's :class:`agentrl.Precision` (bf16 or fp32); None: fp32."""
    columns: list[str] = field(default_factory=list)
    """The env's task columns (``question``, ``answer``, ...)."""
    tokenizer: Any = None
    """The policy's tokenizer; None until the run has loaded it (read it at call time)."""
    engine: Any = None
    """The policy's generation engine (the weights being trained, no second copy); None until the
    run has built it, so a reward reads it when called, not in its factory."""


def split_scheme(name: str, registry: Any) -> tuple[str, str] | None:
    """``(scheme, argument)`` when ``name`` is ``SCHEME:ARGUMENT`` of a registered scheme, else None."""
    scheme, sep, argument = name.partition(":")
    if not sep or scheme not in registry.names("reward_scheme"):
        return None
    if not argument:
        raise ConfigError(f"reward {name!r}: scheme {scheme!r} needs an argument ({scheme}:ARGUMENT[:WEIGHT])")
    return scheme, argument


def with_absolute_paths(config: Any, registry: Any) -> Any:
    """``config`` with each ``SCHEME:ARGUMENT`` reward whose scheme declares its argument a path
    (``path_argument``, see the module docstring) and that names an existing relative path made
    absolute, and each bare folder a scheme takes written ``SCHEME:/abs/folder``
    (:func:`canonical_reward`); ``config`` itself when nothing changes."""
    if not config.rewards:
        return config
    rewards = {canonical_reward(name, registry): weight for name, weight in config.rewards.items()}
    return config if list(rewards) == list(config.rewards) else dataclasses.replace(config, rewards=rewards)


def absolute_argument(name: str, registry: Any) -> str:
    """``name`` with its scheme argument made absolute when the scheme declares it a path and it
    names an existing relative path; ``name`` as it is otherwise."""
    scheme = split_scheme(name, registry)
    if scheme is None:
        return name
    declared = registry.get("reward_scheme", scheme[0]).meta.get("path_argument", False)
    path = Path(scheme[1]).expanduser()
    if not (declared(scheme[1]) if callable(declared) else declared) or path.is_absolute() or not path.exists():
        return name
    if is_alias(scheme[1]):  # a model alias, even where a folder of that name exists
        return name
    return f"{scheme[0]}:{os.path.abspath(path)}"


def unknown_prefix_message(name: str, registry: Any) -> str | None:
    """The error for ``PREFIX:TEXT`` whose prefix is neither a scheme nor importable and whose text is
    not a weight (``format:heavy``); None when ``name`` may be an import spec."""
    head, sep, tail = name.rpartition(":")
    if not sep or not head.isidentifier() or _importable(head):
        return None
    schemes = ", ".join(registry.names("reward_scheme")) or "none registered"
    return (
        f"reward {name!r}: weight {tail!r} is not a number, and {head!r} is neither a reward scheme "
        f"({schemes}) nor an importable module; accepted: an installed reward "
        f"({', '.join(registry.names('reward')) or 'none'}), {reward_forms(registry)}"
    )


def scheme_forms(registry: Any) -> list[str]:
    """Each registered scheme written with its argument's form (meta ``argument``): ``rm:MODEL_DIR``."""
    return [
        f"{name}:{registry.get('reward_scheme', name).meta.get('argument', 'ARGUMENT')}"
        for name in registry.names("reward_scheme")
    ]


def reward_forms(registry: Any) -> str:
    """Every form a reward may take besides an installed name, in the words of the errors."""
    bare = [c for c in _schemes(registry) if c.meta.get("bare_folder")]
    folder = "".join(f", a folder holding {_folder_kind(c)} (used as {c.name}:)" for c in bare)
    schemes = ", ".join(scheme_forms(registry)) or "none registered"
    return (
        f"a reward scheme ({schemes}){folder}, or a function: path/file.py:func or module:func; "
        "each with an optional :WEIGHT"
    )


def unknown_reward_message(name: str, registry: Any) -> str:
    """The error for a reward ``name`` that is none of the forms: every installed reward, every
    scheme's form, the bare folder and the function specs."""
    message = unknown_name_message("reward", name, registry.names("reward"))
    if "/" in name or name.startswith((".", "~")):
        message += f" No folder {name!r} exists either."
    return f"{message} Also accepted: {reward_forms(registry)}"


def canonical_reward(name: str, registry: Any) -> str:
    """``name`` as a run stores it: a bare folder a scheme takes as ``SCHEME:/abs/folder``
    (:func:`bare_folder`), a declared-path scheme argument made absolute (:func:`absolute_argument`)."""
    return bare_folder(name, registry) or absolute_argument(name, registry)


def bare_folder(name: str, registry: Any) -> str | None:
    """``SCHEME:/abs/folder`` when ``name`` is an existing folder (not an installed reward, no
    ``:``) that a scheme declaring ``bare_folder`` takes, said once on stderr; None when ``name`` is
    no folder or no scheme takes bare folders; a ConfigError naming what the folder holds and the
    schemes that take it (``use judge:./my_lm``) otherwise."""
    schemes = _schemes(registry)
    bare = [c for c in schemes if c.meta.get("bare_folder")]
    folder = Path(name).expanduser()
    if ":" in name or name in registry.names("reward") or not bare or not folder.is_dir():
        return None
    fits = [c for c in schemes if _takes(c, folder)]
    chosen = next((c for c in fits if c.meta.get("bare_folder")), None)
    if chosen is not None:
        canonical = f"{chosen.name}:{os.path.abspath(folder)}"
        if (name, canonical) not in _NOTED and os.environ.get("RANK", "0") == "0":  # one line per run, not per rank
            _NOTED.add((name, canonical))
            print(
                f"note: reward {name!r} is a folder holding {_folder_kind(chosen)}: used as {canonical}",
                file=sys.stderr,
                flush=True,
            )
        return canonical
    taken = " or ".join(f"{_folder_kind(c)} (as {c.name}:)" for c in bare)
    holding = _holding(folder)
    if fits:
        use = " or ".join(f"{c.name}:{name}" for c in fits)
        raise ConfigError(
            f"reward {name!r} is a folder holding {holding}; a bare folder is used only when it holds {taken}: "
            f"use {use}"
        )
    raise ConfigError(
        f"reward {name!r} is a folder holding {holding}, which no reward scheme takes; a bare folder is used "
        f"only when it holds {taken}; the schemes: {', '.join(scheme_forms(registry))}"
    )


def _schemes(registry: Any) -> list[Any]:
    return [registry.get("reward_scheme", name) for name in registry.names("reward_scheme")]


def _takes(scheme: Any, folder: Path) -> bool:
    """Whether ``scheme``'s declared ``takes_folder`` (a role or a predicate) accepts ``folder``."""
    check = scheme.meta.get("takes_folder")
    if isinstance(check, str):
        try:
            check_folder(check, folder)
        except ModelFolderError:
            return False
        return True
    return bool(check(str(folder))) if callable(check) else False


def _folder_kind(scheme: Any) -> str:
    """What a folder ``scheme`` takes holds, in words: ``a`` its role's kind, else ``what SCHEME: takes``."""
    role = ROLES.get(scheme.meta.get("takes_folder")) if isinstance(scheme.meta.get("takes_folder"), str) else None
    return f"a {role.kind}" if role is not None else f"what {scheme.name}: takes"


def _holding(folder: Path) -> str:
    """What a folder holds, in words: ``a causal LM (LlamaForCausalLM)``, ``no model (no config.json)``."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except FileNotFoundError:
        return "no model (no config.json)"
    except (OSError, ValueError):
        return "a model whose config.json is unreadable"
    architectures = config.get("architectures") if isinstance(config, dict) else None
    if not architectures:
        return "a model whose config.json names no architecture"
    kind = architecture_kind(str(architectures[0]))
    return f"a {kind} ({architectures[0]})" if kind else f"a {architectures[0]}"


def _importable(module: str) -> bool:
    """Whether ``module`` can be imported (the current directory counts, as under ``python -m``)."""
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
