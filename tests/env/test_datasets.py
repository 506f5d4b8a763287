"""Tasks from datasets: every file format, a saved ``datasets.Dataset``, rows in memory; held-out
splits that never overlap training; one clear line for each bad input."""

from __future__ import annotations

import json

import datasets
import pytest

from agentrl import ConfigError
from agentrl.env.datasets import dataset_splits, read_rows, use_dataset
from agentrl.env.tasks import task_key
from agentrl_dataset import DatasetEnv

ROWS = [{"prompt": f"What is {a} + {b}?", "answer": str(a + b), "level": a % 3} for a in range(8) for b in range(2)]


def write(tmp_path, suffix):
    """ROWS written as one file of the format ``suffix``; its path."""
    path = tmp_path / f"tasks{suffix}"
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    elif suffix == ".json":
        path.write_text(json.dumps(ROWS))
    elif suffix == ".csv":
        datasets.Dataset.from_list(ROWS).to_csv(str(path), index=False)
    else:
        datasets.Dataset.from_list(ROWS).to_parquet(str(path))
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv", ".parquet"])
def test_each_file_format_reads_every_row_with_every_column(tmp_path, suffix):
    rows, held_out = read_rows(write(tmp_path, suffix))
    assert held_out is None and len(rows) == len(ROWS)
    # CSV has no types: its numbers come back as text, as pandas/TRL users know it
    expected = [{k: str(v) for k, v in row.items()} for row in ROWS] if suffix == ".csv" else ROWS
    assert rows == expected


def test_a_saved_dataset_dict_gives_its_train_and_test_splits(tmp_path):
    splits = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(ROWS[:12]), "test": datasets.Dataset.from_list(ROWS[12:])}
    )
    splits.save_to_disk(str(tmp_path / "saved"))
    rows, held_out = read_rows(str(tmp_path / "saved"))
    assert rows == ROWS[:12] and held_out == ROWS[12:]
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "one"))
    assert read_rows(tmp_path / "one") == (ROWS, None)


def test_rows_in_memory_a_list_or_a_dataset_object():
    assert read_rows(ROWS) == (ROWS, None)
    assert read_rows(datasets.Dataset.from_list(ROWS)) == (ROWS, None)
    with pytest.raises(ConfigError, match=r"dataset: int is not a dataset; give a path"):
        read_rows(3)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("bad.jsonl", '{"prompt": "a"}\n{"prompt": \n', r"bad\.jsonl', line 2: not valid JSON"),
        ("list.jsonl", '{"prompt": "a"}\n[1, 2]\n', r"row 2: expected an object of named columns, got \[1, 2\]"),
        ("obj.json", '{"prompt": "a"}', r"expected a JSON list of objects, got dict"),
        ("empty.jsonl", "\n", r"holds no rows"),
        ("tasks.txt", "hello", r"unknown format '\.txt'; give \.jsonl, \.json, \.csv, \.parquet"),
    ],
)
def test_bad_files_are_one_line_naming_the_file_and_the_row(tmp_path, name, text, message):
    (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError, match=message) as caught:
        read_rows(tmp_path / name)
    assert "\n" not in str(caught.value) and name in str(caught.value)


def test_a_missing_path_says_what_a_dataset_may_be(tmp_path):
    with pytest.raises(ConfigError, match=r"'.*nope\.jsonl' does not exist; give \.jsonl"):
        read_rows(str(tmp_path / "nope.jsonl"))


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_a_held_out_fraction_never_overlaps_training_and_is_seeded(seed):
    rows = ROWS + ROWS[:4]  # duplicated tasks must fall on one side
    train, held_out = dataset_splits(rows, None, 0.25, seed)
    assert {task_key(r) for r in train}.isdisjoint({task_key(r) for r in held_out})
    assert len(train) + len(held_out) == len(rows)
    assert len({task_key(r) for r in held_out}) == 4  # a quarter of the 16 distinct tasks
    assert dataset_splits(rows, None, 0.25, seed) == (train, held_out)
    assert [r for r in rows if r in train] == train  # training keeps the file's order


def test_the_split_differs_by_seed_and_holds_at_least_one():
    splits = {tuple(task_key(r) for r in dataset_splits(ROWS, None, 0.25, seed)[1]) for seed in range(5)}
    assert len(splits) > 1
    assert len(dataset_splits(ROWS, None, 0.01, 0)[1]) == 1
    assert dataset_splits(ROWS, None, 0.0, 0) == (ROWS, [])


def test_given_held_out_rows_that_are_also_training_rows_are_refused():
    with pytest.raises(ConfigError, match=r"1 held-out task\(s\) are also training tasks .*What is 0 \+ 1"):
        dataset_splits(ROWS[1:], ROWS[:2], 0.1, 0)
    assert dataset_splits(ROWS[2:], ROWS[:2], 0.1, 0) == (ROWS[2:], ROWS[:2])


def test_the_dataset_env_runs_a_row_and_scores_its_answer(tmp_path):
    env = use_dataset(DatasetEnv(system_prompt="Be brief."), {"path": str(write(tmp_path, ".jsonl"))})
    assert env.scores_episodes and len(env.train_tasks()) + len(env.eval_tasks()) == len(ROWS)
    task = env.train_tasks()[0]
    messages, info = env.reset(options={"task": task})
    assert messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": task["prompt"]}]
    assert info["task"]["level"] == task["level"]
    *_, reward, terminated, _, info = (None, *env.step(f"so \\boxed{{{task['answer']}}}"))[1:]
    assert (reward, terminated, info) == (1.0, True, {"correct": True})
    env.reset(options={"task": task})
    assert env.step("no idea")[1] == 0.0


def test_the_dataset_env_takes_messages_and_refuses_rows_without_a_prompt():
    env = DatasetEnv()
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]
    env.use_tasks([{"messages": chat}], [])
    assert env.reset(options={"task": {"messages": chat}})[0] == chat and not env.scores_episodes
    with pytest.raises(ConfigError, match=r"no 'prompt' / 'messages' / 'question' column \(columns: text\)"):
        DatasetEnv().use_tasks([{"text": "x"}], [])
    with pytest.raises(ConfigError, match=r"row 2: 'prompt' must be a non-empty string"):
        DatasetEnv().use_tasks([{"prompt": "a"}, {"prompt": ""}], [])
    with pytest.raises(ConfigError, match=r"takes its tasks from a dataset: agentrl train --dataset"):
        DatasetEnv().train_tasks()


def test_a_tool_env_runs_dataset_rows_as_its_tasks_and_its_gold_episode_scores():
    from agentrl.testing import check_env
    from agentrl_tool_envs import CalculatorEnv

    rows = [{"question": f"What is {a} * 7 + 3?", "answer": str(a * 7 + 3)} for a in range(20, 30)]
    env = CalculatorEnv()
    train, held_out = dataset_splits(rows, None, 0.2, 0)
    env.use_tasks(train, held_out)
    assert list(env.train_tasks()) == train and list(env.eval_tasks()) == held_out
    messages, _ = env.reset(options={"task": train[0]})
    assert messages[-1]["content"] == train[0]["question"]
    check_env(lambda: _with_tasks(CalculatorEnv(), train, held_out))  # the gold episode, through the tool, scores 1


def _with_tasks(env, train, held_out):
    env.use_tasks(train, held_out)
    return env


def test_the_dataset_env_passes_check_env_on_rows_with_answers():
    from agentrl.testing import check_env

    train, held_out = dataset_splits(ROWS, None, 0.25, 0)
    check_env(lambda: _with_tasks(DatasetEnv(), train, held_out))  # its gold reply, boxed, scores 1
