"""Generate the hook reference, ``docs/hooks.md``, from :mod:`agentrl.hookspecs`.

The hookspec docstrings are the only place the hooks are described; this module renders them
(signature, firstresult or not, docstring) so the reference is never written twice. Which built-in
plugins register or implement what is read from the plugins themselves (the ``agentrl``
distribution's entry points and ``agentrl.defaults``), never listed by hand.

    python -m agentrl.cli.hookdoc            # (re)write docs/hooks.md
    python -m agentrl.cli.hookdoc --check    # exit 1 if docs/hooks.md differs from the hookspecs
    python -m agentrl.cli.hookdoc --output - # print it
"""

from __future__ import annotations

import importlib.metadata
import inspect
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from agentrl import hookspecs
from agentrl.cli.generated import write_or_check

DEFAULT_OUTPUT = Path(__file__).resolve().parents[2] / "docs" / "hooks.md"
"""``docs/hooks.md`` of the source checkout this module lives in."""

_ROLE = re.compile(r":(?:class|func|mod|meth|attr|data|obj):`~?([^`]+)`")


def to_markdown(text: str) -> str:
    """reST inline markup of a docstring as Markdown: ``x`` -> `x`, :class:`X` -> `X`."""
    text = _ROLE.sub(r"``\1``", text)
    return re.sub(r"``(.+?)``", r"`\1`", text, flags=re.S)


def hook_functions(module: ModuleType = hookspecs) -> list:
    """The module's hookspecs in source order."""
    attr = f"{module.PROJECT}_spec"
    specs = [value for value in vars(module).values() if inspect.isfunction(value) and hasattr(value, attr)]
    return sorted(specs, key=lambda fn: fn.__code__.co_firstlineno)


def is_firstresult(fn: object, module: ModuleType = hookspecs) -> bool:
    """Whether the hook stops at the first non-None result."""
    return bool(getattr(fn, f"{module.PROJECT}_spec").get("firstresult"))


def signature(fn: object) -> str:
    """``name(arg: Type, ...) -> Return``, annotations as written in the hookspecs."""
    return f"{fn.__name__}{inspect.signature(fn)}".replace("'", "")


def summary(fn: object) -> str:
    """The first sentence of the hook's docstring, on one line."""
    doc = to_markdown(" ".join(inspect.getdoc(fn).split("\n\n")[0].split()))
    first = re.split(r"(?<=[.;:])\s", doc, maxsplit=1)[0].rstrip(":;")
    first = re.sub(r" \((?:[^()`]|`[^`]*`)*\)", "", first)  # parentheticals go to the full entry
    if len(first) > 120:
        first = first[:120].rsplit(" ", 1)[0].rstrip(",;") + " ..."
    return first


def builtin_plugins() -> Any:
    """A :class:`agentrl.PluginManager` holding agentrl's own plugins only: ``agentrl.defaults`` and
    the entry points of the ``agentrl`` distribution (any other installed plugin is not loaded)."""
    from agentrl.plugins import ENTRY_POINT_GROUP, load_plugins

    others = [
        ep.name
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        if ep.dist is None or ep.dist.name != "agentrl"
    ]
    return load_plugins(disabled=others)


def registered_kind(hook_name: str, project: str = "agentrl") -> str:
    """The registry kind a registration hook fills: ``agentrl_register_envs`` -> ``env``."""
    from agentrl.plugins import KINDS

    suffix = hook_name.removeprefix(f"{project}_register_")
    return next(kind for kind in KINDS if suffix in (kind, f"{kind}s"))


def implementers(manager: Any, hook_name: str) -> list[str]:
    """The plugins of ``manager`` implementing ``hook_name``, in load order."""
    order = list(manager.plugins)
    names = {impl.plugin_name for impl in getattr(manager.pm.hook, hook_name).get_hookimpls()}
    return sorted(names, key=order.index)


def builtins_line(fn: Any, manager: Any, project: str = "agentrl") -> str:
    """The built-in plugins behind hook ``fn``: for a registration hook, each with what it registers."""
    plugins = implementers(manager, fn.__name__)
    if fn.__name__.startswith(f"{project}_register_"):
        kind = registered_kind(fn.__name__, project)
        parts = [
            f"`{manager.plugins[name].module}` ({', '.join(manager.plugins[name].registered.get(kind, []))})"
            for name in plugins
        ]
        return f"Built-in: {', '.join(parts) or 'none'}."
    return f"Built-in implementations: {', '.join(f'`{manager.plugins[name].module}`' for name in plugins) or 'none'}."


