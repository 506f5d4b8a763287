"""Checkpoints are input: loading one never runs code from it; a damaged newest one is
named (which file, what is wrong) and the run resumes from the newest intact one; a write that
fails (disk full, read-only) names the path and the cause and loses nothing; a cut metrics log
keeps its whole lines. Runs are tiny and in-process, as in test_resume.py."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_in_process import agentrl_in_process
from safetensors.torch import load_file

from agentrl.config.train import TrainConfig
from agentrl.errors import CheckpointError, ConfigError, TrainingError
from agentrl.plugins import load_plugins
from agentrl.rundir import checkpoints as ckpt
from agentrl.rundir import state_files as statefiles
from agentrl.rundir.checkpoints import complete_checkpoints
from agentrl.rundir.directory import resume_config
from agentrl.rundir.saved import read_checkpoint
from agentrl.testing import lockstep_plugins
from agentrl.training import rng
from agentrl.training.trainer import Trainer

NEWEST = "checkpoints/step-000003"


def test_state_json_round_trips_tensors_and_rng_states_exactly_and_refuses_other_objects():
    value = {
        "a": [1, 2.5, None, True, "x", (3, 4)],
        "t": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3),
        "g": torch.Generator().manual_seed(3).get_state(),
        "e": torch.empty(0, 2),
        "s": torch.tensor(7),
    }
    back = statefiles.from_json(json.loads(json.dumps(statefiles.to_json(value, "state.json"))))
    assert back["a"] == [1, 2.5, None, True, "x", [3, 4]]  # a tuple comes back as a list
    assert all(back[k].dtype == value[k].dtype and torch.equal(back[k], value[k]) for k in "tges")
    states = rng.rng_states()
    draws = (random.random(), np.random.normal(), torch.rand(2))
    rng.set_rng_states(statefiles.from_json(json.loads(json.dumps(statefiles.to_json(states, "rng")))))
    again = (random.random(), np.random.normal(), torch.rand(2))
    assert draws[:2] == again[:2] and torch.equal(draws[2], again[2])
    with pytest.raises(CheckpointError, match=r"state\.json\.plugins\.seen: a set cannot be stored in a checkpoint"):
        statefiles.to_json({"plugins": {"seen": {1}}}, "state.json")
    with pytest.raises(CheckpointError, match="state.json: key 3 cannot be stored"):
        statefiles.to_json({3: 1}, "state.json")


def _config(model_dir: Path, base: Path, out: Path, **overrides) -> TrainConfig:
    """A tiny run rewarded by reply length (a random model's math rewards are all 0), a checkpoint
    per step kept whole, at a constant rate: 3 steps resumed to 4 equal 4 steps straight."""
    config = dict(
        model=str(model_dir),
        max_steps=3,
        prompts_per_step=2,
        num_generations=2,
        max_new_tokens=8,
        eval_tasks=0,
        output_dir=str(out),
        checkpoint_every=1,
        keep_checkpoints=2,
        learning_rate=1e-3,
        lr_scheduler="constant",
        keep_finished_checkpoints=True,
        log_completions_every=1,
        rewards={f"{base / 'length_reward.py'}:reply_length": 1.0},
        plugins=lockstep_plugins(),
    )
    return TrainConfig(**{**config, **overrides})


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("checkpoint-safety")
    (folder / "length_reward.py").write_text(
        "def reply_length(completions, **kwargs):\n    return [len(c[-1]['content']) / 100 for c in completions]\n"
    )
    return folder


@pytest.fixture(scope="module")
def straight(tiny_model_dir, base) -> Path:
    """4 steps in one go: what every resumed run below must equal."""
    out = base / "straight"
    Trainer(_config(tiny_model_dir, base, out, max_steps=4), load_plugins()).train()
    return out


@pytest.fixture(scope="module")
def finished(tiny_model_dir, base) -> Path:
    out = base / "finished"
    Trainer(_config(tiny_model_dir, base, out), load_plugins()).train()
    assert [p.name for p in complete_checkpoints(out)] == ["step-000002", "step-000003"]
    return out


@pytest.fixture
def run(finished, tmp_path) -> Path:
    """A copy of a finished 3-step run whose checkpoints step-2 and step-3 are whole."""
    return Path(shutil.copytree(finished, tmp_path / "run"))


def _lines(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in rows]


def _assert_same_run(run_dir: Path, straight: Path) -> None:
    assert _lines(run_dir) == _lines(straight)
    assert (run_dir / "completions.jsonl").read_text() == (straight / "completions.jsonl").read_text()
    a, b = load_file(run_dir / "model" / "model.safetensors"), load_file(straight / "model" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _rehash(folder: Path) -> None:
    """Make the manifest agree with the files, as someone who swapped a file would."""
    manifest = json.loads((folder / ckpt.COMPLETE).read_text())
    for name in manifest["files"]:
        data = (folder / name).read_bytes()
        manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / ckpt.COMPLETE).write_text(json.dumps(manifest))


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "cut":
        path.write_bytes(data[: len(data) // 2])
    elif how == "delete":
        path.unlink()
    elif how == "garble":
        path.write_bytes(b"{not json" + b"#" * (len(data) - 9))  # same size: only the hash tells
    else:  # flip one byte in the middle
        path.write_bytes(data[: len(data) // 2] + bytes([data[len(data) // 2] ^ 1]) + data[len(data) // 2 + 1 :])


CHANGED = r"has changed since it was written \(its sha256 differs\)"
DAMAGE = [  # (file of the newest checkpoint, what happens to it, what the note says)
    ("optimizers.pt", "cut", r"optimizers\.pt is \d+ bytes, but \d+ were written"),
    ("optimizers.pt", "delete", r"optimizers\.pt is missing"),
    ("state.json", "cut", r"state\.json is \d+ bytes, but \d+ were written"),
    ("state.json", "delete", r"state\.json is missing"),
    ("model/model.safetensors", "cut", r"model/model\.safetensors is \d+ bytes, but \d+ were written"),
    ("model/model.safetensors", "delete", r"model/model\.safetensors is missing"),
    ("model/model.safetensors", "flip", r"model/model\.safetensors " + CHANGED),
    ("trainer_state.json", "delete", r"trainer_state\.json is missing"),
    ("trainer_state.json", "garble", r"trainer_state\.json " + CHANGED),
    ("modules.pt", "delete", r"modules\.pt is missing"),
    ("COMPLETE", "garble", r"COMPLETE does not hold a manifest this agentrl can read"),
]


@pytest.mark.parametrize(("name", "how", "said"), DAMAGE, ids=[f"{name}-{how}" for name, how, _ in DAMAGE])
def test_a_damaged_newest_checkpoint_is_named_and_the_older_one_resumed(run, name, how, said):
    _damage(run / NEWEST / name, how)
    notes: list[str] = []
    config, folder = resume_config(run, max_steps=4, say=notes.append)
    assert folder.name == "step-000002"
    assert len(notes) == 1 and re.fullmatch(
        f"note: checkpoint step-000003 is damaged: {said}; resuming from "
        r"step-000002, the newest intact one \(.*\)",
        notes[0],
    ), notes
    assert Trainer(config, load_plugins(), resume=folder).resumed["step"] == 2


def test_resuming_past_a_damaged_checkpoint_equals_a_straight_run(run, straight, capsys):
    _damage(run / NEWEST / "optimizers.pt", "cut")
    config, folder = resume_config(run, max_steps=4)
    Trainer(config, load_plugins(), resume=folder).train()
    assert "checkpoint step-000003 is damaged: optimizers.pt is" in capsys.readouterr().out
    _assert_same_run(run, straight)
    assert (run / "checkpoints" / "damaged-step-000003" / "optimizers.pt").is_file()  # kept aside, not reused
    assert [p.name for p in complete_checkpoints(run)] == ["step-000003", "step-000004"]


def test_no_intact_checkpoint_is_one_line_naming_each(run):
    _damage(run / NEWEST / "optimizers.pt", "cut")
    _damage(run / "checkpoints/step-000002/model/model.safetensors", "delete")
    message = (
        r"no intact checkpoint \(step-000003: optimizers\.pt is \d+ bytes, but \d+ were written; "
        r"step-000002: model/model\.safetensors is missing\): nothing can be resumed; train the run again with "
        "another --output-dir"
    )
    with pytest.raises(CheckpointError, match=message):
        resume_config(run, max_steps=4)
    cli = agentrl_in_process("train", "--resume", str(run), "--max-steps", "4")  # a refusal: no process's test
    assert cli.returncode == 2 and cli.stderr.startswith("error: ") and "Traceback" not in cli.stderr
    assert re.search(message, " ".join(cli.stderr.split()))


class _Payload:
    """Unpickling it writes ``marker``: the code a tampered checkpoint would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # torch, on the raw pickle it then refuses
@pytest.mark.parametrize("form", ["torch.save", "pickle"])
@pytest.mark.parametrize(
    "name", ["optimizers.pt", "modules.pt", "state.json", "trainer_state.json", "model/model.safetensors"]
)
def test_a_pickle_payload_in_any_checkpoint_file_never_runs(run, tmp_path, name, form, capsys):
    """The payload is refused by name, and the resume falls back to the older checkpoint."""
    marker = tmp_path / "payload-ran"
    payload = {"policy": _Payload(marker)}
    path = run / NEWEST / name
    torch.save(payload, path) if form == "torch.save" else path.write_bytes(pickle.dumps(payload))
    _rehash(run / NEWEST)  # the manifest agrees: whoever swapped the file rewrote it too
    config, folder = resume_config(run, max_steps=4)
    assert Trainer(config, load_plugins(), resume=folder).resumed["step"] == 2
    (note,) = [line for line in capsys.readouterr().out.splitlines() if "step-000003" in line]
    assert not marker.exists()
    assert Path(name).name in note and "resuming from step-000002" in note
    if name.endswith(".pt"):
        assert "refused it" in note and "weights_only=True" in note


def _to_legacy(folder: Path) -> None:
    """Rewrite a checkpoint as an earlier agentrl wrote it: (state, schedule) pairs in optimizers.pt,
    pickled RNG states (numpy's as an array) in state.pt, the step alone in COMPLETE."""
    saved = read_checkpoint(folder)
    torch.save(
        {name: (saved.optimizers[name], saved.schedules[name]) for name in saved.schedules}, folder / "optimizers.pt"
    )
    processes = []
    for process in saved.processes:
        (version, internal, gauss), (name, keys, *rest) = process["rng"]["python"], process["rng"]["numpy"]
        rng = {
            **process["rng"],
            "python": (version, tuple(internal), gauss),
            "numpy": (name, np.array(keys, dtype=np.uint32), *rest),
        }
        processes.append({**process, "rng": rng})
    torch.save(
        {
            "rng": processes[0]["rng"],
            "engine": processes[0]["engine"],
            "processes": processes,
            "algorithm": saved.algorithm,
            "plugins": saved.plugins,
        },
        folder / "state.pt",
    )
    (folder / "state.json").unlink()
    (folder / ckpt.COMPLETE).write_text("3\n")


def test_an_earlier_agentrls_checkpoint_loads_safely_and_resumes_exactly(run, straight):
    _to_legacy(run / NEWEST)
    config, folder = resume_config(run, max_steps=4)
    assert folder.name == "step-000003" and ckpt.read_manifest(folder) is None
    Trainer(config, load_plugins(), resume=folder).train()
    _assert_same_run(run, straight)


def test_a_payload_in_an_earlier_agentrls_state_pt_never_runs(run, tmp_path, capsys):
    _to_legacy(run / NEWEST)
    marker = tmp_path / "payload-ran"
    torch.save({"rng": _Payload(marker)}, run / NEWEST / "state.pt")
    config, folder = resume_config(run, max_steps=4)
    assert Trainer(config, load_plugins(), resume=folder).resumed["step"] == 2  # the older one
    refused = r"state\.pt holds pickled objects beyond tensors .*\((builtins\.)?exec\)"
    assert re.search(refused, capsys.readouterr().out)
    assert not marker.exists()


class _FullDisk:
    """A file that fails as a full disk does once ``room`` bytes are written."""

    def __init__(self, file, room: int) -> None:
        self.file, self.room = file, room

    def write(self, data) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_a_failed_checkpoint_write_names_the_cause_and_loses_nothing(
    tiny_model_dir, base, straight, tmp_path, monkeypatch, code
):
    out = tmp_path / "run"
    real_save, real_mkdtemp = torch.save, ckpt.tempfile.mkdtemp

    def full_disk_save(value, file):  # step 3's optimizers.pt runs out of room half-way (torch wraps the OSError)
        return real_save(value, _FullDisk(file, 4096) if ".tmp-step-000003" in str(getattr(file, "name", "")) else file)

    def read_only_mkdtemp(*args, **kwargs):  # step 3's checkpoint folder cannot be created
        if "step-000003" in (kwargs.get("prefix") or ""):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(kwargs["dir"]))
        return real_mkdtemp(*args, **kwargs)

    if code == errno.ENOSPC:
        monkeypatch.setattr(torch, "save", full_disk_save)
    else:
        monkeypatch.setattr(ckpt.tempfile, "mkdtemp", read_only_mkdtemp)
    with pytest.raises(CheckpointError) as info:
        Trainer(_config(tiny_model_dir, base, out, max_steps=4), load_plugins()).train()
    monkeypatch.undo()
    said = "no space left on device" if code == errno.ENOSPC else "read-only file system"
    assert re.fullmatch(
        f"could not write checkpoint step-000003: {said} .*; its temporary folder was removed and "
        r"checkpoint step-000002 is intact: .*, then continue with `agentrl train --resume .*`",
        str(info.value),
    ), str(info.value)
    assert not list((out / "checkpoints").glob(".tmp-*"))
    assert [p.name for p in complete_checkpoints(out)] == ["step-000001", "step-000002"]
    assert [row["step"] for row in _lines(out)] == [1, 2, 3]  # step 3's line came before its checkpoint
    config, folder = resume_config(out)
    assert folder.name == "step-000002"
    Trainer(config, load_plugins(), resume=folder).train()
    _assert_same_run(out, straight)


