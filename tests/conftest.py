"""Shared fixtures: the real SmolLM2 tokenizer, a tiny random model built in-process, a venv that
plugin packages are pip-installed into, and a plugin file that fails on purpose."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# pytest-xdist workers share the cores: each worker (and every process its tests start, which
# inherit the variable) sizes its OpenMP pool to its share, instead of every worker spinning one
# thread per core (on 2 cores with 2 workers that oversubscription cost ~25% of the wall time).
if os.environ.get("PYTEST_XDIST_WORKER"):
    _workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(1, _workers))))

import pytest
from faulty_plugin import FAULTS

from agentrl.model.loading import DEFAULT_MODEL, load_tokenizer
from agentrl.testing import build_tiny_model


@pytest.fixture(scope="session")
def tokenizer():
    """The default model's real tokenizer and chat template (converted once into the cache)."""
    return load_tokenizer(DEFAULT_MODEL)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer) -> Path:
    """A saved tiny model + the real tokenizer: usable anywhere ``--model`` is."""
    folder = tmp_path_factory.mktemp("tiny-model")
    build_tiny_model(len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@dataclass(frozen=True)
class PluginVenv:
    """A venv layered over the test venv: what is pip-installed into it is seen by its ``python``
    alone, while agentrl and every other package come from the test venv."""

    python: Path

    def pip(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``pip ARGS`` into this venv (the test venv's pip, ``--python`` this venv's interpreter)."""
        return subprocess.run(
            [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check", "--python", str(self.python), *args],
            capture_output=True,
            text=True,
            timeout=600,
        )

    def agentrl(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """``agentrl ARGS`` with this venv's interpreter: it sees what was installed here."""
        return subprocess.run(
            [str(self.python), "-m", "agentrl.cli.app", *args], cwd=cwd, capture_output=True, text=True, timeout=600
        )


@pytest.fixture
def plugin_venv(tmp_path) -> PluginVenv:
    """A fresh venv whose site-packages come first and the test venv's after them (a ``.pth`` adds
    them, editable installs included): a test pip-installs plugin packages into it, as a user
    installs them, while the tests running beside it keep seeing the test venv unchanged."""
    folder = tmp_path / "plugin-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    python = folder / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    lines = [f"import site; site.addsitedir({path!r})" for path in site.getsitepackages()]
    (Path(purelib) / "_layered_over_the_test_venv.pth").write_text("\n".join(lines) + "\n")
    return PluginVenv(python)


@pytest.fixture
def faults(tmp_path) -> Iterator[Path]:
    """``FAULTS`` (tests/faulty_plugin.py) as ``tmp_path/faults.py``: name its envs and rewards as
    ``f"{faults}:Tasks"``. A call into it that the test abandoned while it hung ends with the test."""
    path = tmp_path / "faults.py"
    path.write_text(FAULTS)
    yield path
    (tmp_path / "release").write_text("")  # abandoned hung calls end now, not during later tests
    time.sleep(0.2)
