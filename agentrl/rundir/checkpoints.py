"""Resumable checkpoints: atomic, verified ``step-N`` folders under ``<run_dir>/checkpoints``.

A checkpoint is written into a temporary folder beside its final place, flushed to disk, marked
complete, then renamed (a rename is atomic on one filesystem), so a process killed at any moment
leaves either the previous checkpoints or the new one, never half of one. Only the newest
``keep`` complete checkpoints stay. What goes inside is the trainer's business
(:mod:`agentrl.training.saving`); this module knows folders and file formats.

Loading a checkpoint never runs code from it: tensors are read by ``torch.load(weights_only=True)``
(``modules.pt``, ``optimizers.pt``) or safetensors (``model/``), everything else is JSON
(``state.json``: RNG states, schedules, engine, algorithm and plugin state, its tensors as base64):
:mod:`agentrl.rundir.saved` reads them back.
The ``COMPLETE`` marker holds a manifest: each file's size and sha256 as written (sha256 runs at
about 700 MB/s with SHA-NI on these CPUs: 2 s for the default model's 1.6 GB checkpoint).
:func:`intact_checkpoint` checks it before ``--resume`` trusts a checkpoint, and falls back to the
newest intact one, naming what is wrong with the newer ones. A write that fails (disk full, a
read-only folder) removes its temporary folder and raises a CheckpointError naming the path and
the cause: the older checkpoints are untouched. Checkpoints of an earlier agentrl (``COMPLETE``
holding the step alone, ``state.pt``) still load, by ``weights_only`` too, unverified.

A run that finishes normally keeps only its last checkpoint, slimmed by :func:`slim_finished`
(unless ``keep_finished_checkpoints``): without the optimizer moments (AdamW holds twice the weights),
and without the policy's weights when the exported ``model/`` (or ``last/``) holds the same files.
Resuming it with a larger ``--max-steps`` restarts the moments. Interrupted runs keep whole
checkpoints, so their resume stays exact.
"""

from __future__ import annotations

import errno
import filecmp
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.errors import CheckpointError, ConfigError, one_line
from agentrl.rundir.state_schema import state_problem

CHECKPOINTS = "checkpoints"
COMPLETE = "COMPLETE"  # the manifest: {"format", "step", "files": {path: {"size", "sha256"}}, "weights_in"?}
WEIGHTS = "model"  # the policy's weights inside a checkpoint (a save_pretrained folder)
MODULES = "modules.pt"  # {name: state dict} of the algorithm's own modules
OPTIMIZERS = "optimizers.pt"  # {name: optimizer state dict}; absent from a finished run's slimmed checkpoint
STATE = "trainer_state.json"  # step, task cursor, log positions, config
EXTRA = "state.json"  # {"schedules", "processes": [{"rng", "engine"}], "algorithm", "plugins"}
FORMAT = 2
LEGACY_EXTRA = "state.pt"  # an earlier agentrl's EXTRA (and optimizers.pt held (state, schedule) pairs)
_NAME = re.compile(r"^step-(\d+)$")


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    """Where the checkpoint of ``step`` lives."""
    return run_dir / CHECKPOINTS / f"step-{step:06d}"


# -- writing -----------------------------------------------------------------------------------------
def write_atomically(run_dir: Path, step: int, write: Callable[[Path], None], keep: int) -> Path:
    """Run ``write(folder)`` into a temporary folder, record its manifest and move it to ``step-N``;
    then delete all but the newest ``keep`` complete checkpoints. A complete checkpoint of the
    same step already there is kept as is (the state of a step is the state of that step). A
    failed write (disk full, read-only) is a CheckpointError naming the path and the cause."""
    final = checkpoint_dir(run_dir, step)
    if (final / COMPLETE).is_file():
        return final
    tmp = None
    if final.parent.is_symlink():
        raise CheckpointError(f"{str(final.parent)!r} is a symbolic link: agentrl never writes checkpoints through one")
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
        write(tmp)
        manifest = {"format": FORMAT, "step": step, "files": _manifest(tmp)}
        (tmp / COMPLETE).write_text(json.dumps(manifest, indent=1))
        _fsync_tree(tmp)
        if final.exists():  # an incomplete leftover of the same step (cannot happen with rename, but be safe)
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync(final.parent)
    except BaseException as exc:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        error = os_error(exc) if isinstance(exc, Exception) else None
        if error is None:
            raise
        raise CheckpointError(_write_failure(run_dir, final, error)) from exc
    for old in complete_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def os_error(exc: BaseException) -> OSError | None:
    """The OSError behind ``exc``: itself, its cause or context (torch.save wraps a failed write in
    a RuntimeError), or one rebuilt from a Rust library's ``(os error N)`` (safetensors); None if none."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, OSError) and seen.errno:
            return seen
        if found := re.search(r"\(os error (\d+)\)", str(seen)):
            return OSError(int(found.group(1)), os.strerror(int(found.group(1))))
        seen = seen.__cause__ or seen.__context__
    return None


def _write_failure(run_dir: Path, final: Path, error: OSError) -> str:
    """One line: which checkpoint, the cause and path, what is still intact, what to do."""
    cause = (error.strerror or str(error)).lower()
    where = error.filename or final.parent
    fix = {
        errno.ENOSPC: "free disk space",
        errno.EDQUOT: "free disk space (quota)",
        errno.EROFS: "make it writable",
        errno.EACCES: "make it writable",
        errno.EPERM: "make it writable",
    }.get(error.errno or 0, "fix that")
    previous = complete_checkpoints(run_dir)
    kept = f"checkpoint {previous[-1].name} is intact" if previous else "there is no earlier checkpoint"
    return (
        f"could not write checkpoint {final.name}: {cause} ({where}); its temporary folder was removed and "
        f"{kept}: {fix}, then continue with `agentrl train --resume {run_dir}`"
    )


def _manifest(folder: Path) -> dict[str, dict[str, Any]]:
    """Every file under ``folder`` (relative posix path) with its size and sha256."""
    return {
        p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": _sha256(p)}
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


# -- finding and verifying -------------------------------------------------------------------------------
def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (temporary and unmarked folders ignored)."""
    root = run_dir / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _NAME.match(p.name)) and (p / COMPLETE).is_file()]
    return [p for _, p in sorted(found)]


