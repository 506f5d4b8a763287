"""ProcessRewardModel: a tiny token-classification PRM built here scores each step; the positions are
the tokens completing each separator (checked on the decoded text), the values equal a forward of
the PRM on each prefix alone, batching changes nothing, the model loads once. The ``prm:PATH``
scheme builds it from the run's settings and tokenizer, and trains through the CLI."""

from __future__ import annotations

import json
import re

import pytest
import torch
import yaml
from cli_in_process import agentrl_in_process
from transformers import LlamaConfig, LlamaForTokenClassification

from agentrl import StepRewards, Trajectory, Turn
from agentrl.config.startup import resolve_settings
from agentrl.config.train import TrainConfig
from agentrl.errors import ConfigError
from agentrl.plugins import load_plugins
from agentrl.rewards.schemes import RewardContext
from agentrl.rewards.scoring import score
from agentrl.rewards.specs import resolve_rewards
from agentrl_math import MathEnv
from agentrl_rewards.process_reward_model import ProcessRewardModel

REPLIES = [
    "First, 3 * 4 = 12.\n\nThen 2 + 12 = 14.\n\nSo the answer is \\boxed{14}.",
    "It is 14.",
    "Step one.\n\nStep two.\n\n",
]


def _prm_dir(tmp_path, tokenizer, num_labels: int = 1):
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        num_labels=num_labels,
        pad_token_id=tokenizer.pad_token_id,
    )
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
        mask[turn.start : turn.end] = [1] * (turn.end - turn.start)
    return Trajectory(
        token_ids=ids, loss_mask=mask, sampler_logprobs=[0.0] * len(ids), turns=turns, messages=[], task={"id": "t"}
    )


def _text(tokenizer, ids: list[int]) -> str:
    return "".join(tokenizer.decode([t]) for t in ids)


@pytest.fixture
def episodes(tokenizer):
    return [
        _episode(tokenizer, [REPLIES[0]]),
        _episode(tokenizer, [REPLIES[1]]),
        _episode(tokenizer, [REPLIES[2], REPLIES[0]]),
        _episode(tokenizer, []),
    ]


def test_steps_end_at_each_separator_and_score_their_prefix(tmp_path, tokenizer, episodes):
    prm = ProcessRewardModel(str(_prm_dir(tmp_path, tokenizer)), policy_tokenizer=tokenizer, batch_size=3, device="cpu")
    steps = prm(episodes)
    direct = LlamaForTokenClassification.from_pretrained(prm.path).eval()
    assert [len(s.positions) for s in steps] == [3, 1, 5, 0]  # (a reply ending in a separator: no empty step)
    for episode, rewards in zip(episodes, steps):
        for turn in episode.turns:
            inside = [p for p in rewards.positions if turn.start <= p < turn.end]
            assert inside[-1] == turn.end - 1  # the turn's last step ends with it
            for k, position in enumerate(inside[:-1]):  # the token that completes the k-th separator
                assert _text(tokenizer, episode.token_ids[turn.start : position + 1]).count("\n\n") == k + 1
                assert _text(tokenizer, episode.token_ids[turn.start : position]).count("\n\n") == k
        for position, value in zip(rewards.positions, rewards.values):  # the PRM's output on the prefix alone
            with torch.no_grad():
                alone = direct(input_ids=torch.tensor([episode.token_ids[: position + 1]])).logits[0, -1, 0]
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
            last_char = len(_text(tokenizer, episode.token_ids[: position + 1])) - 1
            holder = next(j for j in range(len(full)) if len(tokenizer.decode(full[: j + 1])) > last_char)
            assert abs(float(logits[holder]) - value) < 1e-5


def test_the_separator_is_configurable_and_scoring_keeps_the_steps(tmp_path, tokenizer, episodes):
    folder = str(_prm_dir(tmp_path, tokenizer))
    by_sentence = ProcessRewardModel(folder, policy_tokenizer=tokenizer, separator=" = ", device="cpu")
    steps = by_sentence(episodes[:1])[0]
    ids = episodes[0].token_ids
    assert [_text(tokenizer, ids[: p + 1]).count(" = ") for p in steps.positions[:-1]] == [1, 2]
    assert [_text(tokenizer, ids[:p]).count(" = ") for p in steps.positions[:-1]] == [0, 1]
    totals, _ = score(episodes[:2], {"prm": (by_sentence, 0.5)}, env_weight=0.0)
    assert isinstance(steps, StepRewards) and episodes[0].step_rewards == {
        p: 0.5 * v for p, v in zip(steps.positions, steps.values)
    }
    assert abs(totals[0] - 0.5 * sum(steps.values)) < 1e-9


def test_long_episodes_keep_their_last_tokens_and_bad_models_are_refused(tmp_path, tokenizer, episodes):
    folder = str(_prm_dir(tmp_path, tokenizer))
    full = ProcessRewardModel(folder, policy_tokenizer=tokenizer, device="cpu")(episodes[:1])[0]
    short = ProcessRewardModel(folder, policy_tokenizer=tokenizer, max_length=12, device="cpu")
    kept = short(episodes[:1])[0]
    assert kept.positions == full.positions[-len(kept.positions) :] and short.truncated_steps == 3 - len(kept.positions)
    assert short.truncated_steps >= 1
    with pytest.raises(ValueError, match=r"num_labels=2: expected 1"):
        ProcessRewardModel(str(_prm_dir(tmp_path, tokenizer, num_labels=2)), policy_tokenizer=tokenizer)(episodes)
    with pytest.raises(ValueError, match=r"separator '' is invalid"):
        ProcessRewardModel(folder, separator="")


