"""Linear layers of the ``hf`` engine's sampling copy with their weights packed once per weight sync.

On a CPU, ``torch.nn.functional.linear`` in bf16 goes through oneDNN, which reorders the weight
matrix into its blocked layout on every call. For the few rows of a decode step that reorder costs
about as much as the product: on the default model (AMD EPYC Zen 4, 2 threads, bf16) a
(6 x 576) @ (576 x 1536) product takes 78 us through ``F.linear`` and 46 us with the weight
reordered beforehand, the LM head at 6 rows 4.3 ms against 1.7 ms. oneDNN computes the same
products either way: every output is bit for bit ``F.linear``'s (tests/plugins/test_hf_packed_linear.py),
so tokens and logprobs do not move.

:func:`pack_linears` turns every plain ``nn.Linear`` of a model into a :class:`PackedLinear` (the same
object, parameters and names; only its class changes) holding the reordered weight beside its own,
and :func:`repack` reorders again after the weights changed (the engine calls it at the end of
every ``sync_weights``). Only the engine's own sampling copy is packed, never the trainer's model,
and a call that needs gradients or another dtype takes ``F.linear`` as before. The packed copy
costs the weights' memory once more (~270 MB for the 135M default model in bf16).

In fp32, ``F.linear`` is MKL's; oneDNN with a packed weight computes a decode step's few rows 1.5-4x
faster (Zen 4: (1 x 576) @ (576 x 1536) 394 -> 187 us, the LM head at 8 rows 21.1 -> 5.1 ms) but
rounds its sums otherwise, so fp32 layers are packed only where the caller allows it
(``can_pack(..., float32=True)``): the engine's ``bfloat16_weights`` copy, never the trainer's model
(``dtype: float32``, whose logprobs must equal the trainer's).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class PackedLinear(torch.nn.Linear):
    """An ``nn.Linear`` whose forward uses :attr:`packed`, its weight in oneDNN's layout, while the
    weight is the one packed: the same tensor, unchanged since (its version counter), same dtype.
    Anything else (a weight changed in place, ``.float()``, a deep copy, a call that needs
    gradients) takes ``F.linear`` as a plain ``nn.Linear`` does."""

    packed: torch.Tensor | None = None
    """The weight reordered by :func:`repack` (None: ``F.linear`` on :attr:`weight`)."""
    packed_from: tuple[int, int, torch.dtype] | None = None
    """The weight :attr:`packed` was made from: (data pointer, version, dtype)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 (nn.Linear's name)
        """``F.linear(input, weight, bias)``, computed on the packed weight where it applies."""
        weight = self.weight
        if (
            self.packed_from != (weight.data_ptr(), weight._version, input.dtype)
            or torch.is_grad_enabled()
            and weight.requires_grad
        ):
            return F.linear(input, weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(input.contiguous(), self.packed, self.bias, "none", [], "")

    def __getstate__(self) -> dict:
        """Copies and pickles carry no packed weight (oneDNN's opaque tensors are not copied)."""
        return {**super().__getstate__(), "packed": None, "packed_from": None}


def can_pack(model: torch.nn.Module, float32: bool = False) -> bool:
    """Whether :func:`pack_linears` applies: a CPU model in bf16 and a torch built with oneDNN that
    computes bf16 (an AVX512 CPU; natively with AVX512-BF16 or AMX), or with ``float32`` an fp32
    one. In fp32, ``F.linear`` is MKL's, whose sums oneDNN rounds otherwise (outputs differ in the
    last bits): only for a model whose outputs need not be ``F.linear``'s bit for bit."""
    parameter = next(model.parameters(), None)
    if parameter is None or parameter.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if parameter.dtype == torch.float32:
        return float32
    return parameter.dtype == torch.bfloat16 and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def pack_linears(model: torch.nn.Module) -> int:
    """Make every plain ``nn.Linear`` of ``model`` (not a subclass: LoRA or quantized layers keep
    their own forward) a :class:`PackedLinear` and pack its weight; how many were."""
    count = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.__class__ = PackedLinear
            count += 1
    repack(model)
    return count


def repack(model: torch.nn.Module) -> None:
    """Reorder the weight of every :class:`PackedLinear` of ``model`` again (after its weights changed)."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, PackedLinear):
                weight = module.weight
                module.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
                module.packed_from = (weight.data_ptr(), weight._version, weight.dtype)
