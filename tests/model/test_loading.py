"""The default model's conversion into the cache dir: once, also when two runs start at once."""

from __future__ import annotations

import errno
import fcntl
import threading
from pathlib import Path

from agentrl.model.loading import resolve_model


def test_a_second_run_waits_for_the_first_conversion_and_reuses_it(tmp_path: Path, monkeypatch) -> None:
    """While another process holds the conversion lock, resolving the alias waits; once the folder is
    complete it returns it without converting again (no download, no rewrite of a folder in use)."""
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    folder = tmp_path / "models" / "smollm2-135m"
    folder.parent.mkdir(parents=True)
    resolved: list[str] = []
    with open(folder.parent / ".smollm2-135m.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # "the first run", mid-conversion
        waiter = threading.Thread(target=lambda: resolved.append(resolve_model("smollm2-135m")), daemon=True)
        waiter.start()
        waiter.join(timeout=1.0)
        assert waiter.is_alive() and not resolved  # waiting, not converting beside the first run
        folder.mkdir()
        for name in ("config.json", "tokenizer_config.json"):
            (folder / name).write_text("{}")  # the first run's finished folder (contents not read here)
    waiter.join(timeout=30)
    assert resolved == [str(folder)]
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "tokenizer_config.json"]  # reused as is


def test_a_cache_on_a_filesystem_without_flock_still_resolves(tmp_path: Path, monkeypatch) -> None:
    """Where ``flock`` fails (ENOLCK: some network filesystems) resolving goes on unlocked, as before."""
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    folder = tmp_path / "models" / "smollm2-135m"

    def no_flock(fd, operation):  # the filesystem refuses the lock; another run's conversion has just ended
        folder.mkdir(parents=True)
        for name in ("config.json", "tokenizer_config.json"):
            (folder / name).write_text("{}")
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    assert resolve_model("smollm2-135m") == str(folder)
