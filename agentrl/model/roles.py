"""Every model folder a run names, checked for the role it plays before training starts.

A role (``policy``, ``rm``, ``prm``, ``judge``) needs a kind of model: a causal LM (the policy,
whose frozen copy is the reference and whose decoder the critic starts from; a ``judge:PATH``), a
sequence-classification model with one output (``rm:``) or a token-classification model with one
output (``prm:``), and its tokenizer. :func:`check_folder` reads only the folder (it exists,
``config.json`` parses, weights and tokenizer files are there, the saved architecture and head
fit the role); :func:`load_for_role` then loads the model with transformers' loading report and
refuses one whose weights would be partly freshly initialised (``missing_keys``) or whose saved
head has another size (``mismatched_keys``). Each refusal is one line naming the role, the folder
and the problem, e.g. ``rm: /models/x is a causal LM (LlamaForCausalLM) with no trained score head:
score.weight would be freshly initialised; give a sequence-classification reward model
(AutoModelForSequenceClassification, num_labels 1)``.

A model alias (``smollm2-135m``, :mod:`agentrl.model.aliases`) names its converted folder for every
role, as ``--model`` does (:func:`role_folder`): ``judge:smollm2-135m`` is the default model as the
judge; an alias given for a role that needs a classification head is refused (every alias is a causal LM).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError, ModelError, one_line
from agentrl.model.aliases import ALIASES, alias_folder, is_alias

CAUSAL, SEQUENCE, TOKEN = "causal LM", "sequence-classification model", "token-classification model"
WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin", "*.safetensors.index.json", "pytorch_model.bin.index.json")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "*.tiktoken",
)
SHOWN_KEYS = 3  # missing weights named in a refusal; the rest counted


class ModelFolderError(ModelError, ConfigError):
    """A model folder the config names cannot play its role (missing, broken, or the wrong kind)."""


@dataclass(frozen=True)
class Role:
    """What a role needs from its folder, and what to give instead."""

    name: str
    kind: str
    auto_class: str
    give: str
    one_label: bool = False


ROLES = {
    role.name: role
    for role in (
        Role(
            "policy",
            CAUSAL,
            "AutoModelForCausalLM",
            "give a causal LM folder (AutoModelForCausalLM) with its tokenizer",
        ),
        Role(
            "judge",
            CAUSAL,
            "AutoModelForCausalLM",
            "judge:PATH takes a causal LM folder (AutoModelForCausalLM) with its tokenizer or a model alias "
            f"({', '.join(sorted(ALIASES))}) (or use judge:policy, judge:openai)",
        ),
        Role(
            "rm",
            SEQUENCE,
            "AutoModelForSequenceClassification",
            "give a sequence-classification reward model (AutoModelForSequenceClassification, num_labels 1)",
            one_label=True,
        ),
        Role(
            "prm",
            TOKEN,
            "AutoModelForTokenClassification",
            "give a token-classification process reward model (AutoModelForTokenClassification, num_labels 1, "
            "a causal decoder)",
            one_label=True,
        ),
    )
}


def architecture_kind(architecture: str) -> str | None:
    """``CAUSAL``, ``SEQUENCE`` or ``TOKEN`` for a transformers class name; None for another head
    (a bare decoder, question answering, ...)."""
    from transformers.models.auto import modeling_auto

    if architecture.endswith("ForSequenceClassification"):
        return SEQUENCE
    if architecture.endswith("ForTokenClassification"):
        return TOKEN
    if architecture.endswith(("ForCausalLM", "LMHeadModel")):
        return CAUSAL
    causal = {n for v in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values() for n in _names(v)}
    return CAUSAL if architecture in causal else None


def _names(value: Any) -> tuple[str, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (str(value),)


def refuse(role: str, path: str | Path, problem: str, error: type[Exception] = ModelFolderError) -> Exception:
    """The one-line error for ``role``'s folder ``path``: ``"ROLE: PATH PROBLEM"``."""
    return error(f"{role}: {path} {problem}")


def role_folder(role: str, path: str | Path, error: type[Exception] = ModelFolderError) -> str | Path:
    """``path`` as ``role`` reads it: a model alias is its converted folder (fetched and converted on
    first use, as for ``--model``), refused for a role whose kind is not the aliases' causal LM;
    anything else is ``path`` itself."""
    if not is_alias(path):
        return path
    spec = ROLES[role]
    if spec.kind != CAUSAL:
        raise refuse(role, path, f"is a model alias of a causal LM, not a {spec.kind}; {spec.give}", error)
    return alias_folder(str(path))


def check_folder(role: str, path: str | Path, error: type[Exception] = ModelFolderError) -> Any:
    """Check the local folder ``path`` (or model alias) for ``role`` without loading weights; its
    transformers config. Raises ``error`` with one line naming the role, the folder and the problem."""
    spec = ROLES[role]
    path = role_folder(role, path, error)
    folder = Path(path).expanduser()
    if not folder.is_dir():
        what = "does not exist" if not folder.exists() else "is a file, not a model folder"
        raise refuse(role, path, f"{what}; {spec.give}", error)
    config = _config(spec, folder, path, error)
    _check_architecture(spec, config, path, error)
    if not any(next(folder.glob(pattern), None) for pattern in WEIGHT_FILES):
        raise refuse(
            role,
            path,
            "has no weights (no model.safetensors or pytorch_model.bin): save the model with save_pretrained; "
            + spec.give,
            error,
        )
    if not any(next(folder.glob(pattern), None) for pattern in TOKENIZER_FILES):
        raise refuse(
            role,
            path,
            "has no tokenizer (no tokenizer.json or tokenizer_config.json): save its tokenizer into the folder "
            "(tokenizer.save_pretrained)",
            error,
        )
    return config


