"""Figures of what training does, recorded from the code as it is, for tests/e2e/test_behaviour_unchanged.py.

Three scenarios on the tiny in-process model (``agentrl.testing.build_tiny_model`` + the real
tokenizer, as in tests/conftest.py), each in a fresh process with one CPU thread:

* ``grpo``: 5 GRPO steps (KL to a reference, two micro-batches per step, evaluations and best model);
* ``ppo``: 4 PPO steps of 2 epochs x 2 mini-batches, with the critic;
* ``resume``: the GRPO run interrupted (SIGINT, as Ctrl-C) during step 3, which completes and is
  checkpointed, then resumed in a new Trainer to step 5: full state, so it should equal ``grpo``.

For each: every metrics.jsonl row without the timing/memory figures (``perf/*``), and every tensor
the run dir holds outside ``checkpoints/`` (``model/``, ``critic/``, ``last/``...) as name, dtype,
shape, float64 sum and L2 norm, and the sha256 of its raw bytes. Also the tiny model the run started
from, and the machine's fingerprint (floats are bit-for-bit the same only on the same CPU type with
the same torch and transformers, at one thread). The runs draw no training.png (see
:func:`_skip_the_plot`); everything else is the real ``Trainer.train()``.

    python tests/record_behaviour.py --record   # rewrite tests/data/behaviour_golden.json from this code

    # one scenario, its figures as JSON in OUT (what the test runs; --set KEY=JSON changes the config,
    # --changed KEY=JSON --changed-out OUT2 then runs it again changed, to show the test notices)
    python tests/record_behaviour.py --scenario grpo --tiny-model DIR --workdir DIR --out OUT
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

# One thread everywhere, CPU only; set in a scenario's process before torch is imported (nothing
# here imports torch at module level, so the test can import this file without side effects).
SINGLE_THREAD = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "CUDA_VISIBLE_DEVICES": "",
    "TOKENIZERS_PARALLELISM": "false",
    "MPLBACKEND": "Agg",
}
GOLDEN = Path(__file__).resolve().parent / "data" / "behaviour_golden.json"
SCENARIOS = ("grpo", "ppo", "resume")
TIMING_PREFIXES = ("perf/",)  # wall-clock and memory figures: differ between any two runs
SKIPPED_DIRS = {"checkpoints", "tensorboard"}  # weights read from the run dir outside these

COMMON: dict[str, Any] = dict(
    prompts_per_step=2,
    num_generations=4,
    max_new_tokens=8,
    learning_rate=1e-3,
    rewards={"agentrl.testing:parity_reward": 1.0},  # groups with signal
    precision="fp32",  # "auto" would pick bf16 on some CPUs
    log_completions_every=0,
    seed=0,
)
GRPO: dict[str, Any] = dict(
    COMMON,
    algo="grpo",
    max_steps=5,
    algorithm={"beta": 0.04},
    micro_batch_size=4,
    eval_tasks=2,
    eval_every=2,
    eval_sampled=True,
    checkpoint_every=0,
)
PPO: dict[str, Any] = dict(
    COMMON, algo="ppo", max_steps=4, algorithm={"ppo_epochs": 2, "mini_batches": 2}, eval_tasks=0, checkpoint_every=0
)
RESUME_STOP = 3
# A plugin that sends this process SIGINT at the end of step RESUME_STOP, as Ctrl-C during the update.
STOP_PLUGIN = f"""
import os, signal
from agentrl import hookimpl

@hookimpl
def agentrl_on_step_end(step, metrics):
    if step == {RESUME_STOP} and os.environ.get("AGENTRL_BEHAVIOUR_STOP") == "1":
        os.kill(os.getpid(), signal.SIGINT)
