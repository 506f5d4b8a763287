"""The ``openai_agent`` endpoint: every request body validated (a 400 naming the field), no
traceback in the run's log, and an episode's record written only by its own live agent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from agentrl import SamplingParams
from agentrl.config.train import TrainConfig
from agentrl.plugins import load_plugins
from agentrl.testing import build_tiny_model
from agentrl_openai_agent import server as endpoint
from agentrl_openai_agent.server import BackgroundServer, make_app

M = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": "{}"}}

MALFORMED = [  # (what, body: a JSON text or an object, the field the 400 must name)
    ("a message without a role", {"messages": [{"content": "x"}]}, "messages[0].role"),
    ("an unknown role", {"messages": [{"role": "hacker", "content": "x"}]}, "messages[0].role"),
    ("the deprecated function role", {"messages": [{"role": "function", "content": "x"}]}, "messages[0].role"),
    ("integer content", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ("a message that is a string", {"messages": ["hi"]}, "messages[0]"),
    ("no messages", {"model": "m"}, "messages"),
    ("empty messages", {"messages": []}, "messages"),
    ("messages as a string", {"messages": "hi"}, "messages"),
    ("an image part", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content"),
    (
        "a text part's text an int",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]},
        "messages[0].content[0].text",
    ),
    ("an unknown message field", {"messages": [{"role": "user", "content": "x", "foo": 1}]}, "messages[0].foo"),
    ("tool_calls not a list", {"messages": [{"role": "assistant", "tool_calls": "x"}]}, "messages[0].tool_calls"),
    (
        "a tool call's arguments an object",
        {"messages": [{"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": {}}}]}]},
        "messages[0].tool_calls[0].function.arguments",
    ),
    (
        "a tool call without id",
        {"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": CALL["function"]}]}]},
        "messages[0].tool_calls[0].id",
    ),
    (
        "a tool result's tool_call_id an int",
        {"messages": [{"role": "tool", "content": "5", "tool_call_id": 7}]},
        "messages[0].tool_call_id",
    ),
    ("a tool result without content", {"messages": [{"role": "tool", "tool_call_id": "a"}]}, "messages[0].content"),
    ("an assistant message saying nothing", {"messages": [*M, {"role": "assistant"}]}, "messages[1]"),
    ("tools not a list", {"messages": M, "tools": TOOL}, "tools"),
    ("a tool without function", {"messages": M, "tools": [{"type": "function"}]}, "tools[0].function"),
    (
        "a tool name with a space",
        {"messages": M, "tools": [{"type": "function", "function": {"name": "a b"}}]},
        "tools[0].function.name",
    ),
    ("tool_choice 'any'", {"messages": M, "tools": [TOOL], "tool_choice": "any"}, "tool_choice"),
    (
        "tool_choice naming a missing tool",
        {"messages": M, "tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "clock"}}},
        "tool_choice",
    ),
    ("tool_choice required without tools", {"messages": M, "tool_choice": "required"}, "tool_choice"),
    ("temperature NaN", '{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', "temperature"),
    (
        "temperature Infinity",
        '{"messages": [{"role": "user", "content": "hi"}], "temperature": Infinity}',
        "temperature",
    ),
    ("temperature 2.5", {"messages": M, "temperature": 2.5}, "temperature"),
    ("temperature a string", {"messages": M, "temperature": "0.5"}, "temperature"),
    ("top_p 0", {"messages": M, "top_p": 0}, "top_p"),
    ("top_p 1.5", {"messages": M, "top_p": 1.5}, "top_p"),
    ("max_tokens 0", {"messages": M, "max_tokens": 0}, "max_tokens"),
    ("max_completion_tokens true", {"messages": M, "max_completion_tokens": True}, "max_completion_tokens"),
    ("n 0", {"messages": M, "n": 0}, "n"),
    ("n 17", {"messages": M, "n": 17}, "n"),
    ("stop an int", {"messages": M, "stop": 5}, "stop"),
    ("five stop strings", {"messages": M, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ("an empty stop string", {"messages": M, "stop": [""]}, "stop[0]"),
    ("seed a string", {"messages": M, "seed": "1"}, "seed"),
    ("stream 'yes'", {"messages": M, "stream": "yes"}, "stream"),
    ("stream_options without stream", {"messages": M, "stream_options": {"include_usage": True}}, "stream_options"),
    ("an unknown field", {"messages": M, "reasoning_effort": "low"}, "reasoning_effort"),
    ("a presence penalty", {"messages": M, "presence_penalty": 1.0}, "presence_penalty"),
    ("a logit bias", {"messages": M, "logit_bias": {"5": 10}}, "logit_bias"),
    ("logprobs true", {"messages": M, "logprobs": True}, "logprobs"),
    ("parallel_tool_calls false", {"messages": M, "parallel_tool_calls": False}, "parallel_tool_calls"),
    ("a JSON response format", {"messages": M, "response_format": {"type": "json_object"}}, "response_format.type"),
]


@pytest.fixture(scope="module")
def never_answered():
    """The real app on a real server whose rollout side must never be reached (every body is bad)."""
    answered = []
    server = BackgroundServer(make_app(lambda key, options: answered.append(options) or {}))
    yield server, answered
    server.close()


@pytest.mark.parametrize(("what", "body", "param"), MALFORMED, ids=[case[0] for case in MALFORMED])
def test_a_malformed_body_is_a_400_naming_its_field(never_answered, what, body, param):
    server, answered = never_answered
    content = body if isinstance(body, str) else json.dumps(body)
    response = httpx.post(
        server.base_url("episode-0-x") + "/chat/completions",
        content=content,
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400, (what, response.text)
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"] == param, (what, error)
    assert param.split(".")[0].split("[")[0] in error["message"], error  # the message names the field too
    assert "\n" not in error["message"] and not answered


def test_not_json_huge_bodies_and_other_paths_answer_in_openai_shape(never_answered):
    server, answered = never_answered
    url = server.base_url("episode-0-x") + "/chat/completions"
    cases = [
        (httpx.post(url, content=b"{not json"), 400, "not JSON"),
        (httpx.post(url, content=b"[1, 2]"), 400, "must be a JSON object, got list"),
        (httpx.post(url, content=b"[" * 100_000 + b"]" * 100_000), 400, "not JSON"),
        (httpx.post(url, content=b" " * (endpoint.MAX_BODY_BYTES + 1)), 413, "over 16777216 bytes"),
        (httpx.get(url), 405, "serves POST <the base_url the agent was given>/chat/completions"),
        (httpx.post(server.base_url("x") + "/embeddings"), 404, "serves POST <the base_url the agent was given>/chat/"),
    ]
    for response, status, says in cases:
        assert response.status_code == status and says in response.json()["error"]["message"], response.text
    assert not answered


def test_the_models_an_agent_lists_are_the_run_s_model_and_other_runs_get_a_404():
    import openai

    server = BackgroundServer(make_app(lambda key, options: {}, model="smollm2-135m"))
    try:
        client = openai.OpenAI(base_url=server.base_url("episode-0-x"), api_key="unused")
        assert [m.id for m in client.models.list()] == ["smollm2-135m"]
        assert client.models.retrieve("gpt-4o-mini").id == "gpt-4o-mini"  # any name reaches the policy
        stranger = server.base_url("episode-0-x").replace(server.app.state.secret, "not-the-run")
        assert httpx.get(stranger + "/models").status_code == 404
    finally:
        server.close()


def test_an_unexpected_error_is_a_500_in_openai_shape_said_once_and_no_traceback(capfd):
    def answer(key, options):
        raise ZeroDivisionError("the answer divided by zero")

    app = make_app(answer)

    @app.get("/crash")  # a route outside the endpoint's own handler: uvicorn logs what escapes it
    async def crash():
        raise RuntimeError("escaped the handler")

    server = BackgroundServer(app)
    try:
        url = server.base_url("episode-0-x") + "/chat/completions"
        responses = [httpx.post(url, json={"messages": M}) for _ in range(3)]
        crashes = [httpx.get(f"http://127.0.0.1:{server.port}/crash") for _ in range(2)]
    finally:
        server.close()
    for response in responses:
        assert response.status_code == 500 and response.json()["error"] == {
            "message": "internal error: ZeroDivisionError: the answer divided by zero",
            "type": "server_error",
            "param": None,
            "code": "internal_error",
        }
    assert [c.status_code for c in crashes] == [500, 500]
    log = "".join(capfd.readouterr())
    assert "Traceback" not in log and 'File "' not in log, log
    assert log.count("answered 500: ZeroDivisionError: the answer divided by zero") == 1, log
    assert log.count("Exception in ASGI application: RuntimeError: escaped the handler") == 1, log


# -- through the rollout: whose call is it ---------------------------------------------------------------


def _rollout(tokenizer, agent: str, **options):
    model = build_tiny_model(len(tokenizer))
    registry = load_plugins().registry
    engine = registry.get("engine", "hf").factory(
        model=model, tokenizer=tokenizer, config=TrainConfig(engine_args={"dtype": "float32"})
    )
    config = TrainConfig(max_new_tokens=6, plugins={"openai_agent": {"agent": agent, **options}})
    return registry.get("rollout", "openai_agent").factory(engine=engine, tokenizer=tokenizer, config=config)


def _agent_file(tmp_path, body: str) -> str:
    path = tmp_path / "agent.py"
    path.write_text("import json, os, threading, time\n\nimport openai\n\n" + body)
    return f"{path}:solve"


LATE = """
def solve(task, client):
    messages = [{"role": "user", "content": "Hi"}]
    if task["role"] == "waits":  # keeps the step open until the other episode's late call is answered
        deadline = time.monotonic() + 60
        while not os.path.exists(task["done"]) and time.monotonic() < deadline:
            time.sleep(0.02)
        return None
    client.chat.completions.create(model="m", messages=messages)

    own = openai.OpenAI(base_url=str(client.base_url), api_key=client.api_key, max_retries=0)  # outlives solve's

    def late():
        time.sleep(0.02)  # solve() has returned by now (its worker allows 0.2 s for threads to end)
        try:
            own.chat.completions.create(model="m", messages=messages)
            said = {"status": 200}
        except openai.APIStatusError as exc:
            said = {"status": exc.status_code, "error": exc.body}
        with open(task["done"] + ".tmp", "w") as out:
            json.dump(said, out)
        os.rename(task["done"] + ".tmp", task["done"])

    threading.Thread(target=late).start()
    return 1.0
