"""``bench/train_reward_model.py --tiny``: the folder it writes is a reward model ``--reward rm:DIR``
loads, scoring as a direct forward does; its labels are the math env's verdicts on train questions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from agentrl.config.train import TrainConfig
from agentrl.plugins import load_plugins
from agentrl.rewards.schemes import RewardContext
from agentrl.rewards.specs import resolve_rewards
from agentrl.testing import make_trajectory
from agentrl_math import LEVELS, MathEnv

BENCH = Path(__file__).resolve().parents[2] / "bench" / "train_reward_model.py"


@pytest.fixture(scope="module", params=[0, 1], ids=["head-only", "top-layer"])
def trained(request, tmp_path_factory) -> tuple[Path, dict, list[dict]]:
    """The --tiny run's folder, report and examples (head only, and with the top layer trained)."""
    out = tmp_path_factory.mktemp("rm") / "rm"
    result = subprocess.run(
        [sys.executable, str(BENCH), "--tiny", "--train-layers", str(request.param), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"--reward rm:{out} --set env_reward_weight=0" in result.stdout
    report = json.loads((out / "rm_report.json").read_text())
    examples = [json.loads(line) for line in (out / "rm_examples.jsonl").read_text().splitlines()]
    return out, report, examples


def test_the_folder_loads_through_the_rm_scheme_and_scores_as_a_direct_forward(trained):
    folder, _, examples = trained
    assert AutoConfig.from_pretrained(folder).num_labels == 1
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.chat_template and tokenizer.pad_token_id is not None
    model = AutoModelForSequenceClassification.from_pretrained(folder).float().eval()
    config = TrainConfig(rewards={f"rm:{folder}": 1.0}, env_reward_weight=0.0)
    manager = load_plugins()
    resolved = resolve_rewards(config, manager.registry, MathEnv(), RewardContext(config=config, settings={}))
    assert list(resolved) == ["rm"]
    held = [e for e in examples if e["split"] == "heldout"]
    got = np.array(
        resolved["rm"][0]([make_trajectory(e["messages"], {"question": e["question"]}) for e in held]), dtype=np.float64
    )
    direct = []
    for example in held:  # one unpadded forward of the whole conversation, as rendered by the RM's template
        ids = tokenizer(tokenizer.apply_chat_template(example["messages"], tokenize=False), add_special_tokens=False)[
            "input_ids"
        ]
        with torch.no_grad():
            direct.append(float(model(input_ids=torch.tensor([ids])).logits[0, 0]))
    np.testing.assert_allclose(got, direct, rtol=1e-5, atol=1e-6)
    # ... and as the trained model scored them (the figures in the report come from these scores)
    np.testing.assert_allclose(got, [e["score"] for e in held], rtol=1e-4, atol=1e-5)


def test_labels_are_the_env_verdicts_on_train_questions_only(trained):
    _, report, examples = trained
    env = MathEnv()
    eval_questions = {t["question"] for t in env.eval_tasks()}
    assert not eval_questions & {e["question"] for e in examples}
    level = LEVELS["single_digit"]  # the default difficulty: every problem and its answer
    gold = {p["question"]: p["answer"] for p in map(level.problem, range(level.size))}
    answers = {}
    for example in examples:
        user, reply = example["messages"][-2]["content"], example["messages"][-1]["content"]
        answers[example["question"]] = gold[example["question"]]
        env.reset(options={"task": {"question": example["question"], "answer": gold[example["question"]]}})
        _, _, _, _, info = env.step(reply)
        assert example["label"] == info["correct"], example
        assert user == example["question"] and example["messages"][-1]["role"] == "assistant"
    written = [e for e in examples if e["source"] == "reference"]
    for question, answer in answers.items():  # each question: the gold reply right, a wrong-number one wrong
        mine = [e for e in written if e["question"] == question]
        right = [e["messages"][-1] for e in mine if e["label"]]
        assert {"role": "assistant", "content": f"\\boxed{{{answer}}}"} in right
        assert sum(e["label"] for e in mine) == 2 and len(mine) == 4
    sampled = [e for e in examples if e["source"] == "sampled"]
    assert len(sampled) == report["settings"]["prompts"] * report["settings"]["samples"]


def test_the_report_counts_the_examples_and_its_auc_is_their_scores(trained):
    _, report, examples = trained
    held = [e for e in examples if e["split"] == "heldout"]
    held_questions = {e["question"] for e in held}
    assert not held_questions & {e["question"] for e in examples if e["split"] == "train"}
    assert 0.15 <= len(held) / len(examples) == report["heldout_share"] <= 0.2
    for split, mine in (("all", examples), ("heldout", held)):
        counts = report["counts"][split]
        assert counts["examples"] == len(mine) and counts["positives"] == sum(e["label"] for e in mine)
        assert counts["negatives"] == len(mine) - counts["positives"]
    pos = [e["score"] for e in held if e["label"]]
    neg = [e["score"] for e in held if not e["label"]]
    pairs = [(p > n) + 0.5 * (p == n) for p in pos for n in neg]
    assert report["heldout"]["auc"] == pytest.approx(sum(pairs) / len(pairs))
    assert report["saved_model_check"]["fp32_max_abs_diff"] < 1e-4