def test_a_cut_metrics_log_keeps_its_whole_lines_and_a_broken_one_is_named(run, straight, capsys):
    path = run / "metrics.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + lines[1][:20])  # cut inside step 2's line, below what step-3 recorded
    config, folder = resume_config(run, max_steps=4)
    assert folder.name == "step-000003"  # the checkpoints themselves are intact
    Trainer(config, load_plugins(), resume=folder).train()
    assert re.search(
        r"note: .*metrics\.jsonl is \d+ bytes, shorter than the \d+ the checkpoint recorded: lines "
        r"written before the checkpoint were lost; its torn last line \(20 bytes\) was dropped",
        capsys.readouterr().out,
    )
    assert [row["step"] for row in _lines(run)] == [1, 4] and _lines(run)[0] == _lines(straight)[0]

    shutil.rmtree(run / "checkpoints" / "step-000004")  # resume from step-3 again, the log's line 1 now broken
    path.write_bytes(b"{torn\n" + path.read_bytes())
    config, folder = resume_config(run, max_steps=4)
    with pytest.raises(
        TrainingError, match=re.escape(f"{path}, line 1: not a JSON object ('{{torn'); fix or delete that line")
    ):
        Trainer(config, load_plugins(), resume=folder).train()


def _mount(*args: str) -> bool:
    return os.geteuid() == 0 and subprocess.run(["mount", *args], capture_output=True).returncode == 0


