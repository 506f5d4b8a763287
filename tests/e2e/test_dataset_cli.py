"""``agentrl train --dataset``: a JSONL and a saved ``datasets.Dataset`` as single-turn tasks and as
an agent program's tasks, a given held-out split, and one line for each bad dataset."""

from __future__ import annotations

import json

import datasets
import pytest
import yaml
from cli_in_process import agentrl_in_process

SUMS = [{"question": f"What is {a} + {b}?", "answer": str(a + b), "level": a % 2} for a in range(6) for b in range(3)]
SMALL = ["--max-steps", "2", "--num-generations", "2", "--prompts-per-step", "2", "--set", "max_new_tokens=6"]
AGENT = """
import re

import openai


def run_agent(question: str, base_url: str, model: str = "gpt-4o-mini", max_turns: int = 3) -> str:
    client = openai.OpenAI(base_url=base_url, api_key="x")
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": question}], max_tokens=4)
    a, b = re.search(r"What is (\\d+) \\+ (\\d+)", question).groups()
    return reply.choices[0].message.content + " so \\\\boxed{" + str(int(a) + int(b)) + "}"
"""


def jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def lines(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def work(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path, ["--model", str(tiny_model_dir), *SMALL]


def test_a_jsonl_with_a_given_held_out_file_trains_single_turn(work):
    folder, flags = work
    jsonl(folder / "train.jsonl", SUMS[:14])
    jsonl(folder / "held.jsonl", SUMS[14:])
    result = agentrl_in_process(
        "train", "--dataset", "train.jsonl", "--eval-dataset", "held.jsonl", *flags, "--output-dir", "run"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "agentrl grpo on dataset with" in result.stdout and "on 4 held-out tasks" in result.stdout
    config = yaml.safe_load((folder / "run" / "config.yaml").read_text())
    assert config["env"] == "dataset"
    assert config["dataset"] == {"path": str(folder / "train.jsonl"), "eval_path": str(folder / "held.jsonl")}
    rows = lines(folder / "run")
    assert [row["step"] for row in rows if "loss/total" in row] == [1, 2] and "reward/env_mean" in rows[0]
    sampled = [json.loads(line) for line in (folder / "run" / "completions.jsonl").read_text().splitlines()]
    trained_on = {m["content"] for line in sampled for m in line["messages"] if m["role"] == "user"}
    assert trained_on and trained_on <= {row["question"] for row in SUMS[:14]}  # never a held-out one


REWARDS = '''
def level_bonus(completions, level, **kwargs):
    """TRL-style: reads the dataset's level column."""
    return [0.5 * int(value) for value in level]
'''


def test_a_saved_dataset_folder_with_a_trl_reward_reading_a_column(work):
    folder, flags = work
    datasets.Dataset.from_list(SUMS).save_to_disk(str(folder / "sums"))
    (folder / "rewards.py").write_text(REWARDS)
    result = agentrl_in_process(
        "train", "--dataset", "sums", "--reward", "rewards.py:level_bonus", *flags, "--output-dir", "run"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rewards: env return x1 + level_bonus x1" in result.stdout
    bonus = [row["reward/level_bonus_mean"] for row in lines(folder / "run") if "reward/level_bonus_mean" in row]
    assert len(bonus) == 2 and all(value in (0.0, 0.25, 0.5) for value in bonus)


def test_dataset_rows_as_the_tasks_of_an_agent_program(work):
    folder, flags = work
    jsonl(folder / "tasks.jsonl", SUMS)
    (folder / "agent.py").write_text(AGENT)
    result = agentrl_in_process(
        "train", "--dataset", "tasks.jsonl", *flags, "--output-dir", "run", "--set", "rollout=openai_agent",
        "--set", "plugins.openai_agent.agent=agent.py:run_agent", "--set", "eval_tasks=2", "--set", "save_model=false",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    trained = [row for row in lines(folder / "run") if "loss/total" in row]
    assert len(trained) == 2 and all(row["reward/env_mean"] == 1.0 for row in trained)  # its answers, scored


@pytest.mark.parametrize(
    ("setup", "args", "message"),
    [
        (
            lambda f: jsonl(f / "plain.jsonl", [{"prompt": f"Say {i}"} for i in range(4)]),
            ["--dataset", "plain.jsonl"],
            "env 'dataset' does not score episodes itself and no reward was given: give --reward NAME",
        ),
        (
            lambda f: (jsonl(f / "a.jsonl", SUMS), jsonl(f / "b.jsonl", SUMS[:2])),
            ["--dataset", "a.jsonl", "--eval-dataset", "b.jsonl"],
            "2 held-out task(s) are also training tasks",
        ),
        (
            lambda f: (f / "bad.jsonl").write_text('{"prompt": "a"}\n{oops\n'),
            ["--dataset", "bad.jsonl"],
            "bad.jsonl', line 2: not valid JSON",
        ),
        (lambda f: None, ["--dataset", "missing.jsonl"], "missing.jsonl' does not exist; give .jsonl, .json"),
        (
            lambda f: jsonl(f / "cols.jsonl", [{"text": "a"}, {"text": "b"}]),
            ["--dataset", "cols.jsonl", "--reward", "format"],
            "dataset rows have no 'prompt' / 'messages' / 'question' column (columns: text)",
        ),
    ],
    ids=["no-reward", "overlap", "bad-line", "missing", "no-prompt-column"],
)
def test_a_bad_dataset_is_one_line_and_writes_no_run(work, setup, args, message):
    folder, flags = work
    setup(folder)
    result = agentrl_in_process("train", *args, *flags, "--output-dir", "run")
    assert result.returncode == 2, result.stdout + result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and message in last, result.stderr
    assert not (folder / "run" / "metrics.jsonl").exists()
