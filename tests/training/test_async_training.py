"""Asynchronous training (``async_steps``): which policy version samples each step, the correction
of stale tokens against an independent float64 computation, and resumes (Ctrl-C, SIGKILL) that
lose no episode, train none twice and equal an uninterrupted run bit for bit. A reward function
that fails in the rollout thread stops the run with the error a synchronous run gives, and the
thread ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from cli_in_process import agentrl_in_process
from faulty_plugin import unclipped_run_config
from safetensors.torch import load_file

from agentrl.config.train import TrainConfig
from agentrl.errors import ConfigError, RewardError, TrainingInterrupted
from agentrl.plugins import load_plugins
from agentrl.rundir.directory import resume_config
from agentrl.sampling.versioned_engine import VersionedEngine
from agentrl.testing import LOCKSTEP_ARGS, lockstep_plugins
from agentrl.training import async_rollouts, weight_copies
from agentrl.training.async_rollouts import version_for
from agentrl.training.trainer import Trainer

PARITY = {"agentrl.testing:parity_reward": 1.0}  # groups with a reward spread: every step changes the weights


def _config(model_dir: Path, out: Path, **overrides) -> TrainConfig:
    base = dict(
        model=str(model_dir),
        max_steps=5,
        prompts_per_step=2,
        num_generations=3,
        max_new_tokens=8,
        eval_tasks=4,
        eval_every=2,
        output_dir=str(out),
        log_completions_every=1,
        checkpoint_every=3,
        keep_checkpoints=10,
        learning_rate=1e-2,
        rewards=PARITY,
        async_steps=2,
        plugins=lockstep_plugins(),
    )
    base.update(overrides)
    return TrainConfig(**base)


def _lines(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in rows]


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return {k: v for file in sorted(folder.glob("*.safetensors")) for k, v in load_file(file).items()}


def _assert_same_run(a: Path, b: Path) -> None:
    """Same metrics (but timings), training and evaluation episodes and final weights, bit for bit."""
    assert _lines(a) == _lines(b)
    assert (a / "completions.jsonl").read_text() == (b / "completions.jsonl").read_text()
    evaluated = [(run / "eval_completions.jsonl").is_file() for run in (a, b)]  # none in a run without eval
    assert evaluated[0] == evaluated[1]
    if evaluated[0]:
        assert (a / "eval_completions.jsonl").read_text() == (b / "eval_completions.jsonl").read_text()
    wa, wb = _weights(a / "model"), _weights(b / "model")
    assert wa and wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("async_steps", [1, 2])
def test_each_step_is_sampled_by_the_version_its_bound_allows(tiny_model_dir, tmp_path, async_steps):
    out = tmp_path / "run"
    Trainer(_config(tiny_model_dir, out, async_steps=async_steps, max_steps=4), load_plugins()).train()
    rows = [r for r in _lines(out) if "async/sampling_version" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for row in rows:
        version = version_for(row["step"], async_steps, 0)  # max(0, step - 1 - N)
        lag = row["step"] - 1 - version
        assert row["async/sampling_version"] == version
        assert row["async/staleness_mean"] == row["async/staleness_max"] == lag <= async_steps
        assert row[f"async/tokens_lag_{lag}"] == 1.0  # one version per batch
        assert row["async/dropped_episodes"] == 0
        assert "mismatch/ratio_mean" in row  # sampler_correction's auto is tis in an asynchronous run
    assert rows[-1]["async/staleness_max"] == async_steps
    episodes = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert [e["policy_version"] for e in episodes] == [version_for(e["step"], async_steps, 0) for e in episodes]
    assert all(t["policy_version"] == e["policy_version"] for e in episodes for t in e["turns"])
    stale = [r for r in rows if r["async/staleness_mean"] > 0]
    assert max(abs(r["mismatch/ratio_max"] - 1) for r in stale) > 1e-3  # the stale weights differ visibly


def test_a_version_the_engine_holds_keeps_no_snapshot(tiny_model_dir, tmp_path, monkeypatch):
    """A published version's snapshot (a whole copy of the weights) is dropped once the engine has
    loaded it, older ones with it: only versions published and not yet loaded stay in memory."""
    loads = []
    into_engine = async_rollouts.AsyncRollouts._into_engine

    def recording(self, version):
        into_engine(self, version)
        with self.cond:
            loads.append((version, sorted(self.snapshots)))

    monkeypatch.setattr(async_rollouts.AsyncRollouts, "_into_engine", recording)
    Trainer(_config(tiny_model_dir, tmp_path / "run", async_steps=2, max_steps=5), load_plugins()).train()
    # step 4's collection loads version 1, the evaluations after steps 2 and 4 load 2 and 4 (step 5
    # samples version 2, which the engine holds by then)
    assert [version for version, _ in loads] == [1, 2, 4]
    assert all(kept > version for version, snapshots in loads for kept in snapshots), loads


def test_a_synchronous_run_records_no_versions_and_corrects_nothing(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    Trainer(_config(tiny_model_dir, out, async_steps=0, max_steps=2, eval_tasks=0), load_plugins()).train()
    assert not [k for row in _lines(out) for k in row if k.startswith(("async/", "mismatch/"))]
    episodes = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert episodes and not [e for e in episodes if "policy_version" in e]


CAPTURE_PLUGIN = """
import os, time, torch
from agentrl import hookimpl

