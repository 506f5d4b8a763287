"""``agentrl new``: scaffold an installable plugin package for an env or a reward function.

``agentrl new env NAME [--dir DIR] [--multi-turn | --tools]`` and ``agentrl new reward NAME [--dir DIR]`` write a
package ``agentrl-env-NAME`` / ``agentrl-reward-NAME`` (default directory: that name, in the current
directory) holding:

* ``pyproject.toml`` with an entry point in the ``agentrl`` group, so ``pip install -e DIR`` makes
  ``--env NAME`` / ``--reward NAME`` work with no other step;
* the module ``agentrl_env_NAME`` / ``agentrl_reward_NAME``: a short documented example and the
  ``agentrl_register_envs`` / ``agentrl_register_rewards`` hook implementation;
* ``README.md`` and ``tests/test_NAME.py``, which runs ``agentrl.testing.check_env`` /
  ``check_reward`` and passes as generated (``pytest`` in DIR; no install needed).

The files are rendered from ``string.Template`` files shipped with agentrl as package data
(``agentrl/cli/templates/``, read through :mod:`importlib.resources`; placeholders ``$name``, ``$module``,
``$dist``, ``$Class`` / ``$fn``, ``$kind``, ``$entry``, ``$summary``). The library functions
(:func:`new_env`, :func:`new_reward`) raise :class:`agentrl.ConfigError` for a bad name or an
existing directory; the CLI (:mod:`agentrl.cli.new`) prints that one line and exits 2.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from string import Template

from agentrl.errors import ConfigError

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Scaffold:
    """What :func:`new_env` / :func:`new_reward` wrote, and the commands to run next."""

    kind: str
    """``env`` or ``reward``."""
    name: str
    """The component name (``--env NAME`` / ``--reward NAME``)."""
    directory: Path
    """The package directory (pass it to ``pip install -e``)."""
    module: str
    """The importable module (``agentrl_env_NAME``)."""
    files: list[Path] = field(default_factory=list)
    """Every file written, under ``directory``."""

    @property
    def next_commands(self) -> list[str]:
        """The shell commands that install, test and use the new package."""
        use = (
            f"agentrl train --env {self.name}"
            if self.kind == "env"
            else f"agentrl train --env math --reward accuracy:1.0 --reward {self.name}:0.2"
        )
        return [f"pip install -e {self.directory}", f"pytest {self.directory / 'tests'}", use]


MAX_NAME_LENGTH = 64
"""The longest component name ``agentrl new`` takes: it names the package's folder, module and test
file (``agentrl-reward-NAME``, ``tests/test_NAME.py``), which must fit a file system's 255-byte names."""


def check_name(kind: str, name: str) -> None:
    """Raise ConfigError unless ``name`` is an ASCII Python identifier starting with a letter, of at
    most :data:`MAX_NAME_LENGTH` characters."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(
            f"{kind} name {name!r} is not valid: use a Python identifier (ASCII letters, digits "
            "and underscores, starting with a letter), e.g. 'countdown'"
        )
    if len(name) > MAX_NAME_LENGTH:
        raise ConfigError(
            f"{kind} name {name[:20]!r}... is {len(name)} characters long: at most {MAX_NAME_LENGTH} "
            "(it names the package's folder and files)"
        )


def class_name(name: str) -> str:
    """``my_game`` -> ``MyGame``: the CamelCase stem of the generated class."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part)


def new_env(name: str, directory: str | Path | None = None, multi_turn: bool = False, tools: bool = False) -> Scaffold:
    """Write the package ``agentrl-env-NAME`` into ``directory`` (default ``./agentrl-env-NAME``):
    a single-turn env, a multi-turn one (``multi_turn``) or a tool-using ``ToolEnv`` (``tools``)."""
    check_name("env", name)
    if multi_turn and tools:
        raise ConfigError(
            "--multi-turn and --tools are exclusive: a tool env is multi-turn already "
            "(one turn per round of tool calls); pick one"
        )
    module = f"agentrl_env_{name}"
    values = {
        "name": name,
        "module": module,
        "dist": f"agentrl-env-{name}",
        "Class": f"{class_name(name)}Env",
        "kind": "env",
        "entry": f"{name}_env",
    }
    if tools:
        source, folder = "tool_env/env.py.tmpl", "tool_env"
        summary = "a tool-using environment (a typed tool the reward needs)"
    else:
        source, folder = ("env/multi_turn.py.tmpl" if multi_turn else "env/single_turn.py.tmpl"), "env"
        summary = (
            "a multi-turn environment (feedback and another try after a wrong reply)"
            if multi_turn
            else "a single-turn environment"
        )
    return _write(
        "env",
        name,
        directory,
        module,
        values,
        {
            "pyproject.toml": "pyproject.toml.tmpl",
            f"{module}/__init__.py": source,
            "README.md": f"{folder}/README.md.tmpl",
            f"tests/test_{name}.py": f"{folder}/test.py.tmpl",
        },
        summary,
    )


def new_reward(name: str, directory: str | Path | None = None) -> Scaffold:
    """Write the package ``agentrl-reward-NAME`` into ``directory`` (default ``./agentrl-reward-NAME``)."""
    check_name("reward", name)
    module = f"agentrl_reward_{name}"
    values = {
        "name": name,
        "module": module,
        "dist": f"agentrl-reward-{name}",
        "fn": f"{name}_reward",
        "kind": "reward",
        "entry": f"{name}_reward",
    }
    return _write(
        "reward",
        name,
        directory,
        module,
        values,
        {
            "pyproject.toml": "pyproject.toml.tmpl",
            f"{module}/__init__.py": "reward/reward.py.tmpl",
            "README.md": "reward/README.md.tmpl",
            f"tests/test_{name}.py": "reward/test.py.tmpl",
        },
        "a reward function",
    )


def template_text(relative: str) -> str:
    """The text of the template ``agentrl/cli/templates/<relative>``, read as package data."""
    return (resources.files("agentrl.cli") / "templates" / relative).read_text(encoding="utf-8")


def _write(
    kind: str,
    name: str,
    directory: str | Path | None,
    module: str,
    values: dict[str, str],
    templates: dict[str, str],
    summary: str,
) -> Scaffold:
    """Render ``templates`` (path written -> template file) into a new directory; refuse an existing one."""
    target = Path(directory if directory is not None else values["dist"]).expanduser()
    if os.path.lexists(target):
        raise ConfigError(
            f"directory {str(target)!r} already exists; agentrl new never overwrites: pass another --dir or remove it"
        )
    values = {**values, "summary": summary}
    texts = {relative: Template(template_text(template)).substitute(values) for relative, template in templates.items()}
    written: list[Path] = []
    path = target
    try:
        target.mkdir(parents=True)
        for relative, text in texts.items():
            path = target / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            written.append(path)
    except OSError as exc:  # a name too long for the file system, no space, no permission
        if path != target:  # this call created target: leave nothing half-written
            shutil.rmtree(target, ignore_errors=True)
        raise ConfigError(f"could not write {str(path)!r}: {exc.strerror or exc}; nothing was kept") from None
    return Scaffold(kind=kind, name=name, directory=target, module=module, files=written)
