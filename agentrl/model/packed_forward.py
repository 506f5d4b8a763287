"""A transformers decoder run over rows packed into one prefix tree: shared prefixes computed once.

What the policy's logprob forward (:class:`agentrl.model.policy.TokenLogprobs`) does to its rows,
for any decoder a plugin trains or scores with (PPO's critic, a reward model): right-padded rows
that share prefixes (a GRPO group's prompt, an agent episode's segments) become one prefix-tree
sequence (:mod:`agentrl.model.packing`), each distinct prefix one position attending to its
ancestors, block by block under ``sdpa`` (:mod:`agentrl.model.tree_attention`). Used where it drops
at least a tenth of the padded positions and the decoder's attention takes a custom mask (sdpa,
eager); otherwise the padded rows run as they are.
"""

from __future__ import annotations

from typing import Any

import torch

from agentrl.model.packing import PackedRows, pack_prefix_tree
from agentrl.model.tree_attention import KEYWORD, TreeBlocks, use_tree_attention

PACKING_ATTENTION = ("sdpa", "eager")  # implementations that take a custom 4D mask
PACKING_MIN_SAVING = 0.1  # pack only when it drops at least this share of the padded positions


def can_pack(model: torch.nn.Module) -> bool:
    """Whether ``model``'s attention takes the packed sequence's custom mask."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None) in PACKING_ATTENTION


def packed_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> PackedRows | None:
    """The rows as one prefix tree, or None where that would not save a tenth of their positions."""
    packed = pack_prefix_tree(input_ids, attention_mask)
    return packed if 0 < packed.length <= (1 - PACKING_MIN_SAVING) * int(attention_mask.sum()) else None


def packed_inputs(model: torch.nn.Module, packed: PackedRows, tree: bool = True) -> dict[str, Any]:
    """The keyword arguments that run ``packed`` through ``model`` (its ids or embeddings given
    apart): the ancestor mask as the model's attention takes it, the positions, and with ``tree``
    the blocks its ``sdpa`` attends by (:func:`~agentrl.model.tree_attention.use_tree_attention`)."""
    mask = packed.attend
    if model.config._attn_implementation != "sdpa":  # eager adds the mask: 0 or the most negative
        mask = torch.zeros(mask.shape, device=mask.device).masked_fill(~mask, torch.finfo(torch.float32).min)
    inputs: dict[str, Any] = {"attention_mask": mask, "position_ids": packed.position_ids}
    if tree and use_tree_attention(model):
        inputs[KEYWORD] = TreeBlocks.from_parents(list(packed.parents), packed.input_ids.device)
    return inputs


def selected_hidden_states(
    decoder: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    rows: torch.Tensor,
    cols: torch.Tensor,
    pack: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``decoder``'s last hidden states at positions ``(rows[k], cols[k])`` of right-padded rows
    ``(N, T)``: ``(U, H)`` and each selected position's index into them ``(K,)``. Packed (with
    ``pack``, where :func:`can_pack` and it saves work), a prefix several rows share is one position,
    computed once (U <= K); padded, U = K. Equal to the padded forward's to float rounding."""
    packed = packed_rows(input_ids, attention_mask) if pack and can_pack(decoder) else None
    if packed is None:
        hidden = decoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (N, T, H)
        return hidden[rows, cols], torch.arange(len(rows), device=input_ids.device)
    nodes, where = packed.node_index[rows, cols].unique(return_inverse=True)  # (U,), (K,)
    hidden = decoder(input_ids=packed.input_ids, **packed_inputs(decoder, packed)).last_hidden_state[0]  # (L, H)
    return hidden[nodes], where


def probe_rows(vocab: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Ids and attention mask ``(3, 12)`` of three rows sharing prefixes (the second the first's 6
    first ids, the third its 9 first, padded after 10): a batch on which a packed forward must give
    the padded one's results (seeded, the same every call)."""
    ids = torch.randint(3, vocab, (3, 12), generator=torch.Generator().manual_seed(0))
    ids[1, :6] = ids[0, :6]
    ids[2, :9] = ids[0, :9]
    attention = torch.ones_like(ids)
    attention[2, 10:] = 0
    return ids.to(device), attention.to(device)


@torch.no_grad()
def packing_agrees(decoder: torch.nn.Module, tolerance: float = 1e-3) -> bool:
    """Whether ``decoder``'s packed hidden states (:func:`selected_hidden_states`) equal its padded
    ones on :func:`probe_rows`, the largest difference within ``tolerance`` of the largest state:
    where a model's attention ignores the packed mask they do not, and a caller runs padded rows."""
    ids, attention = probe_rows(int(decoder.config.vocab_size), next(decoder.parameters()).device)
    rows, cols = attention.nonzero(as_tuple=True)
    packed, where = selected_hidden_states(decoder, ids, attention, rows, cols, pack=True)
    padded, _ = selected_hidden_states(decoder, ids, attention, rows, cols, pack=False)
    return bool((packed[where] - padded).abs().max() <= tolerance * padded.abs().max())
