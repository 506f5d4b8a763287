"""Defects that biased multi-turn training (found by reading and trying the code), each pinned
by a test that failed before its fix."""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest
import torch

from agentrl import ConfigError, Env, SamplingParams, Trajectory, Turn, collate
from agentrl.config.train import TrainConfig
from agentrl.plugins import load_plugins
from agentrl.rewards.scoring import score
from agentrl.sampling.chat import ChatTokenizer
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


def _engine_and_rollout(tokenizer, engine_class=None, model=None, **config):
    manager = load_plugins()
    model = model if model is not None else build_tiny_model(len(tokenizer))
    engine_class = engine_class or manager.registry.get("engine", "hf").factory
    engine = engine_class(model=model, tokenizer=tokenizer, config=TrainConfig(engine_args={"dtype": "float32"}))
    rollout = manager.registry.get("rollout", "multi_turn").factory(
        engine=engine, tokenizer=tokenizer, config=TrainConfig(**{"max_new_tokens": 8, **config})
    )
    return engine, rollout


def test_every_turn_gets_its_own_seed_reproducibly(tokenizer):
    hf = load_plugins().registry.get("engine", "hf").factory

    class RecordingEngine(hf):
        """The real hf engine, recording the seed of every generate call (the one prompt's: each
        request carries its own, ``sampling.prompt_seeds``)."""

        seeds: list

        def generate(self, prompts, sampling):
            self.seeds.append((sampling.seeds_for(len(prompts)) or [None])[0])
            return super().generate(prompts, sampling)

    runs = []
    for _ in range(2):
        engine, rollout = _engine_and_rollout(tokenizer, RecordingEngine)
        engine.seeds = []
        [trajectory] = rollout.run([TalkEnv()], [{"question": "Talk."}], [0], SamplingParams(max_new_tokens=8, seed=5))
        runs.append((engine.seeds, trajectory.token_ids))
    seeds = runs[0][0]
    # distinct per turn, turn 0 unchanged (the seed the engine derived for prompt 0 of a batch seeded 5)
    assert len(seeds) == 3 and seeds[0] == 5 * 1_000_003 and len(set(seeds)) == 3
    assert runs[0] == runs[1]  # and reproducible from the one seed
    engine.seeds = []
    rollout.run([TalkEnv()], [{"question": "Talk."}], [0], SamplingParams(max_new_tokens=8))
    assert engine.seeds == [None, None, None]  # no seed: the engine's own stream goes on


def test_later_turns_do_not_repeat_the_first_turns_draws(tokenizer):
    # The tiny random model's next-token distribution is close to uniform over 49k tokens, so the
    # same random draws pick the same tokens whatever the context: with one seed reused every turn,
    # every turn repeated turn 1's tokens exactly.
    _, rollout = _engine_and_rollout(tokenizer)
    [trajectory] = rollout.run([TalkEnv()], [{"question": "Talk."}], [0], SamplingParams(max_new_tokens=8, seed=5))
    turns = [trajectory.token_ids[t.start : t.end] for t in trajectory.turns]
    assert len(turns) == 3 and all(len(t) == 8 for t in turns)
    assert turns[0] != turns[1] and turns[1] != turns[2] and turns[0] != turns[2]


def _two_turn(rewards):
    return Trajectory(
        token_ids=list(range(10, 20)),
        loss_mask=[0, 0, 0, 1, 1, 0, 0, 1, 1, 1],
        sampler_logprobs=[0.0] * 10,
        turns=[Turn(3, 5, reward=rewards[0]), Turn(7, 10, reward=rewards[1])],
        messages=[],
        task={},
    )


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
    assert chat.decode(usual) == after[len(before) + len("5<|im_end|>") :]  # as before: the stop token closes the turn
    other = chat.delta_ids(history, content + [endoftext], assistant, reply, stopped=True)
    assert other[0] == im_end  # the template's end-of-turn joins the env delta
    assert chat.decode(other) == "<|im_end|>" + chat.decode(usual)
    cut = chat.delta_ids(history, content, assistant, reply, stopped=False)  # length cap: no stop token
    assert cut == other


def test_a_rollout_survives_a_model_that_stops_with_another_eos(tokenizer):
    """A model whose generation config stops on ``<|endoftext|>`` (id 0) as well as ``<|im_end|>``
    (like Qwen2.5's), with an LM-head bias that makes id 0 about as likely as all other tokens
    together: each turn is a few tokens ending in id 0."""
    hf = load_plugins().registry.get("engine", "hf").factory
    model = build_tiny_model(len(tokenizer))
    model.generation_config.eos_token_id = [2, 0]
    head = torch.nn.Linear(model.config.hidden_size, len(tokenizer), bias=True)
    head.weight = model.model.embed_tokens.weight  # still tied
    with torch.no_grad():
        head.bias.zero_()
        head.bias[0] = math.log(len(tokenizer))
    model.lm_head = head

    class RecordingEngine(hf):
        """The real hf engine, recording what it sampled."""

        sampled: list

        def generate(self, prompts, sampling):
            generations = super().generate(prompts, sampling)
            self.sampled += [g.token_ids for g in generations]
            return generations

    engine, rollout = _engine_and_rollout(tokenizer, RecordingEngine, model)
    engine.sampled = []
    # Each turn stops at its first token with probability ~1/2; this seed gives turns of both kinds.
    [trajectory] = rollout.run([TalkEnv()], [{"question": "Talk."}], [0], SamplingParams(max_new_tokens=8, seed=5))
    ids, mask = trajectory.token_ids, trajectory.loss_mask
    assert len(trajectory.turns) == 3 and trajectory.terminated
    assert max(turn.end - turn.start for turn in trajectory.turns) > 1  # some turns have content
    for turn, sampled in zip(trajectory.turns, engine.sampled):
        assert turn.finish_reason == "stop" and sampled[-1] == 0
        assert ids[turn.start : turn.end] == sampled and set(mask[turn.start : turn.end]) == {1}  # untouched, trained
    for turn in trajectory.turns[:-1]:
        assert ids[turn.end] == 2 and mask[turn.end] == 0  # the template's <|im_end|> is env text
    chat = ChatTokenizer(tokenizer)
    last = trajectory.turns[-1]
    stops = {turn.end - 1 for turn in trajectory.turns}
    without_stops = [t for i, t in enumerate(ids[: last.start]) if i not in stops]
    assert chat.decode(without_stops) == chat.render(trajectory.messages[:-1], add_generation_prompt=True)


