"""Checks on folders agentrl writes to, before a run spends time loading anything."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from agentrl.errors import ConfigError


def folder_problem(folder: str | Path) -> str | None:
    """Why files cannot be written under ``folder`` (created if missing), or None if they can:
    it, or a folder above it, is a file; or the nearest existing folder is not writable."""
    path = Path(folder).expanduser()
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        if existing == path:
            return f"{str(path)!r} is a file, not a folder"
        return f"{str(path)!r} lies under {str(existing)!r}, which is a file"
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        return f"{str(existing)!r} is not writable ({os.strerror(exc.errno) if exc.errno else exc})"
    return None


def check_output_dir(output_dir: str | Path) -> None:
    """ConfigError when the run dir cannot be written (a file, under a file, or not writable):
    call at start-up, before the model loads."""
    problem = folder_problem(output_dir)
    if problem is not None:
        raise ConfigError(f"output_dir: {problem}; pick another --output-dir")
