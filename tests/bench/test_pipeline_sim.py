"""``bench/pipeline_sim.py``: the simulated pipeline's logic on configurations whose answer is known by hand
(no timing: every figure here is simulated time)."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import pipeline_hw  # noqa: E402
import pipeline_sim  # noqa: E402
from pipeline_sim import SimConfig, simulate  # noqa: E402

# 32 single-turn episodes of exactly 40 sampled tokens after a 48-token prompt; a replica's decode
# iteration takes 0.25 s whatever the batch (a static batch), so a collection is 40 x 0.25 = 10 s
# of decoding; the update trains 32 x 88 = 2816 tokens at 281.6 tokens/s: 10 s.
BASE = dict(episodes=32, turns=1, prompt_tokens=48, gen_tokens=40, engine_batch=32, decode_t0=0.25, train_tps=281.6)


def run(**overrides) -> pipeline_sim.SimResult:
    return simulate(SimConfig(**{**BASE, **overrides}))


def test_synchronous_step_is_rollout_plus_update_plus_sync():
    # 2 GB of weights at 8 Gb/s: 2 s; the env answers after 1 s
    result = run(env_latency=1.0, weight_bytes=2e9, sync_gbps=8)
    assert result.rollout_s == pytest.approx(11.0)
    assert result.update_s == pytest.approx(10.0)
    assert result.sync_s == pytest.approx(2.0)
    assert result.step_s == pytest.approx(23.0)
    assert result.staleness_mean == 0 and result.staleness_max == 0


def test_with_no_latency_and_unbounded_engines_a_step_is_the_update():
    result = run(decode_t0=1e-9, engines=64, engine_batch=1)
    assert result.step_s == pytest.approx(10.0, rel=1e-6)
    assert result.trainer_util == pytest.approx(1.0, rel=1e-6)


@pytest.mark.parametrize(("gen_tokens", "expected"), [(40, 12.0), (80, 20.0)])
def test_one_step_off_hides_the_shorter_of_collection_and_update(gen_tokens, expected):
    # update + sync = 12 s; the collection takes 10 s (hidden behind the trainer) or 20 s (the trainer waits)
    train_tps = 32 * (48 + gen_tokens) / 10.0
    result = run(gen_tokens=gen_tokens, train_tps=train_tps, weight_bytes=2e9, sync_gbps=8, async_steps=1)
    assert result.step_s == pytest.approx(expected)
    assert result.staleness_mean == pytest.approx(1.0) and result.staleness_max == 1
    sync = run(gen_tokens=gen_tokens, train_tps=train_tps, weight_bytes=2e9, sync_gbps=8)
    assert sync.step_s == pytest.approx(gen_tokens * 0.25 + 12.0)


def test_doubling_the_engines_halves_a_generation_bound_collection():
    # compute-bound replicas (an iteration costs 10 ms per sequence): half the sequences each, twice as fast
    one = run(decode_t0=0.0, decode_t1=0.01, engines=1)
    two = run(decode_t0=0.0, decode_t1=0.01, engines=2)
    assert one.rollout_s == pytest.approx(32 * 40 * 0.01)
    assert two.rollout_s == pytest.approx(one.rollout_s / 2)
    # memory-bound replicas full to their batch limit: 4 waves of 8 on one, 2 on two
    waves = run(episodes=32, engine_batch=8, engines=1).rollout_s
    assert waves == pytest.approx(4 * 10.0)
    assert run(episodes=32, engine_batch=8, engines=2).rollout_s == pytest.approx(waves / 2)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(async_steps=0, partial=True),
        dict(async_steps=1),
        dict(async_steps=2),
        dict(async_steps=1, partial=True),
        dict(async_steps=2, partial=True, inflight_batches=3),
        dict(async_steps=3, partial=True, inflight_batches=2, sync_mode="per-replica"),
    ],
)
def test_staleness_never_exceeds_the_bound(overrides):
    # the update (about 4 s) is shorter than a collection, so new versions arrive while episodes run
    result = run(
        **overrides,
        train_tps=2000,
        turns=3,
        obs_tokens=20,
        gen_sigma=0.8,
        max_gen_tokens=200,
        env_latency=0.5,
        env_sigma=1.0,
        engines=3,
        engine_batch=8,
        decode_t0=0.02,
        decode_t1=0.001,
        weight_bytes=1e9,
        sync_gbps=4,
        steps=14,
        seed=3,
    )
    k = overrides["async_steps"]
    assert 0 <= result.staleness_mean <= k and result.staleness_max <= k
    if not overrides.get("partial"):
        assert result.staleness_mean == pytest.approx(k)  # a whole batch is sampled by version t - 1 - k
    elif k:
        assert result.staleness_mean < k  # episodes in flight go on with each new version


def test_sync_time_broadcast_against_per_replica():
    one = 15e9 * 8 / 100e9
    broadcast = SimConfig(weight_bytes=15e9, sync_gbps=100, engines=64)
    assert broadcast.sync_s() == pytest.approx(one)
    assert SimConfig(weight_bytes=15e9, sync_gbps=100, engines=64, sync_mode="per-replica").sync_s() == pytest.approx(
        64 * one
    )
    # per replica, the trainer waits for every copy
    slow = run(weight_bytes=1e9, sync_gbps=8, engines=4, sync_mode="per-replica")
    assert slow.step_s == pytest.approx(10.0 / 4 * 4 + 10.0 + 4.0)


def test_env_workers_and_the_driver_bound_a_collection():
    fast = dict(decode_t0=1e-6, env_latency=2.0)
    assert run(**fast).rollout_s == pytest.approx(2.0, abs=0.01)
    assert run(**fast, env_workers=8).rollout_s == pytest.approx(4 * 2.0, abs=0.01)
    # one controller hands out 32 turns, then 32 env calls, 50 ms each: the last call starts at 3.2 s
    driven = run(**fast, driver_ms=50).rollout_s
    assert driven == pytest.approx(64 * 0.05 + 2.0, abs=0.01)


def test_long_tailed_lengths_make_stragglers_that_partial_rollouts_overlap():
    tail = dict(episodes=64, turns=2, gen_tokens=40, gen_sigma=1.2, max_gen_tokens=1000, decode_t1=0.0005, engines=2)
    fixed = run(**{**tail, "gen_sigma": 0.0})
    straggling = run(**tail)
    assert straggling.rollout_s > 2 * fixed.rollout_s  # the longest episode sets the collection's length
    assert straggling.engine_util < fixed.engine_util
    overlapped = run(**tail, async_steps=2, partial=True, inflight_batches=3)
    assert overlapped.steps_per_hour > 1.5 * straggling.steps_per_hour


def test_runs_are_reproducible_and_seeds_differ():
    config = dict(gen_sigma=1.0, env_latency=0.3, env_sigma=0.5, turns=2)
    assert run(**config, seed=1).step_ends == run(**config, seed=1).step_ends
    assert run(**config, seed=1).step_ends != run(**config, seed=2).step_ends


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sync-mode", "multicast"], "--sync-mode 'multicast': allowed are broadcast, per-replica"),
        (["--inflight-batches", "2"], "--inflight-batches 2: more than 1 needs --partial"),
        (["--engines", "0"], "--engines 0: must be >= 1"),
    ],
)
def test_bad_flags_are_one_line(argv, message, capsys):
    assert pipeline_sim.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_the_default_job_and_json_output(capsys):
    assert pipeline_sim.main(["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"]["decode_t0"] == pipeline_sim.CPU_DEFAULT["decode_t0"]
    assert out["step_s"] == pytest.approx(out["rollout_s"] + out["update_s"])
    assert pipeline_sim.main(["--async-steps", "1"]) == 0
    assert "staleness of trained tokens: mean 1.00, max 1" in capsys.readouterr().out


def test_find_returns_the_smallest_engine_count_that_keeps_the_trainer_busy(capsys):
    config = SimConfig(**{**BASE, "decode_t0": 0.0, "decode_t1": 0.01, "async_steps": 1, "steps": 6, "warmup": 2})
    engines, result = pipeline_sim.find(config, "engines", 0.9)
    assert result.trainer_util >= 0.9
    assert simulate(SimConfig(**{**asdict(config), "engines": engines - 1})).trainer_util < 0.9
    assert engines == 2  # 12.8 s of decoding on one replica against a 10 s update


def test_calibration_fits_a_run_and_reproduces_its_steps(tmp_path, capsys):
    rows = [
        {"step": s, "perf/rollout_seconds": r, "perf/update_seconds": u, "perf/step_seconds": r + u,
         "rollout/sampled_tokens_mean": 30.0, "rollout/sampled_tokens_max": 64.0, "rollout/sequence_length_mean": 78.0}
        for s, r, u in ((1, 25.0, 20.0), (2, 16.0, 12.48), (3, 16.0, 12.48))
    ]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    fitted, steps = pipeline_hw.calibration_from_run(tmp_path, 32)
    assert [s["step"] for s in steps] == [2, 3]  # step 1 is left out
    assert fitted["decode_t0"] == pytest.approx(0.25) and fitted["train_tps"] == pytest.approx(200.0)
    assert pipeline_sim.main(["--calibrate", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "step 2: measured 28.5 s" in out and "mean error" in out
    assert pipeline_sim.main(["--calibrate", str(tmp_path / "nowhere")]) == 2
    assert "no metrics.jsonl there" in capsys.readouterr().err


def test_hardware_figures_follow_the_model_and_the_context():
    short = pipeline_hw.hardware("7b", "h100", 2_000, trainers=8)
    long = pipeline_hw.hardware("7b", "h100", 32_000, trainers=8)
    assert short["engine_gpus"] == 1 and long["engine_batch"] < short["engine_batch"] / 8
    assert long["decode_t1"] > short["decode_t1"]  # each sequence reads a longer KV cache
    h100, h200 = (pipeline_hw.hardware("70b", gpu, 2_000, 8) for gpu in ("h100", "h200"))
    assert h100["engine_gpus"] == h200["engine_gpus"] == 4  # 141 GB of weights: at most half of the memory
    assert h200["engine_batch"] > 2 * h100["engine_batch"] and h200["decode_t0"] < h100["decode_t0"]
    # bf16 7B weights (15.2 GB) at 100 Gb/s
    assert SimConfig(weight_bytes=short["weight_bytes"], sync_gbps=100).sync_s() == pytest.approx(1.22, abs=0.01)
    assert math.isclose(pipeline_hw.MODELS["7b"].kv_bytes, 57_344)
