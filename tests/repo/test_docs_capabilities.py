"""docs/reference/capabilities.md is generated from the capability table and in the site's nav."""

from __future__ import annotations

from pathlib import Path

from agentrl.cli import capabilitydoc

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "capabilities.md"


def test_capabilities_md_is_generated_from_the_table():
    assert PAGE.read_text() == capabilitydoc.render(), (
        "docs/reference/capabilities.md differs from agentrl/config/capabilities.py: "
        "run `python -m agentrl.cli.capabilitydoc`"
    )
    supported, refused = capabilitydoc.counts()
    assert f"**{supported} are supported** and {refused} refused" in PAGE.read_text()


def test_capabilitydoc_writes_and_checks(tmp_path, capsys):
    path = tmp_path / "capabilities.md"
    assert capabilitydoc.main(["--output", str(path), "--check"]) == 1
    err = capsys.readouterr().err
    assert "is out of date with agentrl/config/capabilities.py: run `python -m agentrl.cli.capabilitydoc`" in err
    assert capabilitydoc.main(["--output", str(path)]) == 0 and path.read_text() == capabilitydoc.render()
    assert capabilitydoc.main(["--output", str(path), "--check"]) == 0
    path.write_text(path.read_text() + "edited by hand\n")
    assert capabilitydoc.main(["--output", str(path), "--check"]) == 1


def test_the_page_is_in_the_nav_and_linked_from_the_readme():
    assert "reference/capabilities.md" in (ROOT / "mkdocs.yml").read_text()
    assert "(docs/reference/capabilities.md)" in (ROOT / "README.md").read_text()