def remove_partial(run_dir: Path) -> None:
    """Delete temporary folders a killed save left behind."""
    root = run_dir / CHECKPOINTS
    for path in root.glob(".tmp-step-*") if root.is_dir() else []:
        shutil.rmtree(path, ignore_errors=True)


def latest_checkpoint(run_dir: Path) -> Path:
    """The newest complete checkpoint of ``run_dir``; a ConfigError saying why there is none."""
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"--resume {str(run_dir)!r}: not a run dir (no config.yaml)")
    found = complete_checkpoints(run_dir)
    if not found:
        raise ConfigError(
            f"--resume {str(run_dir)!r}: the run has no complete checkpoint under {CHECKPOINTS}/ "
            "(checkpoint_every was 0, or it stopped before its first checkpoint): start it again"
        )
    return found[-1]


def say(line: str) -> None:
    """Print ``line`` on the main process only (a launched run's workers all resume)."""
    if os.environ.get("RANK", "0") == "0":
        print(line, flush=True)


def intact_checkpoint(run_dir: Path, say: Callable[[str], None] = say) -> Path:
    """The newest complete checkpoint that :func:`damage` finds nothing wrong with; ``say`` gets one
    line per newer, damaged one (which file, what is wrong). A CheckpointError when none is intact."""
    latest_checkpoint(run_dir)  # a ConfigError when there is none at all
    folders = list(reversed(complete_checkpoints(run_dir)))
    return newest_intact(run_dir, folders, lambda folder: damage(run_dir, folder), say, "is damaged")


def newest_intact(
    run_dir: Path, folders: list[Path], problem_of: Callable[[Path], str | None], say: Callable[[str], None], what: str
) -> Path:
    """The first of ``folders`` (newest first) ``problem_of`` finds nothing wrong with; ``say`` gets
    one line per folder passed over (it ``what``: which file, what is wrong). A CheckpointError
    naming every problem when none is intact."""
    problems: list[tuple[str, str]] = []
    for folder in folders:
        problem = problem_of(folder)
        if problem is None:
            for name, line in problems:
                say(
                    f"note: checkpoint {name} {what}: {line}; resuming from {folder.name}, the newest intact one "
                    f"({name} is moved to {CHECKPOINTS}/damaged-{name})"
                )
            return folder
        problems.append((folder.name, problem))
    found = "; ".join(f"{name}: {line}" for name, line in problems)
    raise CheckpointError(
        f"--resume {str(run_dir)!r}: no intact checkpoint ({found}): nothing can be resumed; "
        "train the run again with another --output-dir"
    )


def damage(run_dir: Path, folder: Path) -> str | None:
    """What is wrong with checkpoint ``folder`` (a file missing, cut short or changed since it was
    written, or an unreadable manifest; a value in its JSON state files that a resume could not
    use: :func:`agentrl.rundir.state_schema.state_problem`); None when every file matches the
    manifest and its values check out. A slimmed checkpoint's weights are checked in ``run_dir``'s export."""
    try:
        manifest = read_manifest(folder)
    except CheckpointError as exc:
        return str(exc)
    if manifest is None:
        return _legacy_damage(folder)
    if manifest["step"] != _step_of(folder):
        return f"{COMPLETE} key 'step': {manifest['step']!r}, but the folder is {folder.name}"
    checks = [(name, folder / name, want) for name, want in manifest["files"].items()]
    moved = manifest.get("weights_in")
    if moved:
        checks += [
            (f"{moved['folder']}/{name} (the run's export)", run_dir / moved["folder"] / name, want)
            for name, want in moved["files"].items()
        ]
    for name, path, want in checks:
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != want["size"]:
            return f"{name} is {size} bytes, but {want['size']} were written"
        if _sha256(path) != want["sha256"]:
            return f"{name} has changed since it was written (its sha256 differs)"
    return state_problem(folder, _step_of(folder))


