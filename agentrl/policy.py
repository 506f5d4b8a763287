"""Per-token logprobs of a causal LM, computing the LM head only where the loss needs it.

``TokenLogprobs`` wraps a HF causal LM as one ``nn.Module`` so accelerate/DDP see a single
forward. It runs the decoder over the whole (right-padded) sequence, then applies the output
head only at the positions that predict loss-mask tokens: on SmolLM2 the head is a fifth of the
FLOPs per token, and prompt/env tokens are most of the sequence in multi-turn episodes.

Alignment (see agentrl.trajectory): ``logprobs[i, t]`` is the logprob of ``input_ids[i, t]``
computed from the hidden state at ``t - 1``; entries off the mask are 0.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel


class TokenLogprobs(nn.Module):
    """``forward(input_ids, attention_mask, loss_mask) -> (logprobs, entropy)``, both ``(N, T)``."""

    def __init__(self, model: PreTrainedModel, temperature: float = 1.0) -> None:
        super().__init__()
        self.model = model
        self.temperature = temperature

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                loss_mask: torch.Tensor, with_entropy: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Logprobs (with grad) and entropies (no grad) of the loss-mask tokens; 0 elsewhere."""
        decoder = self.model.get_decoder()
        head = self.model.get_output_embeddings()
        hidden = decoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (N, T, H)
        targets = loss_mask[:, 1:] > 0  # (N, T-1): position t-1 predicts token t
        rows, cols = targets.nonzero(as_tuple=True)  # K selected predictions
        logits = head(hidden[rows, cols]).float() / self.temperature  # (K, V), fp32 (TRAPS 12)
        log_probs = torch.log_softmax(logits, dim=-1)  # (K, V)
        token_ids = input_ids[rows, cols + 1]  # (K,)
        picked = log_probs.gather(-1, token_ids[:, None]).squeeze(-1)  # (K,)
        logprobs = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
        logprobs = logprobs.index_put((rows, cols + 1), picked)  # (N, T)
        entropy = torch.zeros_like(logprobs)
        if with_entropy:
            with torch.no_grad():
                per_token = -(log_probs.exp() * log_probs).sum(-1)  # (K,)
                entropy[rows, cols + 1] = per_token
        if rows.numel() == 0:  # keep the graph connected for a fully masked micro-batch
            logprobs = logprobs + 0.0 * hidden.sum()
        return logprobs, entropy
