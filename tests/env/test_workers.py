"""A turn's env calls run at once (``env_workers`` threads; ``async def`` envs on one event loop),
under the same CallGuard as before, and the rollout's tokens do not depend on which env answers first."""

from __future__ import annotations

import asyncio
import random
import re
import threading
import time

import pytest

from agentrl import CallGuard, ConfigError, Env, EnvCall, EnvError, EnvWorkers, SamplingParams
from agentrl.config.train import TrainConfig
from agentrl.plugins import load_plugins
from agentrl.testing import build_tiny_model

TASKS = [{"id": f"t{i}", "question": f"Count to {i}."} for i in range(8)]


class Echo(Env):
    """Two turns; the reward is the reply's length, so it depends on the sampled tokens."""

    max_turns = 2

    def __init__(self, delay: float = 0.0, jitter: float = 0.0) -> None:
        super().__init__()
        self.delay, self.jitter = delay, jitter
        self.threads: list[str] = []
        self._rng = random.Random()  # unseeded: a different latency every call and every run

    def train_tasks(self):
        return list(TASKS)

    eval_tasks = train_tasks

    def start(self, task):
        return [{"role": "user", "content": task["question"]}]

    def respond(self, text):
        done = self.turn >= 2
        answer = [] if done else [{"role": "user", "content": f"You said {len(text)} characters. Go on."}]
        return answer, len(text) / 100, done, {}

    def latency(self) -> float:
        self.threads.append(threading.current_thread().name)
        return self.delay + self._rng.uniform(0, self.jitter)


class SlowEcho(Echo):
    """``Echo`` whose ``reset`` and ``step`` block for their latency (a sandbox, a web call)."""

    def reset(self, *, seed=None, options=None):
        time.sleep(self.latency())
        return super().reset(seed=seed, options=options)

    def step(self, action):
        time.sleep(self.latency())
        return super().step(action)


class AsyncEcho(Echo):
    """``Echo`` with ``async def`` ``reset`` and ``step`` that await their latency."""

    async def reset(self, *, seed=None, options=None):
        await asyncio.sleep(self.latency())
        return super().reset(seed=seed, options=options)

    async def step(self, action):
        await asyncio.sleep(self.latency())
        return super().step(action)


@pytest.fixture(scope="module")
def tiny(tokenizer):
    return build_tiny_model(len(tokenizer)), tokenizer


def _rollout(tiny, **overrides):
    model, tokenizer = tiny
    manager = load_plugins()
    engine = manager.registry.get("engine", "hf").factory(
        model=model, tokenizer=tokenizer, config=TrainConfig(engine_args={"dtype": "float32"})
    )
    config = TrainConfig(**{"max_new_tokens": 6, **overrides})
    return manager.registry.get("rollout", "multi_turn").factory(engine=engine, tokenizer=tokenizer, config=config)


