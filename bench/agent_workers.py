"""What running agents in worker processes costs: per episode, against the thread each ran in before.

    python bench/agent_workers.py [--episodes 200] [--concurrency 8] [--calls 0 1 3]

An agent that makes ``--calls`` chat completions against the rollout's endpoint (served as in a
run, answering a fixed reply at once: no model, so what is left is the cost of running the agent)
and returns 1.0 runs ``--episodes`` episodes, ``--concurrency`` at a time, two ways:

* ``thread``: as before worker processes, the agent called in a thread of this process, with an
  ``openai.OpenAI`` built for the episode and a watcher thread for its time limit;
* ``thread, shared TLS``: the same with the TLS context built once, as the workers build their
  clients (building it, 0.1 s or more of CPU, was most of the cost of an episode's client), so
  ``workers`` against it is the cost of the process boundary alone;
* ``workers``: :class:`agentrl_openai_agent.workers.AgentWorkers` (the pool already started).

For each it prints the wall time per episode, and the pool's one-off costs: starting
``--concurrency`` workers, and replacing one (an episode that leaves a thread running: the time
until its fresh worker is ready, which a run overlaps with the rest of the step and the update).
"""

from __future__ import annotations

import argparse
import ssl
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import certifi

from agentrl_openai_agent.agent_process import import_agent
from agentrl_openai_agent.server import BackgroundServer, completion_body, make_app
from agentrl_openai_agent.workers import AgentWorkers

AGENT = """
import threading
import time


def solve(task, client):
    for _ in range(task["calls"]):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}])
    if task.get("leave_thread"):
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    return 1.0
"""


def _threaded(fn: Any, task: dict[str, Any], base_url: str, tls: Any = None) -> Any:
    """One episode as before: a client built for it (with the TLS context ``tls``: None, one of its
    own), the agent in a thread watched for its limit."""
    import openai

    http = None if tls is None else openai.DefaultHttpxClient(verify=tls)
    client = openai.OpenAI(base_url=base_url, api_key="agentrl", max_retries=0, http_client=http)
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.setdefault("value", fn(task, client)), daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.25)
    return out["value"]


def _per_episode(run: Any, episodes: int, concurrency: int, calls: int) -> float:
    """Seconds per episode of ``episodes`` runs of ``run(task, index)``, ``concurrency`` at once."""
    started = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda i: run({"calls": calls}, i), range(episodes)))
    assert all(r == 1.0 for r in results), results[:3]
    return (time.monotonic() - started) / episodes


def main() -> None:
    """Print the figures (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--calls", type=int, nargs="+", default=[0, 1, 3])
    args = parser.parse_args()
    path = Path(tempfile.mkdtemp()) / "bench_agent.py"
    path.write_text(AGENT)
    spec = f"{path}:solve"
    server = BackgroundServer(make_app(lambda key, options: completion_body("m", [({"content": "ok"}, "stop")], 5, 1)))
    fn = import_agent(spec)
    tls = ssl.create_default_context(cafile=certifi.where())
    started = time.monotonic()
    workers = AgentWorkers(spec, args.concurrency)
    start_s = time.monotonic() - started
    urls = [server.base_url(f"episode-{i}") for i in range(args.episodes)]
    for calls in args.calls:
        _per_episode(lambda task, i: _threaded(fn, task, urls[i]), args.concurrency, args.concurrency, calls)  # warm
        threaded = _per_episode(lambda task, i: _threaded(fn, task, urls[i]), args.episodes, args.concurrency, calls)
        shared = _per_episode(lambda task, i: _threaded(fn, task, urls[i], tls), args.episodes, args.concurrency, calls)
        pooled = _per_episode(
            lambda task, i: workers.run(task, urls[i], "agentrl", 600.0).result, args.episodes, args.concurrency, calls
        )
        print(
            f"{calls} call(s) an episode, {args.concurrency} at once, ms/episode: thread {threaded * 1e3:.1f}, "
            f"thread with a shared TLS context {shared * 1e3:.1f}, workers {pooled * 1e3:.1f} "
            f"({(pooled - shared) * 1e3:+.1f} ms for the process boundary)"
        )
    started = time.monotonic()
    outcome = workers.run({"calls": 0, "leave_thread": True}, server.base_url("episode-x"), "agentrl")
    while workers.starting:
        time.sleep(0.01)
    assert outcome.replaced, outcome
    print(f"starting {args.concurrency} workers: {start_s:.2f} s; replacing one: {time.monotonic() - started:.2f} s")
    workers.close()
    server.close()


if __name__ == "__main__":
    main()
