"""The Python API: ``agentrl.train`` and ``agentrl.Trainer`` give the runs ``agentrl train`` gives,
take Python objects where the CLI takes names, and step a run by hand."""

from __future__ import annotations

import json

import datasets
import pytest
import yaml
from cli_in_process import agentrl_in_process

import agentrl
from agentrl import ConfigError
from agentrl.api.objects import agent_spec
from agentrl.env.tasks import task_key

SMALL = {"max_steps": 2, "num_generations": 2, "prompts_per_step": 2, "eval_tasks": 4, "max_new_tokens": 8}
FLAGS = ["--max-steps", "2", "--num-generations", "2", "--prompts-per-step", "2"]
FLAGS += ["--set", "eval_tasks=4", "--set", "max_new_tokens=8"]


def metrics(run_dir):
    """Each metrics.jsonl row but the timings and memory (``perf/*``), which differ run to run."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in rows]


def test_the_cli_and_the_api_give_the_same_metrics(tiny_model_dir, tmp_path):
    cli = agentrl_in_process(
        "train", "--env", "math", "--model", str(tiny_model_dir), *FLAGS, "--output-dir", str(tmp_path / "cli")
    )
    assert cli.returncode == 0, cli.stderr
    result = agentrl.train(env="math", model=str(tiny_model_dir), output_dir=str(tmp_path / "api"), **SMALL)
    assert isinstance(result, agentrl.TrainResult) and result.run_dir == tmp_path / "api"
    assert metrics(tmp_path / "api") == metrics(tmp_path / "cli") and len(result.history) == 2
    assert yaml.safe_load((tmp_path / "api" / "config.yaml").read_text()) == {
        **yaml.safe_load((tmp_path / "cli" / "config.yaml").read_text()),
        "output_dir": str(tmp_path / "api"),
    }


def test_steps_taken_by_hand_equal_a_whole_run(tiny_model_dir, tmp_path):
    whole = agentrl.train(model=str(tiny_model_dir), output_dir=str(tmp_path / "whole"), verbose=False, **SMALL)
    with agentrl.Trainer(model=str(tiny_model_dir), output_dir=str(tmp_path / "steps"), verbose=False, **SMALL) as t:
        first = t.train_step()
        assert t.step == 1 and first["reward/total_mean"] == whole.history[0]["reward/total_mean"]
        assert t.evaluate()["eval/num_tasks"] == 4
        assert t.save().name == "step-000001"
        result = t.train()  # the step left, then what a whole run does at its end
    assert metrics(tmp_path / "steps") == metrics(tmp_path / "whole")
    assert result.eval_after == whole.eval_after and (tmp_path / "steps" / "eval.json").is_file()
    with pytest.raises(ConfigError, match="the run has done its max_steps=2 steps"):
        t.train_step()


def mentions_topic(completions, topic, **kwargs):
    """TRL-style: the reply names the row's topic."""
    return [float(t in c[-1]["content"]) for c, t in zip(completions, topic)]


def test_rows_in_memory_and_a_trl_reward_train_and_are_kept_in_the_run_dir(tiny_model_dir, tmp_path):
    rows = [{"prompt": f"Say something about {t}.", "topic": t} for t in "abcdefghijklmnopqrst"]
    with agentrl.Trainer(
        dataset=rows, rewards=[mentions_topic], model=str(tiny_model_dir), output_dir=str(tmp_path / "run"), **SMALL
    ) as trainer:
        env = trainer.run_trainer.envs[0]
        train, held_out = env.train_tasks(), env.eval_tasks()
        assert len(held_out) == 2 and len(train) == 18  # a seeded tenth held out
        assert {task_key(r) for r in train}.isdisjoint(task_key(r) for r in held_out)
        result = trainer.train()
    stored = tmp_path / "run" / "dataset" / "train.jsonl"
    assert [json.loads(line) for line in stored.read_text().splitlines()] == rows
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert config["dataset"]["path"] == str(stored) and config["env"] == "dataset"
    assert config["rewards"] == {"mentions_topic": 1.0}
    assert "reward/mentions_topic_mean" in result.history[0]