def builtins_table(manager: Any, project: str = "agentrl") -> list[str]:
    """Markdown rows: every built-in plugin, its module, what it registers and the step hooks it implements."""
    lines = ["| plugin | module | registers | step hooks |", "|---|---|---|---|"]
    for name, info in manager.plugins.items():
        hooks = sorted(
            caller.name
            for caller in manager.pm.get_hookcallers(manager.pm.get_plugin(name))
            if not caller.name.startswith(f"{project}_register_")
        )
        registers = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in info.registered.items())
        lines.append(
            f"| `{name}` | `{info.module}` | {registers or '-'} | {', '.join(f'[`{h}`](#{h})' for h in hooks) or '-'} |"
        )
    return lines


def render(module: ModuleType = hookspecs, manager: Any = None) -> str:
    """The whole Markdown reference for ``module``'s hookspecs, naming the built-in plugins of
    ``manager`` (default: :func:`builtin_plugins`)."""
    manager = builtin_plugins() if manager is None else manager
    project = module.PROJECT
    hooks = hook_functions(module)
    groups = [
        ("Registration hooks", [h for h in hooks if h.__name__.startswith(f"{project}_register_")]),
        ("Step hooks", [h for h in hooks if not h.__name__.startswith(f"{project}_register_")]),
    ]
    lines = [
        "# Hook reference",
        "",
        f"<!-- Generated by `python -m agentrl.cli.hookdoc` from `{module.__name__}` and the built-in plugins; do not "
        "edit by hand. tests/repo/test_docs.py fails when this file and the hookspecs differ. -->",
        "",
        to_markdown(inspect.getdoc(module)),
        "",
        "Implement a hook with `from agentrl import hookimpl` and a function of the hook's name in a "
        "plugin module ([the plugins guide](guides/plugins.md) says how a module becomes a plugin). A hook marked "
        "*firstresult* stops at the first implementation that returns something other than `None`; "
        "every other hook calls all implementations and the core combines their results as the "
        "hook's text says.",
        "",
        "| hook | kind | firstresult | what it does |",
        "|---|---|---|---|",
    ]
    for title, group in groups:
        kind = title.split()[0].lower()
        for fn in group:
            first = "yes" if is_firstresult(fn, module) else "no"
            lines.append(f"| [`{fn.__name__}`](#{fn.__name__}) | {kind} | {first} | {summary(fn)} |")
    if hasattr(module, "Register"):
        lines += ["", f"`Register`: {to_markdown(_attribute_doc(module, 'Register'))}"]
    lines += [
        "",
        "## Built-in plugins",
        "",
        "The plugins agentrl ships (`agentrl plugins` lists them with any "
        "others installed), what each registers and which step hooks it implements:",
        "",
        *builtins_table(manager, project),
    ]
    for title, group in groups:
        lines += ["", f"## {title}"]
        for fn in group:
            lines += hook_section(fn, module, manager)
    return "\n".join(lines).rstrip() + "\n"


def hook_section(fn: Any, module: ModuleType, manager: Any) -> list[str]:
    """The Markdown lines of one hook's section: heading, signature, calling rule, docstring, built-ins."""
    first = (
        "**firstresult**: the first non-None result is used and later implementations are not called."
        if is_firstresult(fn, module)
        else "Not firstresult: every implementation is called."
    )
    return [
        "",
        f"### {fn.__name__}",
        "",
        f"`{signature(fn)}`",
        "",
        first,
        "",
        to_markdown(inspect.getdoc(fn)),
        "",
        builtins_line(fn, manager, module.PROJECT),
    ]


def _attribute_doc(module: ModuleType, name: str) -> str:
    """The string literal under a module-level assignment (attribute docstring), from the source."""
    source = inspect.getsource(module)
    match = re.search(rf"^{name} = .*\n\"\"\"(.*?)\"\"\"", source, flags=re.M | re.S)
    return inspect.cleandoc(match.group(1)) if match else ""


def main(argv: list[str] | None = None) -> int:
    """Write (or ``--check``) the hook reference; the exit status says whether it was up to date."""
    return write_or_check(
        argv,
        prog="python -m agentrl.cli.hookdoc",
        description=__doc__.splitlines()[0],
        default=DEFAULT_OUTPUT,
        render=render,
        source="agentrl/hookspecs.py",
    )


if __name__ == "__main__":
    sys.exit(main())
