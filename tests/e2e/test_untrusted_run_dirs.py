"""A run dir handed over from elsewhere stays inert (docs/concepts/run-dir.md#untrusted-run-dirs):
a symbolic link in it is refused before anything is written (the file it points to is untouched);
code its config names inside it is not imported unless the command names it; a full disk at
``--resume`` is one line; a finished run whose checkpoints were removed says so."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cli_in_process import agentrl_in_process

from agentrl.config.train import TrainConfig
from agentrl.plugins import load_plugins
from agentrl.rundir import checkpoints as ckpt
from agentrl.testing import lockstep_plugins
from agentrl.training.trainer import Trainer


@pytest.fixture(scope="module")
def finished(tiny_model_dir, tmp_path_factory) -> Path:
    """A finished 2-step run (checkpoints kept whole), its plots and eval.json written."""
    out = tmp_path_factory.mktemp("untrusted") / "run"
    config = TrainConfig(
        model=str(tiny_model_dir),
        max_steps=2,
        prompts_per_step=2,
        num_generations=2,
        max_new_tokens=4,
        eval_tasks=0,
        output_dir=str(out),
        checkpoint_every=1,
        keep_finished_checkpoints=True,
        log_completions_every=1,
        plugins=lockstep_plugins(),
    )
    Trainer(config, load_plugins()).train()
    return out


@pytest.fixture
def run(finished, tmp_path) -> Path:
    return Path(shutil.copytree(finished, tmp_path / "run"))


def _one_line(result, *said: str) -> str:
    assert result.returncode == 2, (result.stdout[-2000:], result.stderr[-2000:])
    assert "Traceback" not in result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and all(s in lines[0] for s in said), result.stderr
    return lines[0]


LINKED = ["metrics.jsonl", "completions.jsonl", "config.yaml", "eval.json", "training.png", "tensorboard", "model"]


@pytest.mark.parametrize("name", [*LINKED, "checkpoints/step-000002/optimizers.pt", "model/model.safetensors"])
def test_a_symbolic_link_in_a_resumed_run_dir_is_refused_and_its_target_untouched(run, tmp_path, name):
    target = tmp_path / "precious"
    shutil.move(run / name, target)  # the link points at what the run dir held: a resume would write it
    (run / name).symlink_to(target, target_is_directory=target.is_dir())
    before = {p: p.read_bytes() for p in ([target] if target.is_file() else sorted(target.rglob("*")))}
    result = agentrl_in_process("train", "--resume", str(run), "--max-steps", "3")
    _one_line(result, f"{str(run / name)!r} is a symbolic link (to {str(target)!r})", "never writes through a link")
    assert {p: p.read_bytes() for p in before} == before and not any(
        p not in before for p in (target.rglob("*") if target.is_dir() else [])
    )


def test_a_run_started_over_refuses_a_linked_config_too(run, tmp_path):
    shutil.rmtree(run / "checkpoints")
    (run / "eval.json").unlink()  # stopped before its first checkpoint: --resume starts it over
    target = tmp_path / "precious.yaml"
    target.write_bytes((run / "config.yaml").read_bytes())
    (run / "config.yaml").unlink()
    (run / "config.yaml").symlink_to(target)
    before = target.read_bytes()
    _one_line(agentrl_in_process("train", "--resume", str(run)), "config.yaml' is a symbolic link")
    assert target.read_bytes() == before


def test_plot_replaces_a_linked_png_without_writing_through_it(run, tmp_path):
    target = tmp_path / "precious.png"
    target.write_bytes(b"not a plot")
    (run / "training.png").unlink()
    (run / "training.png").symlink_to(target)
    result = agentrl_in_process("plot", str(run))
    assert result.returncode == 0, result.stderr
    assert target.read_bytes() == b"not a plot"
    assert not (run / "training.png").is_symlink() and (run / "training.png").read_bytes()[:4] == b"\x89PNG"


EVIL = """
from pathlib import Path
Path({marker!r}).write_text("ran")
from agentrl_math import MathEnv as Env
def reward(completions, **kwargs):
    return [0.0 for _ in completions]
