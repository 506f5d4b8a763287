"""``agentrl new``'s templates are package data: found through importlib.resources, every one used,
and shipped by a non-editable build (a wheel) whose ``agentrl new`` writes what the checkout writes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import resources
from pathlib import Path

from agentrl.cli.scaffold import new_env, new_reward, template_text

ROOT = Path(__file__).resolve().parents[2]
PLACEHOLDER = re.compile(r"\$\{?(name|module|dist|Class|fn|kind|entry|summary|howto)\b")
VARIANTS = {"env": {}, "multi_turn": {"multi_turn": True}, "tools": {"tools": True}}


def template_files() -> list[str]:
    """Every ``*.tmpl`` under ``agentrl/cli/templates``, as importlib.resources finds them."""
    found: list[str] = []

    def walk(folder, prefix: str) -> None:
        for entry in folder.iterdir():
            if entry.is_dir():
                walk(entry, f"{prefix}{entry.name}/")
            elif entry.name.endswith(".tmpl"):
                found.append(prefix + entry.name)

    walk(resources.files("agentrl.cli") / "templates", "")
    return sorted(found)


def write_every_variant(folder: Path) -> dict[str, str]:
    """Every kind of package ``agentrl new`` writes, under ``folder``: relative path -> text."""
    for variant, options in VARIANTS.items():
        new_env("demo", folder / variant, **options)
    new_reward("demo", folder / "reward")
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_templates_are_found_through_importlib_resources_and_each_is_used(tmp_path, monkeypatch):
    names = template_files()
    assert "pyproject.toml.tmpl" in names and "tool_env/env.py.tmpl" in names and len(names) == 11
    used: list[str] = []
    monkeypatch.setattr(
        "agentrl.cli.scaffold.template_text", lambda relative: used.append(relative) or template_text(relative)
    )
    files = write_every_variant(tmp_path)
    assert sorted(set(used)) == names  # no template left unused, none missing
    assert len(files) == 16
    assert not [path for path, text in files.items() if PLACEHOLDER.search(text)]  # every placeholder filled


def test_a_built_wheel_ships_the_templates_and_writes_what_the_checkout_writes(tmp_path):
    source = tmp_path / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist")
    for name in ("agentrl", "plugins", "envs"):
        shutil.copytree(ROOT / name, source / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp_path / "dist").glob("agentrl-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = sorted(
            n.removeprefix("agentrl/cli/templates/")
            for n in archive.namelist()
            if n.startswith("agentrl/cli/templates/")
        )
        archive.extractall(tmp_path / "installed")
    assert shipped == template_files()
    installed = tmp_path / "installed"
    script = (
        "import sys, agentrl.cli.scaffold as s; from pathlib import Path; "
        f"assert Path(s.__file__).is_relative_to({str(installed)!r}), s.__file__; "
        f"sys.path.insert(0, {str(Path(__file__).parent)!r}); "
        "from test_scaffold_templates import write_every_variant; "
        f"write_every_variant(Path({str(tmp_path / 'wheel')!r}))"
    )
    env = {**os.environ, "PYTHONPATH": str(installed)}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    from_wheel = {
        str(p.relative_to(tmp_path / "wheel")): p.read_text()
        for p in sorted((tmp_path / "wheel").rglob("*"))
        if p.is_file()
    }
    assert from_wheel == write_every_variant(tmp_path / "checkout")