batches = {}

@hookimpl
def agentrl_adjust_loss_mask(batch, config, settings, metrics):
    time.sleep(float(os.environ.get("AGENTRL_TEST_UPDATE_S", "0")))  # a slower update, before the new version
    batches[len(batches) + 1] = {"input_ids": batch.input_ids.clone(), "attention_mask": batch.attention_mask.clone(),
                                 "loss_mask": batch.loss_mask.clone(), "sampler": batch.sampler_logprobs.clone(),
                                 "old": batch.extras["old_logprobs"].clone(),
                                 "versions": batch.extras["policy_versions"].clone()}
    torch.save(batches, os.environ["AGENTRL_TEST_CAPTURE"])
"""


def _float64_logprobs(model_dir: Path, weights: Path | dict, captured: dict, temperature: float) -> torch.Tensor:
    """Token logprobs of the weights in ``weights`` (a folder, or a state dict) at ``temperature``, in
    float64, by a plain forward."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64)
    state = _weights(weights) if isinstance(weights, Path) else weights
    assert state, weights
    model.load_state_dict({k: v.double() for k, v in state.items()}, strict=False)
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=captured["input_ids"], attention_mask=captured["attention_mask"]).logits.double()
    logp = torch.log_softmax(logits[:, :-1] / temperature, dim=-1)
    out = torch.zeros(captured["input_ids"].shape, dtype=torch.float64)
    out[:, 1:] = logp.gather(-1, captured["input_ids"][:, 1:, None])[..., 0]
    return out * captured["loss_mask"].double()


