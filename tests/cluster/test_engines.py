"""Engine replicas as Ray actors (``ray.engines``) on a real multi-node Ray cluster of this host:
placement on the engine node, the same tokens and logprobs as the in-process engine, weights sent
through the object store, a replica killed mid-call (restarted, same tokens), and short training
runs whose metrics and completions equal those of a run without Ray."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch

from agentrl.cluster.engines import RESTARTS, SYNC_SECONDS, RemoteEngines, check_engines
from agentrl.cluster.replica import pack_weights, plugin_choice, unpack_weights
from agentrl.cluster.routing import PrefixRouter
from agentrl.config.cluster import RayConfig
from agentrl.config.train import TrainConfig
from agentrl.errors import ConfigError, EngineError
from agentrl.model.loading import load_model
from agentrl.plugins import load_plugins
from agentrl.sampling.engine import SamplingParams
from agentrl.testing import lockstep_plugins
from agentrl.training.trainer import Trainer

ray = pytest.importorskip("ray")

ENGINE_NODE = {"CPU": 1, "engine": 1}
HEAD_NODE = {"CPU": 1, "head": 1}  # the module's two replicas hold the engine node's slots
PROMPTS = [[1, 5, 6, 7], [1, 9], [1, 3, 4, 5, 6, 7, 8, 9, 10, 11], [1], [1, 40, 41], [1, 60, 61, 62, 63, 64]]


def _ray_config(cluster, engines: int = 2, resources=ENGINE_NODE, **overrides) -> RayConfig:
    return RayConfig(address=cluster.address, engines=engines, engine_resources=resources, **overrides)


@pytest.fixture(scope="module")
def tiny_config(tiny_model_dir) -> TrainConfig:
    return TrainConfig(model=str(tiny_model_dir), seed=3)


@pytest.fixture(scope="module")
def remote(ray_cluster, tiny_config, tokenizer):
    """Two hf replicas of the tiny model on the engine node."""
    engines = RemoteEngines(tiny_config, _ray_config(ray_cluster), load_model(tiny_config.model), tokenizer)
    yield engines
    engines.close()


def _local(config: TrainConfig, tokenizer, model=None):
    factory = load_plugins().registry.get("engine", config.engine).factory
    return factory(model=model or load_model(config.model), tokenizer=tokenizer, config=config)


def _same(a, b) -> None:
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.finish_reason for g in a] == [g.finish_reason for g in b]
    for x, y in zip(a, b):
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5, rtol=0)


# -- routing and packing (no cluster) --------------------------------------------------------------------
def test_a_later_turn_goes_to_the_replica_of_its_longest_known_prefix():
    router = PrefixRouter(3)
    assert router.route([[1, 2], [1, 3], [1, 4], [1, 5]]) == [0, 1, 2, 0]  # least-loaded, lowest first
    router.remember([1, 2, 7, 8], 2)
    router.remember([1, 2, 7, 8, 9, 10, 11], 1)
    routes = router.route([[1, 2, 7, 8, 9, 10, 11, 12], [1, 2, 7, 8, 5], [1, 2, 7], [9]])
    assert routes == [1, 2, 0, 0]  # longest prefix wins; [1, 2, 7] has none; then least-loaded
    router.forget()
    assert router.route([[1, 2, 7, 8, 9]]) == [0]


def test_the_router_forgets_its_oldest_sequences_past_its_capacity():
    router = PrefixRouter(2, capacity=2)
    for n, replica in [(3, 1), (4, 1), (5, 1)]:
        router.remember(list(range(n)), replica)
    assert len(router.seen) == 2 and sorted(router.lengths) == [4, 5]
    assert router.route([[0, 1, 2, 9], [0, 1, 2, 3, 9]]) == [0, 1]  # length 3 forgotten


def test_packed_weights_round_trip_with_ties_kept_once(tiny_model_dir):
    model = load_model(str(tiny_model_dir))
    packed = pack_weights(model)
    assert packed["aliases"] == {"lm_head.weight": "model.embed_tokens.weight"}  # tied: sent once
    state = unpack_weights(packed)
    assert state.keys() == model.state_dict().keys()
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    bf16 = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    model.to(torch.bfloat16)
    assert all(torch.equal(unpack_weights(pack_weights(model))[k], v) for k, v in bf16.items())


def test_replicas_load_the_plugins_of_the_run(tmp_path):
    extra = tmp_path / "extra_plugin.py"
    extra.write_text("")
    manager = load_plugins(disabled=["gspo"], modules=[str(extra)])
    assert plugin_choice(manager) == (["gspo"], [str(extra)])
    assert plugin_choice(load_plugins()) == ([], []) == plugin_choice(None)


def test_engines_not_a_multiple_of_the_processes_or_with_lora_is_one_line():
    with pytest.raises(ConfigError, match=r"ray.engines=3 is not a multiple of the 2 trainer processes"):
        check_engines(TrainConfig(), RayConfig(engines=3), 2)
    with pytest.raises(ConfigError, match="ray.engines with lora"):
        check_engines(TrainConfig(lora={}), RayConfig(engines=2), 1)


# -- replicas on the cluster -----------------------------------------------------------------------------
def test_replicas_run_on_the_engine_node_and_say_so(remote, ray_cluster):
    assert [ray_cluster.name_of(node) for node in remote.replica_nodes()] == ["engine", "engine"]
    short = ray_cluster.node_ids["engine"][:6]
    assert remote.description.startswith(f"2 hf replicas on Ray: node {short} (")
    assert remote.keeps_synced_model is False


@pytest.mark.parametrize("seeding", ["prompt_seeds", "seed"])
def test_replicas_sample_the_tokens_of_the_in_process_engine(remote, tiny_config, tokenizer, seeding):
    sampling = SamplingParams(max_new_tokens=12, temperature=1.0, top_k=50)
    sampling = dataclasses_replace(sampling, seeding)
    local = _local(tiny_config, tokenizer).generate(PROMPTS, sampling)
    remote.router.forget()
    got = remote.generate(PROMPTS, sampling)
    _same(got, local)
    assert len(set(remote.router.seen.values())) == 2  # both replicas sampled


def dataclasses_replace(sampling: SamplingParams, seeding: str) -> SamplingParams:
    import dataclasses

    if seeding == "seed":
        return dataclasses.replace(sampling, seed=11)
    return dataclasses.replace(sampling, prompt_seeds=tuple(range(100, 100 + len(PROMPTS))))


def test_new_weights_reach_every_replica_through_one_object(remote, tiny_config, tokenizer):
    changed = load_model(tiny_config.model)
    with torch.no_grad():
        for p in changed.parameters():
            p.mul_(3.0)  # sharper logits: different tokens
    sampling = SamplingParams(max_new_tokens=10, prompt_seeds=tuple(range(len(PROMPTS))))
    before = remote.generate(PROMPTS, sampling)
    remote.counts()
    remote.sync_weights(changed)
    assert not remote.router.seen  # new weights: routes forgotten
    counts = remote.counts()
    assert counts[RESTARTS] == 0 and counts[SYNC_SECONDS] > 0
    after = remote.generate(PROMPTS, sampling)
    _same(after, _local(tiny_config, tokenizer, changed).generate(PROMPTS, sampling))
    assert [g.token_ids for g in after] != [g.token_ids for g in before]
    remote.sync_weights(load_model(tiny_config.model))  # back to the fixture's weights


def test_a_later_turn_is_sampled_on_the_replica_of_its_first(remote):
    sampling = SamplingParams(max_new_tokens=4, prompt_seeds=tuple(range(len(PROMPTS))))
    remote.router.forget()
    first = remote.generate(PROMPTS, sampling)
    where = remote.router.route([p + g.token_ids for p, g in zip(PROMPTS, first)])
    later = [p + g.token_ids + [7, 8] for p, g in zip(PROMPTS, first)]
    assert remote.router.route(later[::-1]) == where[::-1]  # each conversation to its own replica
    assert sorted(where) == [0, 0, 0, 1, 1, 1]


def test_a_replica_killed_mid_call_is_restarted_and_the_call_returns_the_same_tokens(remote, ray_cluster):
    prompts = [[1, 5 + i] for i in range(4)]
    sampling = SamplingParams(max_new_tokens=300, prompt_seeds=(1, 2, 3, 4))
    remote.router.forget()
    start = time.perf_counter()
    expected = remote.generate(prompts, sampling)
    seconds = time.perf_counter() - start
    remote.counts()
    remote.router.forget()
    result: dict = {}
    thread = threading.Thread(target=lambda: result.setdefault("got", remote.generate(prompts, sampling)))
    thread.start()
    time.sleep(min(1.0, seconds / 3))  # the call is under way on both replicas
    assert thread.is_alive()
    ray.kill(remote.actors[0], no_restart=False)
    thread.join(timeout=300)
    _same(result["got"], expected)
    assert remote.counts()[RESTARTS] == 1
    assert [ray_cluster.name_of(node) for node in remote.replica_nodes()] == ["engine", "engine"]


def test_a_replica_whose_restarts_are_spent_stops_the_call_with_one_line(ray_cluster, tiny_config, tokenizer):
    engines = RemoteEngines(
        tiny_config, _ray_config(ray_cluster, 1, HEAD_NODE, max_restarts=0), load_model(tiny_config.model), tokenizer
    )
    try:
        ray.kill(engines.actors[0], no_restart=False)
        with pytest.raises(EngineError) as info:
            engines.generate(PROMPTS[:2], SamplingParams(max_new_tokens=2, seed=1))
        message = str(info.value)
        assert "\n" not in message
        assert message.startswith(f"engine replica 0 on node {ray_cluster.node_ids['head'][:6]} head (")
        assert "died after 0 restart(s) (ray.max_restarts=0)" in message
    finally:
        engines.close()


def test_replicas_that_fit_no_node_are_one_line(ray_cluster, tiny_config, tokenizer):
    bad = _ray_config(ray_cluster, 1, {"CPU": 1, "gpu_node": 1}, start_timeout_s=3)
    with pytest.raises(ConfigError, match=r"engine replica\(s\) of 'hf' needing .*gpu_node.* not placed within 3s"):
        RemoteEngines(tiny_config, bad, load_model(tiny_config.model), tokenizer)


def test_engine_state_round_trips_through_each_replica(remote):
    state = remote.state_dict()
    assert len(state["replicas"]) == 2 and all("generator" in s for s in state["replicas"])
    unseeded = SamplingParams(max_new_tokens=6)
    remote.router.forget()
    first = remote.generate(PROMPTS, unseeded)
    remote.load_state_dict(state)
    remote.router.forget()
    assert [g.token_ids for g in remote.generate(PROMPTS, unseeded)] == [g.token_ids for g in first]


# -- training runs ---------------------------------------------------------------------------------------
def _train_config(model_dir: Path, out: Path, **overrides) -> TrainConfig:
    base = dict(
        model=str(model_dir),
        max_steps=2,
        prompts_per_step=2,
        num_generations=3,
        max_new_tokens=8,
        eval_tasks=0,
        output_dir=str(out),
        log_completions_every=1,
        learning_rate=1e-2,
        rewards={"agentrl.testing:parity_reward": 1.0},
        plugins=lockstep_plugins(),
    )
    base.update(overrides)
    return TrainConfig(**base)


def _lines(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith(("perf/", "faults/"))} for row in rows]


def test_an_asynchronous_run_with_an_engine_replica_equals_the_run_without_ray(ray_cluster, tiny_model_dir, tmp_path):
    """``async_steps=1``: the replica samples the next step's episodes while the trainer trains,
    its weights sent from the rollout thread; the same episodes and metrics as without Ray (the
    synchronous run with every role on Ray: tests/cluster/test_trainers.py)."""
    async_steps = 1
    ray_section = {"address": ray_cluster.address, "engines": 1, "engine_resources": HEAD_NODE}
    plain, remote = tmp_path / "plain", tmp_path / "ray"
    Trainer(_train_config(tiny_model_dir, plain, async_steps=async_steps), load_plugins()).train()
    Trainer(_train_config(tiny_model_dir, remote, async_steps=async_steps, ray=ray_section), load_plugins()).train()
    rows = [json.loads(line) for line in (remote / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if RESTARTS in row]
    assert len(steps) == 2 and all(row[RESTARTS] == 0 and row[SYNC_SECONDS] >= 0 for row in steps)
    assert max(row[SYNC_SECONDS] for row in steps) > 0  # the weights were sent (at the start, after updates)
    assert _lines(remote) == _lines(plain)
    assert (remote / "completions.jsonl").read_text() == (plain / "completions.jsonl").read_text()
