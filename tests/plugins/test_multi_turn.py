"""The ``multi_turn`` rollout (plugins/agentrl_rollouts): episodes are token-exact
(ids = sampled ids + template deltas, mask = sampled spans); each episode samples from its own seed
stream, advanced across its turns; a model that stops on another EOS than the template's end-of-turn keeps its
episode going; an episode whose prompt alone fills ``max_total_tokens`` scores as an empty reply,
counted and warned about once; an engine failure names the engine and the batch."""

from __future__ import annotations

import copy
import json
import math
import re
import warnings

import pytest
import torch
from faulty_plugin import unclipped_run_config

from agentrl import Env, SamplingParams, TemplateError
from agentrl.config.train import TrainConfig
from agentrl.errors import EngineError
from agentrl.model.loading import DEFAULT_MODEL, load_model
from agentrl.plugins import load_plugins
from agentrl.sampling.chat import ChatTokenizer
from agentrl.testing import build_tiny_model
from agentrl.tools.tool import Tool, ToolCall, ToolEnv, render_tools_system_prompt
from agentrl.training.trainer import Trainer


def echo(text: str) -> str:
    """Say ``text`` back.

    Args:
        text: What to say.
    """
    return text


class ScriptedEnv(Env):
    """Ends after ``task["turns"]`` turns; answers alternately as a tool and as the user."""

    max_turns = 6

    def train_tasks(self):
        return [{"turns": 1}, {"turns": 2}, {"turns": 3}]

    def eval_tasks(self):
        return [{"turns": 2}]

    def start(self, task):
        return [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Count with me: 1"}]

    def respond(self, text):
        if self.turn >= self.task["turns"]:
            return [], 1.0, True, {}
        role = "tool" if self.turn % 2 else "user"
        return [{"role": role, "content": f"reply {self.turn}: {len(text)} chars"}], 0.25, False, {}


def _rollout(model, tokenizer, **overrides):
    manager = load_plugins()
    config = TrainConfig(**{"max_new_tokens": 12, **overrides})
    engine = manager.registry.get("engine", "hf").factory(
        model=model, tokenizer=tokenizer, config=TrainConfig(engine_args={"dtype": "float32"})
    )
    return manager.registry.get("rollout", "multi_turn").factory(engine=engine, tokenizer=tokenizer, config=config)


def _check_token_exact(trajectory, tokenizer):
    chat = ChatTokenizer(tokenizer)
    trajectory.validate()
    decoded = chat.decode(trajectory.token_ids)
    rendered = chat.render(trajectory.messages, add_generation_prompt=False, tools=trajectory.tools)
    # The trajectory ends with the model's last sampled token; the template's closing separator
    # (and the stop token of a turn cut by the length cap) come after it.
    assert rendered.startswith(decoded)
    assert rendered[len(decoded) :] in ("\n", "<|im_end|>\n")
    # Rebuild the ids independently: first prompt, then per turn sampled ids + delta ids.
    first_user = next(i for i, m in enumerate(trajectory.messages) if m["role"] == "assistant")
    expected = chat.prompt_ids(trajectory.messages[:first_user], tools=trajectory.tools)
    assert trajectory.token_ids[: len(expected)] == expected
    for turn in trajectory.turns:
        assert all(trajectory.loss_mask[t] == 1 for t in range(turn.start, turn.end))
        assert all(lp <= 0.0 for lp in trajectory.sampler_logprobs[turn.start : turn.end])
    off_mask = [lp for lp, m in zip(trajectory.sampler_logprobs, trajectory.loss_mask) if m == 0]
    assert all(lp == 0.0 for lp in off_mask)
    assert sum(trajectory.loss_mask) == sum(t.end - t.start for t in trajectory.turns)


def test_tiny_model_episodes_end_at_different_turns(tokenizer):
    model = build_tiny_model(len(tokenizer))
    rollout = _rollout(model, tokenizer)
    envs = [ScriptedEnv() for _ in range(6)]
    tasks = [{"turns": k} for k in (1, 2, 3, 3, 2, 1)]
    trajectories = rollout.run(envs, tasks, [0, 0, 0, 1, 1, 1], SamplingParams(max_new_tokens=12, seed=0))
    assert [len(t.turns) for t in trajectories] == [1, 2, 3, 3, 2, 1]
    for trajectory in trajectories:
        _check_token_exact(trajectory, tokenizer)
        assert trajectory.env_return == pytest.approx(0.25 * (len(trajectory.turns) - 1) + 1.0)
        # A random tiny model never stops by itself: every turn hit the per-turn cap.
        assert all(turn.finish_reason == "length" and turn.end - turn.start == 12 for turn in trajectory.turns)
        assert trajectory.truncated  # the last turn was cut


# ChatML that renders ``tools=`` into the system message, the way Qwen2.5-style templates do.
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n<tools>\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools><|im_end|>\n"
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{%- endif %}"
    "{%- for message in messages %}{% if not (loop.first and message.role == 'system') %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class CallEveryTurnEnv(ToolEnv):
    """Every reply counts as a call of ``echo`` (the tiny model writes no real calls)."""

    tools = (Tool(echo),)
    instructions = "Echo things."
    max_turns = 3

    def __init__(self) -> None:
        super().__init__(tool_parser=lambda text: [ToolCall("echo", {"text": "hi"}, None, text)])

    def train_tasks(self):
        return [{"question": "Say hi."}]

    eval_tasks = train_tasks

    def score_answer(self, text):
        return 0.0


def test_templates_that_render_tools_get_the_schemas_instead_of_the_fallback(tokenizer):
    tools_tokenizer = copy.deepcopy(tokenizer)
    tools_tokenizer.chat_template = TOOLS_TEMPLATE
    assert ChatTokenizer(tools_tokenizer).renders_tools and not ChatTokenizer(tokenizer).renders_tools
    model = build_tiny_model(len(tokenizer))
    for tok, native in ((tools_tokenizer, True), (tokenizer, False)):
        rollout = _rollout(model, tok, max_new_tokens=6)
        [trajectory] = rollout.run(
            [CallEveryTurnEnv()], [{"question": "Say hi."}], [0], SamplingParams(max_new_tokens=6, seed=0)
        )
        assert len(trajectory.turns) == 3 and trajectory.truncated
        assert [m["content"] for m in trajectory.messages if m["role"] == "tool"] == ["hi", "hi"]
        assert trajectory.info["unseen_messages"] == [{"role": "tool", "content": "hi", "name": "echo"}]
        _check_token_exact(trajectory, tok)
        system = trajectory.messages[0]["content"]
        decoded = ChatTokenizer(tok).decode(trajectory.token_ids)
        if native:
            assert trajectory.tools == [Tool(echo).schema] and system == "Echo things."
            assert json.dumps(Tool(echo).schema) in decoded
        else:
            assert trajectory.tools is None and render_tools_system_prompt([Tool(echo)]) in system
            assert "<tools>" not in decoded


def test_episode_token_caps_truncate(tokenizer):
    model = build_tiny_model(len(tokenizer))
    rollout = _rollout(model, tokenizer, max_sampled_tokens=20)
    [trajectory] = rollout.run([ScriptedEnv()], [{"turns": 3}], [0], SamplingParams(max_new_tokens=12, seed=1))
    assert trajectory.num_sampled_tokens == 20 and len(trajectory.turns) == 2 and trajectory.truncated
    _check_token_exact(trajectory, tokenizer)
    rollout = _rollout(model, tokenizer, max_total_tokens=60)
    [trajectory] = rollout.run([ScriptedEnv()], [{"turns": 3}], [0], SamplingParams(max_new_tokens=12, seed=1))
    assert len(trajectory.token_ids) <= 60 and trajectory.truncated


def test_real_model_multi_turn_keeps_stop_tokens(tokenizer):
    model = load_model(DEFAULT_MODEL)
    rollout = _rollout(model, tokenizer, max_new_tokens=48)
    envs = [ScriptedEnv() for _ in range(4)]
    trajectories = rollout.run(
        envs,
        [{"turns": 3}, {"turns": 2}, {"turns": 3}, {"turns": 1}],
        [0, 0, 1, 1],
        SamplingParams(max_new_tokens=48, temperature=0.7, seed=3),
    )
    stopped = 0
    for trajectory in trajectories:
        _check_token_exact(trajectory, tokenizer)
        for turn in trajectory.turns:
            if turn.finish_reason == "stop":
                stopped += 1
                assert trajectory.token_ids[turn.end - 1] == tokenizer.eos_token_id
                assert trajectory.loss_mask[turn.end - 1] == 1  # the stop token is trained on
                if turn.end < len(trajectory.token_ids):  # the separator after it is env's
                    assert trajectory.loss_mask[turn.end] == 0
    assert stopped > 0


def test_non_prefix_template_fails_loudly(tokenizer):
    broken = type(tokenizer).from_pretrained(tokenizer.name_or_path)
    # A template that renders only the last two messages: rendering a longer conversation rewrites it.
    broken.chat_template = (
        "{% for m in messages[-2:] %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    rollout = _rollout(build_tiny_model(len(tokenizer)), broken)
    with pytest.raises(TemplateError, match="not prefix-preserving"):
        rollout.run([ScriptedEnv()], [{"turns": 3}], [0], SamplingParams(max_new_tokens=4, seed=0))


def test_train_batch_moves_every_tensor_extras_included():
    from agentrl import collate
    from agentrl.testing import make_trajectory

    trajectory = make_trajectory([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], {})
    batch = collate([trajectory, trajectory], [1.0, 0.0], pad_token_id=2)
    batch.extras["advantages"] = torch.ones(2, 3)
    moved = batch.to("meta")
    assert moved is batch
    tensors = [v for v in vars(batch).values() if isinstance(v, torch.Tensor)] + list(batch.extras.values())
    assert len(tensors) >= 10 and {t.device.type for t in tensors} == {"meta"}


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


@pytest.mark.parametrize("async_steps", [0, 1])
def test_an_engine_failure_names_the_engine_and_the_batch(tiny_model_dir, tmp_path, faults, monkeypatch, async_steps):
    """The message names the engine the user chose, also in an asynchronous run (whose engine is a
    VersionedEngine wrapping it)."""
    trainer = Trainer(
        unclipped_run_config(tiny_model_dir, tmp_path, env=f"{faults}:Tasks", async_steps=async_steps), load_plugins()
    )
    assert type(trainer.engine).__name__ == ("VersionedEngine" if async_steps else "HFEngine")

    def broken_generate(prompts, sampling):
        raise RuntimeError("CUDA error: out of memory\nCompile with TORCH_USE_CUDA_DSA")

    monkeypatch.setattr(trainer.engine, "generate", broken_generate)
    with pytest.raises(
        EngineError,
        match=r"^engine 'hf' \(HFEngine\) failed at turn 1 on 4 prompts of \d+-\d+ "
        r"tokens \(max_new_tokens=6, temperature=1\.0\): RuntimeError: CUDA error: "
        r"out of memory Compile with TORCH_USE_CUDA_DSA$",
    ):
        trainer.rollout_step(1)
    monkeypatch.setattr(trainer.engine, "generate", lambda prompts, sampling: [])
    with pytest.raises(EngineError, match=re.escape("on 4 prompts of") + ".*: returned 0 generations for 4 prompts"):
        trainer.rollout_step(2)