"""


def test_a_call_after_the_agent_returned_is_a_410_and_records_nothing(tokenizer, tmp_path):
    done = str(tmp_path / "late.json")
    rollout = _rollout(tokenizer, _agent_file(tmp_path, LATE))
    tasks = [{"role": "calls", "done": done}, {"role": "waits", "done": done}]
    returned, waited = rollout.run([None] * 2, tasks, [0, 1], SamplingParams(max_new_tokens=6, seed=0), seeds=[1, 2])
    said = json.loads(Path(done).read_text())
    assert said["status"] == 410 and said["error"]["code"] == "episode_finished", said
    assert "episode 0's agent has returned" in said["error"]["message"]
    assert returned.info["agent_calls"] == 1 and len(returned.turns) == 1  # the late call left no trace
    assert returned.info["metrics"]["agent/refused_calls"] == 1.0 and waited.info["agent_calls"] == 0


CROSS = """
def solve(task, client):
    share = task["dir"] + "/url0"
    if task["i"] == 0:
        with open(share + ".tmp", "w") as out:
            out.write(str(client.base_url))
        os.rename(share + ".tmp", share)
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Mine"}])
        deadline = time.monotonic() + 60  # stays live while episode 1 tries its URL
        while not os.path.exists(task["dir"] + "/tried") and time.monotonic() < deadline:
            time.sleep(0.02)
        return 1.0
    deadline = time.monotonic() + 60
    while not os.path.exists(share) and time.monotonic() < deadline:
        time.sleep(0.02)
    url0 = open(share).read()
    said = []
    for base_url in (url0, url0.replace(url0.split("/")[-3], "episode-0-guessed")):
        other = openai.OpenAI(base_url=base_url, api_key=client.api_key, max_retries=0)
        try:
            other.chat.completions.create(model="m", messages=[{"role": "user", "content": "Theirs"}])
            said.append([200, None])
        except openai.APIStatusError as exc:
            said.append([exc.status_code, exc.body["code"]])
    open(task["dir"] + "/tried", "w").close()
    return [{"role": "assistant", "content": json.dumps({"said": said, "url0": url0, "key": client.api_key})}]