def test_stale_tokens_are_weighted_by_old_over_sampler_of_their_own_version(tiny_model_dir, tmp_path, monkeypatch):
    """Step 4 with async_steps=2 trains on episodes of version 1 while the policy is version 3:
    the sampler logprobs are version 1's and the old ones version 3's (each checked against a
    float64 forward of the checkpointed weights), and the TIS factor is min(old/sampler, cap)."""
    plugin = tmp_path / "capture_plugin.py"
    plugin.write_text(CAPTURE_PLUGIN)
    manager = load_plugins(modules=[str(plugin)])
    monkeypatch.setenv("AGENTRL_TEST_CAPTURE", str(tmp_path / "captured.pt"))
    out = tmp_path / "run"
    config = _config(
        tiny_model_dir,
        out,
        max_steps=4,
        checkpoint_every=1,
        eval_tasks=0,
        precision="fp32",
        keep_finished_checkpoints=True,
    )
    Trainer(config, manager).train()
    captured = torch.load(tmp_path / "captured.pt")[4]  # the 4th rollout batch: step 4
    mask = captured["loss_mask"] > 0
    assert set(captured["versions"][mask].tolist()) == {1} and set(captured["versions"][~mask].tolist()) <= {-1}
    sampler_v1 = _float64_logprobs(
        tiny_model_dir, out / "checkpoints" / "step-000001" / "model", captured, config.temperature
    )
    old_v3 = _float64_logprobs(
        tiny_model_dir, out / "checkpoints" / "step-000003" / "model", captured, config.temperature
    )
    torch.testing.assert_close(captured["sampler"].double()[mask], sampler_v1[mask], atol=2e-4, rtol=0)
    torch.testing.assert_close(captured["old"].double()[mask], old_v3[mask], atol=2e-4, rtol=0)
    assert float((old_v3 - sampler_v1)[mask].abs().max()) > 1e-2  # two versions apart: visibly different

    from agentrl.trajectory import TrainBatch
    from agentrl_sampler_correction import agentrl_per_token_loss_factors

    batch = TrainBatch(
        input_ids=captured["input_ids"],
        attention_mask=captured["attention_mask"],
        loss_mask=captured["loss_mask"],
        sampler_logprobs=captured["sampler"],
        rewards=torch.zeros(len(mask)),
        groups=torch.zeros(len(mask), dtype=torch.long),
        token_rewards=torch.zeros_like(captured["sampler"]),
        truncated=torch.zeros(len(mask), dtype=torch.bool),
        lengths=captured["attention_mask"].sum(1),
    )
    factors = agentrl_per_token_loss_factors(batch=batch, old_logprobs=captured["old"], config=config, settings={})
    expected = torch.clamp(torch.exp(old_v3 - sampler_v1), max=2.0)  # the default cap, from the float64 forwards
    torch.testing.assert_close(factors.double()[mask], expected[mask], atol=1e-3, rtol=1e-3)


INTERRUPT_PLUGIN = """
import os, signal
from agentrl import hookimpl

def _stop_at():
    return int(os.environ.get("AGENTRL_TEST_SIGINT_AT", "0"))

@hookimpl
def agentrl_on_rollout_end(trajectories, step, metrics):
    if step == _stop_at() and os.environ.get("AGENTRL_TEST_SIGINT_IN") == "rollout":
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the rollout thread collects a later step

@hookimpl
def agentrl_on_step_end(step, metrics):
    if step == _stop_at() and os.environ.get("AGENTRL_TEST_SIGINT_IN") == "update":
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while a step's records are written
"""


@pytest.mark.parametrize("where", ["rollout", "update"])
def test_ctrl_c_with_episodes_in_flight_then_resume_equals_straight(tiny_model_dir, tmp_path, monkeypatch, where):
    plugin = tmp_path / "interrupt_plugin.py"
    plugin.write_text(INTERRUPT_PLUGIN)
    straight, split = tmp_path / "straight", tmp_path / "split"
    Trainer(_config(tiny_model_dir, straight), load_plugins(modules=[str(plugin)])).train()
    monkeypatch.setenv("AGENTRL_TEST_SIGINT_AT", "4" if where == "rollout" else "2")
    monkeypatch.setenv("AGENTRL_TEST_SIGINT_IN", where)
    with pytest.raises(TrainingInterrupted) as info:
        Trainer(_config(tiny_model_dir, split), load_plugins(modules=[str(plugin)])).train()
    monkeypatch.delenv("AGENTRL_TEST_SIGINT_AT")
    config, checkpoint = resume_config(split)
    assert checkpoint == Path(info.value.checkpoint)
    saved = json.loads((checkpoint / "state.json").read_text())["processes"][0]["async"]
    step = int(checkpoint.name.split("-")[1])
    ahead = [c["step"] for c in saved["ready"]]
    assert ahead == list(range(step + 1, saved["next_step"])) and len(ahead) >= 2  # t+1 .. t+N at least
    Trainer(config, load_plugins(modules=[str(plugin)]), resume=checkpoint).train()
    _assert_same_run(straight, split)
    assert [r["step"] for r in _lines(split)][:-1] == [1, 2, 3, 4, 5]  # every step once (then the final row)


