"""Tree attention: the blocks of a prefix tree by hand, block-by-block attention against ``sdpa`` with
the dense ancestor mask (outputs and gradients), and the packed training forward that uses it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_packing import _rows  # the rows of a batch, right-padded (same folder)
from transformers import LlamaConfig, LlamaForCausalLM

from agentrl.model.packing import pack_prefix_tree
from agentrl.model.policy import TokenLogprobs
from agentrl.model.tree_attention import TreeBlocks, tree_attention, use_tree_attention


def test_blocks_of_a_tree_by_hand():
    # rows: 1 2 3 4 | 1 2 5 (branches after 2) | 1 2 3 6 7 (after 3) | 9 8 (a second root)
    packed = pack_prefix_tree(*_rows([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3, 6, 7], [9, 8]]))
    assert packed.parents == (-1, 0, 1, 2, 1, 2, 5, -1, 7)
    blocks = TreeBlocks.from_parents(list(packed.parents))
    assert blocks.bounds == ((0, 4), (4, 5), (5, 7), (7, 9))
    keys = [blocks.index[lo:hi].tolist() for lo, hi in blocks.key_bounds]
    assert keys == [[0, 1, 2, 3], [0, 1, 4], [0, 1, 2, 5, 6], [7, 8]]
    assert blocks.masks[0] is None and blocks.masks[3] is None  # roots: causal over themselves
    assert blocks.masks[2][0, 0].int().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    # every block's mask is the dense ancestor mask restricted to the block's queries and keys
    for (start, end), (lo, hi), mask in zip(blocks.bounds, blocks.key_bounds, blocks.masks):
        dense = packed.attend[0, 0, start:end][:, blocks.index[lo:hi]]
        expected = torch.ones(end - start, end - start, dtype=torch.bool).tril() if mask is None else mask[0, 0]
        assert torch.equal(dense, expected)
        assert packed.attend[0, 0, start:end].sum() == dense.sum()  # no ancestor left out
    assert blocks.pairs == 4 * 4 + 1 * 3 + 2 * 5 + 2 * 2 < 9 * 9


class _Attention(torch.nn.Module):
    """What transformers' attention functions read from the calling module."""

    num_key_value_groups = 3
    is_causal = True
    training = True


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_block_attention_equals_sdpa_with_the_dense_mask_outputs_and_gradients(dtype):
    g = torch.Generator().manual_seed(0)
    rows = [list(range(3, 23)) + torch.randint(30, 90, (n,), generator=g).tolist() for n in (9, 4, 12, 1, 7)]
    rows[4][20:23] = rows[2][20:23]  # a branch below a branch
    rows.append(torch.randint(30, 90, (6,), generator=g).tolist())  # a root of its own
    packed = pack_prefix_tree(*_rows(rows))
    length = packed.length
    q = torch.randn(1, 6, length, 8, dtype=dtype, generator=g, requires_grad=True)
    k = torch.randn(1, 2, length, 8, dtype=dtype, generator=g, requires_grad=True)
    v = torch.randn(1, 2, length, 8, dtype=dtype, generator=g, requires_grad=True)
    weights = torch.randn(1, length, 6, 8, dtype=dtype, generator=g)
    blocks = TreeBlocks.from_parents(list(packed.parents))
    out, _ = tree_attention(_Attention(), q, k, v, packed.attend, scaling=0.3, agentrl_tree=blocks)
    tree_grads = torch.autograd.grad((out * weights).sum(), (q, k, v))
    expected = F.scaled_dot_product_attention(
        q, k.repeat_interleave(3, dim=1), v.repeat_interleave(3, dim=1), attn_mask=packed.attend, scale=0.3
    ).transpose(1, 2)
    dense_grads = torch.autograd.grad((expected * weights).sum(), (q, k, v))
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(out, expected, rtol=0, atol=tol)
    for got, want in zip(tree_grads, dense_grads):
        torch.testing.assert_close(got, want, rtol=0, atol=tol)
    # without the blocks: sdpa with the mask given, unchanged
    plain, _ = tree_attention(_Attention(), q, k, v, packed.attend, scaling=0.3)
    torch.testing.assert_close(plain, expected, rtol=0, atol=0)


def _llama() -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa")  # fmt: skip
    return LlamaForCausalLM(config).eval()


def test_the_packed_forward_attends_block_by_block_and_other_calls_stay_sdpa(monkeypatch):
    torch.manual_seed(0)
    model = _llama()
    reference = _llama()
    reference.load_state_dict(model.state_dict())
    ids = torch.randint(3, 96, (1, 30))
    policy = TokenLogprobs(model, pack=True)
    assert policy.tree_attention and model.config._attn_implementation == "sdpa"  # copies stay as they were
    # a forward without the blocks (the engine sampling from this module, any other model): sdpa's, bit for bit
    assert torch.equal(model(ids).logits, reference(ids).logits)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding, as the engine batches prompts
    assert torch.equal(model(ids, attention_mask=mask).logits, reference(ids, attention_mask=mask).logits)
    calls = []
    kernel = F.scaled_dot_product_attention

    def counting(query, key, *args, **kwargs):
        calls.append((query.shape[2], key.shape[2]))
        return kernel(query, key, *args, **kwargs)

    # 5 6 7 8 9 10 | 11 12 after 7 | 13 after 6: blocks of 6, 2 and 1 queries over 6, 5 and 3 keys
    rows, mask = _rows([[5, 6, 7, 8, 9, 10], [5, 6, 7, 11, 12], [5, 6, 13]])
    loss_mask = mask.float()
    loss_mask[:, :3] = 0
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting)
    packed_logprobs, _ = policy(rows, mask, loss_mask)
    monkeypatch.undo()
    assert calls == [(6, 6), (2, 5), (1, 3)] * model.config.num_hidden_layers
    policy.pack = False
    padded_logprobs, _ = policy(rows, mask, loss_mask)
    torch.testing.assert_close(packed_logprobs, padded_logprobs, rtol=0, atol=1e-5)
    assert (packed_logprobs[loss_mask > 0] != 0).all()


def test_a_model_on_another_attention_keeps_it():
    model = _llama()
    model.config._attn_implementation = "eager"
    assert use_tree_attention(model) is False
    policy = TokenLogprobs(model, pack=True)
    assert policy.pack and not policy.tree_attention  # eager packs through the dense mask
