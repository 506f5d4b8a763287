"""Generate the config reference, ``docs/reference/config.md``, from the config classes.

Every key of :class:`~agentrl.config.train.TrainConfig` and of each built-in plugin's section
(``algorithm`` of every algorithm, ``engine_args`` of every engine, ``lora``, every ``plugins.NAME``)
with its type, default, allowed range and the docstring under the field: the docstrings are the
only help text, so the reference is never written by hand. What a class declares is read by
:func:`config_reference` alone (dataclass fields, the range words of their type hints, the
docstring under each field through ``ast``).

    python -m agentrl.cli.configdoc            # (re)write docs/reference/config.md
    python -m agentrl.cli.configdoc --check    # exit 1 if it differs from the config classes
    python -m agentrl.cli.configdoc --output - # print it
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import json
import sys
import textwrap
import types
import typing
from pathlib import Path
from typing import Annotated, Any, get_type_hints

from agentrl.cli.hookdoc import builtin_plugins, to_markdown
from agentrl.config.lora import LoRAConfig
from agentrl.config.rules import allowed_words
from agentrl.config.train import TrainConfig

DEFAULT_OUTPUT = Path(__file__).resolve().parents[2] / "docs" / "reference" / "config.md"
"""``docs/reference/config.md`` of the source checkout this module lives in."""


@dataclasses.dataclass(frozen=True)
class FieldDoc:
    """One documented config key."""

    name: str
    """The key."""
    type: str
    """Its type as written in the class, without the range metadata (``int | None``)."""
    default: str
    """Its default as YAML would write it (``null``, ``true``, ``'auto'``, ``[0.9, 0.99]``)."""
    range: str
    """What the declared rule allows, in words (``>= 1``, ``one of auto, bf16``), or ``''``."""
    doc: str
    """The docstring under the field, as Markdown on one line."""


def config_reference(cls: type[Any]) -> list[FieldDoc]:
    """Every field of the config dataclass ``cls`` in declaration order, with its type, default,
    range and docstring (a subclass's docstring or rule wins over its base class's)."""
    hints = get_type_hints(cls, include_extras=True)
    docs: dict[str, str] = {}
    rules: dict[str, Any] = {}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):
        docs.update(_docstrings_under_fields(klass))
        own = get_type_hints(klass, include_extras=True)
        rules.update({k: own[k] for k in vars(klass).get("__annotations__", {}) if _has_rule(own[k])})
    return [
        FieldDoc(
            name=f.name,
            type=type_name(hints[f.name]),
            default=yaml_value(f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default),
            range=allowed_words(rules[f.name]) if f.name in rules else "",
            doc=docs.get(f.name, ""),
        )
        for f in dataclasses.fields(cls)
    ]


def _docstrings_under_fields(klass: type[Any]) -> dict[str, str]:
    """Field name -> the string literal right under its annotated assignment in ``klass``'s source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
    body = next(node for node in tree.body if isinstance(node, ast.ClassDef)).body
    out = {}
    for node, after in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            out[node.target.id] = " ".join(to_markdown(inspect.cleandoc(after.value.value)).split())
    return out


def _has_rule(hint: Any) -> bool:
    return typing.get_origin(hint) is Annotated or any(_has_rule(arg) for arg in typing.get_args(hint))


