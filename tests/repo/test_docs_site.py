"""The docs site builds strictly, and docs/reference/config.md is generated from the config classes.

``mkdocs build --strict`` (mkdocs.yml at the repository root) fails on a broken link or anchor and
on a page under docs/ that the nav leaves out; the config reference must be current and name every
key ``agentrl train --print-config`` prints.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentrl.cli import configdoc

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference" / "config.md"


# -- the config reference -----------------------------------------------------------------------------


def test_config_md_is_generated_from_the_config_classes():
    assert REFERENCE.read_text() == configdoc.render(), (
        "docs/reference/config.md differs from the config classes: run `python -m agentrl.cli.configdoc`"
    )


def test_configdoc_writes_and_checks(tmp_path, capsys):
    path = tmp_path / "config.md"
    assert configdoc.main(["--output", str(path), "--check"]) == 1
    assert "is out of date with the config classes: run `python -m agentrl.cli.configdoc`" in capsys.readouterr().err
    assert configdoc.main(["--output", str(path)]) == 0 and path.read_text() == configdoc.render()
    assert configdoc.main(["--output", str(path), "--check"]) == 0
    path.write_text(path.read_text().replace("AdamW peak learning rate.", "AdamW learning rate."))
    assert configdoc.main(["--output", str(path), "--check"]) == 1


def test_config_reference_reads_type_default_range_and_docstring():
    from agentrl.config.reference import ConfigKey, config_reference
    from agentrl.config.train import TrainConfig

    fields = {f.name: f for f in config_reference(TrainConfig)}
    assert list(fields) == list(TrainConfig.__dataclass_fields__)
    assert fields["max_sampled_tokens"] == ConfigKey(
        "max_sampled_tokens",
        "int | None",
        None,
        ">= 1 or null",
        "Cap on tokens the model samples over an episode (None: max_new_tokens x env max_turns);\n"
        "also Dr. GRPO's normalising constant.",
    )
    assert (fields["precision"].default, fields["precision"].allowed) == ("auto", "one of auto, bf16, fp32")
    assert configdoc.yaml_value(fields["adam_betas"].default) == "[0.9, 0.99]"
    assert configdoc.yaml_value(fields["plugins"].default) == "{}"
    assert ":mod:`agentrl.model.packing`" in fields["pack_sequences"].doc
    assert "| `pack_sequences` |" in configdoc.render() and "(`agentrl.model.packing`)" in configdoc.render()


def test_a_subclass_keeps_its_base_class_rule_and_docstring():
    from agentrl.config.reference import config_reference
    from agentrl_gspo import GSPOConfig

    fields = {f.name: f for f in config_reference(GSPOConfig)}
    assert fields["epsilon_low"].default == 0.0003 and fields["epsilon_low"].allowed == "in [0, 1)"
    assert fields["beta"].doc.startswith("KL coefficient to a frozen reference policy")


def _printed_keys(*args: str) -> set[str]:
    """Dotted keys of ``agentrl train --print-config ARGS``: the top level, and inside the
    ``algorithm``, ``engine_args``, ``lora`` and each ``plugins.NAME`` section."""
    from typer.testing import CliRunner

    from agentrl.cli.app import app

    result = CliRunner().invoke(app, ["train", "--print-config", *args])
    assert result.exit_code == 0, result.output
    data = yaml.safe_load(result.output)
    keys = set(data)
    for section in ("algorithm", "engine_args", "lora"):
        keys |= {f"{section}.{key}" for key in data[section] or {}}
    keys |= {f"plugins.{name}.{key}" for name, options in data["plugins"].items() for key in options}
    return keys


def _section(text: str, heading: str) -> str:
    return text.split(f"\n{heading}", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]


@pytest.mark.parametrize(
    ("args", "algorithm", "engine"),
    [(("--set", "lora.r=8"), "grpo", "hf"), (("--algo", "ppo"), "ppo", "hf"), (("--algo", "gspo"), "gspo", "hf")],
)
def test_config_md_lists_every_key_print_config_prints(args, algorithm, engine):
    text = REFERENCE.read_text()
    listed = set(re.findall(r"^\| `([\w.]+)` \|", text, flags=re.M))
    keys = _printed_keys(*args)
    assert keys - listed == set(), "keys --print-config prints that docs/reference/config.md does not list"
    algo_rows = _section(text, f"### `--algo {algorithm}`")
    engine_rows = _section(text, f"### `--engine {engine}`")
    for key in keys:
        if key.startswith("algorithm."):
            assert f"| `{key}` |" in algo_rows, f"{key} missing under --algo {algorithm}"
        if key.startswith("engine_args."):
            assert f"| `{key}` |" in engine_rows, f"{key} missing under --engine {engine}"


# -- the site ---------------------------------------------------------------------------------------------


def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    command = [mkdocs] if mkdocs else [sys.executable, "-m", "mkdocs"]
    done = subprocess.run(
        [*command, "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "reference" / "config" / "index.html").is_file()


def test_every_docs_page_is_in_the_nav():
    """mkdocs reports a page left out of the nav at INFO unless told otherwise: mkdocs.yml makes it
    a warning, which ``--strict`` turns into a failure; this checks the nav by hand as well."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["validation"]["omitted_files"] == "warn"

    def pages(nav) -> set[str]:
        if isinstance(nav, str):
            return {nav}
        if isinstance(nav, dict):
            return set().union(*(pages(value) for value in nav.values()))
        return set().union(*(pages(item) for item in nav))

    on_disk = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert on_disk == pages(config["nav"])
