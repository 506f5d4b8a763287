"""The import order of ``agentrl``'s rooms, and no import circles inside it: every ``agentrl/**/*.py`` is parsed with ``ast`` and each
import it makes, at module level, inside functions or under ``TYPE_CHECKING``, is an edge of the
graph of agentrl modules; any cycle fails the test, named module by module.

A submodule importing a sibling (``agentrl.env.loading`` -> ``agentrl.env.base``) is an edge to
that sibling only, not to the package whose ``__init__`` re-exports both: Python imports the
parent first, but the sibling needs nothing from it.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "agentrl"

ALLOWED_CYCLES: set[frozenset[str]] = set()
"""None: add nothing here."""

LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "faults", "imports", "trajectory", "answers"),
    ("env",),
    ("sampling",),
    ("tools",),
    ("config",),
    ("rundir",),
    ("viewer",),
    ("model",),
    ("rewards",),
    ("algorithms",),
    ("hookspecs",),
    ("defaults",),
    ("plugins",),
    ("testing",),
    ("cluster",),
    ("training",),
    ("api",),
    ("cli",),
    ("__init__", "__main__"),
)
"""The rooms of ``agentrl``, lowest first: a room imports only from its own layer or the layers below.
A room is a subpackage (``agentrl.training``) or a top-level module (``agentrl.errors``); the package's
own ``__init__`` is the public API, above everything."""


def module_name(path: Path, package: Path = PACKAGE) -> str:
    """``agentrl/env/base.py`` -> ``agentrl.env.base``; a package's ``__init__.py`` is the package."""
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str], name: str) -> set[str]:
    """The agentrl modules that ``path`` (module ``name``) imports anywhere in it (``from agentrl
    import sharding`` is ``agentrl.model.sharding``; ``from agentrl import Env`` is the package ``agentrl``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names}
    return {module for module in found if module in modules and module != name}


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the agentrl modules it imports."""
    names = {path: module_name(path, package) for path in sorted(package.rglob("*.py"))}
    modules = set(names.values())
    return {name: imported_modules(path, modules, name) for path, name in names.items()}


def room(module: str) -> str:
    """``agentrl.training.trainer`` -> ``training``; ``agentrl.errors`` -> ``errors``; ``agentrl`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def upward_imports(graph: dict[str, set[str]], layers=LAYERS) -> list[str]:
    """Every import of ``graph`` from a room into a room of a higher layer, as ``a -> b``."""
    rank = {name: level for level, names in enumerate(layers) for name in names}
    return sorted(f"{a} -> {b}" for a, imported in graph.items() for b in imported if rank[room(b)] > rank[room(a)])


def find_cycle(graph: dict[str, set[str]], allowed: set[frozenset[str]] = frozenset()) -> list[str] | None:
    """A cycle of ``graph`` as ``[a, b, ..., a]`` (None if there is none), skipping the ``allowed``
    ones (each named by its set of modules)."""
    graph = {node: set(edges) for node, edges in graph.items()}
    while True:
        try:
            tuple(graphlib.TopologicalSorter(graph).static_order())
            return None
        except graphlib.CycleError as exc:
            cycle = exc.args[1]  # [a, ..., a]: each imports the one before it
            if frozenset(cycle) not in allowed:
                return list(reversed(cycle))
            graph[cycle[1]].discard(cycle[0])


def test_no_import_cycles():
    graph = import_graph()
    assert "agentrl.config.train" in graph and "agentrl.env.base" in graph
    cycle = find_cycle(graph, ALLOWED_CYCLES)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_every_room_has_a_layer_and_no_room_imports_upward():
    graph = import_graph()
    rooms = {room(module) for module in graph}
    layered = {name for names in LAYERS for name in names}
    assert rooms <= layered, f"rooms without a layer in LAYERS: {sorted(rooms - layered)}"
    assert {"training", "cli", "config", "model", "rundir", "sampling", "tools"} <= rooms
    assert upward_imports(graph) == []


def test_an_upward_import_is_named():
    graph = {"agentrl.config.train": {"agentrl.training.trainer", "agentrl.errors"}, "agentrl.training.trainer": set()}
    assert upward_imports(graph) == ["agentrl.config.train -> agentrl.training.trainer"]


def test_function_level_and_relative_imports_are_edges(tmp_path):
    package = tmp_path / "agentrl"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from agentrl.a import A\n")
    (package / "a.py").write_text("A = 1\ndef f():\n    from agentrl import b\n")
    (package / "b.py").write_text("from . import a\nfrom agentrl import A\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "c.py").write_text("from ..b import x\nimport agentrl.sub\n")
    graph = import_graph(package)
    assert graph == {
        "agentrl": {"agentrl.a"},
        "agentrl.a": {"agentrl.b"},
        "agentrl.b": {"agentrl.a", "agentrl"},
        "agentrl.sub": set(),
        "agentrl.sub.c": {"agentrl.b", "agentrl.sub"},
    }
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1] and {"agentrl.a", "agentrl.b"} <= set(cycle)
    assert all(b in graph[a] for a, b in zip(cycle, cycle[1:])), cycle  # each imports the next


@pytest.mark.parametrize("allowed, expected", [(set(), ["x", "y", "x"]), ({frozenset({"x", "y"})}, None)])
def test_find_cycle_names_the_cycle_unless_allowed(allowed, expected):
    found = find_cycle({"x": {"y"}, "y": {"x"}, "z": {"x"}}, allowed)
    assert found == expected or (expected is not None and found == ["y", "x", "y"])