def _run(rollout, envs):
    return rollout.run(
        envs,
        [TASKS[i % len(TASKS)] for i in range(len(envs))],
        [i // 2 for i in range(len(envs))],
        SamplingParams(max_new_tokens=6, temperature=1.0, seed=3),
        seeds=list(range(100, 100 + len(envs))),
    )


def _figures(trajectories):
    return [
        (t.token_ids, t.loss_mask, t.sampler_logprobs, [turn.reward for turn in t.turns], t.messages)
        for t in trajectories
    ]


def test_env_latency_overlaps_instead_of_adding_up(tiny):
    rollout = _rollout(tiny, env_workers=8)
    _run(rollout, [Echo() for _ in range(8)])  # warm up
    start = time.perf_counter()
    generation_only = _run(rollout, [Echo() for _ in range(8)])
    generation_s = time.perf_counter() - start
    envs = [SlowEcho(delay=0.3) for _ in range(8)]
    start = time.perf_counter()
    trajectories = _run(rollout, envs)
    elapsed = time.perf_counter() - start
    serial = sum(len(env.threads) for env in envs) * 0.3  # 8 resets and 16 steps one after another: 7.2 s
    print(f"generation {generation_s:.2f} s, with env latency {elapsed:.2f} s, serial env time {serial:.1f} s")
    assert serial == pytest.approx(7.2)
    assert elapsed - generation_s < 0.5 * serial, (
        elapsed,
        generation_s,
    )  # overlapped: ~0.9 s of env time (3 calls an env), not 7.2
    assert _figures(trajectories) == _figures(generation_only)


@pytest.mark.parametrize("env_class", [SlowEcho, AsyncEcho])
def test_tokens_and_rewards_do_not_depend_on_which_env_answers_first(tiny, env_class):
    serial = _figures(_run(_rollout(tiny, env_workers=1), [SlowEcho() for _ in range(8)]))
    for workers in (1, 8):
        envs = [env_class(jitter=0.05) for _ in range(8)]
        assert _figures(_run(_rollout(tiny, env_workers=workers), envs)) == serial
        if env_class is AsyncEcho:  # awaited on the pool's one event loop: no thread per call
            assert {name for env in envs for name in env.threads} == {"agentrl-env-loop"}


class Counted(Echo):
    """Records how many of its class's calls are in flight at once."""

    lock = threading.Lock()
    active = 0
    most = 0

    def step(self, action):
        with Counted.lock:
            Counted.active += 1
            Counted.most = max(Counted.most, Counted.active)
        time.sleep(0.05)
        with Counted.lock:
            Counted.active -= 1
        return super().step(action)


class NotThreadSafe(Counted):
    concurrent_safe = False


@pytest.mark.parametrize(("env_class", "most"), [(Counted, 4), (NotThreadSafe, 1)])
def test_calls_overlap_up_to_env_workers_unless_the_env_opts_out(env_class, most):
    Counted.most = 0
    workers = EnvWorkers(CallGuard(timeout_s=10), workers=4)
    envs = [env_class() for _ in range(8)]
    for env, task in zip(envs, TASKS):
        env.reset(options={"task": task})
    outcomes = workers.gather([EnvCall(env, "step", ("hi",)) for env in envs])
    assert [error for _, error in outcomes] == [None] * 8 and Counted.most == most
    one = env_class()  # two calls on one instance never overlap, and keep their order
    one.reset(options={"task": TASKS[0]})
    Counted.most = 0
    first, second = workers.gather([EnvCall(one, "step", ("a",)), EnvCall(one, "step", ("b",))])
    assert Counted.most == 1 and first[0][2] is False and second[0][2] is True


RELEASE = threading.Event()


class HangsOnOdd(Echo):
    """Episodes on tasks t1 and t3 hang in ``step`` (until the test releases them)."""

    cancelled = 0

    def step(self, action):
        if self.task["id"] in ("t1", "t3"):
            RELEASE.wait(30)
        return super().step(action)


class AsyncHangsOnOdd(HangsOnOdd):
    async def step(self, action):
        if self.task["id"] in ("t1", "t3"):
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                AsyncHangsOnOdd.cancelled += 1
                raise
        return Env.step(self, action)


@pytest.mark.parametrize("env_class", [HangsOnOdd, AsyncHangsOnOdd])
def test_a_hanging_call_times_out_alone_and_its_episode_is_skipped(tiny, env_class):
    rollout = _rollout(tiny, env_workers=8, call_timeout_s=0.5, on_call_error="skip")
    try:
        start = time.perf_counter()
        with pytest.warns(RuntimeWarning, match=re.escape(f"{env_class.__name__}.step timed out on sample 1")):
            trajectories = _run(rollout, [env_class() for _ in range(8)])
        elapsed = time.perf_counter() - start
    finally:
        RELEASE.set()
    RELEASE.clear()
    hung = [i for i, t in enumerate(trajectories) if t.info.get("error")]
    assert hung == [1, 3] and all(trajectories[i].info["error"]["timed_out"] for i in hung)
    assert [len(t.turns) for t in trajectories] == [1 if i in hung else 2 for i in range(8)]
    assert elapsed < 20
    if env_class is AsyncHangsOnOdd:  # a coroutine, unlike a thread, is cancelled at its limit
        assert AsyncHangsOnOdd.cancelled == 2


class RaisesOnOdd(Echo):
    def step(self, action):
        if self.task["id"] in ("t3", "t5"):
            raise ValueError(f"env bug on {self.task['id']}")
        return super().step(action)


class AsyncRaisesOnOdd(RaisesOnOdd):
    async def step(self, action):
        if self.task["id"] == "t1":
            raise SystemExit(3)  # the env's failure, not the end of the run (nor of the event loop)
        return RaisesOnOdd.step(self, action)


def test_a_failure_names_the_first_failing_sample_whatever_answers_first(tiny):
    messages = []
    for workers in (1, 8):
        with pytest.raises(EnvError) as info:
            _run(_rollout(tiny, env_workers=workers, on_call_error="fail"), [RaisesOnOdd() for _ in range(8)])
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    assert messages[0].startswith("RaisesOnOdd.step raised on sample 3") and "ValueError: env bug on t3" in messages[0]
    with pytest.warns(RuntimeWarning, match=re.escape("AsyncRaisesOnOdd.step raised on sample 1")):
        trajectories = _run(_rollout(tiny, env_workers=8, on_call_error="skip"), [AsyncRaisesOnOdd() for _ in range(8)])
    errors = {i: t.info["error"]["exception"] for i, t in enumerate(trajectories) if t.info.get("error")}
    assert sorted(errors) == [1, 3, 5] and "SystemExit(3)" in errors[1] and "env bug on t5" in errors[5]


def test_the_start_up_checks_await_an_async_reset(tokenizer):
    from agentrl.testing import check_env_startup
    from agentrl.training.build import check_prompt_room

    env = AsyncEcho()
    check_env_startup(env, timeout_s=5)
    check_prompt_room(env, tokenizer, max_total_tokens=512)
    assert env.task == TASKS[min(7, len(TASKS) - 1)]  # the last of the first 8 training prompts was reset
    with pytest.raises(ConfigError, match="max_total_tokens=8 leaves no room"):
        check_prompt_room(env, tokenizer, max_total_tokens=8)
