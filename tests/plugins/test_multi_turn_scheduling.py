"""Episodes advance on their own: each episode asks for its next turn as soon as its own
env has answered, one slow env holds back only its episode, and the tokens do not depend on env
latency. Fast envs give exactly the lockstep batches. Order of events, never wall-clock figures."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from agentrl import CallGuard, Env, EnvCall, EnvWorkers, SamplingParams, turn_seed
from agentrl.config.train import TrainConfig
from agentrl.plugins import load_plugins
from agentrl.testing import build_tiny_model, lockstep_plugins

TASKS = [{"id": f"t{i}", "question": f"Count to {i}.", "turns": 1 + i % 3} for i in range(8)]


class Talk(Env):
    """Ends after ``task["turns"]`` turns; the reward is the reply's length, so it depends on the
    sampled tokens. ``delay(turn)`` is how long its ``step`` takes at that turn (1-based)."""

    max_turns = 3
    log: list[tuple[str, int, int]] = []
    """(event, episode's task id number, turn), for the order of events across episodes."""

    def __init__(self, delay=lambda turn: 0.0) -> None:
        super().__init__()
        self.delay = delay

    def train_tasks(self):
        return list(TASKS)

    eval_tasks = train_tasks

    def start(self, task):
        return [{"role": "user", "content": task["question"]}]

    def respond(self, text):
        done = self.turn >= self.task["turns"]
        answer = [] if done else [{"role": "user", "content": f"You said {len(text)} characters. Go on."}]
        return answer, len(text) / 100, done, {}

    def step(self, action):
        time.sleep(self.delay(self.turn + 1))
        return self._answer(action)

    def _answer(self, action):
        Talk.log.append(("answer", int(self.task["id"][1:]), self.turn + 1))
        return super().step(action)


class AsyncTalk(Talk):
    """``Talk`` with an ``async def`` ``step`` awaiting its delay."""

    async def step(self, action):
        await asyncio.sleep(self.delay(self.turn + 1))
        return self._answer(action)


@pytest.fixture(scope="module")
def tiny(tokenizer):
    return build_tiny_model(len(tokenizer)), tokenizer


class Recording:
    """The real hf engine, recording each batch's per-prompt seeds (which requests it sampled)."""

    def __init__(self, engine):
        self.engine, self.seeds = engine, []

    def generate(self, prompts, sampling):
        self.seeds.append(tuple(sampling.seeds_for(len(prompts)) or [None] * len(prompts)))
        return self.engine.generate(prompts, sampling)


def _rollout(tiny, **overrides):
    model, tokenizer = tiny
    manager = load_plugins()
    engine = Recording(
        manager.registry.get("engine", "hf").factory(
            model=model, tokenizer=tokenizer, config=TrainConfig(engine_args={"dtype": "float32"})
        )
    )
    config = TrainConfig(**{"max_new_tokens": 6, **overrides})
    return manager.registry.get("rollout", "multi_turn").factory(engine=engine, tokenizer=tokenizer, config=config)


SEEDS = list(range(100, 108))


def _run(rollout, envs, seeds=SEEDS, seed=3):
    Talk.log = []
    return rollout.run(
        envs,
        TASKS[: len(envs)],
        [i // 2 for i in range(len(envs))],
        SamplingParams(max_new_tokens=6, temperature=1.0, seed=seed),
        seeds=None if seeds is None else seeds[: len(envs)],
    )


def _figures(trajectories):
    """What must not depend on env latency (the sampler logprobs are compared apart)."""
    return [
        (t.token_ids, t.loss_mask, [turn.reward for turn in t.turns], t.messages, t.truncated) for t in trajectories
    ]


def _lockstep_seeds(seeds, turns):
    """The batches of the lockstep loop, as per-prompt seeds: turn k samples every episode still
    running (task turns > k) together, in episode order."""
    return [tuple(turn_seed(s, k) for s, n in zip(seeds, turns) if n > k) for k in range(max(turns))]


def test_instant_envs_give_the_lockstep_batches(tiny):
    rollout = _rollout(tiny, plugins=lockstep_plugins())  # no split batch even if this machine pauses past 0.5 s
    trajectories = _run(rollout, [Talk() for _ in TASKS])
    turns = [task["turns"] for task in TASKS]
    assert [len(t.turns) for t in trajectories] == turns
    assert rollout.engine.seeds == _lockstep_seeds(SEEDS, turns)
    assert rollout.batches == [8, 5, 2]
    # Without per-episode seeds, episode i's turn k has the seed a batch seeded turn_seed(3, k) gave prompt i.
    rollout.engine.seeds = []
    _run(rollout, [Talk() for _ in TASKS], seeds=None, seed=3)
    assert rollout.engine.seeds == [
        tuple((turn_seed(3, k) * 1_000_003 + i) % 2**63 for i in range(8) if turns[i] > k) for k in range(3)
    ]
    assert rollout.engine.seeds[0] == tuple(SamplingParams(seed=3).seeds_for(8))  # turn 0 as before
    rollout.engine.seeds = []
    _run(rollout, [Talk() for _ in TASKS], seeds=None, seed=None)
    assert rollout.engine.seeds == [(None,) * 8, (None,) * 5, (None,) * 2]


def test_the_engine_samples_in_the_thread_that_runs_the_rollout(tiny):
    """The trainer's thread, so torch's thread pool is the update's (agentrl.sample_here)."""
    rollout = _rollout(tiny)
    real, threads = rollout.engine.generate, []

    def generate(prompts, sampling):
        threads.append(threading.current_thread())
        return real(prompts, sampling)

    rollout.engine.generate = generate
    results = {}
    caller = threading.Thread(target=lambda: results.update(done=_run(rollout, [Talk() for _ in TASKS])))
    caller.start()
    caller.join(60)
    assert len(results["done"]) == len(TASKS) and threads and set(threads) == {caller}
    assert not _queue_threads()


@pytest.mark.parametrize("env_class", [Talk, AsyncTalk])
def test_tokens_do_not_depend_on_env_latency(tiny, env_class):
    instant = _run(_rollout(tiny, plugins=lockstep_plugins()), [Talk() for _ in TASKS])
    # Jitter within batch_wait_s: the same batches, so the logprobs too are bit for bit the same.
    rollout = _rollout(tiny, plugins=lockstep_plugins())
    jittered = _run(rollout, [env_class(lambda turn, i=i: 0.01 * ((7 * i + turn) % 5)) for i in range(8)])
    assert _figures(jittered) == _figures(instant)
    assert [t.sampler_logprobs for t in jittered] == [t.sampler_logprobs for t in instant]
    assert rollout.batches == [8, 5, 2]
    # Latency past batch_wait_s: other batches, the same tokens; logprobs equal up to float rounding.
    rollout = _rollout(tiny, plugins={"multi_turn": {"batch_wait_s": 0.005}})
    spread = _run(rollout, [env_class(lambda turn, i=i: 0.15 * ((3 * i + turn) % 4)) for i in range(8)])
    assert _figures(spread) == _figures(instant)
    for got, want in zip(spread, instant):
        assert got.sampler_logprobs == pytest.approx(want.sampler_logprobs, rel=1e-5, abs=1e-6)
    assert len(rollout.batches) > 3 and sum(rollout.batches) == 15


class Blocking(Talk):
    """Episode 0's ``step`` waits until the other episodes have ended (all their turns answered)."""

    others_done = threading.Event()

    def step(self, action):
        if self.task["id"] == "t0" and self.turn == 0:
            Talk.log.append(("waits", 0, 1))
            Blocking.others_done.wait(30)
        answer = self._answer(action)
        if sum(event == "answer" and turn == 3 for event, _, turn in Talk.log) == 3:
            Blocking.others_done.set()
        return answer


class AsyncBlocking(Blocking):
    async def step(self, action):
        if self.task["id"] == "t0" and self.turn == 0:
            Talk.log.append(("waits", 0, 1))
            for _ in range(3000):  # the event loop stays free for the other episodes' calls
                if Blocking.others_done.is_set():
                    break
                await asyncio.sleep(0.01)
        return Blocking.step(self, action)


@pytest.mark.parametrize("env_class", [Blocking, AsyncBlocking])
def test_a_slow_episode_does_not_hold_back_the_others(tiny, env_class):
    """Four episodes of three turns; episode 0's env answers its first turn only once the others
    have finished: a lockstep loop would wait for it (30 s) before anyone's second turn."""
    tasks = [dict(task, turns=3) for task in TASKS[:4]]
    reference = _rollout(tiny).run([Talk() for _ in tasks], tasks, [0] * 4, SamplingParams(6, seed=3), seeds=SEEDS[:4])
    Blocking.others_done.clear()
    rollout = _rollout(tiny)
    Talk.log = []
    trajectories = rollout.run([env_class() for _ in tasks], tasks, [0] * 4, SamplingParams(6, seed=3), seeds=SEEDS[:4])
    first_answer_of_0 = Talk.log.index(("answer", 0, 1))
    assert {(i, turn) for event, i, turn in Talk.log[:first_answer_of_0] if event == "answer"} == {
        (i, turn) for i in (1, 2, 3) for turn in (1, 2, 3)
    }
    assert rollout.batches == [4, 3, 3, 1, 1]  # episode 0's turns 2 and 3 alone, after the others ended
    assert rollout.engine.seeds[3:] == [(turn_seed(SEEDS[0], 1),), (turn_seed(SEEDS[0], 2),)]
    assert _figures(trajectories) == _figures(reference)


class SlowStart(Talk):
    """Episode 0's ``reset`` waits until the other episodes have ended (all their turns answered)."""

    others_done = threading.Event()

    def reset(self, *, seed=None, options=None):
        if options["task"]["id"] == "t0":
            Talk.log.append(("waits", 0, 0))
            SlowStart.others_done.wait(30)
        return super().reset(seed=seed, options=options)

    def _answer(self, action):
        answer = super()._answer(action)
        if sum(event == "answer" and turn == 3 for event, _, turn in Talk.log) == 3:
            SlowStart.others_done.set()
        return answer


def test_a_slow_reset_does_not_hold_back_the_others(tiny):
    """``reset`` is part of each episode's own chain: episode 0's env resets only once the others have
    finished, and they do not wait for it (a rollout that reset every env first would wait 30 s)."""
    tasks = [dict(task, turns=3) for task in TASKS[:4]]
    reference = _rollout(tiny).run([Talk() for _ in tasks], tasks, [0] * 4, SamplingParams(6, seed=3), seeds=SEEDS[:4])
    SlowStart.others_done.clear()
    rollout = _rollout(tiny)
    Talk.log = []
    trajectories = rollout.run([SlowStart() for _ in tasks], tasks, [0] * 4, SamplingParams(6, seed=3), seeds=SEEDS[:4])
    first_answer_of_0 = Talk.log.index(("answer", 0, 1))
    assert {(i, turn) for event, i, turn in Talk.log[:first_answer_of_0] if event == "answer"} == {
        (i, turn) for i in (1, 2, 3) for turn in (1, 2, 3)
    }
    assert rollout.batches[-3:] == [1, 1, 1]  # episode 0's three turns alone, after the others ended
    assert rollout.engine.seeds[-3:] == [(turn_seed(SEEDS[0], k),) for k in range(3)]
    assert _figures(trajectories) == _figures(reference)


class Interrupt(BaseException):
    """Stands for a Ctrl-C reaching the rollout (not an ``Exception``: never the env's failure)."""


class Interrupts(Talk):
    def step(self, action):
        if self.task["id"] == "t2":
            raise Interrupt
        return super().step(action)


class InterruptsHere(Interrupts):
    concurrent_safe = False  # its calls are made in the rollout's own thread


def _queue_threads():
    names = ("agentrl-batching-queue", "agentrl-requesters")
    return [t for t in threading.enumerate() if t.name in names and t.is_alive()]


@pytest.mark.parametrize("env_class", [Interrupts, InterruptsHere])
def test_an_interrupt_stops_the_rollout_and_its_queue(tiny, env_class):
    rollout = _rollout(tiny, call_timeout_s=5)
    before = len(_queue_threads())
    with pytest.raises(Interrupt):
        _run(rollout, [env_class() for _ in TASKS])
    assert len(_queue_threads()) == before
    assert [len(t.turns) for t in _run(rollout, [Talk() for _ in TASKS])] == [t["turns"] for t in TASKS]


def test_a_keyboard_interrupt_raised_by_engine_code_reaches_the_rollout_as_it_was(tiny):
    """The engine runs in the rollout's thread: what it raises that is not an Exception is
    raised by the rollout (the trainer names it as the plugin's failure), never a hang."""
    rollout = _rollout(tiny)
    real = rollout.engine.generate

    def generate(prompts, sampling):
        if len(rollout.engine.seeds) == 1:  # the second turn's batch
            raise KeyboardInterrupt
        return real(prompts, sampling)

    rollout.engine.generate = generate
    before = len(_queue_threads())
    with pytest.raises(KeyboardInterrupt) as caught:
        _run(rollout, [Talk() for _ in TASKS])
    assert caught.traceback[-1].name == "generate" and len(_queue_threads()) == before
    rollout.engine.generate = real
    assert [len(t.turns) for t in _run(rollout, [Talk() for _ in TASKS])] == [t["turns"] for t in TASKS]


class Gate(Talk):
    """A ``step`` that waits for the test to open the gate, recording which calls ran."""

    gate = threading.Event()
    ran: list[str] = []

    def step(self, action):
        Gate.gate.wait(10)
        Gate.ran.append(action)
        return [], 0.0, True, {}


def test_submit_keeps_the_order_per_instance_and_cancels_the_calls_not_started():
    workers = EnvWorkers(CallGuard(timeout_s=20), workers=2)
    Gate.gate.clear()
    Gate.ran = []
    one, two = Gate(), Gate()
    futures = [
        workers.submit(EnvCall(env, "step", (name,)))
        for env, name in [(one, "a1"), (one, "a2"), (two, "b1"), (one, "a3")]
    ]
    # a1 and b1 run (a thread per instance, both held at the gate); a2 and a3 wait behind a1
    workers.cancel([futures[3]])
    Gate.gate.set()
    outcomes = [f.result(timeout=20) for f in futures[:3]]
    assert futures[3].cancelled() and [error for _, error in outcomes] == [None] * 3
    assert sorted(Gate.ran) == ["a1", "a2", "b1"] and Gate.ran.index("a1") < Gate.ran.index("a2")