def type_name(hint: Any) -> str:
    """``hint`` as written, range metadata left out: ``Annotated[int, Field(ge=1)] | None`` -> ``int | None``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Annotated:
        return type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(arg) for arg in args)
    if hint is type(None):
        return "None"
    if hint is Any:
        return "Any"
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(type_name(arg) for arg in args)}]"
    return getattr(hint, "__name__", str(hint))


def yaml_value(value: Any) -> str:
    """``value`` as a YAML config would write it, on one line."""
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, Path):
        return repr(str(value))
    if isinstance(value, tuple):
        value = list(value)
    return json.dumps(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|") if text else "-"


def table(fields: list[FieldDoc], prefix: str = "") -> list[str]:
    """Markdown rows: key (with ``prefix``), type, default, range, description."""
    lines = ["| key | type | default | allowed | description |", "|---|---|---|---|---|"]
    for f in fields:
        kind = " or ".join(f"`{part}`" for part in f.type.split(" | "))  # no pipe inside a table cell
        lines.append(f"| `{prefix}{f.name}` | {kind} | `{f.default}` | {_cell(f.range)} | {_cell(f.doc)} |")
    return lines


def plugin_sections(manager: Any) -> list[tuple[str, str, list[tuple[str, str, type[Any]]]]]:
    """(section, intro, [(heading, key prefix, config class)]) for the ``algorithm``, ``engine_args``
    and ``plugins`` sections of the components ``manager``'s plugins register (an engine without a
    ``config_class`` has no options)."""
    registry = manager.registry

    def entries(kind: str, label: str, prefix: str, attribute: str | None) -> list[tuple[str, str, type[Any]]]:
        out = []
        for name in sorted(registry.names(kind)):
            factory = registry.get(kind, name).factory
            cls = getattr(factory, attribute, None) if attribute else factory
            if dataclasses.is_dataclass(cls):
                heading = f"`{label.format(name=name)}`: {cls.__name__} (`{cls.__module__}`)"
                out.append((heading, prefix.format(name=name), cls))
        return out

    return [
        (
            "algorithm",
            "The `algorithm:` section, read by the config class of the `--algo` chosen.",
            entries("algorithm", "--algo {name}", "algorithm.", "config_class"),
        ),
        (
            "engine_args",
            "The `engine_args:` section, read by the config class of the `--engine` chosen.",
            entries("engine", "--engine {name}", "engine_args.", "config_class"),
        ),
        (
            "plugins",
            "Each `plugins.NAME:` section, read by the plugin that registered it (a step-hook plugin does "
            "nothing unless its section turns it on). `--print-config` lists every section with its defaults.",
            entries("settings", "plugins.{name}", "plugins.{name}.", None),
        ),
    ]


def render(manager: Any = None) -> str:
    """The whole Markdown reference (``manager``: the plugins whose sections it lists; default
    :func:`agentrl.cli.hookdoc.builtin_plugins`)."""
    manager = builtin_plugins() if manager is None else manager
    lines = [
        "# Config reference",
        "",
        "<!-- Generated by `python -m agentrl.cli.configdoc` from the config classes; do not edit by hand. "
        "tests/repo/test_docs_site.py fails when this file and the classes differ. -->",
        "",
        "A run's config is a YAML file (`--config`), `--set KEY=VALUE` items (dotted keys reach into "
        "sections: `--set algorithm.beta=0.04`) and the command-line flags. "
        "`agentrl train --print-config` prints the resolved whole; this page says what each key means. "
        "Every value is checked when the run starts: a bad one is a one-line error naming the key, the "
        "value and what is allowed.",
        "",
        "## Run keys",
        "",
        "`TrainConfig` (`agentrl/config/train.py`): the top level of the config.",
        "",
        *table(config_reference(TrainConfig)),
        "",
        "## lora",
        "",
        "The `lora:` section (`LoRAConfig`, `agentrl/config/lora.py`): null trains every weight; a mapping, "
        "`{}` included, trains LoRA adapters ([scaling guide](../guides/scaling.md#lora)).",
        "",
        *table(config_reference(LoRAConfig), "lora."),
    ]
    for section, intro, entries in plugin_sections(manager):
        lines += ["", f"## {section}", "", intro]
        for heading, prefix, cls in entries:
            lines += ["", f"### {heading}", "", *table(config_reference(cls), prefix)]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write (or ``--check``) the config reference; the exit status says whether it was up to date."""
    parser = argparse.ArgumentParser(prog="python -m agentrl.cli.configdoc", description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=str(DEFAULT_OUTPUT), help="Where to write it ('-': stdout).")
    parser.add_argument("--check", action="store_true", help="Write nothing; exit 1 if the file is out of date.")
    args = parser.parse_args(argv)
    text = render()
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    path = Path(args.output)
    if args.check:
        if not path.is_file() or path.read_text() != text:
            message = f"{path} is out of date with the config classes: run `python -m agentrl.cli.configdoc`"
            print(message, file=sys.stderr)
            return 1
        print(f"{path} is up to date")
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