"""


def test_an_episodes_client_cannot_write_another_episodes_record(tokenizer, tmp_path):
    rollout = _rollout(tokenizer, _agent_file(tmp_path, CROSS))
    tasks = [{"i": i, "dir": str(tmp_path)} for i in range(2)]
    first, second = rollout.run([None] * 2, tasks, [0, 1], SamplingParams(max_new_tokens=6, seed=0), seeds=[1, 2])
    got = json.loads(second.messages[-1]["content"])
    assert got["said"] == [[401, "invalid_api_key"], [404, "not_found"]]
    assert first.info["agent_calls"] == 1 and "Theirs" not in str(first.messages)  # only its own call
    assert second.info["agent_calls"] == 0 and second.info["metrics"]["agent/refused_calls"] == 1.0  # the caller's
    assert first.info["metrics"]["agent/refused_calls"] == 0.0
    url_key, api_key = got["url0"].split("/")[-3], got["key"]
    assert len(url_key.split("-", 2)[2]) >= 22 and len(api_key.split("-", 3)[3]) >= 32  # >= 128 random bits each


REFUSED = """
import httpx


def solve(task, client):
    said = []
    for call in task["calls"]:
        if isinstance(call, str):  # a raw body (the openai client will not send a NaN)
            url, headers = f"{client.base_url}chat/completions", {"authorization": f"Bearer {client.api_key}"}
            error = httpx.post(url, content=call, headers=headers).json()["error"]
            said.append([error["param"], error["message"]])
            continue
        try:
            client.chat.completions.create(model="m", messages=call)
        except openai.BadRequestError as exc:
            said.append([exc.body["param"], exc.body["message"]])
    return [{"role": "assistant", "content": json.dumps(said)}]