SLOW_ROLLOUT_PLUGIN = """
import os, time
from pathlib import Path
from agentrl import hookimpl

@hookimpl
def agentrl_on_rollout_end(trajectories, step, metrics):
    ready = os.environ.get("AGENTRL_TEST_SLOW_ROLLOUT")
    if ready and step == 5:  # step 5's episodes are in flight (scored, not handed over) until killed
        Path(ready).write_text("collecting")
        time.sleep(600)
"""


def test_sigkill_with_episodes_in_flight_then_resume_equals_straight(tiny_model_dir, tmp_path):
    plugin = tmp_path / "slow_rollout.py"
    plugin.write_text(SLOW_ROLLOUT_PLUGIN)
    cli = [sys.executable, "-m", "agentrl.cli.app", "train"]
    common = [
        "--model",
        str(tiny_model_dir),
        "--max-steps",
        "6",
        "--num-generations",
        "3",
        "--prompts-per-step",
        "2",
        "--reward",
        "agentrl.testing:parity_reward",
        "--set",
        "max_new_tokens=8",
        "--set",
        "eval_tasks=0",
        "--set",
        "checkpoint_every=2",
        "--set",
        "async_steps=2",
        "--set",
        "learning_rate=0.01",
        "--set",
        "log_completions_every=1",
        "--plugin",
        str(plugin),
        *LOCKSTEP_ARGS,
    ]
    straight, killed, ready = tmp_path / "straight", tmp_path / "killed", tmp_path / "ready"
    proc = subprocess.Popen(
        [*cli, *common, "--output-dir", str(killed)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "AGENTRL_TEST_SLOW_ROLLOUT": str(ready)},
    )
    # The straight run, meanwhile, in this process (the slow rollout is off here): it is no process's test.
    first = agentrl_in_process("train", *common, "--output-dir", str(straight))
    assert first.returncode == 0, first.stderr[-3000:]
    deadline = time.monotonic() + 300
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists(), proc.communicate()[1]
    time.sleep(1.0)  # the learner goes on meanwhile: steps 3 and 4 train on what was collected ahead
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = agentrl_in_process("train", "--resume", str(killed), "--plugin", str(plugin))
    assert done.returncode == 0, done.stderr
    assert "step-000002" in done.stdout  # the checkpoint of step 4 waits for step 5's episodes: never written
    _assert_same_run(straight, killed)