def _step_of(folder: Path) -> int | None:
    """The step in a checkpoint folder's name (``step-000003``: 3)."""
    found = _NAME.match(folder.name)
    return int(found.group(1)) if found else None


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest in ``folder``'s COMPLETE marker; None for an earlier agentrl's checkpoint (the
    marker holds the step alone); a CheckpointError when it is unreadable."""
    try:
        text = (folder / COMPLETE).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{COMPLETE} is unreadable ({one_line(exc)})") from None
    if text.strip().isdigit():
        return None
    try:
        data = json.loads(text)
        files = data["files"]
        weights = data.get("weights_in") or {"folder": WEIGHTS, "files": {}}
        entries = [*files.values(), *weights["files"].values()]
        ok = data["format"] == FORMAT and all(
            isinstance(e["size"], int) and isinstance(e["sha256"], str) for e in entries
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        ok = False
    if not ok:
        raise CheckpointError(f"{COMPLETE} does not hold a manifest this agentrl can read")
    return data


def _legacy_damage(folder: Path) -> str | None:
    """What is plainly wrong with an earlier agentrl's checkpoint (no manifest: a file missing or
    empty, its trainer state not JSON)."""
    for name in (STATE, MODULES, OPTIMIZERS, LEGACY_EXTRA):
        if not (folder / name).is_file() or not (folder / name).stat().st_size:
            return f"{name} is missing or empty"
    try:
        read_json(folder / STATE)
    except CheckpointError as exc:
        return str(exc)
    return state_problem(folder, _step_of(folder))


def set_aside_after(run_dir: Path, step: int) -> list[Path]:
    """Rename the complete checkpoints after ``step`` (damaged ones a resume passed over) to
    ``damaged-step-N``, out of the way of the steps about to be redone; their new paths."""
    moved = []
    for folder in complete_checkpoints(run_dir):
        if int(folder.name.removeprefix("step-")) > step:
            target = folder.with_name(f"damaged-{folder.name}")
            for n in range(2, 1000):
                if not target.exists():
                    break
                target = folder.with_name(f"damaged-{folder.name}-{n}")
            os.rename(folder, target)
            moved.append(target)
    return moved


def read_json(path: Path) -> Any:
    """The JSON in ``path``; a CheckpointError naming it when it cannot be read or parsed."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is unreadable ({one_line(exc)})") from None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*"), reverse=True):
        _fsync(path)
    _fsync(root)


# -- the end of a run ---------------------------------------------------------------------------
def slim_finished(run_dir: Path, folder: Path, weights_in: str | None) -> None:
    """Shrink a finished run to what ``--resume --max-steps`` needs: delete every checkpoint but
    ``folder`` (its last), drop the optimizer moments from it (the schedules stay) and its policy
    weights when ``run_dir/weights_in`` (the export) holds the same files. One atomic change, the
    manifest's, decides: a kill at any moment leaves a loadable checkpoint (files the manifest no
    longer lists are ignored). An earlier agentrl's checkpoint is left whole."""
    for old in complete_checkpoints(run_dir):
        if old.name != folder.name:
            shutil.rmtree(old, ignore_errors=True)
    manifest = read_manifest(folder)
    if manifest is None:
        return
    files = {name: entry for name, entry in manifest["files"].items() if name != OPTIMIZERS}
    slim = {**manifest, "files": files}
    moved = weights_in is not None and _same_weights(folder / WEIGHTS, run_dir / weights_in)
    if moved:
        inside = f"{WEIGHTS}/"
        slim["files"] = {name: entry for name, entry in files.items() if not name.startswith(inside)}
        slim["weights_in"] = {
            "folder": weights_in,
            "files": {
                name.removeprefix(inside): entry
                for name, entry in files.items()
                if name.startswith(inside) and name.endswith(".safetensors")
            },
        }
    _replace(folder / COMPLETE, lambda tmp: tmp.write_text(json.dumps(slim, indent=1)))
    (folder / OPTIMIZERS).unlink(missing_ok=True)
    if moved:
        gone = folder / f".{WEIGHTS}.deleting"
        shutil.rmtree(gone, ignore_errors=True)  # left by a kill during an earlier attempt
        os.rename(folder / WEIGHTS, gone)
        shutil.rmtree(gone)


def _replace(path: Path, write: Callable[[Path], None]) -> None:
    """Write ``path`` anew through a temporary file beside it, renamed over it when flushed."""
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    _fsync(tmp)
    os.replace(tmp, path)


def _same_weights(a: Path, b: Path) -> bool:
    """Whether folders ``a`` and ``b`` hold the same ``*.safetensors`` files, byte for byte."""
    names = sorted(p.name for p in a.glob("*.safetensors"))
    return (
        bool(names)
        and names == sorted(p.name for p in b.glob("*.safetensors"))
        and all(filecmp.cmp(a / n, b / n, shallow=False) for n in names)
    )
