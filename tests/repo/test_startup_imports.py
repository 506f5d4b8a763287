"""What every CLI command pays before it can answer: ``import agentrl`` and loading the installed
plugins import torch, but not the libraries only a run needs (transformers ~2 s, math-verify with
sympy ~1 s, vLLM, accelerate, datasets on a slow CPU): ``agentrl --help``, ``agentrl plugins`` and a
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