def test_batches_too_stale_for_a_smaller_bound_are_dropped_and_counted(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    Trainer(
        _config(
            tiny_model_dir,
            out,
            max_steps=4,
            checkpoint_every=2,
            eval_tasks=0,
            save_model=False,
            keep_finished_checkpoints=True,
        ),
        load_plugins(),
    ).train()
    checkpoint = out / "checkpoints" / "step-000002"
    ahead = json.loads((checkpoint / "state.json").read_text())["processes"][0]["async"]
    assert [c["step"] for c in ahead["ready"]] == [3, 4]  # versions 0 and 1: collected for the run's next steps
    # Resumed from step 2 with a bound of 1: the two batches would be 2 versions stale at steps 3 and 4: dropped.
    config = _config(
        tiny_model_dir, out, max_steps=4, checkpoint_every=2, eval_tasks=0, save_model=False, async_steps=1
    )
    Trainer(config, load_plugins(), resume=checkpoint).train()
    rows = _lines(out)
    assert [(r["step"], r["async/sampling_version"], r["async/dropped_episodes"]) for r in rows[2:]] == [
        (3, 2.0, 12.0),
        (4, 2.0, 12.0),
    ]  # re-collected from the resumed version 2: staleness 0, then 1


SLOW_CHAT = f"{Path(__file__).resolve().parents[2] / 'bench' / 'env_latency.py'}:SlowChat"


def test_partial_rollouts_turns_take_each_new_version_and_record_it(tiny_model_dir, tmp_path, monkeypatch):
    """partial_rollouts: an episode in flight when the learner publishes a version samples its next
    turn from it. 5-turn episodes whose env answers in 0.4 s, updates that take 1 s: step s's
    collection starts while step s - 1 trains, so its first turns are version s - 2's and its last
    ones version s - 1's. Every token's version stays within the bound, and every token's sampler
    logprob is its own version's (a float64 forward of the weights the learner published as it)."""
    plugin = tmp_path / "capture_plugin.py"
    plugin.write_text(CAPTURE_PLUGIN)
    monkeypatch.setenv("AGENTRL_TEST_CAPTURE", str(tmp_path / "captured.pt"))
    monkeypatch.setenv("AGENTRL_TEST_UPDATE_S", "1.0")
    published = {}  # each version's weights as the learner hands them over (a checkpoint would quiesce the thread)
    publish = async_rollouts.AsyncRollouts.publish

    def keep(self, version, model):
        published[version] = {k: t.detach().clone() for k, t in model.state_dict().items()}
        publish(self, version, model)

    monkeypatch.setattr(async_rollouts.AsyncRollouts, "publish", keep)
    out = tmp_path / "run"
    config = _config(
        tiny_model_dir,
        out,
        env=SLOW_CHAT,
        env_args={"latency": 0.4, "turns": 5},
        async_steps=1,
        partial_rollouts=True,
        max_steps=5,
        prompts_per_step=2,
        num_generations=2,
        eval_tasks=0,
        checkpoint_every=0,
        precision="fp32",
    )
    Trainer(config, load_plugins(modules=[str(plugin)])).train()
    captured = torch.load(tmp_path / "captured.pt")
    assert sorted(captured) == [1, 2, 3, 4, 5]
    mixed = 0
    for step, batch in captured.items():
        mask = batch["loss_mask"] > 0
        versions = batch["versions"]
        assert set(versions[~mask].tolist()) <= {-1}
        assert set(versions[mask].tolist()) <= set(range(max(0, step - 2), step))  # within async_steps=1
        mixed += sum(len(set(row[m].tolist())) > 1 for row, m in zip(versions, mask))
        for version in set(versions[mask].tolist()):
            weights = tiny_model_dir if version == 0 else published[version]
            expected = _float64_logprobs(tiny_model_dir, weights, batch, config.temperature)
            on = mask & (versions == version)
            torch.testing.assert_close(batch["sampler"].double()[on], expected[on], atol=2e-4, rtol=0)
    assert mixed >= 3  # episodes whose later turns were sampled by a newer version than their first
    rows = [r for r in _lines(out) if "async/staleness_max" in r]
    assert max(r["async/staleness_max"] for r in rows) <= 1
    assert any(0 < r.get("async/tokens_lag_0", 0) < 1 for r in rows)  # fresh tokens beside stale ones


def test_partial_rollouts_need_an_asynchronous_run():
    with pytest.raises(ConfigError, match="partial_rollouts=true needs async_steps >= 1"):
        TrainConfig(partial_rollouts=True)


def _episodes_by_step(run_dir: Path) -> dict[int, list[tuple]]:
    """Each step's episodes as (group, task question), from ``completions.jsonl``."""
    steps: dict[int, list[tuple]] = {}
    for line in (run_dir / "completions.jsonl").read_text().splitlines():
        row = json.loads(line)
        question = next(m["content"] for m in row["messages"] if m["role"] == "user")
        steps.setdefault(row["step"], []).append((row["group"], question))
    return {step: sorted(episodes) for step, episodes in steps.items()}


def test_partial_rollouts_ctrl_c_with_turns_in_flight_then_resume_loses_and_repeats_no_episode(
    tiny_model_dir, tmp_path, monkeypatch
):
    """Which version samples which turn is timing, so a resumed partial run is not bitwise; it still
    trains every step once, on the episodes of the tasks an uninterrupted run trains on there."""
    plugin = tmp_path / "interrupt_plugin.py"
    plugin.write_text(INTERRUPT_PLUGIN)
    straight, split = tmp_path / "straight", tmp_path / "split"
    overrides = dict(
        env=SLOW_CHAT,
        env_args={"latency": 0.05, "turns": 3},
        async_steps=1,
        partial_rollouts=True,
        prompts_per_step=2,
        num_generations=2,
        eval_tasks=0,
        checkpoint_every=2,
    )
    Trainer(_config(tiny_model_dir, straight, **overrides), load_plugins(modules=[str(plugin)])).train()
    monkeypatch.setenv("AGENTRL_TEST_SIGINT_AT", "4")
    monkeypatch.setenv("AGENTRL_TEST_SIGINT_IN", "rollout")  # step 4's episodes collected while step 3 trains
    with pytest.raises(TrainingInterrupted) as info:
        Trainer(_config(tiny_model_dir, split, **overrides), load_plugins(modules=[str(plugin)])).train()
    monkeypatch.delenv("AGENTRL_TEST_SIGINT_AT")
    config, checkpoint = resume_config(split)
    saved = json.loads((checkpoint / "state.json").read_text())["processes"][0]["async"]
    step = int(checkpoint.name.split("-")[1])
    ahead = [c["step"] for c in saved["ready"]]
    assert checkpoint == Path(info.value.checkpoint) and ahead == list(range(step + 1, saved["next_step"])) and ahead
    Trainer(config, load_plugins(modules=[str(plugin)]), resume=checkpoint).train()
    rows = _lines(split)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]  # every step once (no evaluation: no final row)
    assert max(r["async/staleness_max"] for r in rows if "async/staleness_max" in r) <= 1
    episodes = _episodes_by_step(split)
    assert sorted(episodes) == [1, 2, 3, 4, 5] and all(len(e) == 4 for e in episodes.values())
    assert episodes == _episodes_by_step(straight)  # the same tasks at each step: none lost, none twice
    logged = [json.loads(line) for line in (split / "completions.jsonl").read_text().splitlines()]
    for collected in saved["ready"]:  # trained as the checkpoint holds them (partly sampled before it), not re-sampled
        again = [(r["group"], r["messages"]) for r in logged if r["step"] == collected["step"]]
        assert again == [(e["group"], e["messages"]) for e in collected["episodes"]]


