"""keep_best: the run's model/ is the policy that evaluated best; the last one goes to last/."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl.config.train import TrainConfig
from agentrl.plugins import load_plugins
from agentrl.training.best_model import BestModel
from agentrl.training.trainer import Trainer


def _save(marker: str):
    def save(folder):
        folder.mkdir(parents=True)
        (folder / "weights.txt").write_text(marker)

    return save


def test_best_keeps_the_highest_score_and_ties_go_to_the_later_policy(tmp_path):
    best = BestModel(tmp_path, metric="eval/accuracy")
    assert best.offer(0, {"eval/accuracy": 0.5}, _save("step 0"))
    assert not best.offer(10, {"eval/accuracy": 0.25}, _save("step 10"))
    assert not best.offer(15, {"eval/other": 0.9}, _save("step 15"))  # no score: nothing changes
    assert best.offer(20, {"eval/accuracy": 0.5}, _save("step 20"))  # a tie: the later policy
    assert (tmp_path / "best" / "weights.txt").read_text() == "step 20"
    assert json.loads((tmp_path / "best" / "best.json").read_text())["step"] == 20
    assert (best.step, best.score) == (20, 0.5)
    assert not (tmp_path / ".tmp-best").exists()


def test_resume_drops_a_best_saved_after_the_checkpoint(tmp_path):
    BestModel(tmp_path).offer(30, {"eval/reward_mean": 0.7}, _save("step 30"))
    earlier = BestModel(tmp_path)
    earlier.resume(completed_step=30)
    assert (earlier.step, earlier.score) == (30, 0.7)
    later = BestModel(tmp_path)
    later.resume(completed_step=20)  # the resumed run redoes steps 21..30: that best is not its own
    assert later.step is None and not (tmp_path / "best").exists()


def _scripted_trainer(tiny_model_dir, tmp_path, scores, **overrides):
    config = TrainConfig(
        model=str(tiny_model_dir),
        max_steps=4,
        eval_every=2,
        prompts_per_step=2,
        num_generations=2,
        max_new_tokens=4,
        eval_tasks=2,
        output_dir=str(tmp_path / "run"),
        log_completions_every=0,
        precision="fp32",
        engine_args={"dtype": "float32"},
        learning_rate=1e-2,
        checkpoint_every=0,
        rewards={"agentrl.testing:parity_reward": 1.0},
        **overrides,
    )
    trainer = Trainer(config, load_plugins())
    weights = []

    def evaluate(
        step=None, final=False
    ):  # the held-out scores are scripted; the weights each one belongs to are recorded
        weights.append({k: v.detach().clone() for k, v in trainer.model.state_dict().items()})
        score = scores[len(weights) - 1]
        return {"eval/accuracy": 0.5, "eval/reward_mean": score, "eval/num_tasks": 2.0}

    trainer.evaluate = evaluate
    return trainer, weights


def _same_weights(folder, expected) -> bool:
    saved = AutoModelForCausalLM.from_pretrained(folder).state_dict()
    return all(torch.equal(saved[k], expected[k].to(saved[k].dtype)) for k in saved)


def test_the_run_model_is_the_best_evaluated_policy(tiny_model_dir, tmp_path):
    trainer, weights = _scripted_trainer(tiny_model_dir, tmp_path, scores=[0.5, 0.75, 0.25])  # steps 0, 2, 4
    result = trainer.train()
    run = result.run_dir
    assert any(not torch.equal(weights[1][k], weights[2][k]) for k in weights[1])  # it did train
    assert _same_weights(run / "model", weights[1]) and _same_weights(run / "last", weights[2])
    recorded = json.loads((run / "eval.json").read_text())
    assert recorded["after"]["eval/reward_mean"] == 0.25
    assert recorded["best"]["step"] == 2 and recorded["best"]["score"] == 0.75
    assert recorded["best"]["saved_as_model"] is True
    assert result.best["step"] == 2 and not (run / "best").exists()


def test_a_last_policy_as_good_as_the_best_is_the_model(tiny_model_dir, tmp_path):
    trainer, weights = _scripted_trainer(tiny_model_dir, tmp_path, scores=[0.5, 0.75, 0.75])
    run = trainer.train().run_dir
    assert _same_weights(run / "model", weights[2])
    assert not (run / "last").exists() and not (run / "best").exists()
    assert json.loads((run / "eval.json").read_text())["best"]["saved_as_model"] is False


@pytest.mark.parametrize("overrides", [{"keep_best": False}, {"save_model": False}])
def test_without_keep_best_nothing_extra_is_saved(tiny_model_dir, tmp_path, overrides):
    trainer, weights = _scripted_trainer(tiny_model_dir, tmp_path, scores=[0.5, 0.75, 0.25], **overrides)
    run = trainer.train().run_dir
    assert not (run / "best").exists() and not (run / "last").exists()
    assert "best" not in json.loads((run / "eval.json").read_text())
    if overrides.get("save_model", True):
        assert _same_weights(run / "model", weights[2])


def test_eval_reward_mean_is_the_weighted_total_on_held_out_tasks(tiny_model_dir, tmp_path):
    from agentrl.testing import parity_reward
    from agentrl.training.evaluate import evaluate

    trainer, _ = _scripted_trainer(tiny_model_dir, tmp_path, scores=[0.0])
    tasks = [*trainer.envs[0].eval_tasks()][:2] * 2  # as many as the trainer has envs
    metrics, episodes = evaluate(
        trainer.run.rollout,
        trainer.envs,
        tasks,
        max_new_tokens=4,
        temperature=1.0,
        reward_fns={"parity": (parity_reward, 0.5)},
        env_weight=2.0,
        batch_size=4,
    )
    parity = parity_reward(episodes)
    expected = sum(2.0 * t.env_return + 0.5 * p for t, p in zip(episodes, parity)) / len(episodes)
    assert 0 < sum(parity) < len(parity)  # both kinds of episode, so the weights matter
    assert metrics["eval/reward_mean"] == pytest.approx(expected, abs=1e-12)
    assert metrics["eval/parity_mean"] == pytest.approx(sum(parity) / len(parity))