# -- the ``prm:PATH`` reward scheme, through the run's config -------------------------------------------------

TINY = (
    "--max-steps",
    "2",
    "--num-generations",
    "2",
    "--prompts-per-step",
    "2",
    "--set",
    "eval_tasks=0",
    "--set",
    "max_new_tokens=8",
)


def _resolve(config: TrainConfig) -> dict:
    """The run's rewards as the run builds them (before its tokenizer is loaded)."""
    manager = load_plugins()
    context = RewardContext(config=config, settings=resolve_settings(config, manager.registry))
    return resolve_rewards(config, manager.registry, MathEnv(), context)


def test_the_scheme_scores_steps_with_the_runs_settings_and_tokenizer(tmp_path, tokenizer, episodes):
    folder = _prm_dir(tmp_path, tokenizer)
    config = TrainConfig(
        rewards={f"prm:{folder}": 0.5, "format": 1.0},
        plugins={"process_reward_model": {"separator": " = ", "batch_size": 2, "max_length": 12}},
    )
    manager = load_plugins()
    context = RewardContext(config=config, settings=resolve_settings(config, manager.registry))
    resolved = resolve_rewards(config, manager.registry, MathEnv(), context)
    assert list(resolved) == ["prm", "format"] and resolved["prm"][1] == 0.5
    prm = resolved["prm"][0]
    assert prm.model is not None and not prm.model.training  # loaded once, when the run builds its rewards
    model = prm.model
    context.tokenizer = tokenizer  # the run's tokenizer arrives after the rewards are built
    steps = prm(episodes)
    direct = ProcessRewardModel(str(folder), policy_tokenizer=tokenizer, separator=" = ", max_length=12, device="cpu")
    want = direct(episodes)
    assert all(isinstance(s, StepRewards) for s in steps) and sum(len(s.positions) for s in steps) > 0
    for got, expected in zip(steps, want):
        assert got.positions == expected.positions
        assert torch.allclose(torch.tensor(got.values), torch.tensor(expected.values), atol=1e-6)
    assert prm.pop_metrics() == {"truncated_steps": float(direct.truncated_steps)} and direct.truncated_steps >= 1
    assert prm.pop_metrics() == {"truncated_steps": 0.0}
    prm(episodes[:1])
    assert prm.model is model


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"separator": ""},
            "plugins.process_reward_model.separator must be a non-empty string such as '\\n\\n', got ''",
        ),
        ({"max_length": 1}, "plugins.process_reward_model.max_length must be >= 2, got 1"),
        ({"batch_size": 0}, "plugins.process_reward_model.batch_size must be >= 1, got 0"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(options, message):
    config = TrainConfig(plugins={"process_reward_model": options})
    with pytest.raises(ConfigError, match=re.escape(message)):
        resolve_settings(config, load_plugins().registry)


def test_a_folder_that_is_no_token_classification_prm_is_refused(tmp_path, tokenizer):
    two = _prm_dir(tmp_path, tokenizer, num_labels=2)
    with pytest.raises(
        ConfigError, match=re.escape(f"prm: {two} has num_labels=2: expected 1 (one score); give a token-")
    ):
        _resolve(TrainConfig(rewards={f"prm:{two}": 1.0}))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(
        ConfigError,
        match=re.escape(
            f"prm: {empty} has no config.json: not a saved model folder; give a token-classification process "
            "reward model (AutoModelForTokenClassification, num_labels 1, a causal decoder)"
        ),
    ):
        _resolve(TrainConfig(rewards={f"prm:{empty}": 1.0}))


def test_cli_bad_prm_folder_is_one_line_naming_it(tiny_model_dir, tmp_path):
    result = agentrl_in_process(
        "train",
        "--model",
        str(tiny_model_dir),
        "--reward",
        "prm:/nonexistent/prm:0.5",
        "--output-dir",
        str(tmp_path / "r"),
        *TINY,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    err = " ".join(result.stderr.split())
    assert "prm: /nonexistent/prm does not exist; give a token-classification process reward model" in err
    assert "Traceback" not in result.stderr


def test_cli_trains_with_process_advantages_from_a_relative_prm_folder(tiny_model_dir, tokenizer, tmp_path):
    folder = _prm_dir(tmp_path, tokenizer)
    out = tmp_path / "run"
    result = agentrl_in_process(
        "train",
        "--model",
        str(tiny_model_dir),
        "--reward",
        f"prm:{folder.name}:1",
        "--set",
        "algorithm.advantage=process",
        "--set",
        "env_reward_weight=0",
        "--set",
        "precision=fp32",
        "--set",
        "log_completions_every=1",
        "--output-dir",
        str(out),
        *TINY,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["rewards"] == {f"prm:{folder}": 1.0} and saved["algorithm"]["advantage"] == "process"
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all("reward/prm_mean" in line and "prm/truncated_steps" in line for line in lines[:2])
    rewards = [json.loads(line)["reward"] for line in (out / "completions.jsonl").read_text().splitlines()]
    assert len(rewards) == 8 and len(set(rewards)) > 1  # the PRM's step scores summed: they differ by episode
