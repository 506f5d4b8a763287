"""Multi-turn rollouts are token-exact: ids = sampled ids + template deltas, mask = sampled spans."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from agentrl import Env, SamplingParams, TemplateError
from agentrl.config.train import TrainConfig
from agentrl.model.loading import DEFAULT_MODEL, load_model
from agentrl.plugins import load_plugins
from agentrl.sampling.chat import ChatTokenizer
from agentrl.testing import build_tiny_model
from agentrl.tools.tool import Tool, ToolCall, ToolEnv, render_tools_system_prompt


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