"""


def machine_fingerprint() -> dict[str, str]:
    """What bitwise equality of float results depends on: CPU model and feature flags, the
    architecture, torch and transformers versions."""
    import torch
    import transformers

    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())  # the first CPU's
    except OSError:  # not Linux
        pass
    model = info.get("model name") or info.get("CPU part") or platform.processor() or platform.machine()
    flags = " ".join(sorted(set((info.get("flags") or info.get("Features") or "").split())))
    return {
        "cpu": model,
        "cpu_flags_sha256": hashlib.sha256(flags.encode()).hexdigest(),
        "arch": platform.machine(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu_capability": str(torch.backends.cpu.get_cpu_capability()),
    }


def tensor_summary(tensor: Any) -> dict[str, Any]:
    """dtype, shape, float64 sum and L2 norm, sha256 of the raw bytes."""
    import torch

    t = tensor.detach().cpu().contiguous()
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
    wide = t.to(torch.float64)
    return {
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "sum": wide.sum().item(),
        "norm": wide.norm().item(),
        "sha256": hashlib.sha256(raw).hexdigest(),
    }


def folder_weights(root: Path) -> dict[str, dict[str, Any]]:
    """Every tensor in the ``*.safetensors`` and ``*.pt`` files under ``root`` (but not in
    checkpoints/ or tensorboard/), keyed ``folder/name`` (``folder/file.pt:name`` for ``.pt``)."""
    import torch
    from safetensors.torch import load_file

    out: dict[str, dict[str, Any]] = {}
    for file in sorted(root.rglob("*")):
        rel = file.relative_to(root)
        if not file.is_file() or rel.parts[0] in SKIPPED_DIRS:
            continue
        folder = rel.parent.as_posix()
        if file.suffix == ".safetensors":
            tensors = {f"{folder}/{k}": v for k, v in load_file(file).items()}
        elif file.suffix == ".pt":
            state = torch.load(file, weights_only=True, map_location="cpu")
            if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
                raise SystemExit(f"{rel}: not a state dict of tensors; teach folder_weights to read it")
            tensors = {f"{rel.as_posix()}:{k}": v for k, v in state.items()}
        else:
            continue
        for name, tensor in tensors.items():
            if name in out:
                raise SystemExit(f"{name} is in two files under {root}")
            out[name] = tensor_summary(tensor)
    return dict(sorted(out.items()))


def metrics_history(run_dir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl rows without the timing and memory figures."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: v for k, v in row.items() if not k.startswith(TIMING_PREFIXES)} for row in rows]


def ensure_tiny_model(folder: Path) -> None:
    """The tiny model + the real tokenizer in ``folder``, built as tests/conftest.py does, unless there."""
    if (folder / "config.json").is_file():
        return
    from agentrl.model.loading import DEFAULT_MODEL, load_tokenizer
    from agentrl.testing import build_tiny_model

    tokenizer = load_tokenizer(DEFAULT_MODEL)
    folder.mkdir(parents=True, exist_ok=True)
    build_tiny_model(len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def run_scenario(name: str, tiny_model: Path, workdir: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    """Train scenario ``name`` in ``workdir`` and return its figures."""
    import torch

    torch.set_num_threads(1)
    from agentrl import TrainConfig, TrainingInterrupted, load_plugins
    from agentrl.rundir.directory import resume_config
    from agentrl.testing import lockstep_plugins
    from agentrl.training.trainer import Trainer

    ensure_tiny_model(tiny_model)
    _skip_the_plot()
    run_dir = workdir / name

    def config(base: dict[str, Any], **more: Any) -> Any:
        # lockstep_plugins(): the same engine batches however loaded the machine (three scenarios at once)
        return TrainConfig(
            **{
                **base,
                "model": str(tiny_model),
                "output_dir": str(run_dir),
                "plugins": lockstep_plugins(),
                **more,
                **overrides,
            }
        )

    if name == "grpo":
        Trainer(config(GRPO), load_plugins()).train()
    elif name == "ppo":
        Trainer(config(PPO), load_plugins()).train()
    elif name == "resume":
        plugin = workdir / "stop_plugin.py"
        workdir.mkdir(parents=True, exist_ok=True)
        plugin.write_text(STOP_PLUGIN)
        os.environ["AGENTRL_BEHAVIOUR_STOP"] = "1"
        try:
            Trainer(config(GRPO, checkpoint_every=2), load_plugins(modules=[str(plugin)])).train()
            raise SystemExit(f"resume: the run was not interrupted at step {RESUME_STOP}")
        except TrainingInterrupted as stopped:
            expected = run_dir / "checkpoints" / f"step-{RESUME_STOP:06d}"
            if stopped.checkpoint != str(expected):
                raise SystemExit(f"resume: expected {expected}, the run saved {stopped.checkpoint}") from None
        os.environ["AGENTRL_BEHAVIOUR_STOP"] = "0"
        resumed, checkpoint = resume_config(run_dir)
        if checkpoint.name != f"step-{RESUME_STOP:06d}":
            raise SystemExit(f"resume: expected to resume from step {RESUME_STOP}, got {checkpoint}")
        Trainer(resumed, load_plugins(modules=[str(plugin)]), resume=checkpoint).train()
    else:
        raise SystemExit(f"unknown scenario {name!r}: one of {', '.join(SCENARIOS)}")
    return {
        "fingerprint": machine_fingerprint(),
        "threads": torch.get_num_threads(),
        "tiny_model": folder_weights(tiny_model),
        "metrics": metrics_history(run_dir),
        "weights": folder_weights(run_dir),
    }


def _skip_the_plot() -> None:
    """No training.png: it is drawn from metrics.jsonl after the run's figures are final, so it
    cannot change them, and it is half of a tiny run's time (tests/rundir/test_plots.py covers it). If the
    plot moves elsewhere this does nothing, and the runs are only slower."""
    try:
        import agentrl.rundir.plots as plots
    except ImportError:
        return
    if hasattr(plots, "plot_run"):
        plots.plot_run = lambda *args, **kwargs: None


def scenario_command(
    name: str,
    tiny_model: Path,
    workdir: Path,
    out: Path,
    changed: dict[str, Any] | None = None,
    changed_out: Path | None = None,
) -> list[str]:
    """The command line that runs scenario ``name`` in a fresh process (with :func:`child_env`),
    then, given ``changed``, the scenario again with those config values (``changed_out``)."""
    extra = [a for k, v in (changed or {}).items() for a in ("--changed", f"{k}={json.dumps(v)}")]
    extra += ["--changed-out", str(changed_out)] if changed_out else []
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        "--scenario",
        name,
        "--tiny-model",
        str(tiny_model),
        "--workdir",
        str(workdir),
        "--out",
        str(out),
        *extra,
    ]


def child_env() -> dict[str, str]:
    """This environment with one thread and no GPU, and no accelerate launcher settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    return {**env, **SINGLE_THREAD}