def test_the_first_turn_of_a_collection_is_stamped_with_its_version(tokenizer):
    """The versioned engine asks the rollout thread for its version from the thread's first
    ``generate`` on: it is wired before the thread starts (it was wired after, a race)."""
    from agentrl import SamplingParams
    from agentrl.testing import build_tiny_model
    from agentrl_hf_engine import HFEngine

    model = build_tiny_model(len(tokenizer))
    versioned = VersionedEngine(HFEngine(model, tokenizer), partial=True)
    stamped = []

    def collect(step: int, version: int) -> str:
        stamped.extend(g.policy_version for g in versioned.generate([[1, 2, 3]], SamplingParams(max_new_tokens=2)))
        return "collected"

    producer = async_rollouts.AsyncRollouts(
        collect,
        versioned.sync_weights,
        model,
        async_steps=1,
        next_step=1,
        last_step=1,
        floor=3,
        partial=True,
        versioned=versioned,
    )
    assert producer.take(1) == "collected" and producer.close()
    assert stamped == [3]


def test_a_published_snapshot_copies_a_tied_matrix_once_and_loads_tied(tokenizer):
    """A snapshot holds one copy of the tied LM head and embedding (SmolLM2's: a fifth of its
    weights), owns its memory, and loads back into a model whose two names stay one tensor."""
    from agentrl.testing import build_tiny_model

    model = build_tiny_model(len(tokenizer))
    weights = weight_copies.snapshot(model)
    state = model.state_dict()
    assert weights.keys() == state.keys()
    assert weights["lm_head.weight"] is weights["model.embed_tokens.weight"]
    distinct = {id(t): t for t in weights.values()}.values()
    assert sum(t.numel() for t in distinct) == sum(p.numel() for p in model.parameters()) + sum(
        b.numel() for name, b in model.named_buffers() if name in state
    )
    assert all(w.data_ptr() != state[name].data_ptr() for name, w in weights.items())
    with torch.no_grad():  # the learner trains on: the snapshot keeps the version it was given
        for p in model.parameters():
            p.add_(1.0)
    into = build_tiny_model(len(tokenizer))
    into.load_state_dict(weights)
    assert into.lm_head.weight is into.model.embed_tokens.weight
    moved = dict(model.named_parameters(remove_duplicate=False))
    for name, tensor in into.state_dict().items():
        torch.testing.assert_close(tensor, weights[name], rtol=0, atol=0)
        if name in moved:  # the version it was given, not the learner's weights since
            torch.testing.assert_close(moved[name].detach() - 1.0, tensor)


