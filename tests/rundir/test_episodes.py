"""The episode store: every episode of every step and every evaluation, each message marked with
where it came from as the token masks say, resumable byte for byte (tests/training/test_resume.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from cli_in_process import TINY, agentrl_in_process, assert_one_line, cli

from agentrl.config.train import TrainConfig
from agentrl.plugins import load_plugins
from agentrl.rundir.episodes import episode_record, message_sources, with_advantages, with_trainer_values
from agentrl.testing import lockstep_plugins
from agentrl.training.trainer import Trainer
from agentrl.trajectory import Trajectory, Turn

TOOL_ENV = '''
from agentrl import Env

DEMO = [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]


class ToolChat(Env):
    """Three turns: a tool result, then the user's nudge, then the end (reward 1 on the last)."""

    max_turns = 3

    def train_tasks(self):
        return [{"id": f"t{i}", "question": f"q{i}", "answer": str(i)} for i in range(8)]

    def eval_tasks(self):
        return [{"id": f"e{i}", "question": f"e{i}", "answer": str(i)} for i in range(2)]

    def start(self, task):
        return [{"role": "system", "content": "Use the tool."}, *DEMO, {"role": "user", "content": task["question"]}]

    def respond(self, text):
        if self.turn == 1:
            return [{"role": "tool", "content": "41"}], 0.25, False, {"tool_calls": 1, "tool_errors": 1}
        if self.turn == 2:
            return [{"role": "user", "content": "and now?"}], 0.0, False, {}
        return [{"role": "user", "content": "done"}], 1.0, True, {"correct": True}
