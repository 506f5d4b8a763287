"""``agentrl ARGS`` run in the test's own process, for CLI tests that are not about the process; the
flags of the tiniest training run; a check that a command failed in one line."""

from __future__ import annotations

import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

from click.testing import Result
from typer.testing import CliRunner

from agentrl.cli.app import app

TINY = ["--max-steps", "1", "--num-generations", "2", "--prompts-per-step", "2", "--set", "max_new_tokens=4"]
"""``agentrl train`` flags of the tiniest run: one step of 2 prompts x 2 generations of 4 tokens."""


@dataclass(frozen=True)
class CliResult:
    """A finished ``agentrl`` command, under ``subprocess.CompletedProcess``'s names."""

    returncode: int
    stdout: str
    stderr: str


def agentrl_in_process(*args: str, cwd: Path | None = None) -> CliResult:
    """``agentrl ARGS`` through typer's CliRunner in this process, in ``cwd`` when given.

    Why: the pytest worker has torch and transformers imported already, while ``python -m
    agentrl.cli.app`` in a subprocess pays ~10 s of imports before ~1-5 s of work. Keep a subprocess
    where the test is about the process: exit status after a signal, a hang, warnings printed at
    start-up, output to a real file, a lock another process holds, environment variables it reads.

    stdout and stderr stay apart (agentrl's rich consoles write to whatever sys.stdout / sys.stderr
    are at write time, which the runner swaps). An exception escaping the command ends as it would
    in a subprocess: exit status 1 and its traceback at the end of stderr. ``sys.path`` and the
    current directory are restored afterwards (agentrl puts "" on sys.path to import modules from
    the current directory, as ``python -m`` does).
    """
    saved_path = list(sys.path)
    previous = Path.cwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        result = CliRunner().invoke(app, list(args), prog_name="agentrl")
    finally:
        os.chdir(previous)
        sys.path[:] = saved_path
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        assert result.exc_info is not None
        stderr += "".join(traceback.format_exception(*result.exc_info))
    return CliResult(result.exit_code, result.stdout, stderr)


def cli(*args: str) -> Result:
    """``agentrl ARGS`` through typer's CliRunner in this process, its result as the runner returns it."""
    return CliRunner().invoke(app, list(args))


def assert_one_line(result: Result, message: str, code: int = 2) -> str:
    """``result`` (of :func:`cli`) ended with exit status ``code`` and a single stderr line holding
    ``message``, with no traceback anywhere in its output; returns that line."""
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.output
    return lines[0]
