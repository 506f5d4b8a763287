"""The ``openai_agent`` rollout runs agents in worker processes: what an agent leaves behind ends
with its worker, and results are checked (how an agent is called: test_script_agents.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from agentrl import EnvError, SamplingParams
from agentrl.config.train import TrainConfig
from agentrl.plugins import load_plugins
from agentrl.testing import build_tiny_model


def _rollout(tokenizer, agent: str, **options):
    plugins = load_plugins()
    engine = plugins.registry.get("engine", "hf").factory(
        model=build_tiny_model(len(tokenizer)),
        tokenizer=tokenizer,
        config=TrainConfig(engine_args={"dtype": "float32"}),
    )
    on_call_error = options.pop("on_call_error", "skip")
    config = TrainConfig(
        max_new_tokens=8, on_call_error=on_call_error, plugins={"openai_agent": {"agent": agent, **options}}
    )
    return plugins.registry.get("rollout", "openai_agent").factory(engine=engine, tokenizer=tokenizer, config=config)


def _agent(tmp_path, body: str, name: str = "solve") -> str:
    path = tmp_path / "agent.py"
    path.write_text(body)
    return f"{path}:{name}"


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (an ended process not yet reaped)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if _running(p.pid)}


def _settle(workers, timeout_s: float = 120.0) -> None:
    """Wait for the replacement workers to be up (a training step's update gives them that time)."""
    deadline = time.monotonic() + timeout_s
    while workers.starting and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not workers.starting


MISBEHAVING = """
import subprocess
import threading
import time


def _burn():
    while True:
        pass


def solve(task, client):
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": task["question"]}])
    if task.get("misbehave") == "burn":
        for _ in range(2):
            threading.Thread(target=_burn, daemon=True).start()
    elif task.get("misbehave") == "hang":
        time.sleep(3600)
    elif task.get("misbehave") == "child":
        with open(task["pid_file"], "w") as out:
            out.write(str(subprocess.Popen(["sleep", "300"]).pid))
    elif task.get("misbehave") == "daemon":  # its parent gone, in a session of its own
        subprocess.run(["sh", "-c", f"setsid sleep 300 >/dev/null 2>&1 & echo $! > {task['pid_file']}"], check=True)
    return 1.0
"""


@pytest.mark.parametrize(
    ("misbehave", "warned"),
    [
        ("burn", r"left 2 thread\(s\) running \(Thread-\d+ \(_burn\), Thread-\d+ \(_burn\)\) after sample 0"),
        ("hang", r"timed out on sample 0 .*own time .*passed timeout_s=3 s; its worker process was killed"),
        ("child", r"left 1 child process\(es\) \(\S+ \d+\) after sample 0"),  # named as it is now
        ("daemon", r"left 1 child process\(es\) \(\S+ \d+\) after sample 0"),
    ],
    ids=["burn", "hang", "child", "daemon"],
)
def test_a_misbehaving_agent_is_ended_with_all_it_started_and_the_next_step_is_not_slowed(
    tokenizer, tmp_path, misbehave, warned
):
    before = _descendants()
    rollout = _rollout(tokenizer, _agent(tmp_path, MISBEHAVING), timeout_s=3.0, max_concurrency=2)
    clean = [{"question": f"What is {i} + 1?"} for i in range(2)]

    def step(tasks) -> float:
        started = time.monotonic()
        trajectories = rollout.run([None] * 2, tasks, [0, 0], SamplingParams(max_new_tokens=8, seed=0))
        assert all(t.env_return == 1.0 and t.info["agent_calls"] == 1 for t in trajectories)
        return time.monotonic() - started

    step(clean)  # the workers start
    clean_s = min(step(clean) for _ in range(2))
    workers = set(rollout.workers.pids())
    hostile = [{**clean[0], "misbehave": misbehave, "pid_file": str(tmp_path / "child.pid")}, clean[1]]
    with pytest.warns(RuntimeWarning, match=warned):
        trajectories = rollout.run([None] * 2, hostile, [0, 0], SamplingParams(max_new_tokens=8, seed=0))
    assert trajectories[0].info.get("error", {}).get("timed_out", False) == (misbehave == "hang")
    assert trajectories[1].env_return == 1.0 and "error" not in trajectories[1].info
    # Its worker was killed with everything it started; the clean one is kept.
    assert rollout.workers.replaced == 1
    [ended] = workers - set(rollout.workers.pids())
    assert not _running(ended)
    if misbehave in ("child", "daemon"):
        assert not _running(int((tmp_path / "child.pid").read_text()))
    _settle(rollout.workers)
    after_s = min(step(clean) for _ in range(2))
    print(f"{misbehave}: clean step {clean_s:.2f} s, the step after it {after_s:.2f} s")
    assert after_s < 1.5 * clean_s + 1.0, (clean_s, after_s)  # nothing of it slows the steps after
    rollout.close()
    assert not _descendants() - before and not any(_running(pid) for pid in workers)


CRASH = """
import os


def solve(task, client):
    if task.get("crash"):
        os._exit(1)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}])
    return 1.0
"""


def test_a_crashing_worker_is_replaced_its_episode_failed_and_the_next_runs(tokenizer, tmp_path):
    agent = _agent(tmp_path, CRASH)
    rollout = _rollout(tokenizer, agent, max_concurrency=1)  # one worker: the next episode needs the new one
    tasks = [{"question": "a", "crash": True}, {"question": "b"}, {"question": "c"}]
    with pytest.warns(RuntimeWarning, match=r"failed on sample 0 .*worker process died \(exit code 1\); the episode"):
        crashed, *rest = rollout.run([None] * 3, tasks, [0, 0, 1], SamplingParams(max_new_tokens=8, seed=0))
    assert crashed.info["error"] == {
        "method": f"agent {agent}",
        "exception": "the agent's worker process died (exit code 1)",
        "timed_out": False,
    }
    assert all(t.env_return == 1.0 and "error" not in t.info for t in rest) and rollout.workers.replaced == 1
    rollout.close()
    failing = _rollout(tokenizer, agent, on_call_error="fail")
    with pytest.raises(EnvError, match=r"agent .*agent.py:solve failed on sample 0 .*died \(exit code 1\)"):
        failing.run([None], tasks[:1], [0], SamplingParams(seed=0))
    failing.close()


@pytest.mark.parametrize(
    ("returned", "shown"),
    [
        ("[1, 2, 3]", "list [1, 2, 3]"),
        ("1e300", "1e+300 (weighted rewards must be within ±1e+09: rescale it)"),
        ("float('nan')", "nan"),
        ("float('-inf')", "-inf"),
        ("True", "bool True"),
        ("b'the answer is 4'", "bytes b'the answer is 4'"),
        ("[{'content': 'no role'}]", "list [{'content': 'no role'}]"),
    ],
)
def test_a_return_value_that_is_not_a_result_is_one_line_naming_the_agent(tokenizer, tmp_path, returned, shown):
    agent = _agent(tmp_path, f"def solve(task, client):\n    return {returned}\n")
    rollout = _rollout(tokenizer, agent)
    with pytest.raises(EnvError) as caught:
        rollout.run([None], [{"question": "2 + 2?"}], [0], SamplingParams(seed=0))
    assert str(caught.value) == (
        f"agent {agent} returned {shown} on sample 0 (task '2 + 2?'): "
        "return a finite reward, the final answer (a str), the final messages (a list of messages) or None"
    )
    rollout.close()


ORPHAN = """
import subprocess
import time


def solve(task, base_url):
    with open(task["pid_file"], "w") as out:
        out.write(str(subprocess.Popen(["sleep", "300"]).pid))
    time.sleep(3600)
"""
TRAINER = """
import sys, threading, time
from agentrl_openai_agent.workers import AgentWorkers
pool = AgentWorkers(sys.argv[1], 1)
print(pool.pids()[0], flush=True)
threading.Thread(target=pool.run, args=({"pid_file": sys.argv[2]}, "http://127.0.0.1:9/v1", "k"), daemon=True).start()
time.sleep(3600 if sys.argv[3] == "kill" else 0)
while not open(sys.argv[2]).read():
    time.sleep(0.05)
"""


@pytest.mark.parametrize("end", ["kill", "exit"])
def test_workers_and_their_children_end_when_the_trainer_does_even_by_kill_9(tmp_path, end):
    """A trainer killed with SIGKILL (no cleanup runs) or exiting without closing its rollout
    leaves no worker and none of the processes its agents started."""
    pid_file = tmp_path / "child.pid"
    pid_file.write_text("")
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, _agent(tmp_path, ORPHAN), str(pid_file), end],
        stdout=subprocess.PIPE,
        text=True,
    )
    worker = int(trainer.stdout.readline())
    deadline = time.monotonic() + 120
    while not pid_file.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pid_file.read_text())
    assert _running(worker) and _running(child)
    if end == "kill":
        os.kill(trainer.pid, signal.SIGKILL)
    assert trainer.wait(60) == (-signal.SIGKILL if end == "kill" else 0)
    deadline = time.monotonic() + 10
    while (_running(worker) or _running(child)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(worker) and not _running(child)