'''

CAPTURE = """
from agentrl import hookimpl

seen = []

@hookimpl
def agentrl_on_rollout_end(trajectories, step, metrics):
    seen.append((step, list(trajectories)))
"""


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _trajectory(messages: list[dict], spans: list[tuple[int, int]], n: int = 20, **kw) -> Trajectory:
    mask = [0] * n
    for start, end in spans:
        mask[start:end] = [1] * (end - start)
    return Trajectory(
        list(range(n)), mask, [0.0] * n, [Turn(s, e) for s, e in spans], messages, {"answer": "2", "x": 1}, **kw
    )


def test_sources_follow_the_turns_a_demonstration_is_prompt_and_env_answers_are_env_or_tool():
    demo = [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]
    conversation = [
        *demo,
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "a"},
        {"role": "tool", "content": "4"},
        {"role": "assistant", "content": "b"},
    ]
    two_turns = _trajectory(conversation, [(5, 8), (12, 15)])
    assert message_sources(two_turns) == ["prompt", "prompt", "prompt", "sampled", "tool", "sampled"]
    # an agent segment that rewrote its history: its earlier reply is context now (loss mask 0)
    assert message_sources(_trajectory(conversation, [(12, 15)])) == ["prompt"] * 5 + ["sampled"]
    assert message_sources(_trajectory(demo, [])) == ["prompt", "prompt"]  # never sampled (reset failed)
    more_turns = _trajectory(conversation[2:], [(5, 7), (8, 9), (12, 15)])  # a turn that left no message
    assert message_sources(more_turns) == ["prompt", "sampled", "tool", "sampled"]
    assert [t["message"] for t in episode_record(more_turns)["turns"]] == [None, 1, 3]


def test_a_record_counts_tokens_turns_and_tool_calls_and_moves_unseen_messages_last():
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    trajectory = _trajectory(messages, [(5, 9)], n=12, truncated=True, policy_versions=[-1] * 5 + [3] * 4 + [-1] * 3)
    trajectory.turns[0] = Turn(5, 9, reward=0.5, finish_reason="length", tool_calls=2, tool_errors=1)
    trajectory.info = {"unseen_messages": [{"role": "tool", "content": "late"}], "score": float("nan")}
    record = episode_record(trajectory, index=2, total=float("nan"), components={"f": 1.0}, unscored="no_reward")
    assert record["tokens"] == {"prompt": 5, "sampled": 4, "env": 3}
    assert record["turns"] == [
        {
            "message": 1,
            "tokens": 4,
            "reward": 0.5,
            "finish_reason": "length",
            "tool_calls": 2,
            "tool_errors": 1,
            "policy_version": 3,
        }
    ]
    assert (record["reward"], record["unscored"], record["index"], record["task"]) == (
        None,
        "no_reward",
        2,
        {"answer": "2"},
    )
    assert record["policy_version"] == 3 and record["truncated"] and record["info"] == {"score": None}
    assert [m["source"] for m in record["messages"]] == ["prompt", "sampled", "tool"]
    assert record["messages"][-1]["unseen"] is True
    json.dumps(record, allow_nan=False)  # strict JSON


def test_an_agent_episode_s_advantage_is_the_mean_over_its_rows():
    records = [{"segments": 1}, {}, {}]
    assert [r["advantage"] for r in with_advantages(records, [1.0, 3.0, None, -0.5])] == [2.0, None, -0.5]


def test_trainer_values_go_to_each_episode_s_rows_in_order_on_its_sampled_tokens_only():
    def segment(kind):
        return {"text": ["x"] * len(kind), "kind": kind, "sampler_logprob": [None] * len(kind)}

    records = [{"segments": 1, "token_view": {"segments": [segment("ps"), segment("pse")]}}, {"segments": 0}]
    records.append({"token_view": {"segments": [segment("pss")]}})
    rows = [
        {"trainer_logprob": [0.0, -1.0], "entropy": [9.0, 0.5]},
        {"trainer_logprob": [0.0, -2.0, 7.0], "entropy": [9.0, 0.25, 9.0]},
        {"trainer_logprob": [1.0], "entropy": [1.0]},  # the episode without a token view: its row is skipped
        {"trainer_logprob": [0.0, -3.0, -4.123456], "entropy": [9.0, 1.0, 2.0]},
    ]
    with_trainer_values(records, rows)
    first, second = records[0]["token_view"]["segments"]
    assert first["trainer_logprob"] == [None, -1.0] and first["entropy"] == [None, 0.5]
    assert second["trainer_logprob"] == [None, -2.0, None] and second["entropy"] == [None, 0.25, None]
    (last,) = records[2]["token_view"]["segments"]
    assert last["trainer_logprob"] == [None, -3.0, -4.1235] and last["entropy"] == [None, 1.0, 2.0]
    records = [{"token_view": {"segments": [segment("ps")]}}]
    with_trainer_values(records, [{"trainer_logprob": [0.0], "entropy": [1.0]}])  # a length that differs: left out
    assert "trainer_logprob" not in records[0]["token_view"]["segments"][0]


def _config(model_dir: Path, out: Path, env: str, **overrides) -> TrainConfig:
    base = dict(
        model=str(model_dir),
        env=env,
        max_steps=2,
        prompts_per_step=2,
        num_generations=2,
        max_new_tokens=6,
        eval_tasks=2,
        output_dir=str(out),
        save_model=False,
        checkpoint_every=0,
        plugins=lockstep_plugins(),
        rewards={"agentrl.testing:parity_reward": 1.0},
    )
    base.update(overrides)
    return TrainConfig(**base)


def test_every_episode_of_every_step_is_written_marked_as_its_token_masks_say(tiny_model_dir, tokenizer, tmp_path):
    (tmp_path / "tool_chat.py").write_text(TOOL_ENV)
    (tmp_path / "capture.py").write_text(CAPTURE)
    manager = load_plugins(modules=[str(tmp_path / "capture.py")])
    config = _config(tiny_model_dir, tmp_path / "run", f"{tmp_path / 'tool_chat.py'}:ToolChat", log_tokens="logprobs")
    assert config.log_completions_every == 1  # the default: every step
    Trainer(config, manager).train()
    seen = manager.pm.get_plugins()
    captured = next(p for p in seen if getattr(p, "seen", None) is not None).seen
    records = _lines(tmp_path / "run" / "completions.jsonl")
    assert [r["step"] for r in records] == [1] * 4 + [2] * 4
    trajectories = [t for _, batch in captured for t in batch]
    assert len(trajectories) == len(records)
    for record, trajectory in zip(records, trajectories, strict=True):
        sources = [m["source"] for m in record["messages"]]
        sampled = [m for m in record["messages"] if m["source"] == "sampled"]
        assert sources[:4] == ["prompt"] * 4  # system, the demonstration's question and answer, the question
        assert len(sampled) == len(trajectory.turns) == len(record["turns"])
        for turn, message, entry in zip(trajectory.turns, sampled, record["turns"], strict=True):
            ids = trajectory.token_ids[turn.start : turn.end]
            assert all(trajectory.loss_mask[turn.start : turn.end])  # the message's tokens are the trained ones
            assert message["content"].strip() in tokenizer.decode(ids)
            assert entry["tokens"] == len(ids) and entry["finish_reason"] == turn.finish_reason
            assert record["messages"][entry["message"]] is not None and entry["reward"] == turn.reward
        if len(trajectory.turns) > 1:  # the tool's result, then the env's nudge
            assert sources[5:7] == ["tool", "sampled"] and record["tool_calls"] == record["tool_errors"] == 1
        if record["terminated"]:  # the env's last word, which the model never read, comes last
            assert record["messages"][-1] == {"role": "user", "content": "done", "source": "env", "unseen": True}
            assert sources[-4:] == ["sampled", "env", "sampled", "env"] and len(record["turns"]) == 3
        assert record["tokens"]["sampled"] == sum(trajectory.loss_mask)
        assert record["tokens"]["prompt"] + record["tokens"]["sampled"] + record["tokens"]["env"] == len(
            trajectory.token_ids
        )
        assert record["task"]["id"] == trajectory.task["id"] and record["group"] == trajectory.group
        assert record["rewards"].keys() >= {"parity_reward"} and math.isfinite(record["reward"])
        assert record["advantage"] is not None and math.isfinite(record["advantage"])
        _assert_token_view_is_the_trajectory(record["token_view"], trajectory, tokenizer, trainer=True)
    assert any(r["terminated"] for r in records) and any(len(r["turns"]) > 1 for r in records)
    for step in (1, 2):  # GRPO: a group's advantages add up to zero
        for group in (0, 1):
            pair = [r for r in records if r["step"] == step and r["group"] == group]
            assert [r["index"] for r in pair] == [0, 1] and abs(sum(r["advantage"] for r in pair)) < 1e-4
    evals = _lines(tmp_path / "run" / "eval_completions.jsonl")
    assert [(e["when"], e["step"], e["group"]) for e in evals] == [
        ("before", 0, 0),
        ("before", 0, 1),
        ("after", 2, 0),
        ("after", 2, 1),
    ]
    assert all("advantage" not in e and e["task"]["id"] in ("e0", "e1") for e in evals)
    assert all({"text", "kind", "sampler_logprob"} == e["token_view"]["segments"][0].keys() for e in evals)


def _assert_token_view_is_the_trajectory(view: dict, trajectory: Trajectory, tokenizer, trainer: bool) -> None:
    """Each token's text, its kind as the loss mask says (p before the first sampled token, e after
    it), the sampler's logprob on sampled tokens only; with ``trainer``, the trainer's logprob
    (the same weights here: within float rounding of the sampler's) and an entropy on them."""
    (row,) = view["segments"]
    mask = trajectory.loss_mask
    first = mask.index(1)
    assert row["kind"] == "".join("s" if m else "p" if i < first else "e" for i, m in enumerate(mask))
    assert len(row["text"]) == len(trajectory.token_ids)
    assert row["text"] == [tokenizer.decode([i]) for i in trajectory.token_ids]
    for i, m in enumerate(mask):
        assert (row["sampler_logprob"][i] is None) == (not m)
        if m:
            assert row["sampler_logprob"][i] == round(trajectory.sampler_logprobs[i], 4)
    assert ("trainer_logprob" in row) == ("entropy" in row) == trainer
    if trainer:
        sampled = [i for i, m in enumerate(mask) if m]
        assert [i for i, v in enumerate(row["trainer_logprob"]) if v is not None] == sampled
        assert all(abs(row["trainer_logprob"][i] - row["sampler_logprob"][i]) < 2e-3 for i in sampled)
        assert all(row["entropy"][i] >= 0 for i in sampled) and any(row["entropy"][i] > 0.1 for i in sampled)


def test_the_trainer_s_token_logprobs_change_nothing_the_run_trains(tiny_model_dir, tmp_path):
    """``log_tokens: logprobs`` computes the trainer's logprobs before the update; an algorithm that
    needs them (two optimizer steps per batch) takes those as its old logprobs: the same run."""
    runs = {}
    for mode in ("tokens", "logprobs"):
        out = tmp_path / mode
        config = _config(tiny_model_dir, out, "math", log_tokens=mode, algorithm={"mini_batches": 2}, eval_tasks=0)
        Trainer(config, load_plugins()).train()
        metrics = [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in _lines(out / "metrics.jsonl")]
        runs[mode] = metrics, _lines(out / "completions.jsonl")
    assert runs["tokens"][0] == runs["logprobs"][0] and len(runs["tokens"][0]) == 2
    for plain_line, detailed in zip(runs["tokens"][1], runs["logprobs"][1], strict=True):
        (row,) = detailed.pop("token_view")["segments"]
        assert plain_line.pop("token_view")["segments"][0] == {k: row[k] for k in ("text", "kind", "sampler_logprob")}
        assert plain_line == detailed and row["kind"].count("s") == sum(v is not None for v in row["entropy"])


def test_the_math_env_s_demonstration_is_prompt_and_every_evaluation_is_written(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    args = ["--model", str(tiny_model_dir), "--output-dir", str(run), *TINY, "--max-steps", "2"]
    result = agentrl_in_process(
        "train", *args, "--set", "env_args.demonstration=true", "--set", "eval_tasks=2", "--set", "eval_every=1"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    records = _lines(run / "completions.jsonl")
    assert sorted({r["step"] for r in records}) == [1, 2] and len(records) == 8
    for record in records:
        roles = [(m["role"], m["source"]) for m in record["messages"]]
        assert ("assistant", "prompt") in roles  # the worked example
        assert roles[-1] == ("assistant", "sampled") and [s for _, s in roles].count("sampled") == 1
        (row,) = record["token_view"]["segments"]  # the default, log_tokens: tokens
        assert (
            row.keys() == {"text", "kind", "sampler_logprob"} and row["kind"].count("s") == record["tokens"]["sampled"]
        )
    evals = _lines(run / "eval_completions.jsonl")
    assert [e["when"] for e in evals] == ["before"] * 2 + ["step 1"] * 2 + ["after"] * 2


def test_agentrl_eval_saves_its_episodes_and_names_a_folder_that_is_not_there(tiny_model_dir, tmp_path):
    saved = tmp_path / "episodes.jsonl"
    args = ["eval", "--model", str(tiny_model_dir), "--num-tasks", "3", "--max-new-tokens", "4"]
    result = agentrl_in_process(*args, "--save-episodes", str(saved))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = _lines(saved)
    assert [(e["when"], e["group"]) for e in lines] == [("eval", 0), ("eval", 1), ("eval", 2)]
    assert all([m["source"] for m in e["messages"]] == ["prompt", "sampled"] for e in lines)
    assert all(e["token_view"]["segments"][0]["kind"].count("s") == e["tokens"]["sampled"] for e in lines)
    missing = tmp_path / "nowhere" / "episodes.jsonl"
    assert_one_line(
        cli(*args, "--save-episodes", str(missing)), f"--save-episodes {str(missing)!r}: its folder does not exist"
    )
