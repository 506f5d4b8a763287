"""No import circles inside ``agentrl``: every ``agentrl/**/*.py`` is parsed with ``ast`` and each
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

PACKAGE = Path(__file__).resolve().parents[1] / "agentrl"

ALLOWED_CYCLES: set[frozenset[str]] = set()
"""None: add nothing here."""


def module_name(path: Path, package: Path = PACKAGE) -> str:
    """``agentrl/env/base.py`` -> ``agentrl.env.base``; a package's ``__init__.py`` is the package."""
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str], name: str) -> set[str]:
    """The agentrl modules that ``path`` (module ``name``) imports anywhere in it (``from agentrl
    import sharding`` is ``agentrl.sharding``; ``from agentrl import Env`` is the package ``agentrl``)."""
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
    assert "agentrl.config" in graph and "agentrl.env.base" in graph
    cycle = find_cycle(graph, ALLOWED_CYCLES)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_function_level_and_relative_imports_are_edges(tmp_path):
    package = tmp_path / "agentrl"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from agentrl.a import A\n")
    (package / "a.py").write_text("A = 1\ndef f():\n    from agentrl import b\n")
    (package / "b.py").write_text("from . import a\nfrom agentrl import A\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "c.py").write_text("from ..b import x\nimport agentrl.sub\n")
    graph = import_graph(package)
    assert graph == {"agentrl": {"agentrl.a"}, "agentrl.a": {"agentrl.b"}, "agentrl.b": {"agentrl.a", "agentrl"},
                     "agentrl.sub": set(), "agentrl.sub.c": {"agentrl.b", "agentrl.sub"}}
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1] and {"agentrl.a", "agentrl.b"} <= set(cycle)
    assert all(b in graph[a] for a, b in zip(cycle, cycle[1:])), cycle  # each imports the next


@pytest.mark.parametrize("allowed, expected", [(set(), ["x", "y", "x"]), ({frozenset({"x", "y"})}, None)])
def test_find_cycle_names_the_cycle_unless_allowed(allowed, expected):
    found = find_cycle({"x": {"y"}, "y": {"x"}, "z": {"x"}}, allowed)
    assert found == expected or (expected is not None and found == ["y", "x", "y"])
