"""What sending the weights to engine replicas on Ray costs (``ray.engines``): seconds per sync.

    python bench/weight_sync.py [--model smollm2-135m] [--replicas 1 2] [--syncs 5]

For each replica count it starts that many ``hf`` replicas of ``--model`` on a local one-machine Ray
cluster (:class:`agentrl.cluster.engines.RemoteEngines`, as ``ray.engines: K`` does), then times
``--syncs`` calls of ``sync_weights`` (the first, made while the replicas start, is left out), each:
the state dict packed as flat arrays, one ``ray.put`` into the object store, every replica loading
it (``load_state_dict``, then the engine's own copy: ``hf``'s bf16-rounded one by default). It
prints the median seconds per sync and its parts measured alone (pack, put, the replicas' load).

It then prints seconds on paper for 1.5B and 7B models (bf16 weights: 2 bytes a parameter) over
10, 100 and 400 Gb/s links: ``bytes x 8 / bandwidth``, assuming one copy crosses the trainer's
link (a broadcast, pipelined: Ray's object store streams an object in chunks, and a node pulling it
can fetch from any node that holds it already) and nothing else costs (no serialization, no load):
a lower bound, to set beside the measured local costs, which grow with the bytes too.
"""

from __future__ import annotations

import argparse
import statistics
import time

from agentrl.cluster.engines import RemoteEngines
from agentrl.cluster.replica import pack_weights, packed_bytes
from agentrl.cluster.runtime import connect, runtime_env
from agentrl.config.cluster import RayConfig
from agentrl.config.train import TrainConfig
from agentrl.model.loading import DEFAULT_MODEL, load_model, load_tokenizer

PAPER_MODELS = {"1.5B": 1.5e9, "7B": 7e9}
"""Parameters of the models priced on paper."""
LINKS_GBPS = (10, 100, 400)


def paper_seconds(parameters: float, gbps: float, bytes_per_parameter: int = 2) -> float:
    """Seconds for one copy of ``parameters`` weights (bf16: 2 bytes each) over a ``gbps`` link."""
    return parameters * bytes_per_parameter * 8 / (gbps * 1e9)


def measure(model_name: str, replicas: int, syncs: int) -> dict[str, float]:
    """Median seconds per ``sync_weights`` with ``replicas`` replicas, and its parts alone."""
    config = TrainConfig(model=model_name)
    model, tokenizer = load_model(model_name), load_tokenizer(model_name)
    ray_config = RayConfig(engines=replicas, engine_resources={"CPU": 1})
    ray = connect(ray_config)  # joined already by main()
    engines = RemoteEngines(config, ray_config, model, tokenizer)
    try:
        whole, pack, put, load = [], [], [], []
        for _ in range(syncs):
            start = time.perf_counter()
            engines.sync_weights(model)
            whole.append(time.perf_counter() - start)
        for _ in range(syncs):
            start = time.perf_counter()
            packed = pack_weights(model)
            pack.append(time.perf_counter() - start)
            start = time.perf_counter()
            ref = ray.put(packed)
            put.append(time.perf_counter() - start)
            start = time.perf_counter()
            ray.get([actor.load_weights.remote([ref]) for actor in engines.actors])
            load.append(time.perf_counter() - start)
            del ref
        return {
            "bytes": float(packed_bytes(packed)),
            "sync": statistics.median(whole),
            "pack": statistics.median(pack),
            "put": statistics.median(put),
            "load": statistics.median(load),
        }
    finally:
        engines.close()


def main() -> None:
    """Measure, then price the larger models on paper."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--syncs", type=int, default=5)
    args = parser.parse_args()
    import ray  # a new one-machine cluster of its own (not one that another program started here)

    ray.init(
        address="local", num_cpus=max(args.replicas) + 1, runtime_env=runtime_env(RayConfig()), include_dashboard=False
    )
    print(f"measured: {args.model}, local Ray cluster, median of {args.syncs} syncs")
    print("| replicas | weights sent | s/sync | pack | ray.put | replicas load |")
    print("|---|---|---|---|---|---|")
    for replicas in args.replicas:
        m = measure(args.model, replicas, args.syncs)
        print(
            f"| {replicas} | {m['bytes'] / 1e9:.2f} GB | {m['sync']:.2f} | {m['pack']:.2f} | "
            f"{m['put']:.2f} | {m['load']:.2f} |",
            flush=True,
        )
    print("\non paper: bf16 weights, one copy over the link (bytes x 8 / bandwidth)")
    print("| model | weights | " + " | ".join(f"{g} Gb/s" for g in LINKS_GBPS) + " |")
    print("|---|---|" + "---|" * len(LINKS_GBPS))
    for name, parameters in PAPER_MODELS.items():
        cells = " | ".join(f"{paper_seconds(parameters, g):.2f} s" for g in LINKS_GBPS)
        print(f"| {name} | {parameters * 2 / 1e9:.1f} GB | {cells} |")


if __name__ == "__main__":
    main()
