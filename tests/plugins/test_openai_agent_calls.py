"""An agent episode's calls in the episode store: what each call sent and got back, why a segment
began, the step's ``agent/*`` means, and a warning, once, for an agent that rebuilds its history."""

from __future__ import annotations

import json
import warnings

from cli_in_process import agentrl_in_process

from agentrl import SamplingParams
from agentrl.config.train import TrainConfig
from agentrl.plugins import load_plugins
from agentrl.rundir.episodes import episode_record
from agentrl.testing import build_tiny_model
from agentrl_openai_agent.calls import sent_messages

# Each call's messages and reply are logged by the agent itself, one JSON line per call, to the
# file the task names: what the agent really sent, to compare with what the store kept.
APPENDS = """
import json


def solve(task, client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": task["question"]}]
    for _ in range(3):
        reply = client.chat.completions.create(model="m", messages=messages, max_tokens=4)
        content = reply.choices[0].message.content
        with open(task["log"], "a") as f:
            f.write(json.dumps({"sent": messages, "reply": content}) + "\\n")
        messages = messages + [{"role": "assistant", "content": content}, {"role": "user", "content": "Go on."}]
    return [{"role": "assistant", "content": "final: " + content}]
"""
"""Appends to its conversation (a new list each call, the same messages); returns its final output
alone, as agent frameworks do."""

REBUILDS = """
import json


def solve(task, client):
    said = []
    for step in range(3):
        messages = [
            {"role": "system", "content": f"Step {step} of 3."},
            {"role": "user", "content": task["question"]},
            *[{"role": "assistant", "content": text} for text in said],
        ]
        reply = client.chat.completions.create(model="m", messages=messages, max_tokens=4)
        said.append(reply.choices[0].message.content)
        with open(task["log"], "a") as f:
            f.write(json.dumps({"sent": messages, "reply": said[-1]}) + "\\n")
    return said[-1]
"""
"""Rebuilds its history each call, its system message changed (the smolagents style)."""

REBUILT = "rewrites its message history"


def _rollout(tokenizer, tmp_path, body: str):
    path = tmp_path / "agent.py"
    path.write_text(body)
    engine = (
        load_plugins()
        .registry.get("engine", "hf")
        .factory(
            model=build_tiny_model(len(tokenizer)),
            tokenizer=tokenizer,
            config=TrainConfig(engine_args={"dtype": "float32"}),
        )
    )
    config = TrainConfig(max_new_tokens=4, plugins={"openai_agent": {"agent": f"{path}:solve"}})
    return (
        load_plugins()
        .registry.get("rollout", "openai_agent")
        .factory(engine=engine, tokenizer=tokenizer, config=config)
    )


def _run(rollout, tmp_path, n: int, tag: str):
    tasks = [{"question": f"What is {i} + 1?", "log": str(tmp_path / f"{tag}-{i}.jsonl")} for i in range(n)]
    trajectories = rollout.run([None] * n, tasks, list(range(n)), SamplingParams(seed=0), seeds=list(range(n)))
    logged = [[json.loads(line) for line in open(task["log"])] for task in tasks]
    return [episode_record(t) for t in trajectories], logged