def test_adopted_weights_are_the_snapshot_itself_with_ties_kept_and_meta_frees_them(tokenizer):
    """:func:`adopt` makes a snapshot's tensors a module's (no second copy), one Parameter for the
    tied head and embedding; :func:`on_meta` empties the module again and keeps RoPE's buffer."""
    from agentrl.testing import build_tiny_model

    model, into = build_tiny_model(len(tokenizer)), build_tiny_model(len(tokenizer))
    weights = weight_copies.snapshot(model)
    weight_copies.adopt(into, weights)
    state = into.state_dict()
    assert state.keys() == weights.keys() and all(state[k].data_ptr() == weights[k].data_ptr() for k in weights)
    assert into.lm_head.weight is into.model.embed_tokens.weight
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        torch.testing.assert_close(into(ids).logits, model(ids).logits, rtol=0, atol=0)
    rotary = {name: b for name, b in into.named_buffers() if name not in state}  # non-persistent: RoPE's inv_freq
    weight_copies.adopt(into, weight_copies.on_meta(weights))
    assert all(p.is_meta for p in into.parameters()) and into.lm_head.weight is into.model.embed_tokens.weight
    assert rotary and all(b is dict(into.named_buffers())[name] and not b.is_meta for name, b in rotary.items())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_rollout_copy_is_freed_where_the_engine_keeps_weights_of_its_own(tokenizer, dtype):
    """With a bf16 ``hf`` engine (weights copied in) the thread's copy of the weights holds no
    memory once loaded, and the engine samples the published version; with float32 (the engine
    samples from the copy) the copy is the published snapshot itself, not a second copy of it."""
    from agentrl.testing import build_tiny_model
    from agentrl_hf_engine import HFEngine

    model = build_tiny_model(len(tokenizer))
    engine = HFEngine(model, tokenizer, TrainConfig(engine_args={"dtype": dtype}))
    assert engine.keeps_synced_model == (dtype == "float32")
    seen = []

    def collect(step: int, version: int) -> int:
        seen.append({n: p.detach().clone() for n, p in engine.model.named_parameters()})
        return version

    producer = async_rollouts.AsyncRollouts(
        collect,
        engine.sync_weights,
        model,
        async_steps=0,
        next_step=2,
        last_step=2,
        floor=0,
        frees_copy=not engine.keeps_synced_model,
    )
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)
    producer.publish(1, model)
    published = dict(producer.snapshots[1])
    assert producer.take(2) == 1 and producer.close()
    copies = dict(producer.copy.named_parameters(remove_duplicate=False))
    if dtype == "bfloat16":
        assert all(p.is_meta for p in copies.values())
    else:
        assert all(p.data_ptr() == published[name].data_ptr() for name, p in copies.items())
    for name, p in model.named_parameters():  # the engine sampled version 1: the halved weights
        torch.testing.assert_close(seen[0][name], p.detach().to(seen[0][name].dtype), rtol=0, atol=0)


def test_a_raising_reward_with_fail_in_the_rollout_thread_stops_an_async_run_with_the_same_error(
    tiny_model_dir, tmp_path, faults
):
    import threading

    config = unclipped_run_config(
        tiny_model_dir,
        tmp_path,
        env=f"{faults}:Tasks",
        rewards={f"{faults}:fragile": 1.0},
        on_call_error="fail",
        async_steps=1,
        max_steps=3,
    )
    with pytest.raises(RewardError, match=r"^reward function 'fragile' raised on sample \d \(task 'bad'"):
        Trainer(config, load_plugins()).train()
    assert not [t for t in threading.enumerate() if t.name == "agentrl-async-rollouts"]  # the thread ended