def test_a_read_only_run_dir_is_one_line_naming_it(run):
    if not _mount("--bind", str(run), str(run)):
        pytest.skip("needs root to bind-mount the run dir read-only")
    try:
        assert _mount("-o", "remount,ro,bind", str(run), str(run))
        with pytest.raises(
            ConfigError, match=re.escape(f"--resume {str(run)!r}: {str(run)!r} is not writable (Read-only file system)")
        ):
            resume_config(run, max_steps=4)
        cli = subprocess.run(
            [sys.executable, "-m", "agentrl", "train", "--resume", str(run), "--max-steps", "4"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert cli.returncode == 2 and cli.stderr.startswith("error: ") and "Traceback" not in cli.stderr
        assert "Read-only file system" in cli.stderr
    finally:
        subprocess.run(["umount", str(run)], check=True)


def test_a_full_disk_for_real_then_freed(tiny_model_dir, base, straight, tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    if not _mount("-t", "tmpfs", "-o", "size=40m", "tmpfs", str(disk)):
        pytest.skip("needs root to mount a small tmpfs")
    try:
        out = disk / "run"
        with pytest.raises((CheckpointError, TrainingError), match="no space left on device"):
            Trainer(_config(tiny_model_dir, base, out, max_steps=4), load_plugins()).train()
        done = complete_checkpoints(out)
        assert done and not list((out / "checkpoints").glob(".tmp-*"))
        assert all(ckpt.damage(out, folder) is None for folder in done)
        assert _mount("-o", "remount,size=200m", str(disk))  # space freed
        config, folder = resume_config(out)
        assert folder == done[-1]
        Trainer(config, load_plugins(), resume=folder).train()
        _assert_same_run(out, straight)
    finally:
        subprocess.run(["umount", str(disk)], check=True)
