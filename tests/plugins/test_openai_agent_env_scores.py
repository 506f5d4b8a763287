"""Agent episodes get their env's score of the final answer: an env return and held-out accuracy."""

from __future__ import annotations

import json

import pytest
from cli_in_process import agentrl_in_process

from agentrl import EnvError, SamplingParams
from agentrl.config.train import TrainConfig
from agentrl.plugins import load_plugins
from agentrl.testing import build_tiny_model
from agentrl.training.build import make_env
from agentrl.training.evaluate import episode_success

BOXES = """
def solve(task, client):
    messages = [{"role": "user", "content": task["question"]}]
    client.chat.completions.create(model="m", messages=messages, max_tokens=4)
    answer = task["answer"] if task.get("right", True) else "-12345"
    return messages + [{"role": "assistant", "content": "The answer is \\\\boxed{" + answer + "}."}]
"""


def _agent(tmp_path, body=BOXES) -> str:
    path = tmp_path / "boxing_agent.py"
    path.write_text(body)
    return f"{path}:solve"


def _rollout(tokenizer, agent, **overrides):
    plugins = load_plugins()
    config = TrainConfig(**{"max_new_tokens": 4, "plugins": {"openai_agent": {"agent": agent}}, **overrides})
    engine = plugins.registry.get("engine", "hf").factory(
        model=build_tiny_model(len(tokenizer)),
        tokenizer=tokenizer,
        config=TrainConfig(engine_args={"dtype": "float32"}),
    )
    return plugins.registry.get("rollout", "openai_agent").factory(engine=engine, tokenizer=tokenizer, config=config)


def _math_tasks(n: int) -> list[dict]:
    env = make_env(load_plugins(), TrainConfig(env="math"))
    return [dict(env.eval_tasks()[i]) for i in range(n)]


def test_the_env_scores_the_agents_final_answer(tokenizer, tmp_path):
    tasks = _math_tasks(4)
    tasks[1]["right"] = tasks[3]["right"] = False
    envs = [make_env(load_plugins(), TrainConfig(env="math")) for _ in tasks]
    trajectories = _rollout(tokenizer, _agent(tmp_path)).run(envs, tasks, [0, 0, 1, 1], SamplingParams(seed=0))
    assert [t.env_return for t in trajectories] == [1.0, 0.0, 1.0, 0.0]
    assert [episode_success(t) for t in trajectories] == [True, False, True, False]
    assert all(t.info["env_scored"] and t.info["agent_calls"] == 1 for t in trajectories)


def test_env_scores_off_and_agents_that_return_a_reward_keep_theirs(tokenizer, tmp_path):
    tasks = _math_tasks(2)
    envs = [make_env(load_plugins(), TrainConfig(env="math")) for _ in tasks]
    off = _rollout(
        tokenizer, (agent := _agent(tmp_path)), plugins={"openai_agent": {"agent": agent, "env_scores": False}}
    )
    assert [t.env_return for t in off.run(envs, tasks, [0, 1], SamplingParams(seed=0))] == [0.0, 0.0]
    numeric = _agent(tmp_path, BOXES.replace("    return messages +", "    return 0.25\n    return messages +"))
    trajectories = _rollout(tokenizer, numeric).run(envs, tasks, [0, 1], SamplingParams(seed=0))
    assert [t.env_return for t in trajectories] == [0.25, 0.25] and "env_scored" not in trajectories[0].info


class BrokenChecker:
    """An env whose step (the final-answer check) raises."""

    def reset(self, seed=None, options=None):
        return [{"role": "user", "content": "q"}], {}

    def step(self, action):
        raise ValueError(f"cannot read {action[:10]!r}")


def test_a_failing_env_check_is_skipped_or_fails_the_run(tokenizer, tmp_path):
    tasks = _math_tasks(1)
    with pytest.warns(RuntimeWarning, match="BrokenChecker.step .scoring the agent's final answer. failed"):
        [trajectory] = _rollout(tokenizer, _agent(tmp_path)).run([BrokenChecker()], tasks, [0], SamplingParams(seed=0))
    assert trajectory.env_return == 0.0 and "env_scored" not in trajectory.info
    with pytest.raises(EnvError, match="BrokenChecker.step .* ValueError: cannot read"):
        _rollout(tokenizer, _agent(tmp_path), on_call_error="fail").run(
            [BrokenChecker()], tasks, [0], SamplingParams(seed=0)
        )