def test_a_dataset_dict_gives_its_test_split_as_the_held_out_tasks(tiny_model_dir, tmp_path):
    rows = [{"question": f"What is {a} + 1?", "answer": str(a + 1)} for a in range(12)]
    splits = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(rows[:9]), "test": datasets.Dataset.from_list(rows[9:])}
    )
    with agentrl.Trainer(
        env="math", dataset=splits, model=str(tiny_model_dir), output_dir=str(tmp_path / "run"), verbose=False, **SMALL
    ) as trainer:
        env = trainer.run_trainer.envs[0]  # the math env, on the dataset's rows
        assert list(env.train_tasks()) == rows[:9] and list(env.eval_tasks()) == rows[9:]
    assert (tmp_path / "run" / "dataset" / "eval.jsonl").is_file()


class CountingEnv(agentrl.Env):
    """A one-turn env given as a class: the reply's length in words is its reward."""

    def train_tasks(self):
        return [{"question": f"Say {i} words."} for i in range(8)]

    def eval_tasks(self):
        return [{"question": "Say 9 words."}]

    def start(self, task):
        return [{"role": "user", "content": task["question"]}]

    def respond(self, text):
        return [], float(len(text.split())), True, {}


def test_an_env_class_and_an_instance_are_registered_under_their_class_name(tiny_model_dir, tmp_path):
    for i, env in enumerate([CountingEnv, CountingEnv()]):
        result = agentrl.train(
            env=env, model=str(tiny_model_dir), output_dir=str(tmp_path / f"run{i}"), verbose=False, **SMALL
        )
        assert yaml.safe_load((tmp_path / f"run{i}" / "config.yaml").read_text())["env"] == "CountingEnv"
        assert result.history[0]["reward/env_mean"] > 0


def accuracy(trajectories):
    return [1.0 for _ in trajectories]


def test_a_reward_function_named_as_an_installed_one_is_refused(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"reward 'accuracy': an installed plugin \('rewards'\) already has"):
        agentrl.Trainer(rewards=accuracy, model=str(tiny_model_dir), output_dir=str(tmp_path / "run"), **SMALL)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_an_agent_its_workers_could_not_import_is_refused_with_the_fix():
    def nested(question, base_url):
        return ""

    with pytest.raises(ConfigError, match=r"must be a top-level function .* agent='agent.py:run_agent'"):
        agent_spec(nested)
    assert agent_spec(mentions_topic) == f"{__file__}:mentions_topic"
    assert agent_spec("agent.py:run") == "agent.py:run"


def test_a_run_resumed_from_python_or_the_cli_equals_a_straight_one(tiny_model_dir, tmp_path):
    rows = [{"prompt": f"Say something about {t}.", "topic": t} for t in "abcdefghijkl"]
    for way, rewards in (("python", [mentions_topic]), ("cli", ["format"])):
        common = {"dataset": rows, "reward_funcs": rewards, "model": str(tiny_model_dir), "verbose": False}
        agentrl.train(output_dir=str(tmp_path / f"straight-{way}"), **common, **SMALL)
        run_dir = tmp_path / way
        agentrl.train(output_dir=str(run_dir), checkpoint_every=1, **common, **{**SMALL, "max_steps": 1})
        if way == "python":  # the same objects again, registered by name; the run's own config for the rest
            agentrl.train(resume=run_dir, max_steps=2, rewards=[mentions_topic], verbose=False)
        else:  # everything by name, the rows in the run dir: the CLI continues it
            resumed = agentrl_in_process("train", "--resume", str(run_dir), "--max-steps", "2")
            assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert metrics(run_dir) == metrics(tmp_path / f"straight-{way}")


def test_trl_names_for_rewards_and_the_dataset_and_plugin_objects(tiny_model_dir, tmp_path):
    seen = []

    class StepCounter:
        """A plugin given as an object: it sees each step end."""

        @agentrl.hookimpl
        def agentrl_on_step_end(self, step, metrics):
            seen.append(step)

    rows = [{"prompt": f"Say {t}.", "topic": t} for t in "abcdefgh"]
    result = agentrl.train(
        train_dataset=rows, reward_funcs=mentions_topic, plugins=[StepCounter()], model=str(tiny_model_dir),
        output_dir=str(tmp_path / "run"), verbose=False, **SMALL,
    )  # fmt: skip
    assert seen == [1, 2] and "reward/mentions_topic_mean" in result.history[-1]
    with pytest.raises(ConfigError, match="rewards and reward_funcs name the same thing: give one of them"):
        agentrl.Trainer(rewards=["format"], reward_funcs=[mentions_topic])
    with pytest.raises(ConfigError, match=r"resume continues the run with its own config; drop seed"):
        agentrl.Trainer(resume=tmp_path / "run", seed=3)
