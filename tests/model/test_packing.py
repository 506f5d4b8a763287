"""Prefix-tree packing: the tree by hand, and packed logprobs/gradients equal the padded forward."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from agentrl.config.train import TrainConfig
from agentrl.model.loading import load_model
from agentrl.model.packing import pack_prefix_tree
from agentrl.model.policy import TokenLogprobs
from agentrl.plugins import load_plugins
from agentrl.testing import GradientRecorder
from agentrl.training.batching import plan_micro_batches, plan_packed_micro_batches
from agentrl.training.trainer import Trainer


def _rows(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return ids, mask


def test_prefix_tree_by_hand():
    ids, mask = _rows([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3, 6, 7]])
    packed = pack_prefix_tree(ids, mask)
    # nodes in creation order: 1 2 3 4 | 5 (after 1 2) | 6 7 (after 1 2 3)
    assert packed.input_ids.tolist() == [[1, 2, 3, 4, 5, 6, 7]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 2, 3, 4]]
    assert packed.node_index.tolist() == [[0, 1, 2, 3, -1], [0, 1, 4, -1, -1], [0, 1, 2, 5, 6]]
    ancestors = {q: [k for k in range(7) if packed.attend[0, 0, q, k]] for q in range(7)}
    assert ancestors == {
        0: [0],
        1: [0, 1],
        2: [0, 1, 2],
        3: [0, 1, 2, 3],
        4: [0, 1, 4],
        5: [0, 1, 2, 5],
        6: [0, 1, 2, 5, 6],
    }


def test_rows_with_nothing_in_common_stay_apart():
    ids, mask = _rows([[5, 6], [7, 8, 9]])
    packed = pack_prefix_tree(ids, mask)
    assert packed.length == 5 and not packed.attend[0, 0, 2:, :2].any() and not packed.attend[0, 0, :2, 2:].any()


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model(str(tiny_model_dir))


def _group(vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Six rows sharing a 20-token prompt, two of them also sharing their first sampled tokens."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, vocab, (20,), generator=g).tolist()
    rows = [prompt + torch.randint(3, vocab, (n,), generator=g).tolist() for n in (9, 4, 12, 1, 7, 7)]
    rows[5][20:24] = rows[4][20:24]
    ids, mask = _rows(rows)
    loss_mask = mask.float()
    loss_mask[:, :20] = 0
    return ids, mask, loss_mask


def test_packed_logprobs_entropy_and_gradients_equal_padded(tiny):
    ids, mask, loss_mask = _group(tiny.config.vocab_size, 0)
    results = {}
    for pack in (False, True):
        tiny.zero_grad()
        policy = TokenLogprobs(tiny, temperature=0.7, pack=pack)
        logprobs, entropy = policy(ids, mask, loss_mask)
        weights = torch.linspace(-1, 1, logprobs.numel()).reshape(logprobs.shape)  # a loss that weighs every token
        (logprobs * weights * loss_mask).sum().backward()
        grads = [p.grad.clone() for p in tiny.parameters() if p.grad is not None]
        results[pack] = (logprobs.detach(), entropy, grads)
    packed_length = pack_prefix_tree(ids, mask).length
    assert packed_length == 20 + 9 + 4 + 12 + 1 + 7 + 3  # the prompt once, rows 4 and 5 share 4 more
    torch.testing.assert_close(results[True][0], results[False][0], rtol=0, atol=2e-5)
    torch.testing.assert_close(results[True][1], results[False][1], rtol=0, atol=2e-5)
    assert (results[True][0][loss_mask == 0] == 0).all()
    assert len(results[True][2]) == len(results[False][2])
    for packed, padded in zip(results[True][2], results[False][2]):
        torch.testing.assert_close(packed, padded, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("pack", [False, True])
def test_a_sparse_embedding_gradient_equals_the_dense_one_and_grad_stays_dense(tiny, pack):
    """The tied embedding's gradient taken sparse (the looked-up rows, added into the head's
    gradient): the same ``.grad`` as the dense lookup's, still dense, over two accumulated
    micro-batches; an untied model keeps the dense lookup."""
    assert tiny.get_input_embeddings().weight is tiny.get_output_embeddings().weight
    grads = {}
    for sparse in (False, True):
        tiny.zero_grad()
        policy = TokenLogprobs(tiny, pack=pack, sparse_embedding=sparse)
        assert policy.sparse_embedding is sparse
        for seed in (0, 1):  # two micro-batches accumulate into .grad
            ids, mask, loss_mask = _group(tiny.config.vocab_size, seed)
            logprobs, _ = policy(ids, mask, loss_mask)
            weights = torch.linspace(-1, 1, logprobs.numel()).reshape(logprobs.shape)
            (logprobs * weights * loss_mask).sum().backward()
        grads[sparse] = {name: p.grad.clone() for name, p in tiny.named_parameters() if p.grad is not None}
    assert grads[True].keys() == grads[False].keys() and len(grads[True]) == len(list(tiny.parameters()))
    assert not any(g.is_sparse for g in grads[True].values())
    for name, dense in grads[False].items():
        torch.testing.assert_close(grads[True][name], dense, rtol=1e-5, atol=1e-7)
    untied = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                          num_attention_heads=2, tie_word_embeddings=False))  # fmt: skip
    assert TokenLogprobs(untied, sparse_embedding=True).sparse_embedding is False


def test_packing_error_is_small_and_unsupported_attention_is_refused(tiny):
    assert TokenLogprobs(tiny, pack=True).packing_error() < 1e-4
    original = tiny.config._attn_implementation
    tiny.config._attn_implementation = "flash_attention_2"
    try:
        assert TokenLogprobs(tiny, pack=True).pack is False
    finally:
        tiny.config._attn_implementation = original


def _tree_size(rows: list[list[int]]) -> int:
    """Distinct prefixes of ``rows``: the packed positions, counted independently of the planner."""
    return len({tuple(row[: t + 1]) for row in rows for t in range(len(row))})


def test_packed_plan_puts_rows_sharing_prefixes_together_and_counts_distinct_tokens():
    system = list(range(100, 160))  # 60 tokens every row opens with
    episodes = []  # 3 agent-like episodes of 3 segments: a rewritten history after the first reply
    for e in range(3):
        reply = [1000 + e] * 10
        episodes.append([system + reply + [2000 + e * 10 + s] * (5 + 5 * s) for s in range(3)])
    rows = [episodes[e][s] for s in range(3) for e in range(3)]  # interleaved, as a batch comes
    plan = plan_packed_micro_batches(rows, max_rows=8, max_tokens=10**6)
    assert len(plan) == 2 and sorted(r for mb in plan for r in mb) == list(range(9))  # only the row cap cuts
    one_episode = 10 + 5 + 10 + 15  # its distinct tokens after the system prompt
    assert _tree_size(rows) == 60 + 3 * one_episode
    assert len(plan_packed_micro_batches(rows, max_rows=9, max_tokens=60 + 3 * one_episode)) == 1
    assert len(plan_packed_micro_batches(rows, max_rows=9, max_tokens=60 + 3 * one_episode - 1)) == 2
    plan = plan_packed_micro_batches(rows, max_rows=8, max_tokens=60 + one_episode)
    assert [sorted(mb) for mb in plan] == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]  # an episode's segments together
    for mb in plan:
        assert _tree_size([rows[r] for r in mb]) <= 60 + one_episode
    padded_plan = plan_micro_batches([len(r) for r in rows], max_rows=8, max_tokens=60 + one_episode)
    assert len(padded_plan) == 9  # padded, no two rows fit the same budget


def test_packed_plan_keeps_both_limits_on_random_rows():
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 5, (int(n),), generator=generator).tolist() for n in (3, 8, 8)]
    rows = [
        prompts[i % 3]
        + torch.randint(0, 3, (int(torch.randint(0, 12, (), generator=generator)),), generator=generator).tolist()
        for i in range(40)
    ]
    for max_rows, max_tokens in [(4, 30), (8, 50), (40, 10**6), (3, 1)]:
        plan = plan_packed_micro_batches(rows, max_rows, max_tokens)
        assert sorted(r for mb in plan for r in mb) == list(range(len(rows)))
        for mb in plan:
            assert len(mb) <= max_rows
            assert _tree_size([rows[r] for r in mb]) <= max_tokens or len(mb) == 1


def test_a_training_step_packed_equals_padded(tiny_model_dir, tmp_path):
    config = TrainConfig(
        model=str(tiny_model_dir),
        max_steps=1,
        prompts_per_step=2,
        num_generations=4,
        max_new_tokens=8,
        eval_tasks=0,
        output_dir=str(tmp_path / "run"),
        log_completions_every=0,
        save_model=False,
        precision="fp32",
        engine_args={"dtype": "float32"},
        max_grad_norm=None,
        algorithm={"beta": 0.05},
    )
    trainer = Trainer(config, load_plugins())
    assert trainer.run.policy_pack
    batch, _, _ = trainer.rollout_step(1)
    grads = {}
    for pack in (True, False):
        trainer.config = dataclasses.replace(config, pack_sequences=pack)
        trainer.accelerator.unwrap_model(trainer.run.policy).pack = pack
        trainer.run.policy_pack = pack
        trainer.run.trained["policy"].optimizer = GradientRecorder(trainer.model.parameters())
        metrics: dict[str, float] = {}
        trainer.update(batch, metrics)
        grads[pack] = (trainer.run.trained["policy"].optimizer.steps[0], metrics["loss/total"])
    assert grads[True][1] == pytest.approx(grads[False][1], abs=1e-6)
    for a, b in zip(grads[True][0], grads[False][0]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
