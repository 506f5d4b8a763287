"""Where the ``openai_agent`` endpoint listens: loopback by default, any address on request, every
URL behind the run's secret, and the checks that agent workers on other nodes can reach it."""

from __future__ import annotations

import json

import httpx
import pytest

from agentrl import ConfigError
from agentrl.config.train import TrainConfig
from agentrl.plugins import load_plugins
from agentrl.testing import build_tiny_model
from agentrl_openai_agent.address import advertised_host, is_loopback, machine_ip
from agentrl_openai_agent.remote import auto_host, check_bind
from agentrl_openai_agent.server import BackgroundServer, make_app

M = [{"role": "user", "content": "hi"}]


def _place(node: str, ip: str) -> dict:
    return {"node": node, "ip": ip, "host": "h", "pid": 1, "incarnation": "x"}


def test_the_default_endpoint_is_loopback_and_its_urls_carry_the_run_secret():
    app = make_app(lambda key, options: {}, secret="s3cret-of-this-run")
    server = BackgroundServer(app)
    try:
        assert server.base_url("episode-0-k").startswith(f"http://127.0.0.1:{server.port}/s3cret-of-this-run/")
        assert httpx.get(f"{server.root()}/health").json() == {"status": "ok"}
    finally:
        server.close()


@pytest.mark.skipif(is_loopback(machine_ip()), reason="this machine has no address but loopback")
def test_the_default_endpoint_is_not_reached_on_the_machines_own_ip():
    server = BackgroundServer(make_app(lambda key, options: {}))
    try:
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://{machine_ip()}:{server.port}/x/health", timeout=2)
    finally:
        server.close()


def test_bound_to_every_interface_it_advertises_this_machine_and_refuses_requests_without_the_run_secret():
    answered = []
    app = make_app(lambda key, options: answered.append(key) or {"ok": key}, secret="the-run-secret")
    server = BackgroundServer(app, host="0.0.0.0")
    try:
        assert server.advertise_host == machine_ip() != "0.0.0.0"
        url = server.base_url("episode-0-k") + "/chat/completions"
        assert url.startswith(f"http://{machine_ip()}:{server.port}/the-run-secret/episode-0-k/")
        assert httpx.post(url, json={"messages": M}).json() == {"ok": "episode-0-k"}
        port = server.port
        strangers = [
            httpx.post(f"http://127.0.0.1:{port}/episode-0-k/v1/chat/completions", json={"messages": M}),
            httpx.post(f"http://127.0.0.1:{port}/the-run-secreT/episode-0-k/v1/chat/completions", json={"messages": M}),
            httpx.post(f"http://127.0.0.1:{port}//episode-0-k/v1/chat/completions", json={"messages": M}),
            httpx.get(f"http://127.0.0.1:{port}/health"),
            httpx.get(f"http://127.0.0.1:{port}/guess/health"),
        ]
        for response in strangers:
            assert response.status_code == 404, response.text
            error = response.json()["error"]
            assert error["code"] == "not_found" and "the-run-secret" not in response.text, error
        assert answered == ["episode-0-k"]  # no request without the secret reached the rollout
        assert httpx.get(f"http://127.0.0.1:{port}/the-run-secret/health").json() == {"status": "ok"}
    finally:
        server.close()


def test_the_advertised_address_is_the_setting_else_the_bound_one_else_this_machines():
    assert advertised_host("127.0.0.1", None) == "127.0.0.1"
    assert advertised_host("10.1.2.3", None) == "10.1.2.3"
    assert advertised_host("0.0.0.0", None) == advertised_host("::", None) == machine_ip()
    assert advertised_host("0.0.0.0", "trainer.internal") == "trainer.internal"


def test_a_loopback_endpoint_is_refused_while_an_agent_worker_runs_on_another_node():
    here = "10.0.0.1"
    same = [_place("aaaaaa1", here), _place("bbbbbb2", here)]  # one machine, two Ray nodes (as in the tests)
    away = [_place("aaaaaa1", here), _place("cccccc3", "10.0.0.7")]
    check_bind("127.0.0.1", "127.0.0.1", here, same)  # every worker on this machine: loopback reaches them
    check_bind("0.0.0.0", here, here, away)
    check_bind(here, here, here, away)
    for host, advertise in [("127.0.0.1", "127.0.0.1"), ("localhost", "localhost"), ("0.0.0.0", "127.0.0.1")]:
        with pytest.raises(ConfigError) as caught:
            check_bind(host, advertise, here, away)
        line = str(caught.value)
        assert "\n" not in line and "agent worker 1 runs on node cccccc (10.0.0.7)" in line, line
        assert f"host={host!r}" in line and "bind 0.0.0.0 or this node's IP 10.0.0.1" in line, line
    assert auto_host(here, same) == "127.0.0.1"  # the default: loopback unless a worker is elsewhere
    assert auto_host(here, away) == here


def test_an_address_this_machine_does_not_have_is_one_line(tokenizer, tmp_path):
    agent = tmp_path / "agent.py"
    agent.write_text("def solve(task, client):\n    return 1.0\n")
    rollout = _rollout(tokenizer, f"{agent}:solve", host="203.0.113.9")  # TEST-NET-3: no interface of ours
    try:
        with pytest.raises(ConfigError) as caught:
            rollout.run([None], [{"question": "q"}], [0], _sampling())
    finally:
        rollout.close()
    line = str(caught.value)
    assert "\n" not in line and "plugins.openai_agent.host='203.0.113.9'" in line and "cannot listen" in line, line


def test_a_rollout_on_every_interface_warns_once_of_plain_http_and_its_agents_get_reachable_urls(
    tokenizer, tmp_path, recwarn
):
    agent = tmp_path / "agent.py"
    agent.write_text(
        "import json, os\n\n"
        "def solve(task, client):\n"
        "    client.chat.completions.create(model='m', messages=[{'role': 'user', 'content': task['question']}])\n"
        f"    open({str(tmp_path / 'urls.txt')!r}, 'a').write(json.dumps(str(client.base_url)) + '\\n')\n"
        "    return 1.0\n"
    )
    rollout = _rollout(tokenizer, f"{agent}:solve", host="0.0.0.0")
    try:
        for _ in range(2):
            trajectories = rollout.run([None, None], [{"question": "a"}, {"question": "b"}], [0, 1], _sampling())
            assert all(t.turns and t.turns[-1].reward == 1.0 for t in trajectories)
    finally:
        rollout.close()
    urls = [json.loads(line) for line in (tmp_path / "urls.txt").read_text().splitlines()]
    assert len(urls) == 4 and all(url.startswith(f"http://{machine_ip()}:") for url in urls), urls
    assert {url.split("/")[3] for url in urls} == {rollout.secret}  # one secret for the run, in every URL
    said = [str(w.message) for w in recwarn if "plain HTTP" in str(w.message)]
    assert len(said) == 1 and "\n" not in said[0] and "listening on 0.0.0.0:" in said[0], said


def _sampling():
    from agentrl import SamplingParams

    return SamplingParams(max_new_tokens=4, temperature=1.0, seed=3)


def _rollout(tokenizer, agent: str, **options):
    config = TrainConfig(max_new_tokens=4, plugins={"openai_agent": {"agent": agent, **options}})
    plugins = load_plugins()
    engine = plugins.registry.get("engine", "hf").factory(
        model=build_tiny_model(len(tokenizer)),
        tokenizer=tokenizer,
        config=TrainConfig(engine_args={"dtype": "float32"}),
    )
    return plugins.registry.get("rollout", "openai_agent").factory(engine=engine, tokenizer=tokenizer, config=config)
