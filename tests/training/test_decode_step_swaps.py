"""Weights that change between decode steps (partial rollouts on the ``hf`` engine): a turn in
flight takes the new version mid-way, each token records the version that sampled it, and every
token's sampler logprob is its own version's: checked against a separate float64 forward of that
version's weights over the unpadded prompt and the tokens before it (a reused KV cache of the old
weights would fail it)."""

from __future__ import annotations

import copy
import threading
from types import SimpleNamespace

import pytest
import torch

from agentrl import Engine, Env, SamplingParams
from agentrl.config.train import TrainConfig
from agentrl.plugins import load_plugins
from agentrl.sampling.request_queue import cut
from agentrl.sampling.versioned_engine import VersionedEngine
from agentrl.testing import build_tiny_model, version_change_at
from agentrl.training import async_rollouts
from agentrl.training.rollout_phase import _token_versions
from agentrl.trajectory import Trajectory, Turn

FP32 = SimpleNamespace(engine_args={"dtype": "float32"}, precision="fp32", seed=0)
PROMPTS = [[5, 17, 99, 3], [8, 1000, 4], [5, 17, 99, 3], [61, 62, 63, 64, 65, 66]]  # padding, a shared prompt


@pytest.fixture(scope="module")
def versions(tokenizer):
    """Two versions of one tiny model: 0 (the initial weights) and 1 (every weight moved)."""
    first = build_tiny_model(len(tokenizer))
    second = copy.deepcopy(first)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in second.parameters():
            p.add_(0.5 * p.abs().mean() * torch.randn(p.shape, generator=generator))
    return {0: first, 1: second}


def _float64_logprob(
    model: torch.nn.Module, prompt: list[int], tokens: list[int], at: int, temperature: float
) -> float:
    """log_softmax(logits / T) of ``tokens[at]`` after ``prompt + tokens[:at]``, one unpadded float64 forward."""
    double = copy.deepcopy(model).double().eval()
    with torch.no_grad():
        logits = double(input_ids=torch.tensor([prompt + tokens[:at]])).logits[0, -1]
    return float(torch.log_softmax(logits / temperature, dim=-1)[tokens[at]])


def _engine(versions, tokenizer):
    from agentrl_hf_engine import HFEngine

    return HFEngine(versions[0], tokenizer, FP32)


SAMPLING = SamplingParams(max_new_tokens=10, temperature=0.9, prompt_seeds=(11, 12, 13, 14))


def test_without_a_change_the_hook_leaves_every_token_as_it_was(versions, tokenizer):
    engine = _engine(versions, tokenizer)
    plain = engine.generate(PROMPTS, SAMPLING)
    engine.before_decode_step = lambda: 4
    hooked = engine.generate(PROMPTS, SAMPLING)
    assert [g.token_ids for g in hooked] == [g.token_ids for g in plain]
    assert [g.logprobs for g in hooked] == [g.logprobs for g in plain]
    assert all(g.token_versions is None for g in plain)
    assert [g.token_versions for g in hooked] == [[4] * len(g.token_ids) for g in hooked]
    engine.before_decode_step = lambda: None  # the run's thread has stopped: nothing to record
    stopped = engine.generate(PROMPTS, SAMPLING)
    assert [g.token_ids for g in stopped] == [g.token_ids for g in plain]
    assert all(g.token_versions is None for g in stopped)


def test_a_change_between_decode_steps_samples_the_rest_from_the_new_weights(versions, tokenizer):
    """Version 1 loads before the fourth decode step's forward (the hook's fifth call): tokens 0-3
    are version 0's, the rest version 1's, per row, with rows of three prompt lengths, a prompt
    shared by two rows and a row that stopped before the change (dropped from the batch first)."""
    pilot = _engine(versions, tokenizer).generate(PROMPTS, SAMPLING)
    engine = _engine(versions, tokenizer)
    engine.stop_ids = engine.stop_ids | {pilot[1].token_ids[2]}  # row 1 ends at its third token
    engine.before_decode_step = version_change_at(engine, versions[1], call=5)
    generations = engine.generate(PROMPTS, SAMPLING)
    assert len(generations[1].token_ids) <= 3 and generations[1].finish_reason == "stop"
    assert any(len(g.token_ids) > 4 for g in generations)
    for prompt, generation in zip(PROMPTS, generations):
        tokens = generation.token_ids
        assert generation.token_versions == [int(t >= 4) for t in range(len(tokens))]
        for at, (version, logprob) in enumerate(zip(generation.token_versions, generation.logprobs)):
            expected = _float64_logprob(versions[version], prompt, tokens, at, SAMPLING.temperature)
            assert logprob == pytest.approx(expected, abs=2e-4), (prompt, at, version)
    assert engine.model is versions[1]


