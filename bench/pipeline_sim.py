"""A discrete-event simulation of agentrl's asynchronous RL pipeline, for sizing runs beyond one host.

    python bench/pipeline_sim.py                                   # this machine's default job (calibrated)
    python bench/pipeline_sim.py --model 7b --gpu h100 --trainers 8 --engines 8 --episodes 512 \\
        --turns 4 --gen-tokens 2048 --env-latency 1 --async-steps 1
    python bench/pipeline_sim.py --calibrate RUN_DIR               # compare with a run's measured phases

What is simulated (docs/scaling.md states the assumptions):

* A step trains on B episodes (``--episodes``). An episode is ``--turns`` turns; each turn prefills the
  new tokens (the prompt, then the env's reply: the prefix is cached), samples a lognormal number of
  tokens (``--gen-tokens`` mean, ``--gen-sigma``, capped at ``--max-gen-tokens``), then waits for an env
  worker (``--env-workers``, 0: one per episode) that answers after a lognormal ``--env-latency``.
* ``--engines`` E replicas, each holding at most ``--engine-batch`` C sequences. With n sequences
  decoding, one decode iteration (one token for each) takes ``t0 + t1 * n`` seconds: t1 = 0 is a
  memory-bound GPU (the weights are read once per iteration), t0 = 0 a compute-bound CPU. Between
  events the sequences advance as a fluid, so the cost is one event per turn, not per token.
* ``--trainers`` T: an update takes ``tokens / (T * train_tps) + allreduce + overhead``.
* After each update the new weights go to every replica: ``--sync-mode broadcast`` (one pipelined
  stream, the same time for any E) or ``per-replica`` (the source sends E copies one after another).
  The trainer waits for the transfer unless ``--sync-overlaps-trainer``.
* ``--async-steps`` k as in agentrl: step t trains episodes of policy version ``max(0, t - 1 - k)``;
  batches are collected one after another (``--inflight-batches`` 1) and the engines load a staged
  version between two collections. With ``--partial`` every replica pauses for each new version and
  goes on with it mid-episode (tokens record their version; a batch still starts only on replicas that
  hold a version the bound allows), and up to ``--inflight-batches`` batches may be collected at once.
* ``--driver-ms``: one controller hands out every turn and env call, one at a time (0: free).
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import random
import statistics
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_hw import GPUS, MODELS, calibration_from_run, hardware  # noqa: E402


@dataclass
class SimConfig:
    """Every parameter of one simulated run (times in seconds, sizes in tokens or bytes)."""

    episodes: int = 32
    turns: int = 1
    prompt_tokens: float = 48
    obs_tokens: float = 32
    gen_tokens: float = 40
    gen_sigma: float = 0.0
    max_gen_tokens: float = math.inf
    env_latency: float = 0.0
    env_sigma: float = 0.0
    env_workers: int = 0
    engines: int = 1
    engine_batch: int = 32
    decode_t0: float = 0.0
    decode_t1: float = 0.0
    prefill_tps: float = math.inf
    trainers: int = 1
    train_tps: float = math.inf
    allreduce_s: float = 0.0
    update_overhead_s: float = 0.0
    weight_bytes: float = 0.0
    sync_gbps: float = math.inf
    sync_latency_s: float = 0.0
    sync_mode: str = "broadcast"
    sync_overlaps_trainer: bool = False
    async_steps: int = 0
    partial: bool = False
    inflight_batches: int = 1
    driver_ms: float = 0.0
    steps: int = 12
    warmup: int = 3
    seed: int = 0

    def check(self) -> None:
        """Raise ValueError (one line naming the value and what is allowed) on a bad combination."""
        positive = ("episodes", "turns", "engines", "engine_batch", "trainers", "inflight_batches", "steps")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)}: must be >= 1")
        if self.sync_mode not in ("broadcast", "per-replica"):
            raise ValueError(f"--sync-mode {self.sync_mode!r}: allowed are broadcast, per-replica")
        if self.inflight_batches > 1 and not self.partial:
            raise ValueError(
                f"--inflight-batches {self.inflight_batches}: more than 1 needs --partial "
                "(without it every batch is sampled by one fixed version)"
            )
        if self.async_steps < 0 or not 0 <= self.warmup < self.steps:
            raise ValueError(
                f"--async-steps {self.async_steps} / --warmup {self.warmup}: need k >= 0, 0 <= warmup < steps"
            )
        if self.decode_t0 <= 0 and self.decode_t1 <= 0 and self.gen_tokens > 0:
            raise ValueError("--decode-t0 and --decode-t1 are both 0: a decode iteration must take some time")

    def iteration_s(self, n: int) -> float:
        """Seconds of one decode iteration with ``n`` sequences decoding on a replica."""
        return self.decode_t0 + self.decode_t1 * n

    def sync_s(self) -> float:
        """Seconds until the last replica holds a new version (transfer only)."""
        one = self.weight_bytes * 8 / (self.sync_gbps * 1e9) if self.weight_bytes else 0.0
        if self.sync_mode == "per-replica":
            return self.engines * (one + self.sync_latency_s)
        return one + self.sync_latency_s * math.ceil(math.log2(self.engines + 1))


@dataclass
class SimResult:
    """What a simulated run measured over its steps after the warm-up."""

    step_s: float
    steps_per_hour: float
    trainer_util: float
    engine_util: float
    engine_busy: float
    staleness_mean: float
    staleness_max: float
    rollout_s: float
    update_s: float
    sync_s: float
    trainer_wait_s: float
    tokens_per_step: float
    step_ends: list = field(default_factory=list, repr=False)


class _Seq:
    """One turn's generation on a replica."""

    __slots__ = ("episode", "finish_v", "seg_v", "version", "engine")

    def __init__(self, episode: _Episode, engine: _Engine, gen: float) -> None:
        self.episode, self.engine = episode, engine
        self.version = engine.version
        self.seg_v = engine.v
        self.finish_v = engine.v + gen