def test_infinite_rewards_count_as_not_scored():
    def bad(trajectories):
        return [math.inf, 1.0, -math.inf]

    trajectories = [_two_turn([0.0, 0.0]) for _ in range(3)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        totals, components = score(trajectories, {"bad": (bad, 1.0)}, env_weight=1.0)
    assert totals == [0.0, 1.0, 0.0]  # the env still scored the first and last; no inf in any total
    assert np.isnan(components["bad"][0]) and np.isnan(components["bad"][2])
    assert [str(w.message) for w in caught] == [
        "reward 'bad' gave 2 non-finite value(s) (inf or NaN); they count as not scored"
    ]


def test_non_finite_rewards_are_counted_per_component():
    def shaky(trajectories):
        return [math.nan, None, -math.inf]

    trajectories = [_two_turn([0.0, 0.0]), _two_turn([0.0, math.inf]), _two_turn([1.0, 0.0])]
    counts: dict[str, int] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        totals, components = score(trajectories, {"shaky": (shaky, 2.0)}, env_weight=1.0, nonfinite=counts)
    assert counts == {"env": 1, "shaky": 2}  # None is "not scored", not a non-finite value
    assert totals[0] == 0.0 and math.isnan(totals[1]) and totals[2] == 1.0
    assert np.isnan(components["env"][1]) and np.isnan(components["shaky"]).all()
    assert [str(w.message) for w in caught] == [
        "reward 'env' gave 1 non-finite value(s) (inf or NaN); they count as not scored",
        "reward 'shaky' gave 2 non-finite value(s) (inf or NaN); they count as not scored",
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rewards": {"format": math.inf}}, "rewards.format must be a finite number, got inf"),
        ({"rewards": {"format": math.nan}}, "rewards.format must be a finite number, got nan"),
        ({"env_reward_weight": -math.inf}, "env_reward_weight must be a finite number, got -inf"),
    ],
)
def test_non_finite_reward_weights_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        TrainConfig(**kwargs)


def test_cli_refuses_an_infinite_reward_weight():
    from agentrl.cli.app import _parse_rewards

    with pytest.raises(ConfigError, match=re.escape("--reward 'format:inf': weight 'inf' must be a finite number")):
        _parse_rewards(["format:inf"])


def test_an_episode_whose_prompt_fills_the_budget_scores_as_an_empty_reply(tokenizer):
    from agentrl.rundir.metrics import rollout_metrics
    from agentrl_rewards import format_reward
    from agentrl_tool_envs import CalculatorEnv

    env = CalculatorEnv()
    task = env.eval_tasks()[0]
    _, rollout = _engine_and_rollout(tokenizer, max_total_tokens=64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        [trajectory] = rollout.run([env], [task], [0], SamplingParams(max_new_tokens=8, seed=0))
    assert any(m["role"] == "assistant" for m in trajectory.messages)  # the worked examples
    assert trajectory.turns == [] and trajectory.completion_text == ""  # not the demonstration's answer
    assert format_reward([trajectory]) == [0.0]
    assert trajectory.truncated and trajectory.info["prompt_too_long"] is True
    assert rollout_metrics([trajectory])["rollout/prompt_too_long_frac"] == 1.0
    assert [str(w.message) for w in caught] == [
        "1 of 1 episodes ended before the model spoke: their prompt alone fills max_total_tokens=64; "
        "they score as empty replies. Raise max_total_tokens or shorten the prompt."
    ]


def test_prompt_too_long_is_counted_and_warned_once_per_run(tokenizer):
    from agentrl.rundir.metrics import rollout_metrics
    from agentrl_tool_envs import CalculatorEnv

    envs = [CalculatorEnv(), CalculatorEnv(), TalkEnv()]
    tasks = [envs[0].eval_tasks()[0], envs[1].eval_tasks()[1], {"question": "Talk."}]
    _, rollout = _engine_and_rollout(tokenizer, max_total_tokens=64)
    with pytest.warns(RuntimeWarning, match=re.escape("2 of 3 episodes ended before the model spoke")) as caught:
        trajectories = rollout.run(envs, tasks, [0, 1, 2], SamplingParams(max_new_tokens=8, seed=0))
    assert len([w for w in caught if "before the model spoke" in str(w.message)]) == 1
    assert [len(t.turns) > 0 for t in trajectories] == [False, False, True]
    assert "prompt_too_long" not in trajectories[2].info
    assert rollout_metrics(trajectories)["rollout/prompt_too_long_frac"] == pytest.approx(2 / 3)
