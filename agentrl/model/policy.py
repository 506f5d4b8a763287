"""Per-token logprobs of a causal LM, computing the LM head only where the loss needs it.

``TokenLogprobs`` wraps a HF causal LM as one ``nn.Module`` so accelerate/DDP see a single
forward. It runs the decoder over the whole (right-padded) sequence, then applies the output
head only at the positions that predict loss-mask tokens: on SmolLM2 the head is a fifth of the
FLOPs per token, and prompt/env tokens are most of the sequence in multi-turn episodes.

With ``pack=True`` a micro-batch whose rows share prefixes (a GRPO group's prompt) runs as one
prefix-tree sequence (:mod:`agentrl.model.packing`): shared tokens computed once, no padding. It is
used where it saves at least a tenth of the padded positions and the model's attention takes a
custom mask (sdpa, eager); :meth:`TokenLogprobs.packing_error` measures its agreement with the
padded forward, which the trainer checks at start-up.

Alignment (see agentrl.trajectory): ``logprobs[i, t]`` is the logprob of ``input_ids[i, t]``
computed from the hidden state at ``t - 1``; entries off the mask are 0.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel

from agentrl.model.output_head import head_matches
from agentrl.model.packed_forward import can_pack, packed_inputs, packed_rows, probe_rows
from agentrl.model.packing import PackedRows
from agentrl.model.selected_logprobs import selected_logprobs
from agentrl.model.tied_embedding import split_tied, tied_embedding
from agentrl.model.tree_attention import use_tree_attention


class TokenLogprobs(nn.Module):
    """``forward(input_ids, attention_mask, loss_mask) -> (logprobs, entropy)``, both ``(N, T)``."""

    def __init__(
        self, model: PreTrainedModel, temperature: float = 1.0, pack: bool = False, sparse_embedding: bool = False
    ) -> None:
        super().__init__()
        self.model = model
        self.temperature = temperature
        self.pack = pack and can_pack(model)
        # a packed sdpa forward attends block by block (agentrl.model.tree_attention), not through a dense mask
        self.tree_attention = self.pack and use_tree_attention(model)
        self.sparse_embedding = sparse_embedding and tied_embedding(model) is not None
        # checked here, before any wrapper: a model that caps or scales its logits keeps its own forward
        self.head_is_logits = head_matches(model)
        self._keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor, with_entropy: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logprobs (with grad) and entropies (no grad) of the loss-mask tokens; 0 elsewhere."""
        targets = loss_mask[:, 1:] > 0  # (N, T-1): position t-1 predicts token t
        rows, cols = targets.nonzero(as_tuple=True)  # K selected predictions
        token_ids = input_ids[rows, cols + 1]  # (K,)
        packed = packed_rows(input_ids, attention_mask) if self.pack else None
        weights = self._weights()
        if packed is not None:
            nodes, where = packed.node_index[rows, cols].unique(return_inverse=True)  # (U,), (K,)
            logits = self._packed_logits(packed, nodes, weights)  # (U, V): a node shared by rows is computed once
        else:
            logits, where = self._padded_logits(input_ids, attention_mask, rows, cols, weights)  # (K, V), (K,)
        picked, node_entropy = selected_logprobs(logits, where, token_ids, self.temperature, with_entropy)  # (K,), (U,)
        logprobs = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
        logprobs = logprobs.index_put((rows, cols + 1), picked.float())  # (N, T); a float64 model's too
        entropy = torch.zeros_like(logprobs)
        if node_entropy is not None:
            entropy[rows, cols + 1] = node_entropy[where].float()
        if rows.numel() == 0:  # keep the graph connected for a fully masked micro-batch
            logprobs = logprobs + 0.0 * logits.sum()
        return logprobs, entropy

    def _padded_logits(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        rows: torch.Tensor,
        cols: torch.Tensor,
        weights: tuple[torch.Tensor | None, torch.Tensor | None],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``(K, V)`` at the selected positions of the padded rows and each one's index."""
        where = torch.arange(len(rows), device=input_ids.device)  # (K,)
        if not self.head_is_logits:  # capped or scaled logits: the model's own forward
            logits = self.model(**self._inputs(input_ids, weights), attention_mask=attention_mask).logits  # (N, T, V)
            return logits[rows, cols], where
        decoder = self.model.get_decoder()
        hidden = decoder(**self._inputs(input_ids, weights), attention_mask=attention_mask).last_hidden_state
        # softmax taken in fp32 by selected_logprobs (guards.md#logprob-parity)
        return self._head(hidden[rows, cols], weights), where  # hidden (N, T, H)

    def _packed_logits(
        self, packed: PackedRows, nodes: torch.Tensor, weights: tuple[torch.Tensor | None, torch.Tensor | None]
    ) -> torch.Tensor:
        """Logits ``(U, V)`` at the packed sequence's positions ``nodes``."""
        inputs = dict(self._inputs(packed.input_ids, weights), **packed_inputs(self.model, packed, self.tree_attention))
        if not self.head_is_logits:  # capped or scaled logits: the model's own forward
            if not self._keeps_logits:
                return self.model(**inputs).logits[0, nodes]
            return self.model(**inputs, logits_to_keep=nodes).logits[0]  # at those positions only
        hidden = self.model.get_decoder()(**inputs).last_hidden_state[0]  # (L, H)
        return self._head(hidden[nodes], weights)

    def _weights(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(the input lookup's weight, the head's weight) where this forward looks the ids up itself
        (:attr:`sparse_embedding`), else (None, None): the model's own modules. With a head applied
        here too the tied weight is split (:func:`~agentrl.model.tied_embedding.split_tied`), so its two
        gradients meet in place."""
        if not self.sparse_embedding:
            return None, None
        weight = self.model.get_input_embeddings().weight
        if not self.head_is_logits or not torch.is_grad_enabled():
            return weight, None
        return split_tied(weight)

    def _inputs(self, input_ids: torch.Tensor, weights: tuple[torch.Tensor | None, Any]) -> dict[str, torch.Tensor]:
        """The decoder's input: the ids, or with :attr:`sparse_embedding` their embeddings looked up
        here with a sparse gradient (:mod:`agentrl.model.tied_embedding`)."""
        lookup = weights[0]
        if lookup is None:
            return {"input_ids": input_ids}
        padding = self.model.get_input_embeddings().padding_idx
        return {"inputs_embeds": F.embedding(input_ids, lookup, padding, sparse=True)}

    def _head(self, hidden: torch.Tensor, weights: tuple[Any, torch.Tensor | None]) -> torch.Tensor:
        """The output head over ``hidden`` (R, H): the module, or ``F.linear`` with the split head weight."""
        head = self.model.get_output_embeddings()
        return head(hidden) if weights[1] is None else F.linear(hidden, weights[1], head.bias)

    @torch.no_grad()
    def packing_error(self) -> float:
        """Max |packed - padded| logprob on a small batch of rows sharing prefixes (0.0 without
        packing): the trainer turns packing off where a model's attention does not honour it."""
        if not self.pack:
            return 0.0
        vocab = int(self.model.get_output_embeddings().weight.shape[0])
        ids, attention = probe_rows(vocab, next(self.model.parameters()).device)
        loss_mask = attention.float()
        loss_mask[:, :3] = 0
        packed, _ = self(ids, attention, loss_mask, with_entropy=False)
        self.pack = False
        try:
            padded, _ = self(ids, attention, loss_mask, with_entropy=False)
        finally:
            self.pack = True
        return float((packed - padded).abs().max())


def check_packing(policy: TokenLogprobs, asked: bool) -> bool:
    """Whether the policy's forward packs shared prefixes: asked, supported by the model's
    attention, and agreeing with the padded forward (max |logprob difference| <= 1e-3 in fp32 on a
    test batch); otherwise turned off with a warning saying why."""
    if not asked:
        return False
    attention = getattr(policy.model.config, "_attn_implementation", None)
    if not policy.pack:
        warnings.warn(
            f"pack_sequences: the model's attention {attention!r} takes no custom mask; the training "
            "forward runs padded rows",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    error = policy.packing_error()
    if not error <= 1e-3:
        policy.pack = False
        warnings.warn(
            f"pack_sequences: the packed forward differs from the padded one by {error:.2g} on this model "
            f"(attention {attention!r}); the training forward runs padded rows",
            RuntimeWarning,
            stacklevel=2,
        )
    return policy.pack