def record() -> None:
    """Run every scenario (one process at a time) and write GOLDEN."""
    with tempfile.TemporaryDirectory(prefix="agentrl-behaviour-") as tmp:
        tiny = Path(tmp) / "tiny-model"
        scenarios, fingerprint = {}, None
        for name in SCENARIOS:
            out = Path(tmp) / f"{name}.json"
            done = subprocess.run(
                scenario_command(name, tiny, Path(tmp) / "runs", out), env=child_env(), capture_output=True, text=True
            )
            if done.returncode:
                raise SystemExit(f"scenario {name} failed:\n{done.stderr[-4000:]}")
            figures = json.loads(out.read_text())
            if fingerprint not in (None, figures["fingerprint"]):
                raise SystemExit("the scenarios ran on machines with different fingerprints")
            fingerprint = figures.pop("fingerprint")
            figures.pop("threads")
            scenarios[name] = figures
            print(f"{name}: {len(figures['metrics'])} metric rows, {len(figures['weights'])} tensors", flush=True)
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "agentrl", "plugins", "envs"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent,
    ).stdout.strip()
    golden = {
        "recorded_from": commit + (" (with uncommitted changes)" if dirty else ""),
        "fingerprint": fingerprint,
        "scenarios": scenarios,
        "configs": {
            "common": COMMON,
            "grpo": GRPO,
            "ppo": PPO,
            "resume": {"interrupted_in_step": RESUME_STOP, "checkpoint_every": 2},
        },
    }
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=False) + "\n")
    print(f"wrote {GOLDEN}")


def main() -> None:
    os.environ.update(SINGLE_THREAD)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", action="store_true", help=f"rewrite {GOLDEN.name} from this code")
    parser.add_argument("--scenario", choices=SCENARIOS)
    parser.add_argument("--tiny-model", type=Path, help="the tiny model's folder (built there if missing)")
    parser.add_argument("--workdir", type=Path, help="where the scenario's run dirs go")
    parser.add_argument("--out", type=Path, help="the JSON file the figures are written to")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=JSON", help="change a config value")
    parser.add_argument(
        "--changed",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="then run the scenario again with this config value changed (in the same process: "
        "the test only needs its figures to differ), writing its figures to --changed-out",
    )
    parser.add_argument("--changed-out", type=Path)
    args = parser.parse_args()
    if args.record:
        record()
        return
    if not (args.scenario and args.tiny_model and args.workdir and args.out):
        parser.error("give --record, or --scenario, --tiny-model, --workdir and --out")
    if bool(args.changed) != bool(args.changed_out):
        parser.error("--changed and --changed-out go together")
    overrides = dict(_key_value(item) for item in args.set)
    figures = run_scenario(args.scenario, args.tiny_model, args.workdir, overrides)
    args.out.write_text(json.dumps(figures))
    if args.changed:
        changed = run_scenario(
            args.scenario,
            args.tiny_model,
            args.workdir / "changed",
            {**overrides, **dict(_key_value(item) for item in args.changed)},
        )
        args.changed_out.write_text(json.dumps(changed))


def _key_value(item: str) -> tuple[str, Any]:
    key, _, value = item.partition("=")
    return key, json.loads(value)


if __name__ == "__main__":
    main()
