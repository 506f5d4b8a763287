"""The command line of a generated docs page (``python -m agentrl.cli.hookdoc``, ``...configdoc``):
write the page, print it, or check that the file on disk is current."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def write_or_check(
    argv: list[str] | None, *, prog: str, description: str, default: Path, render: Callable[[], str], source: str
) -> int:
    """Write ``render()`` to ``--output`` (``-``: stdout), or with ``--check`` write nothing and exit
    1 when the file differs, naming ``source`` (what the page is generated from) and the command."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--output", default=str(default), help="Where to write it ('-': stdout).")
    parser.add_argument("--check", action="store_true", help="Write nothing; exit 1 if the file is out of date.")
    args = parser.parse_args(argv)
    text = render()
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    path = Path(args.output)
    if args.check:
        if not path.is_file() or path.read_text() != text:
            print(f"{path} is out of date with {source}: run `{prog}`", file=sys.stderr)
            return 1
        print(f"{path} is up to date")
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {path}")
    return 0
