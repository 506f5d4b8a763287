"""ProcessRewardModel: a tiny token-classification PRM built here scores each step; the positions are
the tokens completing each separator (checked on the decoded text), the values equal a forward of
the PRM on each prefix alone, batching changes nothing, the model loads once."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForTokenClassification

from agentrl import ProcessRewardModel, StepRewards, Trajectory, Turn
from agentrl.scoring import score

REPLIES = ["First, 3 * 4 = 12.\n\nThen 2 + 12 = 14.\n\nSo the answer is \\boxed{14}.",
           "It is 14.",
           "Step one.\n\nStep two.\n\n"]


def _prm_dir(tmp_path, tokenizer, num_labels: int = 1):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         num_labels=num_labels, pad_token_id=tokenizer.pad_token_id)
    folder = tmp_path / f"prm-{num_labels}"
    LlamaForTokenClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _episode(tokenizer, replies: list[str]) -> Trajectory:
    ids = tokenizer("Question: what is 2 + 3 * 4?\n", add_special_tokens=False)["input_ids"]
    turns = []
    for reply in replies:
        reply_ids = tokenizer(reply, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        turns.append(Turn(len(ids), len(ids) + len(reply_ids)))
        ids = ids + reply_ids + tokenizer("\nuser: go on\n", add_special_tokens=False)["input_ids"]
    mask = [0] * len(ids)
    for turn in turns:
        mask[turn.start:turn.end] = [1] * (turn.end - turn.start)
    return Trajectory(token_ids=ids, loss_mask=mask, sampler_logprobs=[0.0] * len(ids), turns=turns, messages=[],
                      task={"id": "t"})


def _text(tokenizer, ids: list[int]) -> str:
    return "".join(tokenizer.decode([t]) for t in ids)


@pytest.fixture
def episodes(tokenizer):
    return [_episode(tokenizer, [REPLIES[0]]), _episode(tokenizer, [REPLIES[1]]),
            _episode(tokenizer, [REPLIES[2], REPLIES[0]]), _episode(tokenizer, [])]


def test_steps_end_at_each_separator_and_score_their_prefix(tmp_path, tokenizer, episodes):
    prm = ProcessRewardModel(str(_prm_dir(tmp_path, tokenizer)), policy_tokenizer=tokenizer, batch_size=3,
                             device="cpu")
    steps = prm(episodes)
    direct = LlamaForTokenClassification.from_pretrained(prm.path).eval()
    assert [len(s.positions) for s in steps] == [3, 1, 5, 0]  # (a reply ending in a separator: no empty step)
    for episode, rewards in zip(episodes, steps):
        for turn in episode.turns:
            inside = [p for p in rewards.positions if turn.start <= p < turn.end]
            assert inside[-1] == turn.end - 1  # the turn's last step ends with it
            for k, position in enumerate(inside[:-1]):  # the token that completes the k-th separator
                assert _text(tokenizer, episode.token_ids[turn.start:position + 1]).count("\n\n") == k + 1
                assert _text(tokenizer, episode.token_ids[turn.start:position]).count("\n\n") == k
        for position, value in zip(rewards.positions, rewards.values):  # the PRM's output on the prefix alone
            with torch.no_grad():
                alone = direct(input_ids=torch.tensor([episode.token_ids[:position + 1]])).logits[0, -1, 0]
            assert abs(float(alone) - value) < 1e-5
    model = prm.model
    one_by_one = ProcessRewardModel(prm.path, policy_tokenizer=tokenizer, batch_size=1, device="cpu")(episodes)
    for a, b in zip(steps, one_by_one):
        assert a.positions == b.positions and torch.allclose(torch.tensor(a.values), torch.tensor(b.values), atol=1e-5)
    prm(episodes[:1])
    assert prm.model is model  # loaded once


def test_a_prm_with_another_vocabulary_reads_the_text(tmp_path, tokenizer, episodes):
    prm = ProcessRewardModel(str(_prm_dir(tmp_path, tokenizer)), policy_tokenizer=tokenizer, device="cpu")
    prm.load()
    assert prm.same_vocab
    prm.same_vocab = False  # as a PRM with its own tokenizer: the episode's text, re-tokenized
    direct = LlamaForTokenClassification.from_pretrained(prm.path).eval()
    for episode, rewards in zip(episodes, prm(episodes)):
        full = tokenizer(_text(tokenizer, episode.token_ids), add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = direct(input_ids=torch.tensor([full])).logits[0, :, 0] if full else None
        for position, value in zip(rewards.positions, rewards.values):
            last_char = len(_text(tokenizer, episode.token_ids[:position + 1])) - 1
            holder = next(j for j in range(len(full)) if len(tokenizer.decode(full[:j + 1])) > last_char)
            assert abs(float(logits[holder]) - value) < 1e-5


def test_the_separator_is_configurable_and_scoring_keeps_the_steps(tmp_path, tokenizer, episodes):
    folder = str(_prm_dir(tmp_path, tokenizer))
    by_sentence = ProcessRewardModel(folder, policy_tokenizer=tokenizer, separator=" = ", device="cpu")
    steps = by_sentence(episodes[:1])[0]
    ids = episodes[0].token_ids
    assert [_text(tokenizer, ids[:p + 1]).count(" = ") for p in steps.positions[:-1]] == [1, 2]
    assert [_text(tokenizer, ids[:p]).count(" = ") for p in steps.positions[:-1]] == [0, 1]
    totals, _ = score(episodes[:2], {"prm": (by_sentence, 0.5)}, env_weight=0.0)
    assert isinstance(steps, StepRewards) and episodes[0].step_rewards == {
        p: 0.5 * v for p, v in zip(steps.positions, steps.values)}
    assert abs(totals[0] - 0.5 * sum(steps.values)) < 1e-9


def test_long_episodes_keep_their_last_tokens_and_bad_models_are_refused(tmp_path, tokenizer, episodes):
    folder = str(_prm_dir(tmp_path, tokenizer))
    full = ProcessRewardModel(folder, policy_tokenizer=tokenizer, device="cpu")(episodes[:1])[0]
    short = ProcessRewardModel(folder, policy_tokenizer=tokenizer, max_length=12, device="cpu")
    kept = short(episodes[:1])[0]
    assert kept.positions == full.positions[-len(kept.positions):] and short.truncated_steps == 3 - len(kept.positions)
    assert short.truncated_steps >= 1
    with pytest.raises(ValueError, match=r"num_labels=2: expected 1"):
        ProcessRewardModel(str(_prm_dir(tmp_path, tokenizer, num_labels=2)), policy_tokenizer=tokenizer)(episodes)
    with pytest.raises(ValueError, match=r"separator '' is invalid"):
        ProcessRewardModel(folder, separator="")
