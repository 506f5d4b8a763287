"""Consistently forged checkpoint values (the manifest rewritten to agree) are found before they are
used: one line naming the file and the key, then the resume falls back to the newest intact
checkpoint; with none intact, one line and no traceback. Runs are tiny and in-process."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from cli_in_process import agentrl_in_process
from safetensors.torch import load_file, save_file

from agentrl.config.train import TrainConfig
from agentrl.plugins import load_plugins
from agentrl.rundir import checkpoints as ckpt
from agentrl.rundir import state_files
from agentrl.rundir.directory import resume_config
from agentrl.testing import lockstep_plugins
from agentrl.training.trainer import Trainer

NEWEST, OLDER = "checkpoints/step-000002", "checkpoints/step-000001"


@pytest.fixture(scope="module")
def finished(tiny_model_dir, tmp_path_factory) -> Path:
    """A 2-step run whose checkpoints step-1 and step-2 are whole."""
    out = tmp_path_factory.mktemp("forged") / "run"
    config = TrainConfig(
        model=str(tiny_model_dir),
        max_steps=2,
        prompts_per_step=2,
        num_generations=2,
        max_new_tokens=4,
        eval_tasks=0,
        output_dir=str(out),
        checkpoint_every=1,
        keep_checkpoints=2,
        keep_finished_checkpoints=True,
        lr_scheduler="constant",
        plugins=lockstep_plugins(),
    )
    Trainer(config, load_plugins()).train()
    return out


@pytest.fixture
def run(finished, tmp_path) -> Path:
    return Path(shutil.copytree(finished, tmp_path / "run"))


def _rehash(folder: Path) -> None:
    """The manifest made to agree with the files, as a forger would."""
    manifest = json.loads((folder / ckpt.COMPLETE).read_text())
    for name in manifest["files"]:
        data = (folder / name).read_bytes()
        manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / ckpt.COMPLETE).write_text(json.dumps(manifest))


def _json(name: str, change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def forge(folder: Path) -> None:
        data = state_files.from_json(json.loads((folder / name).read_text()))
        change(data)
        (folder / name).write_text(json.dumps(state_files.to_json(data, name)))

    return forge


def _tensors(change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def forge(folder: Path) -> None:
        data = torch.load(folder / ckpt.OPTIMIZERS, weights_only=True)
        change(data["policy"])
        torch.save(data, folder / ckpt.OPTIMIZERS)

    return forge


def _weights(folder: Path) -> None:
    weights = load_file(folder / "model" / "model.safetensors")
    key = next(k for k, v in weights.items() if v.dim() == 2)
    weights[key] = weights[key][:-1].contiguous()
    save_file(weights, folder / "model" / "model.safetensors", metadata={"format": "pt"})


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for part in parents:
            data = data[int(part)] if isinstance(data, list) else data[part]
        data[int(last) if isinstance(data, list) else last] = value(data[int(last) if isinstance(data, list) else last])

    return change


def _first_moment(state: dict[str, Any]) -> None:
    first = next(iter(state["state"].values()))
    first["exp_avg"] = first["exp_avg"].reshape(-1)[:3].clone()


def _step_as_text(state: dict[str, Any]) -> None:
    next(iter(state["state"].values()))["step"] = "3"


FORGED = [  # (what, forge the newest checkpoint, the file and key the line names)
    ("negative task cursor", _json("trainer_state.json", _set("task_cursor", lambda v: -3)), "trainer_state.json key 'task_cursor'"),
    ("step as text", _json("trainer_state.json", _set("step", lambda v: "2")), "trainer_state.json key 'step'"),
    ("another step", _json("trainer_state.json", _set("step", lambda v: 7)), "trainer_state.json key 'step': 7"),
    ("negative log size", _json("trainer_state.json", _set("metrics_bytes", lambda v: -1)), "trainer_state.json key 'metrics_bytes'"),
    ("eval episodes size as text", _json("trainer_state.json", _set("eval_completions_bytes", lambda v: "0")), "trainer_state.json key 'eval_completions_bytes'"),
    ("truncated python rng", _json("state.json", _set("processes.0.rng.python.1", lambda v: v[:100])), "state.json key 'processes.0.rng.python'"),
    ("truncated torch rng", _json("state.json", _set("processes.0.rng.torch", lambda v: v[:100])), "state.json key 'processes.0.rng.torch'"),
    ("sampler state of the wrong length", _json("state.json", _set("processes.0.engine.generator", lambda v: v[:64])), "state.json key 'engine'.generator"),
    ("schedule step as text", _json("state.json", _set("schedules.policy.last_epoch", lambda v: "x")), "state.json key 'schedules.policy'.last_epoch"),
    ("moments of the wrong shape", _tensors(_first_moment), "optimizers.pt key 'policy'.state.0.exp_avg"),
    ("a doubled param group", _tensors(lambda s: s["param_groups"].append(dict(s["param_groups"][0]))), "optimizers.pt key 'policy'.param_groups"),
    ("optimizer step as text", _tensors(_step_as_text), "optimizers.pt key 'policy'.state.0.step"),
    ("weights of the wrong shape", _weights, "model key"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "forge", "named"), FORGED, ids=[f[0] for f in FORGED])
def test_a_forged_value_is_named_and_the_older_checkpoint_resumed(run, what, forge, named, capsys):
    forge(run / NEWEST)
    _rehash(run / NEWEST)
    config, folder = resume_config(run, max_steps=3)
    trainer = Trainer(config, load_plugins(), resume=folder)
    assert trainer.resumed["step"] == 1
    said = capsys.readouterr().out
    notes = [line for line in said.splitlines() if "step-000002" in line]
    assert len(notes) == 1 and named in notes[0] and "resuming from step-000001" in notes[0], said


def test_no_checkpoint_left_is_one_line_without_a_traceback(run):
    for folder in (NEWEST, OLDER):
        _json("trainer_state.json", _set("task_cursor", lambda v: -1))(run / folder)
        _rehash(run / folder)
    result = agentrl_in_process("train", "--resume", str(run), "--max-steps", "3")
    assert result.returncode == 2 and "Traceback" not in result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and re.search(
        r"no intact checkpoint \(step-000002: trainer_state\.json key 'task_cursor'", lines[0]
    )


def test_forged_moments_in_every_checkpoint_fail_cleanly_on_the_cli(run):
    for folder in (NEWEST, OLDER):
        _tensors(_first_moment)(run / folder)
        _rehash(run / folder)
    result = agentrl_in_process("train", "--resume", str(run), "--max-steps", "3")
    assert result.returncode == 2 and "Traceback" not in result.stdout + result.stderr, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "no intact checkpoint" in lines[0] and "optimizers.pt key 'policy'" in lines[0]
