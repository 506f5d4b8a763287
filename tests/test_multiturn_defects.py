"""Defects that biased multi-turn training (found by reading and trying the code), each pinned
by a test that failed before its fix."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from agentrl import ConfigError, Env, SamplingParams, Trajectory, Turn, collate
from agentrl.chat import ChatTokenizer
from agentrl.config import TrainConfig
from agentrl.plugins import load_plugins
from agentrl.scoring import score
from agentrl.testing import build_tiny_model


class TalkEnv(Env):
    """Three turns; the user always answers "Go on." (the model's reply is never scored)."""

    max_turns = 3

    def train_tasks(self):
        return [{"question": "Talk."}]

    eval_tasks = train_tasks

    def start(self, task):
        return [{"role": "user", "content": task["question"]}]

    def respond(self, text):
        if self.turn >= 3:
            return [], 0.0, True, {}
        return [{"role": "user", "content": "Go on."}], 0.0, False, {}


def _engine_and_rollout(tokenizer, engine_class=None, **config):
    manager = load_plugins()
    model = build_tiny_model(len(tokenizer))
    engine_class = engine_class or manager.registry.get("engine", "hf").factory
    engine = engine_class(model=model, tokenizer=tokenizer, config=TrainConfig(engine_args={"dtype": "float32"}))
    rollout = manager.registry.get("rollout", "multi_turn").factory(
        engine=engine, tokenizer=tokenizer, config=TrainConfig(**{"max_new_tokens": 8, **config}))
    return engine, rollout


def test_every_turn_draws_fresh_randomness_reproducibly(tokenizer):
    hf = load_plugins().registry.get("engine", "hf").factory

    class RecordingEngine(hf):
        """The real hf engine, recording the seed of every generate call."""

        seeds: list

        def generate(self, prompts, sampling):
            self.seeds.append(sampling.seed)
            return super().generate(prompts, sampling)

    runs = []
    for _ in range(2):
        engine, rollout = _engine_and_rollout(tokenizer, RecordingEngine)
        engine.seeds = []
        [trajectory] = rollout.run([TalkEnv()], [{"question": "Talk."}], [0], SamplingParams(max_new_tokens=8, seed=5))
        runs.append((engine.seeds, trajectory.token_ids))
    seeds = runs[0][0]
    assert len(seeds) == 3 and seeds[0] == 5 and len(set(seeds)) == 3  # distinct per turn, turn 0 unchanged
    assert runs[0] == runs[1]  # and reproducible from the one seed
    # The tiny random model's next-token distribution is close to uniform over 49k tokens, so the
    # same random draws pick the same tokens whatever the context: with one seed reused every turn,
    # turn 2 repeated turn 1's tokens exactly.
    turns = [trajectory.token_ids[t.start:t.end] for t in trajectory.turns]
    assert turns[0] != turns[1] and turns[1] != turns[2]


def _two_turn(rewards):
    return Trajectory(token_ids=list(range(10, 20)), loss_mask=[0, 0, 0, 1, 1, 0, 0, 1, 1, 1],
                      sampler_logprobs=[0.0] * 10, turns=[Turn(3, 5, reward=rewards[0]), Turn(7, 10, reward=rewards[1])],
                      messages=[], task={})


def test_env_reward_weight_reaches_the_per_turn_rewards():
    trajectories = [_two_turn([0.5, 1.0])]
    totals, _ = score(trajectories, {}, env_weight=0.3)
    batch = collate(trajectories, totals, pad_token_id=0, env_reward_weight=0.3)
    assert totals == [pytest.approx(0.45)]
    assert batch.token_rewards[0].tolist() == pytest.approx([0, 0, 0, 0, 0.15, 0, 0, 0, 0, 0.3])
    assert float(batch.token_rewards.sum()) == pytest.approx(totals[0])


def test_an_eos_that_is_not_the_end_of_turn_token_keeps_the_run_going(tokenizer):
    chat = ChatTokenizer(tokenizer)
    endoftext, im_end = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    assert (endoftext, im_end) == (0, 2)
    history = [{"role": "user", "content": "What is 2 + 3?"}]
    content = chat.encode("5")
    assistant = {"role": "assistant", "content": "5"}
    reply = [{"role": "user", "content": "Sure?"}]
    usual = chat.delta_ids(history, content + [im_end], assistant, reply, stopped=True)
    after = chat.render(history + [assistant] + reply, add_generation_prompt=True)
    before = chat.render(history, add_generation_prompt=True)
    assert chat.decode(usual) == after[len(before) + len("5<|im_end|>"):]  # as before: the stop token closes the turn
    other = chat.delta_ids(history, content + [endoftext], assistant, reply, stopped=True)
    assert other[0] == im_end  # the template's end-of-turn joins the env delta
    assert chat.decode(other) == "<|im_end|>" + chat.decode(usual)
    cut = chat.delta_ids(history, content, assistant, reply, stopped=False)  # length cap: no stop token
    assert cut == other


def test_infinite_rewards_count_as_not_scored():
    def bad(trajectories):
        return [math.inf, 1.0, -math.inf]

    trajectories = [_two_turn([0.0, 0.0]) for _ in range(3)]
    counts: dict[str, int] = {}
    with pytest.warns(RuntimeWarning, match=re.escape("reward 'bad' gave 2 infinite value(s)")):
        totals, components = score(trajectories, {"bad": (bad, 1.0)}, env_weight=1.0, nonfinite=counts)
    assert counts == {"env": 0, "bad": 2}
    assert totals == [0.0, 1.0, 0.0]  # the env still scored the first and last
    assert np.isnan(components["bad"][0]) and all(np.isfinite(totals))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"rewards": {"format": math.inf}}, "rewards.format must be a finite number, got inf"),
    ({"rewards": {"format": math.nan}}, "rewards.format must be a finite number, got nan"),
    ({"env_reward_weight": -math.inf}, "env_reward_weight must be a finite number, got -inf"),
])
def test_non_finite_reward_weights_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        TrainConfig(**kwargs)


def test_cli_refuses_an_infinite_reward_weight():
    from agentrl.cli import _parse_rewards

    with pytest.raises(ConfigError, match=re.escape("--reward 'format:inf': weight 'inf' must be a finite number")):
        _parse_rewards(["format:inf"])


def test_an_episode_whose_prompt_fills_the_budget_scores_as_an_empty_reply(tokenizer):
    from agentrl.metrics import rollout_metrics
    from agentrl_rewards import format_reward
    from agentrl_tool_envs import CalculatorEnv

    env = CalculatorEnv()
    task = env.eval_tasks()[0]
    _, rollout = _engine_and_rollout(tokenizer, max_total_tokens=64)
    with pytest.warns(RuntimeWarning, match=re.escape("1 of 1 episodes ended before the model spoke")):
        [trajectory] = rollout.run([env], [task], [0], SamplingParams(max_new_tokens=8, seed=0))
    assert trajectory.turns == [] and trajectory.truncated and trajectory.info["prompt_too_long"]
    assert any(m["role"] == "assistant" for m in trajectory.messages)  # the worked examples
    assert trajectory.completion_text == ""  # not the demonstration's answer
    assert format_reward([trajectory]) == [0.0]
    assert rollout_metrics([trajectory])["rollout/prompt_too_long_frac"] == 1.0