def test_a_version_published_mid_turn_is_loaded_at_the_next_decode_step(versions, tokenizer):
    """Through the asynchronous run's own parts: the learner publishes version 1 while the rollout
    thread's engine is inside a decode step's forward (the third); the turn goes on from version 1
    at the next step, stamps its first token's version on the Generation and each token's in
    ``token_versions``, and the thread now holds version 1."""
    versioned = VersionedEngine(_engine(versions, tokenizer), partial=True)
    forwards, built = [], threading.Event()

    def collect(step: int, version: int) -> list:
        assert built.wait(30)  # the thread starts inside the constructor

        def publish_on_third(module, args, output):
            forwards.append(None)
            if len(forwards) == 3:
                producer.publish(1, versions[1])

        hook = producer.copy.get_decoder().register_forward_hook(publish_on_third)  # every forward runs it
        try:
            return versioned.generate([PROMPTS[0]], SamplingParams(max_new_tokens=8, temperature=1.0, seed=3))
        finally:
            hook.remove()

    producer = async_rollouts.AsyncRollouts(
        collect,
        versioned.sync_weights,
        versions[0],
        async_steps=1,
        next_step=1,
        last_step=1,
        floor=0,
        partial=True,
        versioned=versioned,
    )
    built.set()
    [generation] = producer.take(1)
    assert producer.close() and producer.loaded == 1
    assert generation.policy_version == 0
    assert generation.token_versions == [0, 0, 0] + [1] * (len(generation.token_ids) - 3)
    for at, version in enumerate(generation.token_versions):
        expected = _float64_logprob(versions[version], PROMPTS[0], generation.token_ids, at, 1.0)
        assert generation.logprobs[at] == pytest.approx(expected, abs=2e-4)


def test_an_engine_that_cannot_swap_mid_call_is_not_asked():
    class Plain(Engine):
        def generate(self, prompts, sampling):
            return []

    plain = Plain()
    VersionedEngine(plain, partial=True)
    assert plain.before_decode_step is None


def test_token_versions_reach_the_trajectory_and_survive_a_cut():
    row = Trajectory(
        token_ids=list(range(9)),
        loss_mask=[0, 0, 1, 1, 1, 0, 1, 1, 0],
        sampler_logprobs=[0.0] * 9,
        turns=[Turn(start=2, end=5, token_versions=[3, 3, 4]), Turn(start=6, end=8, policy_version=4)],
        messages=[],
        task={},
    )
    assert _token_versions(row, version=3) == [-1, -1, 3, 3, 4, -1, 4, 4, -1]
    row.turns[0].token_versions = [3, 4]
    with pytest.raises(ValueError, match="a turn of 3 sampled tokens has 2 token_versions"):
        _token_versions(row, version=3)
    from agentrl import Generation

    kept = cut(Generation([1, 2, 3, 4], "stop", [-1.0] * 4, None, 5, [5, 5, 6, 6]), 3)
    assert kept.token_versions == [5, 5, 6] and kept.policy_version == 5 and kept.finish_reason == "length"


class TwoTurns(Env):
    """Answers the first turn as the user, ends after the second."""

    max_turns = 4

    def train_tasks(self):
        return [{"question": "count"}]

    eval_tasks = train_tasks

    def start(self, task):
        return [{"role": "user", "content": "Count with me: 1"}]

    def respond(self, text):
        return ([], 1.0, True, {}) if self.turn >= 2 else ([{"role": "user", "content": "2"}], 0.0, False, {})


def test_an_episode_records_each_token_s_version_across_a_change_mid_turn(versions, tokenizer):
    """Through the multi-turn rollout (its request queue cuts each generation to the turn's cap):
    version 1 loads mid-way through the first turn, the second turn is version 1's throughout, and
    the per-token versions a step trains with say so; every sampled token's logprob is its
    version's (a float64 forward over the episode's ids)."""
    manager = load_plugins()
    engine = _engine(versions, tokenizer)
    engine.before_decode_step = version_change_at(engine, versions[1], call=5)
    rollout = manager.registry.get("rollout", "multi_turn").factory(
        engine=engine, tokenizer=tokenizer, config=TrainConfig(max_new_tokens=12)
    )
    [episode] = rollout.run([TwoTurns()], [{"question": "count"}], [0], SamplingParams(max_new_tokens=12, seed=0))
    first, second = episode.turns
    assert first.token_versions == [0] * 4 + [1] * (first.end - first.start - 4)
    assert second.token_versions == [1] * (second.end - second.start)
    per_token = _token_versions(episode, version=0)
    for t, (mask, version) in enumerate(zip(episode.loss_mask, per_token)):
        assert version == (-1 if not mask else int(t >= first.start + 4))
        if mask:
            expected = _float64_logprob(versions[version], episode.token_ids[:t], episode.token_ids[t:], 0, 1.0)
            assert episode.sampler_logprobs[t] == pytest.approx(expected, abs=2e-4), t