def test_held_out_accuracy_of_an_agent_run_through_the_cli(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    result = agentrl_in_process(
        "train",
        "--env",
        "math",
        "--model",
        str(tiny_model_dir),
        "--max-steps",
        "1",
        "--num-generations",
        "2",
        "--prompts-per-step",
        "2",
        "--output-dir",
        str(out),
        "--set",
        "rollout=openai_agent",
        "--set",
        f"plugins.openai_agent.agent={_agent(tmp_path)}",
        "--set",
        "eval_tasks=4",
        "--set",
        "max_new_tokens=4",
        "--set",
        "save_model=false",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = json.loads((out / "eval.json").read_text())
    # the agent boxes the gold answer and the env says correct (before this fix: 0.000 for any agent)
    assert evals["before"]["eval/accuracy"] == evals["after"]["eval/accuracy"] == 1.0
    assert [line["final/eval/accuracy"] for line in lines if "final/eval/accuracy" in line] == [1.0]
    train = [line for line in lines if "loss/total" in line]
    assert train[0]["reward/env_mean"] == 1.0


class ScriptedEngine:
    """Replies by call number since the last user message (counted by assistant headers), stop token included."""

    def __init__(self, tokenizer, replies):
        self.tokenizer, self.replies = tokenizer, replies

    def generate(self, prompts, sampling):
        from agentrl import Generation

        out = []
        for prompt in prompts:
            calls = self.tokenizer.decode(prompt).rpartition("<|im_start|>user")[2].count("<|im_start|>assistant") - 1
            ids = self.tokenizer(self.replies[min(calls, len(self.replies) - 1)], add_special_tokens=False)["input_ids"]
            out.append(Generation(ids + [self.tokenizer.eos_token_id], "stop", [-0.5] * (len(ids) + 1)))
        return out


TOOL_LOOP = """
import json
TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {
    "type": "object", "properties": {"expression": {"type": "string"}}}}}]

def solve(task, client):
    messages = [{"role": "user", "content": task["question"]}]
    for _ in range(3):
        message = client.chat.completions.create(model="m", messages=messages, tools=TOOLS).choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "5"})
    return messages
"""


def test_tool_calls_are_counted_so_tool_use_rewards_agents_as_envs(tokenizer, tmp_path):
    from agentrl_rewards import tool_use_reward

    replies = [
        '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>',
        '<tool_call>{"name": "abacus", "arguments": {}}</tool_call>',
        "\\boxed{5}",
    ]
    plugins = load_plugins()
    config = TrainConfig(max_new_tokens=40, plugins={"openai_agent": {"agent": _agent(tmp_path, TOOL_LOOP)}})
    rollout = plugins.registry.get("rollout", "openai_agent").factory(
        engine=ScriptedEngine(tokenizer, replies), tokenizer=tokenizer, config=config
    )
    [trajectory] = rollout.run([None], [{"question": "What is 2 + 3?"}], [0], SamplingParams(seed=0))
    assert [(t.tool_calls, t.tool_errors) for t in trajectory.turns] == [(1, 0), (1, 1), (0, 0)]
    assert trajectory.num_tool_calls == 2 and trajectory.num_tool_calls_ok == 1
    assert tool_use_reward([trajectory]) == [1.0]


def test_the_calculator_agent_program_is_the_calculator_env_token_for_token(tokenizer):
    """bench/agents/calculator_agent.py, the agent program of the env-vs-agent learning comparison, gives the
    same episode as ``--env calculator`` for the same replies: token ids, loss mask, env return."""
    from pathlib import Path

    from agentrl.training.build import make_env

    agent = f"{Path(__file__).resolve().parents[2] / 'bench' / 'agents' / 'calculator_agent.py'}:solve"
    plugins = load_plugins()
    env_config = TrainConfig(env="calculator", max_new_tokens=40)
    env = make_env(plugins, env_config)
    task = dict(env.train_tasks()[3])
    replies = [
        f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{task["expression"]}"}}}}</tool_call>',
        f"The answer is \\boxed{{{task['answer']}}}.",
    ]
    engine = ScriptedEngine(tokenizer, replies)
    [by_env] = (
        plugins.registry.get("rollout", "multi_turn")
        .factory(engine=engine, tokenizer=tokenizer, config=env_config)
        .run([env], [task], [0], SamplingParams(seed=0))
    )
    agent_config = TrainConfig(env="calculator", max_new_tokens=40, plugins={"openai_agent": {"agent": agent}})
    [by_agent] = (
        plugins.registry.get("rollout", "openai_agent")
        .factory(engine=engine, tokenizer=tokenizer, config=agent_config)
        .run([make_env(plugins, env_config)], [task], [0], SamplingParams(seed=0))
    )
    assert (
        by_env.env_return == by_agent.env_return == 1.0 and by_env.num_tool_calls_ok == by_agent.num_tool_calls_ok == 1
    )
    assert tokenizer.decode(by_agent.token_ids) == tokenizer.decode(by_env.token_ids)
    assert by_agent.token_ids == by_env.token_ids and by_agent.loss_mask == by_env.loss_mask
