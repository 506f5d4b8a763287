"""ruff decides the layout: ``ruff check`` and ``ruff format --check`` pass on the whole repository
(the rules are ``[tool.ruff]`` in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "command", [["check", "--quiet", "."], ["format", "--check", "--quiet", "."]], ids=["check", "format"]
)
def test_ruff_passes(command):
    result = subprocess.run([sys.executable, "-m", "ruff", *command], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, f"ruff {' '.join(command)}:\n{result.stdout}{result.stderr}"
