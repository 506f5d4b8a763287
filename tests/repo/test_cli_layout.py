"""The CLI's modules: no import circle among them, the scaffold library free of the CLI, and the
entry points (``agentrl = agentrl.cli.app:app``, ``python -m agentrl.cli.app``) intact."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "agentrl"
CLI_MODULES = sorted(p.stem for p in (PACKAGE / "cli").glob("*.py") if p.stem != "__init__")


def agentrl_imports(stem: str) -> set[str]:
    """The ``agentrl.cli.*`` modules ``agentrl/cli/<stem>.py`` imports, at any level (function bodies too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse((PACKAGE / "cli" / f"{stem}.py").read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("agentrl.cli."):
            found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[2] for a in node.names if a.name.startswith("agentrl.cli.")}
    return found


def test_no_import_circle_among_the_cli_modules():
    graph = {stem: agentrl_imports(stem) & set(CLI_MODULES) for stem in CLI_MODULES}
    assert "scaffold" in graph["new"] and "support" in graph["new"]  # the graph is really read

    def visit(stem: str, path: tuple[str, ...]) -> None:
        assert stem not in path, f"import circle: {' -> '.join((*path, stem))}"
        for other in graph[stem]:
            visit(other, (*path, stem))

    for stem in graph:
        visit(stem, ())
    assert graph["scaffold"] == set() and graph["support"] == set()


def test_the_scaffold_library_imports_no_cli():
    code = (
        "import sys, agentrl.cli.scaffold; print(sorted(m for m in sys.modules if m in ('typer', 'agentrl.cli.app')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


def test_the_launcher_of_several_processes_imports_no_transformers():
    """``--num-processes N`` checks the config, resolves the model folder and starts ``accelerate
    launch`` without transformers (seconds of imports in a process that loads no model)."""
    code = (
        "import sys, agentrl.cli.train, agentrl.model.launch, agentrl.model.loading, agentrl.config.train, agentrl.rundir.directory; "
        "from agentrl.cli.support import plugin_manager; plugin_manager(None, None); "  # every plugin loaded
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'transformers'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


@pytest.mark.parametrize("module", ["agentrl.cli.app", "agentrl"])
def test_the_command_runs_as_a_module(module):
    done = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert all(command in done.stdout for command in ("train", "eval", "plugins", "plot", "new"))


def test_debug_shows_the_traceback_of_agentrl_new_run_as_a_module(tmp_path):
    plain = subprocess.run(
        [sys.executable, "-m", "agentrl.cli.app", "new", "env", "9x"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plain.returncode == 2 and plain.stderr.startswith("error: env name '9x' is not valid")
    debug = subprocess.run(
        [sys.executable, "-m", "agentrl.cli.app", "--debug", "new", "env", "9x"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "ConfigError" in debug.stderr