class _Episode:
    __slots__ = ("batch", "turn", "gens", "tokens", "by_version", "started")

    def __init__(self, batch: int, gens: list[float], cfg: SimConfig, started: float) -> None:
        self.batch, self.turn, self.gens, self.started = batch, 0, gens, started
        self.tokens = cfg.prompt_tokens + (cfg.turns - 1) * cfg.obs_tokens + sum(gens)
        self.by_version: dict[int, float] = {}


class _Engine:
    """A replica: sequences advance together; ``v`` counts tokens sampled per decoding sequence."""

    def __init__(self, index: int) -> None:
        self.index, self.version, self.v, self.last = index, 0, 0.0, 0.0
        self.decoding: list[tuple[float, int, _Seq]] = []
        self.slots, self.paused_until, self.stamp = 0, 0.0, 0
        self.tokens = self.busy = 0.0


class PipelineSim:
    """The simulation; ``run()`` returns a :class:`SimResult`."""

    def __init__(self, cfg: SimConfig) -> None:
        cfg.check()
        self.cfg, self.rng, self.now = cfg, random.Random(cfg.seed), 0.0
        self.events: list = []
        self.counter = itertools.count()
        self.engines = [_Engine(i) for i in range(cfg.engines)]
        self.loads = [(0, i) for i in range(cfg.engines)]  # (slots, index), lazily updated: a min-heap
        self.gen_queue: list[tuple[int, int, _Episode]] = []  # (batch, arrival, episode): oldest batch first
        self.env_queue: list[_Episode] = []
        self.env_free = cfg.env_workers or math.inf
        self.driver_free = 0.0
        self.published = 0  # newest version the trainer has made (and sent)
        self.staged = 0  # newest version every replica has received
        self.next_batch, self.open_batches = 1, 0
        self.left: dict[int, int] = {}
        self.done_batches: dict[int, list[_Episode]] = {}
        self.trainer_busy_until, self.training, self.trained = 0.0, False, 0
        self.log: list[dict] = []
        self.collect_start: dict[int, float] = {}
        self.collect_end: dict[int, float] = {}
        self.arrivals: dict[int, int] = {}
        self.marks: dict[int, tuple[float, float]] = {0: (0.0, 0.0)}

    # -- events -------------------------------------------------------------------------------------
    def at(self, time: float, fn, *args) -> None:
        heapq.heappush(self.events, (time, next(self.counter), fn, args))

    def driver(self, fn, *args) -> None:
        """Run ``fn`` after the single controller has handled it (FIFO, ``driver_ms`` each)."""
        if self.cfg.driver_ms <= 0:
            fn(*args)
            return
        self.driver_free = max(self.now, self.driver_free) + self.cfg.driver_ms / 1000
        self.at(self.driver_free, fn, *args)

    # -- replicas -----------------------------------------------------------------------------------
    def advance(self, e: _Engine) -> None:
        dt = self.now - max(e.last, e.paused_until) if self.now > e.paused_until else 0.0
        if e.decoding and dt > 0:
            n = len(e.decoding)
            dv = dt / self.cfg.iteration_s(n)
            e.v += dv
            e.tokens += n * dv
            e.busy += dt
        e.last = self.now

    def reschedule(self, e: _Engine) -> None:
        e.stamp += 1
        if e.decoding:
            start = max(self.now, e.paused_until)
            when = start + (e.decoding[0][0] - e.v) * self.cfg.iteration_s(len(e.decoding))
            self.at(when, self.decoded, e, e.stamp)

    def decoded(self, e: _Engine, stamp: int) -> None:
        if stamp != e.stamp:
            return
        self.advance(e)
        if e.decoding:  # this event was set for the first sequence's end: no rounding may leave it running
            e.v = max(e.v, e.decoding[0][0])
        while e.decoding and e.decoding[0][0] <= e.v * (1 + 1e-12):
            _, _, seq = heapq.heappop(e.decoding)
            ep = seq.episode
            ep.by_version[seq.version] = ep.by_version.get(seq.version, 0.0) + seq.finish_v - seq.seg_v
            e.slots -= 1
            heapq.heappush(self.loads, (e.slots, e.index))
            self.driver(self.to_env, ep)
        self.reschedule(e)
        self.dispatch()

    def prefilled(self, e: _Engine, ep: _Episode) -> None:
        self.advance(e)
        seq = _Seq(ep, e, ep.gens[ep.turn])
        heapq.heappush(e.decoding, (seq.finish_v, next(self.counter), seq))
        self.reschedule(e)

    def dispatch(self) -> None:
        """Hand waiting turns to replicas with a free slot and an allowed version, least loaded first."""
        while self.gen_queue:
            e = self.least_loaded()
            if e is None:
                return
            _, _, ep = heapq.heappop(self.gen_queue)
            e.slots += 1
            heapq.heappush(self.loads, (e.slots, e.index))
            new = self.cfg.prompt_tokens if ep.turn == 0 else self.cfg.obs_tokens
            self.at(self.now + new / self.cfg.prefill_tps, self.prefilled, e, ep)

    def least_loaded(self) -> _Engine | None:
        """The replica with the fewest sequences (None: every one is full). Every replica may take a
        turn of any open batch: a batch opens only once every replica holds a version its bound allows."""
        while self.loads:
            slots, index = self.loads[0]
            if slots == self.engines[index].slots:
                return self.engines[index] if slots < self.cfg.engine_batch else None
            heapq.heappop(self.loads)  # a stale entry
        return None

    def want_turn(self, ep: _Episode) -> None:
        heapq.heappush(self.gen_queue, (ep.batch, next(self.counter), ep))
        self.dispatch()

    # -- env workers --------------------------------------------------------------------------------
    def lognormal(self, mean: float, sigma: float) -> float:
        if mean <= 0 or sigma <= 0:
            return max(mean, 0.0)
        return self.rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)

    def to_env(self, ep: _Episode) -> None:
        self.env_queue.append(ep)
        self.env_dispatch()

    def env_dispatch(self) -> None:
        while self.env_queue and self.env_free > 0:
            self.env_free -= 1
            self.at(
                self.now + self.lognormal(self.cfg.env_latency, self.cfg.env_sigma),
                self.env_done,
                self.env_queue.pop(0),
            )

    def env_done(self, ep: _Episode) -> None:
        self.env_free += 1
        self.env_dispatch()
        ep.turn += 1
        if ep.turn < self.cfg.turns:
            self.driver(self.want_turn, ep)
            return
        self.left[ep.batch] -= 1
        self.done_batches.setdefault(ep.batch, []).append(ep)
        if self.left[ep.batch] == 0:
            self.collect_end[ep.batch] = self.now
            self.open_batches -= 1
            self.maybe_start_batch()
            self.maybe_train()

    # -- collection, training, weight sync ----------------------------------------------------------
    def maybe_start_batch(self) -> None:
        cfg = self.cfg
        while self.open_batches < cfg.inflight_batches and self.trained < cfg.steps:
            need = max(0, self.next_batch - 1 - cfg.async_steps)
            if self.staged < need:
                return
            t, self.next_batch = self.next_batch, self.next_batch + 1
            self.open_batches += 1
            self.left[t] = cfg.episodes
            self.collect_start[t] = self.now
            if not cfg.partial:
                for e in self.engines:  # idle between collections: load the staged version
                    e.version = max(0, t - 1 - cfg.async_steps)
            for _ in range(cfg.episodes):
                gens = [
                    min(self.lognormal(cfg.gen_tokens, cfg.gen_sigma), cfg.max_gen_tokens) for _ in range(cfg.turns)
                ]
                self.driver(self.want_turn, _Episode(t, gens, cfg, self.now))

    def maybe_train(self) -> None:
        t = self.trained + 1
        if self.training or t not in self.collect_end or self.now < self.trainer_busy_until:
            return
        cfg, batch = self.cfg, self.done_batches.pop(t)
        tokens = sum(ep.tokens for ep in batch)
        update = tokens / (cfg.trainers * cfg.train_tps) + (cfg.allreduce_s if cfg.trainers > 1 else 0.0)
        update += cfg.update_overhead_s
        sampled = sum(sum(ep.by_version.values()) for ep in batch)
        lag = sum((t - 1 - v) * n for ep in batch for v, n in ep.by_version.items())
        worst = max((t - 1 - v for ep in batch for v in ep.by_version), default=0)
        self.training = True
        self.log.append(
            {
                "step": t,
                "start": self.now,
                "update": update,
                "tokens": tokens,
                "sampled": sampled,
                "lag": lag,
                "worst": worst,
            }
        )
        self.at(self.now + update, self.updated, t)

    def updated(self, t: int) -> None:
        cfg = self.cfg
        self.trained, self.published, self.training = t, t, False
        sync = cfg.sync_s()
        self.log[-1].update(end=self.now, sync=sync)
        if t == cfg.warmup or t == cfg.steps:
            for e in self.engines:
                self.advance(e)
            self.marks[t] = (sum(e.tokens for e in self.engines), sum(e.busy for e in self.engines))
        if not cfg.sync_overlaps_trainer:
            self.trainer_busy_until = self.now + sync
        one = sync / cfg.engines if cfg.sync_mode == "per-replica" else sync
        for i, e in enumerate(self.engines):
            arrive = self.now + (one * (i + 1) if cfg.sync_mode == "per-replica" else sync)
            if cfg.partial:
                self.at(arrive - one, self.pause, e, t, arrive)
            self.at(arrive, self.received, e, t)
        self.at(self.trainer_busy_until, self.maybe_train)
        self.maybe_start_batch()

    def pause(self, e: _Engine, version: int, until: float) -> None:
        """Partial rollouts: the replica stops decoding while it loads ``version`` in place."""
        self.advance(e)
        for _, _, seq in e.decoding:  # the tokens so far belong to the old version
            ep = seq.episode
            ep.by_version[seq.version] = ep.by_version.get(seq.version, 0.0) + e.v - seq.seg_v
            seq.seg_v, seq.version = e.v, version
        e.paused_until, e.version = max(e.paused_until, until), version
        self.reschedule(e)

    def received(self, e: _Engine, version: int) -> None:
        self.arrivals[version] = self.arrivals.get(version, 0) + 1
        if self.arrivals[version] == self.cfg.engines:
            self.staged = max(self.staged, version)
            del self.arrivals[version]
        self.maybe_start_batch()
        self.dispatch()

    # -- the run ------------------------------------------------------------------------------------
    def run(self) -> SimResult:
        """Simulate ``steps`` steps; figures are over the steps after ``warmup``."""
        self.maybe_start_batch()
        while self.events and self.trained < self.cfg.steps:
            self.now, _, fn, args = heapq.heappop(self.events)
            fn(*args)
        if self.trained < self.cfg.steps:
            raise RuntimeError(f"the pipeline stalled after {self.trained} steps (a bug in the simulation)")
        for e in self.engines:
            self.advance(e)
        return self.summary()

    def summary(self) -> SimResult:
        cfg, w = self.cfg, self.cfg.warmup
        rows, prev = self.log[w:], self.log[w - 1] if w else None
        t0 = prev["end"] if prev else 0.0
        span, n = self.log[-1]["end"] - t0, len(rows)
        peak = cfg.engines * cfg.engine_batch / cfg.iteration_s(cfg.engine_batch)
        tokens = self.marks[cfg.steps][0] - self.marks[w][0]
        busy = self.marks[cfg.steps][1] - self.marks[w][1]
        sampled = sum(r["sampled"] for r in rows)
        free = [(p["end"] + (0.0 if cfg.sync_overlaps_trainer else p["sync"])) for p in self.log[max(w - 1, 0) : -1]]
        waits = [r["start"] - f for f, r in zip(free, rows[-len(free) :])] if free else []
        rollouts = [self.collect_end[r["step"]] - self.collect_start[r["step"]] for r in rows]
        return SimResult(
            step_s=span / n,
            steps_per_hour=3600 * n / span,
            trainer_util=sum(r["update"] for r in rows) / span,
            engine_util=tokens / (peak * span) if peak > 0 else 0.0,
            engine_busy=busy / (cfg.engines * span),
            staleness_mean=sum(r["lag"] for r in rows) / sampled if sampled else 0.0,
            staleness_max=max(r["worst"] for r in rows),
            rollout_s=sum(rollouts) / n,
            update_s=sum(r["update"] for r in rows) / n,
            sync_s=cfg.sync_s(),
            trainer_wait_s=sum(waits) / len(waits) if waits else 0.0,
            tokens_per_step=sum(r["tokens"] for r in rows) / n,
            step_ends=[r["end"] for r in self.log],
        )


