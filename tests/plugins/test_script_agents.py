"""Agents as they are written: a script's ``run_agent(question, base_url, model=..., max_turns=...)``
returning its answer text trains unchanged with the ``openai_agent`` rollout; a signature that
cannot be called with the task is refused at start-up, in one line, with the fix."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from cli_in_process import agentrl_in_process

from agentrl import ConfigError, EnvError, SamplingParams
from agentrl.config.train import TrainConfig
from agentrl.plugins import load_plugins
from agentrl.testing import build_tiny_model
from agentrl.training.build import make_env
from agentrl_openai_agent.scoring import with_final_answer
from agentrl_openai_agent.signature import agent_call, call_shown

FIELDS = {"question", "answer"}


def run_agent(question: str, base_url: str, model: str = "gpt-4o-mini", max_turns: int = 5) -> str:
    """The script shape: a field by name, then the URL, the model and the turns by keyword."""


def run(q, base_url):
    """A first parameter that names no field: the whole task, unless task_field says which field."""


def solve(task, client):
    """The task dict and the client."""


def typed(question: dict, base_url: str, retries: int = 2):
    """Annotated as the task dict, whatever its name; an unknown parameter with a default keeps it."""


def llm_second(task, llm, /, *, api_key, verbose=False):
    """A second positional parameter of another name gets the client, as always; api_key by keyword."""


def text_first(prompt, verbose=False, *, client=None):
    """A field-taking first parameter: an unknown second with a default keeps it."""


def varargs(*args):
    """Takes anything: called as fn(task, client)."""


def only_task(task):
    """Builds its own client from OPENAI_BASE_URL / OPENAI_API_KEY."""


@pytest.mark.parametrize(
    ("fn", "task_field", "plan"),
    [
        (run_agent, None, {"field": "question", "positional": [], "keywords": ["base_url", "model", "max_turns"]}),
        (run, None, {"field": None, "positional": [], "keywords": ["base_url"]}),
        (run, "question", {"field": "question", "positional": [], "keywords": ["base_url"]}),
        (solve, None, {"field": None, "positional": [], "keywords": ["client"]}),
        (typed, None, {"field": None, "positional": [], "keywords": ["base_url"]}),
        (llm_second, None, {"field": None, "positional": ["client"], "keywords": ["api_key"]}),
        (text_first, "answer", {"field": "answer", "positional": [], "keywords": ["client"]}),
        (varargs, None, {"field": None, "positional": ["client"], "keywords": []}),
        (only_task, None, {"field": None, "positional": [], "keywords": []}),
    ],
)
def test_what_the_agent_is_passed_is_decided_from_its_signature(fn, task_field, plan):
    assert agent_call(f"agent.py:{fn.__name__}", fn, FIELDS, task_field) == plan


def test_the_call_is_said_as_it_will_be_made():
    plan = agent_call("agent.py:run_agent", run_agent, FIELDS)
    assert call_shown("agent.py:run_agent", {**plan, "values": {"model": "tiny", "max_turns": 3}}) == (
        "run_agent(task['question'], base_url=<episode URL>, model='tiny', max_turns=3)"
    )
    assert call_shown("agent.py:llm_second", {**agent_call("a:llm_second", llm_second, FIELDS), "values": {}}) == (
        "llm_second(task, <episode client>, api_key=<episode key>)"
    )


def needs_secret(question, base_url, secret_key):
    """A required parameter agentrl cannot fill."""


def asks_query(query: str, base_url):
    """A str first parameter named after no field of the tasks."""


def keywords_only(*, question, base_url):
    """No positional parameter for the task."""


def asks_turns(question, base_url, max_turns):
    """max_turns required, but the run has no value for it (no env, no setting)."""


@pytest.mark.parametrize(
    ("fn", "task_field", "fillable", "refused"),
    [
        (
            needs_secret,
            None,
            None,
            "agent agent.py:needs_secret takes (question, base_url, secret_key): agentrl cannot fill secret_key: it "
            "passes the task first (whole, or the field the first parameter names), then base_url, client, model, "
            "max_turns and api_key by name; give secret_key a default value or compute it inside the function "
            "(from the task, os.environ)",
        ),
        (
            asks_query,
            None,
            None,
            "agent agent.py:asks_query takes (query, base_url): its first parameter query: str takes a task field, "
            "but the tasks have no 'query' field (they have answer, question): rename it to the field it takes or "
            "set plugins.openai_agent.task_field=question (or name it task, unannotated, for the whole task dict)",
        ),
        (
            run,
            "prompt",
            None,
            "plugins.openai_agent.task_field='prompt' is not a field of the tasks (they have answer, question): set "
            "it to the field agent agent.py:run's first parameter q takes",
        ),
        (
            typed,
            "question",
            None,
            "agent agent.py:typed takes (question, base_url, retries): its first parameter question is annotated as "
            "the task dict, but plugins.openai_agent.task_field='question' passes that field's value: drop the "
            "annotation or the setting",
        ),
        (
            keywords_only,
            None,
            None,
            "agent agent.py:keywords_only takes (question, base_url): it has no positional parameter for the task: "
            "agentrl passes the task first (whole, or the field the first parameter names), then base_url, client, "
            "model, max_turns and api_key by name; write def keywords_only(task, client) or def "
            "keywords_only(question, base_url)",
        ),
        (asks_turns, None, ("base_url", "client", "api_key", "model"), "agent agent.py:asks_turns takes (question, "),
    ],
)
def test_a_signature_that_cannot_be_called_with_the_task_is_refused_with_the_fix(fn, task_field, fillable, refused):
    with pytest.raises(ConfigError) as caught:
        agent_call(f"agent.py:{fn.__name__}", fn, FIELDS, task_field, *([fillable] if fillable else []))
    assert str(caught.value).startswith(refused) and "\n" not in str(caught.value)
    if fn is asks_turns:
        assert "cannot fill max_turns" in str(caught.value)


def test_field_checks_wait_for_the_tasks_the_rest_is_checked_at_once():
    """Before the tasks are known (the rollout's start) a field name is taken at its word."""
    assert agent_call("agent.py:asks_query", asks_query, None)["field"] == "query"
    with pytest.raises(ConfigError, match="cannot fill secret_key"):
        agent_call("agent.py:needs_secret", needs_secret, None)


def test_a_returned_answer_replaces_the_last_assistant_message():
    conversation = [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
        {"role": "assistant", "content": "It is five, so \\boxed{5}."},
    ]
    assert with_final_answer(conversation, "5") == conversation[:3] + [{"role": "assistant", "content": "5"}]
    assert with_final_answer(conversation[:1], "5") == conversation[:1] + [{"role": "assistant", "content": "5"}]


SCRIPT = r"""
import re

import openai


def run_agent(question: str, base_url: str, model: str = "gpt-4o-mini", max_turns: int = 5) -> str:
    client = openai.OpenAI(base_url=base_url, api_key="x")
    messages = [{"role": "user", "content": question}]
    for _ in range(max_turns):
        reply = client.chat.completions.create(model=model, messages=messages, max_tokens=4)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
        messages.append({"role": "user", "content": "Check it once more."})
    a, op, b = re.search(r"What is (-?\d+) ([-+*]) (-?\d+)", question).groups()
    return "The answer is \\boxed{" + str(eval(f"{a} {op} {b}")) + "}."
"""
"""A new user's agent script, as written: a field, the URL, the model and the turns; its answer text back."""


def _write(tmp_path, body: str, name: str = "agent.py") -> str:
    path = tmp_path / name
    path.write_text(body)
    return str(path)


def _rollout(tokenizer, options: dict[str, Any], **config: Any):
    plugins = load_plugins()
    engine = plugins.registry.get("engine", "hf").factory(
        model=build_tiny_model(len(tokenizer)),
        tokenizer=tokenizer,
        config=TrainConfig(engine_args={"dtype": "float32"}),
    )
    train = TrainConfig(**{"max_new_tokens": 4, "plugins": {"openai_agent": options}, **config})
    return plugins.registry.get("rollout", "openai_agent").factory(engine=engine, tokenizer=tokenizer, config=train)


def _math(n: int) -> tuple[list[Any], list[dict[str, Any]]]:
    env = make_env(load_plugins(), TrainConfig(env="math"))
    return [make_env(load_plugins(), TrainConfig(env="math")) for _ in range(n)], [
        dict(t) for t in list(env.eval_tasks())[3 : 3 + n]
    ]


ECHO = """
import json


def run_agent(question: str, base_url: str, *, model, max_turns, api_key, client, tries=7):
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": question}])
    return json.dumps({"question": question, "base_url": base_url, "model": model, "max_turns": max_turns,
                       "api_key": api_key, "client_key": client.api_key, "tries": tries})


async def asking(prompt, client):
    reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": prompt}])
    return type(client).__name__ + " " + reply.model
"""


def test_each_parameter_gets_what_it_names_and_the_answer_is_what_is_scored(tokenizer, tmp_path, capfd):
    envs, tasks = _math(2)
    rollout = _rollout(tokenizer, {"agent": _write(tmp_path, ECHO) + ":run_agent"}, model="tiny-policy")
    trajectories = rollout.run(envs, tasks, [0, 1], SamplingParams(seed=0))
    assert "openai_agent: calling run_agent(task['question'], base_url=<episode URL>, model='tiny-policy', " in (
        capfd.readouterr().err
    )
    for trajectory, task in zip(trajectories, tasks):
        answer = json.loads(trajectory.completion_text)  # the returned text is the final assistant message
        assert answer["question"] == task["question"] and answer["model"] == "tiny-policy"
        assert answer["max_turns"] == 1 == envs[0].max_turns and answer["tries"] == 7  # the env's; its default kept
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/[\w-]+/episode-\d-[\w-]+/v1", answer["base_url"])
        assert answer["api_key"] == answer["client_key"] and answer["api_key"].startswith("agentrl-episode-")
        assert trajectory.info["agent_calls"] == 1 and trajectory.info["env_scored"]
    rollout.close()
    asking = _rollout(tokenizer, {"agent": _write(tmp_path, ECHO) + ":asking", "task_field": "question"})
    [trajectory] = asking.run([None], tasks[:1], [0], SamplingParams(seed=0))
    assert trajectory.completion_text == "AsyncOpenAI m"
    asking.close()


def test_the_max_turns_setting_and_a_correct_answer_returned_as_text(tokenizer, tmp_path):
    envs, tasks = _math(2)
    rollout = _rollout(tokenizer, {"agent": _write(tmp_path, SCRIPT) + ":run_agent", "max_turns": 3})
    trajectories = rollout.run(envs, tasks, [0, 1], SamplingParams(seed=0))
    assert [t.info["agent_calls"] for t in trajectories] == [3, 3]
    assert [t.completion_text for t in trajectories] == [f"The answer is \\boxed{{{t['answer']}}}." for t in tasks]
    assert [t.env_return for t in trajectories] == [1.0, 1.0]  # the tiny model's own replies box nothing
    assert all(t.info["correct"] for t in trajectories)
    rollout.close()


def test_a_task_without_the_field_is_one_line_naming_it(tokenizer, tmp_path):
    rollout = _rollout(tokenizer, {"agent": _write(tmp_path, SCRIPT) + ":run_agent"})
    envs, tasks = _math(2)
    rollout.run(envs, tasks, [0, 1], SamplingParams(seed=0))
    with pytest.raises(EnvError) as caught:
        rollout.run(envs[:1], [{"prompt": "What is 1 + 1?"}], [0], SamplingParams(seed=0))
    assert str(caught.value).startswith(
        "sample 0 (task 'What is 1 + 1?') has no 'question' field, which agent "
    ) and str(caught.value).endswith(
        ":run_agent's first parameter takes (plugins.openai_agent.task_field names "
        "another, or name the parameter task for the whole dict)"
    )
    rollout.close()


def _train(workdir, agent: str, *extra: str, steps: int = 2):
    out = workdir / f"run-{agent.partition('.')[0]}"
    return out, agentrl_in_process(
        "train",
        "--env",
        "math",
        "--model",
        str(workdir.parent / "model"),
        "--max-steps",
        str(steps),
        "--num-generations",
        "2",
        "--prompts-per-step",
        "2",
        "--output-dir",
        str(out),
        "--set",
        "rollout=openai_agent",
        "--set",
        f"plugins.openai_agent.agent={agent}",
        "--set",
        "max_new_tokens=4",
        "--set",
        "save_model=false",
        *extra,
        cwd=workdir,
    )


@pytest.fixture
def workdir(tmp_path, tiny_model_dir):
    """A folder for the agent file and the run, beside a link to the tiny model."""
    (tmp_path / "model").symlink_to(tiny_model_dir)
    (tmp_path / "work").mkdir()
    return tmp_path / "work"


def test_a_script_agent_trains_through_the_cli_with_no_glue(workdir):
    (workdir / "agent.py").write_text(SCRIPT)
    out, result = _train(
        workdir, "agent.py:run_agent", "--set", "plugins.openai_agent.max_turns=2", "--set", "eval_tasks=2"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "openai_agent: calling run_agent(task['question'], base_url=<episode URL>, model=" in result.stderr
    assert ", max_turns=2)" in result.stderr
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [line for line in lines if "loss/total" in line]
    assert len(train) == 2
    for line in train:  # every episode scored on the returned text: the env's check and the accuracy reward
        assert line["reward/env_mean"] == 1.0 and line["reward/accuracy_mean"] == 1.0
    evals = json.loads((out / "eval.json").read_text())
    assert evals["before"]["eval/accuracy"] == evals["after"]["eval/accuracy"] == 1.0


def test_an_agent_that_cannot_be_called_is_refused_before_any_episode_runs(workdir):
    (workdir / "needs.py").write_text("def run(question, base_url, secret_key):\n    raise SystemExit('ran')\n")
    _, result = _train(workdir, "needs.py:run", steps=1)
    assert result.returncode == 2, result.stdout + result.stderr
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "agent needs.py:run takes (question, base_url, secret_key): agentrl cannot fill secret_key: it passes the "
            "task first (whole, or the field the first parameter names), then base_url, client, model, max_turns and "
            "api_key by name; give secret_key a default value or compute it inside the function (from the task, "
            "os.environ)"
        )
    )
    (workdir / "asks.py").write_text("def run(query: str, base_url):\n    raise SystemExit('ran')\n")
    _, result = _train(workdir, "asks.py:run", steps=1)
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1].endswith(
        "set plugins.openai_agent.task_field=question (or name it task, unannotated, for the whole task dict)"
    ), result.stdout + result.stderr
