"""What every CLI command pays before it can answer: ``import agentrl`` imports neither torch nor
transformers; loading the installed plugins imports torch, but not the libraries only a run needs
(transformers ~2 s, math-verify with sympy ~1 s, vLLM, accelerate, datasets on a slow CPU): ``agentrl --help``, ``agentrl plugins`` and a
misspelt env name answer without them. Each is imported where it is first used."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("transformers", "math_verify", "sympy", "vllm", "accelerate", "datasets")

PROBE = f"""
import json, sys
from agentrl.plugins import load_plugins
manager = load_plugins(disabled=[], modules=[])
print(json.dumps({{"envs": sorted(manager.registry.names("env")),
                  "heavy": sorted(name for name in {HEAVY!r} if name in sys.modules)}}))
"""


def test_loading_agentrl_and_its_plugins_imports_no_run_only_library() -> None:
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert "math" in loaded["envs"]  # the built-in plugins did load
    assert loaded["heavy"] == [], f"imported at start-up: {loaded['heavy']}"


TORCH_PROBE = """
import json, sys
import agentrl, agentrl.testing
from agentrl.cli.app import app
for args in (["--help"], ["view", "/no-such-run"], ["compare", "/no-such-run", "/no-such-run-2"]):
    try:
        app(args, prog_name="agentrl")
    except SystemExit:
        pass
print(json.dumps(sorted(name for name in ("torch", "transformers") if name in sys.modules)))
"""


def test_import_agentrl_agentrl_help_view_and_compare_load_no_torch() -> None:
    """torch takes ~3 s to import: ``import agentrl``, ``agentrl --help``, the commands that need
    no model (``view``, ``compare``) and an env package's checks (``agentrl.testing``) do without
    it; ``agentrl.Algorithm`` and the other names that need it import it on first use
    (tests/repo/test_public_api.py resolves each)."""
    result = subprocess.run([sys.executable, "-c", TORCH_PROBE], capture_output=True, text=True, check=True)
    assert "Commands" in result.stdout and "'/no-such-run' is not a run dir" in result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [], result.stdout[-2000:]