def _config(spec: Role, folder: Path, path: str | Path, error: type[Exception]) -> Any:
    """The folder's config, read as JSON and then by transformers; one line when either fails."""
    from transformers import AutoConfig

    file = folder / "config.json"
    if not file.is_file():
        raise refuse(spec.name, path, f"has no config.json: not a saved model folder; {spec.give}", error)
    try:
        json.loads(file.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise refuse(spec.name, path, f"has a broken config.json (not JSON: {one_line(exc)})", error) from None
    try:
        return AutoConfig.from_pretrained(folder)
    except Exception as exc:  # transformers raises ValueError, KeyError, TypeError, OSError for a bad config
        raise refuse(spec.name, path, f"has a config.json transformers cannot read: {one_line(exc)}", error) from None


def _check_architecture(spec: Role, config: Any, path: str | Path, error: type[Exception]) -> None:
    """Refuse a saved architecture of another kind than the role's, or a head of more than one output."""
    architectures = list(getattr(config, "architectures", None) or [])
    kind = architecture_kind(architectures[0]) if architectures else None
    if kind is not None and kind != spec.kind:
        if spec.one_label and kind == CAUSAL:
            heads = ", ".join(head_keys(spec, config)) or "its head"
            raise refuse(
                spec.name,
                path,
                f"is a causal LM ({architectures[0]}) with no trained score head: {heads} would be freshly "
                f"initialised; {spec.give}",
                error,
            )
        raise refuse(spec.name, path, f"is a {kind} ({architectures[0]}), not a {spec.kind}: {spec.give}", error)
    if spec.one_label and config.num_labels != 1:
        raise refuse(
            spec.name,
            path,
            f"has num_labels={config.num_labels}: expected 1 (one score); {spec.give}",
            error,
        )


def head_keys(spec: Role, config: Any) -> list[str]:
    """The weights of ``spec``'s head for ``config`` (e.g. ``score.weight``): the model built on
    the meta device (no memory, no init), its keys outside the base model."""
    import torch
    import transformers

    try:
        with torch.device("meta"):
            model = getattr(transformers, spec.auto_class).from_config(config)
    except Exception:  # an architecture without this head: the message names none
        return []
    prefix = f"{model.base_model_prefix}."
    return [key for key in model.state_dict() if not key.startswith(prefix)]


def load_for_role(
    role: str, path: str | Path, error: type[Exception] = ModelFolderError, local: bool = True, **kwargs: Any
) -> Any:
    """The model at ``path`` (a folder, or a model alias: :func:`role_folder`) loaded as ``role``
    needs (:func:`check_folder` first when ``local``), refused when transformers would initialise any
    weight afresh or a saved weight has another shape. ``kwargs`` go to ``from_pretrained`` (``dtype``)."""
    import transformers

    spec = ROLES[role]
    if local:
        path = role_folder(role, path, error)
        check_folder(role, path, error)
    auto = getattr(transformers, spec.auto_class)
    try:
        model, info = auto.from_pretrained(
            str(Path(path).expanduser()) if local else str(path),
            output_loading_info=True,
            ignore_mismatched_sizes=True,
            **kwargs,
        )
    except Exception as exc:  # a damaged weight file, an unknown architecture, a hub error
        raise refuse(role, path, f"could not be loaded as {spec.auto_class}: {one_line(exc)}", error) from None
    problem = loading_problem(spec, info)
    if problem is not None:
        raise refuse(role, path, problem, error)
    return model


def loading_problem(spec: Role, info: dict[str, Any]) -> str | None:
    """What transformers' loading report ``info`` says is wrong for ``spec``, or None."""
    mismatched = list(info.get("mismatched_keys") or [])
    if mismatched:
        key, saved, wanted = mismatched[0]
        return (
            f"has a head of the wrong size: {key} is {list(saved)} in the checkpoint but {list(wanted)} for its "
            f"config (num_labels or hidden size changed after saving); {spec.give}"
        )
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        shown = ", ".join(missing[:SHOWN_KEYS]) + (
            f" and {len(missing) - SHOWN_KEYS} more" if len(missing) > SHOWN_KEYS else ""
        )
        return (
            f"lacks trained weights for {shown}: they would be freshly initialised (random), so the folder is "
            f"not a complete {spec.kind}; {spec.give}"
        )
    return None


def load_tokenizer_for_role(role: str, path: str | Path, error: type[Exception] = ModelFolderError) -> Any:
    """The tokenizer saved in ``path`` (or a model alias's) for ``role``; one line naming the folder
    when it cannot load."""
    from transformers import AutoTokenizer

    path = role_folder(role, path, error)
    try:
        return AutoTokenizer.from_pretrained(str(Path(path).expanduser()))
    except Exception as exc:  # a missing vocabulary file, sentencepiece not installed, a broken tokenizer.json
        raise refuse(role, path, f"has a tokenizer that could not be loaded: {one_line(exc)}", error) from None