def simulate(cfg: SimConfig) -> SimResult:
    """Run one simulation."""
    return PipelineSim(cfg).run()


# -- command line ---------------------------------------------------------------------------------------
CPU_DEFAULT = {  # this machine's default job, fitted by --calibrate (2-core AMD EPYC, AVX2, fp32; see docs/scaling.md)
    "episodes": 32,
    "prompt_tokens": 48.0,
    "gen_tokens": 35.5,
    "gen_sigma": 0.6,
    "max_gen_tokens": 64.0,
    "engine_batch": 32,
    "decode_t0": 0.25,
    "train_tps": 181.0,
}


def episode_tokens(cfg: dict) -> float:
    """Tokens of a whole episode: the prompt, every env reply but the last, every turn's sample."""
    turns = cfg.get("turns", 1)
    return cfg.get("prompt_tokens", 48) + (turns - 1) * cfg.get("obs_tokens", 32) + turns * cfg.get("gen_tokens", 40)


def mean_context(cfg: dict) -> float:
    """Mean tokens a decoding sequence holds in the KV cache over an episode (the middle turn, half sampled)."""
    turns, gen = cfg.get("turns", 1), cfg.get("gen_tokens", 40)
    return cfg.get("prompt_tokens", 48) + (turns - 1) / 2 * (gen + cfg.get("obs_tokens", 32)) + gen / 2


