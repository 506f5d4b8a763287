"""LoRA through peft: train low-rank adapters instead of every weight (``lora:`` in the run config).

``lora: null`` (the default) is a full fine-tune and nothing here changes it: every function
below returns plain models unchanged. With a ``lora`` mapping (``--set lora.r=16``, or
``lora: {}`` for all the defaults of :class:`LoRAConfig`):

* **Policy.** The loaded model is wrapped by peft (:func:`with_adapter`): each target linear layer
  computes ``W x + (alpha / r) B A x`` with ``B`` zero at the start, so step 0 is the base model.
  ``W`` is frozen; only ``A`` and ``B`` require grad, so the optimizer (built from the parameters
  that require grad) holds only them and their Adam moments.
* **Reference policy** (algorithms with ``needs_reference``, e.g. ``beta > 0``): the policy object
  itself under :func:`adapter_disabled` (peft's ``disable_adapter``). The base weights never
  change, so that is the base model exactly, without a second copy in memory.
* **Engines** receive :func:`sampling_model` of the policy, at start-up and after every update: a
  plain model of the base class, named like the base checkpoint (no ``base_model.model.``
  prefix, no ``lora_A``/``lora_B``), whose adapted layers hold the merged weights
  ``W + (alpha / r) B A`` and whose other tensors (embeddings, norms, the tied LM head) are the
  policy's own tensors, shared, not copied. So an engine needs no LoRA code at all: the ``hf``
  engine's bf16 copy and the vLLM engine copy it by name as for a full fine-tune, and the ``hf``
  engine in float32 samples from it directly. The training model is never merged in place (an
  unmerge would not restore ``W`` bit for bit). Cost: one copy of the adapted layers' weights in
  the policy's dtype while a view lives (for the bf16 copy path, only during the sync).
* **Checkpoints** hold the adapter (``adapter/``, peft's ``save_pretrained``) and its optimizer
  state; ``--resume`` reloads the base from ``model`` and the adapter on top, bit for bit.
* **Export**: ``model/`` is the merged model (``AutoModelForCausalLM.from_pretrained``,
  ``agentrl eval``), ``adapter/`` the adapter alone (``PeftModel.from_pretrained(base, ...)``).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from agentrl.config.lora import lora_options
from agentrl.errors import ConfigError, one_line
from agentrl.imports import import_extra

# LLAMA_TARGETS, LoRAConfig and lora_options are importable from here too, as before.

INSTALL_HINT = "LoRA (the `lora` config section) needs peft, which is not installed: pip install 'agentrl[lora]'"
ADAPTER_FILE = "adapter_model.safetensors"


def with_adapter(model: nn.Module, values: dict[str, Any] | None) -> nn.Module:
    """``model`` wrapped by peft with a fresh adapter (eval mode, only the adapter trainable), or
    ``model`` itself when ``values`` is None. Needs peft (``pip install 'agentrl[lora]'``)."""
    options = lora_options(values)
    if options is None:
        return model
    peft = _import_peft()
    config = peft.LoraConfig(
        r=options.r,
        lora_alpha=options.lora_alpha,
        lora_dropout=options.dropout,
        target_modules=options.target_modules,
        bias=options.bias,
    )
    try:
        wrapped = peft.get_peft_model(model, config)
    except (ValueError, RuntimeError, TypeError) as exc:  # e.g. no layer of the model matches target_modules
        linear = sorted({name.rpartition(".")[2] for name, m in model.named_modules() if isinstance(m, nn.Linear)})
        raise ConfigError(
            f"lora: peft could not add the adapter to {type(model).__name__} ({one_line(exc)}); "
            f"its linear layers are named {', '.join(linear)}: set lora.target_modules "
            "to some of them or 'all-linear'"
        ) from exc
    return wrapped.eval()  # get_peft_model switches to train mode; dropout stays off (docs/concepts/guards.md#dropout)


def is_adapted(model: nn.Module) -> bool:
    """Whether ``model`` is a peft-wrapped policy (LoRA is on); never imports peft itself."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def adapter_disabled(model: nn.Module) -> contextlib.AbstractContextManager[Any]:
    """Inside it, ``model`` computes the base model (its adapter off); for a plain model, nothing."""
    return model.disable_adapter() if is_adapted(model) else contextlib.nullcontext()


def trainable_count(model: nn.Module) -> int:
    """Parameters that require grad (each tied tensor once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@torch.no_grad()
def sampling_model(model: nn.Module) -> nn.Module:
    """What an engine samples from: ``model`` itself without an adapter; with one, a plain model
    of the base class whose adapted layers hold ``W + (alpha / r) B A`` and whose other
    parameters and buffers are ``model``'s own tensors (module docstring). ``model`` is not changed."""
    if not is_adapted(model):
        return model
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()  # the HF model, its target layers replaced by peft's LoRA layers
    memo: dict[int, Any] = {id(t): t for t in itertools.chain(base.parameters(), base.buffers())}
    plain = copy.deepcopy(base, memo)  # the module tree copied, every tensor shared
    vars(plain).pop("peft_config", None)  # peft's note on the base model: the view is a plain model
    for name, layer in list(base.named_modules()):
        if not isinstance(layer, LoraLayer):
            continue
        linear = plain.get_submodule(name).base_layer  # a new module object holding the shared W
        weight = layer.get_base_layer().weight
        merged = weight.detach().clone()
        for adapter in layer.active_adapters:
            merged += layer.get_delta_weight(adapter).to(merged.dtype)
        linear.weight = nn.Parameter(merged, requires_grad=False)
        parent, _, child = name.rpartition(".")
        setattr(plain.get_submodule(parent) if parent else plain, child, linear)
    return plain.eval()


def save_adapter(model: nn.Module, folder: Path) -> None:
    """The adapter alone (``adapter_config.json`` and its weights): ``PeftModel.from_pretrained``."""
    model.save_pretrained(folder)


def load_adapter(model: nn.Module, folder: Path) -> None:
    """Load :func:`save_adapter`'s weights into ``model``'s adapter in place (exact values); a
    ConfigError when they do not fit it."""
    from safetensors.torch import load_file

    path = folder / ADAPTER_FILE
    if not path.is_file():
        raise ConfigError(
            f"checkpoint {str(folder.parent)!r} has no {folder.name}/{ADAPTER_FILE}: it was not written by a LoRA run"
        )
    peft = _import_peft()
    weights = load_file(path)
    result = peft.set_peft_model_state_dict(model, weights)
    missing = [k for k in result.missing_keys if "lora_" in k]
    if missing or result.unexpected_keys:
        raise ConfigError(
            f"adapter {str(folder)!r} does not fit the model: missing {missing[:5]}, "
            f"unexpected {list(result.unexpected_keys)[:5]}"
        )


def _import_peft() -> Any:
    return import_extra("peft", INSTALL_HINT, error=ConfigError)