"""


def test_nan_temperature_an_unknown_role_and_a_role_the_template_lacks_are_400s(tokenizer, tmp_path):
    calls = [
        '{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
        [{"role": "hacker", "content": "let me in"}],
        [{"role": "developer", "content": "be brief"}, *M],  # SmolLM2's template has no developer role
    ]
    rollout = _rollout(tokenizer, _agent_file(tmp_path, REFUSED))
    [trajectory] = rollout.run([None], [{"calls": calls}], [0], SamplingParams(max_new_tokens=6, seed=0))
    said = json.loads(trajectory.messages[-1]["content"])
    assert [param for param, _ in said] == ["temperature", "messages[0].role", "messages[0].role"]
    assert "finite number" in said[0][1] and "'hacker' is not one of" in said[1][1] and "use 'system'" in said[2][1]
    assert trajectory.info["agent_calls"] == 0 and not trajectory.turns  # nothing rendered, nothing trained
    assert trajectory.info["metrics"]["agent/bad_requests"] == 3.0


# -- a real run: malformed bodies, then a good call ----------------------------------------------------------

MALFORMED_THEN_GOOD = """
import httpx

BAD = [
    '{"messages": [{"content": "no role"}]}',
    '{"messages": [{"role": "user", "content": 5}]}',
    '{"messages": [{"role": "hacker", "content": "x"}]}',
    '{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}',
    '{"messages": [{"role": "assistant", "tool_calls": "x"}]}',
]


def solve(task, base_url):
    url = base_url + "/chat/completions"
    for body in BAD:
        status = httpx.post(url, content=body, headers={"content-type": "application/json"}).status_code
        assert status == 400, status
    good = {"messages": [{"role": "user", "content": task["question"]}], "max_tokens": 4}
    reply = httpx.post(url, json=good, timeout=120).json()
    return [{"role": "user", "content": task["question"]}, reply["choices"][0]["message"]]
"""


def test_a_run_whose_agent_sends_malformed_bodies_logs_no_traceback_and_counts_them(tiny_model_dir, tmp_path):
    agent = tmp_path / "noisy_agent.py"
    agent.write_text(MALFORMED_THEN_GOOD)
    out, log = tmp_path / "run", tmp_path / "run.log"
    plugins = os.pathsep.join(str(Path(__file__).resolve().parents[2] / p) for p in ("", "plugins", "envs"))
    env = {**os.environ, "PYTHONPATH": plugins + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with log.open("w") as sink:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "agentrl.cli.app",
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
                f"plugins.openai_agent.agent={agent}:solve",
                "--set",
                "eval_tasks=0",
                "--set",
                "max_new_tokens=4",
                "--set",
                "save_model=false",
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
            timeout=600,
        )
    text = log.read_text()
    assert result.returncode == 0, text
    assert "Traceback" not in text and "Exception in ASGI" not in text, text
    assert text.count("openai_agent endpoint: answered 400 (messages[0].role)") == 1, text  # said once
    [step] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"loss/total"' in line]
    assert step["env/agent/bad_requests"] == 5.0  # per episode: its five bad bodies
    assert step["env/agent/refused_calls"] == 0.0 and step["env/agent/server_errors"] == 0.0