def parser() -> argparse.ArgumentParser:
    """Flags for every SimConfig field, presets, --calibrate and --find."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for f in fields(SimConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.type == "bool":
            p.add_argument(flag, action="store_true", default=None)
        else:
            kind = {"int": int, "float": float, "str": str}[f.type]
            p.add_argument(flag, type=kind, default=None, help=f"default {f.default}")
    p.add_argument("--model", choices=sorted(MODELS), help="derive engine and trainer figures for this model ...")
    p.add_argument("--gpu", choices=sorted(GPUS), default="h100", help="... on this GPU (assumed figures)")
    p.add_argument("--calibrate", type=Path, metavar="RUN_DIR", help="fit this machine's figures to a run and compare")
    p.add_argument("--find", choices=("engines", "async-steps"), help="smallest value keeping the trainer busy")
    p.add_argument("--target", type=float, default=0.9, help="trainer utilisation --find aims at")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def build(args: argparse.Namespace) -> tuple[SimConfig, dict]:
    """The SimConfig of the flags: this machine's job, or a --model's derived figures, then the flags given."""
    given = {f.name: getattr(args, f.name) for f in fields(SimConfig) if getattr(args, f.name) is not None}
    values, extra = ({} if args.model else dict(CPU_DEFAULT)), {}
    values.update(given)
    if args.model:
        hw = hardware(args.model, args.gpu, mean_context(values), values.get("trainers", 1), episode_tokens(values))
        extra["engine_gpus"] = hw.pop("engine_gpus")
        values = {**hw, **given}
    return SimConfig(**values), extra


def find(cfg: SimConfig, what: str, target: float) -> tuple[int, SimResult]:
    """The smallest ``engines`` (doubling, then bisection) or ``async_steps`` whose trainer utilisation reaches ``target``."""
    name = "engines" if what == "engines" else "async_steps"

    def at(value: int) -> SimResult:
        return simulate(SimConfig(**{**asdict(cfg), name: value}))

    if name == "async_steps":
        for k in range(0, 9):
            result = at(k)
            if result.trainer_util >= target:
                return k, result
        return k, result
    high = 1
    while at(high).trainer_util < target:
        if high >= 4096:
            return high, at(high)
        high *= 2
    low = high // 2
    while high - low > max(1, high // 16):
        mid = (low + high) // 2
        low, high = (mid, high) if at(mid).trainer_util < target else (low, mid)
    return high, at(high)


def report(cfg: SimConfig, result: SimResult, extra: dict) -> str:
    """A few readable lines."""
    gpus = cfg.engines * extra.get("engine_gpus", 1)
    lines = [
        f"pipeline: {cfg.trainers} trainer GPU(s), {cfg.engines} engine replica(s) ({gpus} GPU(s)), "
        f"{cfg.episodes} episodes x {cfg.turns} turn(s), async_steps={cfg.async_steps}"
        + (f", partial, {cfg.inflight_batches} batch(es) in flight" if cfg.partial else ""),
        f"steps/hour {result.steps_per_hour:.1f}  ({result.step_s:.2f} s/step)",
        f"trainer utilisation {result.trainer_util:.2f}  (update {result.update_s:.2f} s, waits {result.trainer_wait_s:.2f} s, "
        f"weight sync {result.sync_s:.2f} s)",
        f"engine utilisation {result.engine_util:.2f} of peak tokens/s, busy {result.engine_busy:.2f}  "
        f"(collection {result.rollout_s:.2f} s a batch)",
        f"staleness of trained tokens: mean {result.staleness_mean:.2f}, max {result.staleness_max}",
    ]
    return "\n".join(lines)


def calibrate(args: argparse.Namespace) -> int:
    """Fit this machine's figures to a run, then simulate each of its steps and print both."""
    fitted, steps = calibration_from_run(args.calibrate, args.episodes or CPU_DEFAULT["episodes"])
    print("fitted:", json.dumps(fitted))
    errors = []
    for row in steps:
        cfg = SimConfig(
            **{**CPU_DEFAULT, **fitted, "gen_tokens": row["rollout/sampled_tokens_mean"], "steps": 6, "warmup": 1}
        )
        sim = simulate(cfg)
        measured = row["perf/step_seconds"]
        errors.append(sim.step_s / measured - 1)
        print(
            f"step {row['step']}: measured {measured:.1f} s (rollout {row['perf/rollout_seconds']:.1f} + update "
            f"{row['perf/update_seconds']:.1f}), simulated {sim.step_s:.1f} s (rollout {sim.rollout_s:.1f} + update "
            f"{sim.update_s:.1f}): {errors[-1]:+.0%}"
        )
    print(f"mean error {statistics.mean(errors):+.1%}, worst {max(errors, key=abs):+.1%}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    args = parser().parse_args(argv)
    try:
        if args.calibrate:
            return calibrate(args)
        cfg, extra = build(args)
        cfg.check()
        if args.find:
            value, result = find(cfg, args.find, args.target)
            cfg = SimConfig(**{**asdict(cfg), ("engines" if args.find == "engines" else "async_steps"): value})
            print(f"smallest {args.find} with trainer utilisation >= {args.target}: {value}")
        else:
            result = simulate(cfg)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(
            json.dumps(
                {"config": asdict(cfg), **extra, **{k: v for k, v in asdict(result).items() if k != "step_ends"}}
            )
        )
    else:
        print(report(cfg, result, extra))
    return 0


if __name__ == "__main__":
    sys.exit(main())