def test_each_call_is_kept_as_sent_with_its_reply_and_the_whole_conversation_is_the_episode(tokenizer, tmp_path):
    rollout = _rollout(tokenizer, tmp_path, APPENDS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records, logged = _run(rollout, tmp_path, 2, "a")
    assert not [w for w in caught if REBUILT in str(w.message)]
    for record, calls in zip(records, logged):
        assert len(record["calls"]) == len(calls) == 3
        assert sent_messages(record["calls"]) == [call["sent"] for call in calls]  # exactly what the agent sent
        assert [c["reply"]["content"] for c in record["calls"]] == [call["reply"] for call in calls]
        assert [c["cut"] for c in record["calls"]] == ["first call", None, None]
        assert [c["segment"] for c in record["calls"]] == [0, 0, 0] and "segments" not in record
        assert [c["prefix_messages"] for c in record["calls"]] == [0, 2, 4]  # each stores only what is new
        assert [len(c["messages"]) for c in record["calls"]] == [2, 2, 2]
        assert all(c["prompt_tokens"] > 0 and 0 < c["sampled_tokens"] <= 4 for c in record["calls"])
        assert record["calls"][1]["prompt_tokens"] > record["calls"][0]["prompt_tokens"] + 1
        # The episode: the whole conversation the model saw, the agent's returned output last.
        conversation = [(m["role"], m["content"], m["source"]) for m in record["messages"]]
        assert conversation[:2] == [
            ("system", "Be brief.", "prompt"),
            ("user", calls[0]["sent"][1]["content"], "prompt"),
        ]
        assert [m[0] for m in conversation] == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
        assert [m[2] for m in conversation[2:]] == ["sampled", "env", "sampled", "env", "sampled"]
        assert conversation[-1][1] == "final: " + calls[-1]["reply"] and "calls" not in record["info"]
    rollout.close()


def test_an_agent_that_rebuilds_its_history_gets_cut_reasons_and_one_warning(tokenizer, tmp_path):
    rollout = _rollout(tokenizer, tmp_path, REBUILDS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records, logged = _run(rollout, tmp_path, 2, "r1")
        again, _ = _run(rollout, tmp_path, 2, "r2")  # a second step: not warned again
    said = [str(w.message) for w in caught if REBUILT in str(w.message)]
    assert len(said) == 1, said
    assert said[0].endswith(
        "rewrites its message history: 4 of its 4 calls after an episode's first began a new segment on a changed "
        "history (3.0 segments per episode); each segment re-encodes its whole prompt and trains as a row of its own (slower, more "
        "memory). Append each reply and tool result to the message list the agent sends instead of rebuilding it "
        "(agents in the smolagents style rebuild it on every call); each episode's calls and why each segment "
        "began are in the run's completions.jsonl (calls, cut)"
    )
    for record, calls in zip(records + again, logged + [None, None]):
        assert [c["cut"] for c in record["calls"]] == [
            "first call",
            "history rewritten: message 0 differs from the previous call's",
            "history rewritten: message 0 differs from the previous call's",
        ]
        assert [c["segment"] for c in record["calls"]] == [0, 1, 2] and record["segments"] == 2
        assert [c["prefix_messages"] for c in record["calls"]] == [0, 0, 0]
        if calls is not None:
            assert sent_messages(record["calls"]) == [call["sent"] for call in calls]
        # The last segment's conversation: its system message is the third call's.
        assert record["messages"][0]["content"] == "Step 2 of 3." and record["messages"][-1]["source"] == "sampled"
    rollout.close()


CLI_AGENT = """
import openai


def solve(task, client):
    messages = [{"role": "user", "content": task["question"]}]
    for _ in range(1 + len(str(task["answer"])) % 2):
        reply = client.chat.completions.create(model="m", messages=messages, max_tokens=4)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content}, {"role": "user", "content": "?"}]
    return messages[:-1]
"""
"""One or two calls, by the task's answer (in the store's ``task``), appended."""


def test_a_training_run_stores_every_call_and_logs_the_agent_means(tmp_path, tiny_model_dir):
    (tmp_path / "agent.py").write_text(CLI_AGENT)
    out = tmp_path / "run"
    result = agentrl_in_process(
        "train",
        "--env",
        "math",
        "--model",
        str(tiny_model_dir),
        "--max-steps",
        "2",
        "--num-generations",
        "2",
        "--prompts-per-step",
        "2",
        "--output-dir",
        str(out),
        "--set",
        "rollout=openai_agent",
        "--set",
        f"plugins.openai_agent.agent={tmp_path / 'agent.py'}:solve",
        "--set",
        "max_new_tokens=4",
        "--set",
        "eval_tasks=2",
        "--set",
        "save_model=false",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert REBUILT not in result.stderr
    episodes = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    metrics = {line["step"]: line for line in metrics if "loss/total" in line}
    assert len(episodes) == 8 and sorted(metrics) == [1, 2]
    counts = set()
    for episode in episodes:
        calls = episode["calls"]
        assert len(calls) == 1 + len(str(episode["task"]["answer"])) % 2 == len(episode["turns"])
        assert [c["cut"] for c in calls] == ["first call"] + [None] * (len(calls) - 1)
        assert calls[0]["messages"][0]["role"] == "user" and calls[-1]["reply"]["role"] == "assistant"
        assert episode["messages"][-1]["content"] == calls[-1]["reply"]["content"]
        counts.add(len(calls))
    for step, line in metrics.items():
        mine = [e for e in episodes if e["step"] == step]
        assert line["agent/calls_mean"] == sum(len(e["calls"]) for e in mine) / len(mine)
        assert line["agent/segments_mean"] == sum(1 + e.get("segments", 0) for e in mine) / len(mine) == 1.0
        assert line["rollout/turns_mean"] == line["agent/calls_mean"]
    evals = [json.loads(line) for line in (out / "eval_completions.jsonl").read_text().splitlines()]
    assert evals and all(len(e["calls"]) == 1 + len(str(e["task"]["answer"])) % 2 for e in evals)
    size = sum(len(line) for line in (out / "completions.jsonl").read_text().splitlines()) / len(episodes)
    assert size < 20_000, size