"""


def _names_code(run: Path, marker: Path, key: str) -> str:
    """Make ``run``'s config (and, agreeing with it, its checkpoints) name code inside the run dir."""
    (run / "evil.py").write_text(EVIL.format(marker=str(marker)))
    spec = f"{run / 'evil.py'}:{'Env' if key == 'env' else 'reward'}"
    value = spec if key == "env" else {spec: 1.0}
    config = yaml.safe_load((run / "config.yaml").read_text())
    config[key] = value
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    for folder in ckpt.complete_checkpoints(run):
        state = json.loads((folder / ckpt.STATE).read_text())
        state["config"][key] = value
        (folder / ckpt.STATE).write_text(json.dumps(state))
        manifest = json.loads((folder / ckpt.COMPLETE).read_text())
        data = (folder / ckpt.STATE).read_bytes()
        manifest["files"][ckpt.STATE] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        (folder / ckpt.COMPLETE).write_text(json.dumps(manifest))
    return spec


@pytest.mark.parametrize(
    "command",
    [
        ["train", "--resume", "{run}", "--max-steps", "3"],
        ["train", "--resume", "{run}", "--print-config"],
        ["eval", "{run}"],
    ],
)
@pytest.mark.parametrize("key", ["env", "rewards"])
def test_code_inside_the_run_dir_is_not_imported_unless_named(run, tmp_path, command, key):
    marker = tmp_path / "code-ran"
    spec = _names_code(run, marker, key)
    args = [part.format(run=run) for part in command] + (["--num-tasks", "1"] if command[0] == "eval" else [])
    result = agentrl_in_process(*args)
    line = _one_line(result, f"names {key} code {spec!r}, a file inside the run dir")
    flag = "--env" if key == "env" else ("--reward" if command[0] == "train" else "--set 'rewards=")
    assert f"add {flag}" in line and not marker.exists()


def test_naming_the_code_on_the_command_line_runs_it(run, tmp_path):
    marker = tmp_path / "code-ran"
    spec = _names_code(run, marker, "env")
    result = agentrl_in_process("train", "--resume", str(run), "--print-config", "--env", spec)
    assert result.returncode == 0, result.stderr[-2000:]
    assert marker.exists() and f"env: {spec}" in result.stdout
    other = agentrl_in_process("train", "--resume", str(run), "--print-config", "--env", "math")
    _one_line(other, "--env 'math' is not the run's env")


@pytest.mark.parametrize("mode", [0o644, 0o666])
def test_own_code_outside_the_run_dir_runs_and_code_anyone_may_change_does_not(run, tmp_path, mode):
    marker = tmp_path / "code-ran"
    spec = _names_code(run, marker, "env")
    outside = tmp_path / "mine" / "env.py"
    outside.parent.mkdir()
    shutil.move(run / "evil.py", outside)
    outside.chmod(mode)
    for path in (run / "config.yaml", *[f / ckpt.STATE for f in ckpt.complete_checkpoints(run)]):
        path.write_text(path.read_text().replace(str(run / "evil.py"), str(outside)))
    for folder in ckpt.complete_checkpoints(run):  # the manifest agrees
        manifest = json.loads((folder / ckpt.COMPLETE).read_text())
        data = (folder / ckpt.STATE).read_bytes()
        manifest["files"][ckpt.STATE] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        (folder / ckpt.COMPLETE).write_text(json.dumps(manifest))
    result = agentrl_in_process("train", "--resume", str(run), "--print-config")
    if mode == 0o644:
        assert result.returncode == 0, result.stderr[-2000:]
        assert marker.exists() and f"env: {outside}:Env" in result.stdout
    else:
        _one_line(result, f"{spec.replace(str(run / 'evil.py'), str(outside))!r}, a file anyone may write to")
        assert not marker.exists()


def test_a_run_whose_checkpoints_were_removed_says_so(run):
    shutil.rmtree(run / "checkpoints")
    line = _one_line(agentrl_in_process("train", "--resume", str(run)))
    assert "checkpoint_every: 1, but none is left under checkpoints/: they were removed" in line
    assert "checkpoint_every: 0" not in line


def test_a_full_disk_at_resume_is_one_line(run, tmp_path):
    """A tmpfs filled to the last byte (a user and mount namespace of its own: no root needed)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    script = (
        f"mount -t tmpfs -o size=64m tmpfs {disk} && cp -r {run} {disk}/run && "
        f"(dd if=/dev/zero of={disk}/fill bs=1M count=128 2>/dev/null; true) && "
        f"exec {sys.executable} -m agentrl train --resume {disk}/run --max-steps 3"
    )
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("needs unshare to mount a small tmpfs")
    result = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "400"},
    )
    line = _one_line(result, f"--resume '{disk}/run'", "no space left on device", "free disk space")
    assert line.startswith("error: ")
