"""``--reward rm:PATH``: a learned reward model scores whole conversations, as a direct forward would;
a scheme argument declared a path is stored absolute, so a run resumes from any directory."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import torch
import yaml
from cli_in_process import agentrl_in_process
from transformers import LlamaConfig, LlamaForSequenceClassification

from agentrl import hookimpl
from agentrl.config.train import TrainConfig
from agentrl.errors import ConfigError
from agentrl.plugins import load_plugins
from agentrl.rewards.schemes import RewardContext, absolute_argument, with_absolute_paths
from agentrl.rewards.specs import resolve_rewards
from agentrl.testing import make_trajectory
from agentrl_rewards.reward_model import RewardModel, RewardModelConfig

TINY = (
    "--max-steps",
    "2",
    "--num-generations",
    "2",
    "--prompts-per-step",
    "2",
    "--set",
    "eval_tasks=0",
    "--set",
    "max_new_tokens=8",
)


def tiny_reward_model(vocab_size: int, num_labels: int = 1, seed: int = 0) -> LlamaForSequenceClassification:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        num_labels=num_labels,
        pad_token_id=2,
        bos_token_id=1,
        eos_token_id=2,
    )
    return LlamaForSequenceClassification(config).eval()


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory, tokenizer):
    folder = tmp_path_factory.mktemp("tiny-rm")
    model = tiny_reward_model(len(tokenizer))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, model


def conversations() -> list[list[dict[str, str]]]:
    single = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "\\boxed{4}"},
    ]
    multi = [
        {"role": "user", "content": "Use the calculator: 17*3"},
        {"role": "assistant", "content": '<tool_call>{"name": "calc"}</tool_call>'},
        {"role": "tool", "content": "51"},
        {"role": "assistant", "content": "It is 51, so \\boxed{51}."},
    ]
    long = [
        {"role": "user", "content": "Count: " + " ".join(str(i) for i in range(40))},
        {"role": "assistant", "content": "done"},
    ]
    return [single, multi, long, single[:2] + [{"role": "assistant", "content": "5"}]]


def trajectories(messages_list) -> list:
    return [make_trajectory(messages, {"question": "q", "answer": "4"}) for messages in messages_list]


def hand_scores(model, tokenizer, messages_list, max_length=None, autocast=False) -> np.ndarray:
    """One unpadded forward per conversation, rendered by the tokenizer's chat template."""
    out = []
    for messages in messages_list:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids = ids[-max_length:] if max_length else ids
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out.append(float(model(input_ids=torch.tensor([ids])).logits[0, 0].float()))
    return np.array(out, dtype=np.float64)


def test_scores_equal_a_direct_forward_of_each_whole_conversation(rm_dir, tokenizer):
    folder, model = rm_dir
    rm = RewardModel(str(folder), RewardModelConfig(batch_size=3))
    got = np.array(rm(trajectories(conversations())), dtype=np.float64)
    np.testing.assert_allclose(got, hand_scores(model, tokenizer, conversations()), rtol=1e-5, atol=1e-6)
    assert not rm.model.training and rm.pop_metrics() == {"truncated": 0.0}


def test_batch_size_does_not_change_the_scores(rm_dir):
    folder, _ = rm_dir
    batch = trajectories(conversations() * 2)
    one = RewardModel(str(folder), RewardModelConfig(batch_size=1))(batch)
    many = RewardModel(str(folder), RewardModelConfig(batch_size=8))(batch)
    np.testing.assert_allclose(np.array(many, dtype=np.float64), np.array(one, dtype=np.float64), atol=1e-5)


def test_long_conversations_keep_their_end_and_are_counted(rm_dir, tokenizer):
    folder, model = rm_dir
    rm = RewardModel(str(folder), RewardModelConfig(max_length=24))
    got = np.array(rm(trajectories(conversations())), dtype=np.float64)
    lengths = [
        len(tokenizer(tokenizer.apply_chat_template(m, tokenize=False), add_special_tokens=False)["input_ids"])
        for m in conversations()
    ]
    np.testing.assert_allclose(got, hand_scores(model, tokenizer, conversations(), max_length=24), rtol=1e-5, atol=1e-6)
    assert rm.pop_metrics() == {"truncated": float(sum(n > 24 for n in lengths))} and sum(n > 24 for n in lengths) >= 2
    assert rm.pop_metrics() == {"truncated": 0.0}


def test_batch_normalisation_then_scale_and_shift(rm_dir, tokenizer):
    folder, model = rm_dir
    raw = hand_scores(model, tokenizer, conversations())
    rm = RewardModel(str(folder), RewardModelConfig(normalize="batch", scale=2.0, shift=-0.5))
    got = np.array(rm(trajectories(conversations())), dtype=np.float64)
    np.testing.assert_allclose(got, (raw - raw.mean()) / raw.std() * 2.0 - 0.5, rtol=1e-4, atol=1e-5)


def test_bf16_precision_runs_under_autocast(rm_dir, tokenizer):
    folder, model = rm_dir
    got = RewardModel(str(folder), RewardModelConfig(), bf16=True)(trajectories(conversations()))
    want = hand_scores(model, tokenizer, conversations(), autocast=True)
    np.testing.assert_allclose(np.array(got, dtype=np.float64), want, atol=2e-2)


def test_a_tokenizer_without_chat_template_reads_role_content_blocks(tmp_path, tokenizer):
    model = tiny_reward_model(len(tokenizer), seed=3)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "chat_template.jinja").unlink(missing_ok=True)
    rm = RewardModel(str(tmp_path), RewardModelConfig())
    assert not getattr(rm.tokenizer, "chat_template", None)
    messages = conversations()[1]
    text = "\n\n".join(f"{m['role']}: {m['content']}" for m in messages)
    with torch.no_grad():
        want = float(model(input_ids=torch.tensor([tokenizer(text)["input_ids"]])).logits[0, 0])
    assert rm(trajectories([messages]))[0] == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_num_labels_other_than_one_is_refused(tmp_path, tokenizer):
    tiny_reward_model(len(tokenizer), num_labels=2).save_pretrained(tmp_path)
    with pytest.raises(
        ConfigError, match=re.escape(f"rm: {tmp_path} has num_labels=2: expected 1 (one score); give a")
    ):
        RewardModel(str(tmp_path), RewardModelConfig())


def test_the_scheme_loads_the_model_once_with_the_runs_settings(rm_dir, tokenizer):
    from agentrl_math import MathEnv

    folder, model = rm_dir
    config = TrainConfig(
        rewards={f"rm:{folder}": 0.5, "format": 1.0}, plugins={"reward_model": {"normalize": "none", "shift": 1.0}}
    )
    manager = load_plugins()
    context = RewardContext(config=config, settings={"reward_model": RewardModelConfig(shift=1.0)})
    resolved = resolve_rewards(config, manager.registry, MathEnv(), context)
    assert list(resolved) == ["rm", "format"] and resolved["rm"][1] == 0.5
    fn = resolved["rm"][0]
    got = np.array(fn(trajectories(conversations())), dtype=np.float64)
    np.testing.assert_allclose(got, hand_scores(model, tokenizer, conversations()) + 1.0, rtol=1e-5, atol=1e-6)
    assert {"answer", "question"} <= set(context.columns)


def test_cli_trains_with_a_reward_model_and_its_scores_are_the_rewards(rm_dir, tiny_model_dir, tokenizer, tmp_path):
    folder, model = rm_dir
    out = tmp_path / "run"
    result = agentrl_in_process(
        "train",
        "--model",
        str(tiny_model_dir),
        "--reward",
        f"rm:{folder}:1",
        "--set",
        "env_reward_weight=0",
        "--set",
        "precision=fp32",
        "--set",
        "log_completions_every=1",
        "--output-dir",
        str(out),
        *TINY,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert sorted({row["step"] for row in rows}) == [1, 2] and len(rows) == 8
    want = hand_scores(model, tokenizer, [row["messages"] for row in rows])
    np.testing.assert_allclose(np.array([row["reward"] for row in rows], dtype=np.float64), want, rtol=1e-4, atol=1e-5)
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all("reward/rm_mean" in line and line["rm/truncated"] == 0.0 for line in lines[:2])


@pytest.mark.parametrize("spec", ["rm:/nonexistent/reward-model", "rm:/nonexistent/reward-model:0.5"])
def test_cli_bad_reward_model_path_is_one_line_naming_it(spec, tiny_model_dir, tmp_path):
    result = agentrl_in_process(
        "train", "--model", str(tiny_model_dir), "--reward", spec, "--output-dir", str(tmp_path / "r"), *TINY
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "rm: /nonexistent/reward-model does not exist; give a sequence-classification reward model" in " ".join(
        result.stderr.split()
    )
    assert "Traceback" not in result.stderr


def test_cli_unknown_prefix_still_names_the_weight(tiny_model_dir, tmp_path):
    result = agentrl_in_process(
        "train", "--model", str(tiny_model_dir), "--reward", "format:heavy", "--output-dir", str(tmp_path / "r"), *TINY
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert (
        "weight 'heavy' is not a number, and 'format' is neither a reward scheme (judge, prm, rm) nor an importable module"
        in " ".join(result.stderr.split())
    )


class PathSchemes:
    """A third-party plugin: ``mine:`` takes a folder (declared a path), ``api:`` a name."""

    @hookimpl
    def agentrl_register_reward_schemes(self, register):
        register("mine", lambda argument, context: None, path_argument=True)
        register("api", lambda argument, context: None)


def test_scheme_arguments_declared_paths_are_made_absolute(tmp_path, monkeypatch):
    for name in ("my_rm", "policy", "judge_model"):
        (tmp_path / name).mkdir()
    monkeypatch.chdir(tmp_path)
    manager = load_plugins()
    manager.register_plugin(PathSchemes(), name="path_schemes")
    registry = manager.registry
    made = {
        name: absolute_argument(name, registry)
        for name in ("rm:my_rm", "rm:./my_rm", "prm:my_rm", "judge:judge_model", "mine:my_rm", f"rm:{tmp_path}/my_rm")
    }
    assert made == {
        "rm:my_rm": f"rm:{tmp_path}/my_rm",
        "rm:./my_rm": f"rm:{tmp_path}/my_rm",
        "prm:my_rm": f"prm:{tmp_path}/my_rm",
        "judge:judge_model": f"judge:{tmp_path}/judge_model",
        "mine:my_rm": f"mine:{tmp_path}/my_rm",
        f"rm:{tmp_path}/my_rm": f"rm:{tmp_path}/my_rm",
    }
    for kept in ("judge:policy", "judge:openai", "api:my_rm", "rm:missing_folder", "format", "accuracy"):
        assert absolute_argument(kept, registry) == kept  # not a declared path, or no such path here
    config = TrainConfig(rewards={"rm:./my_rm": 0.5, "judge:policy": 1.0, "format": 0.2})
    assert with_absolute_paths(config, registry).rewards == {
        f"rm:{tmp_path}/my_rm": 0.5,
        "judge:policy": 1.0,
        "format": 0.2,
    }
    unchanged = TrainConfig(rewards={"judge:policy": 1.0})
    assert with_absolute_paths(unchanged, registry) is unchanged


def test_cli_run_with_a_relative_rm_path_resumes_from_another_directory(rm_dir, tiny_model_dir, tmp_path):
    """The run names the reward model as TRL's ``reward_funcs="path/to/rm"`` does, a bare folder: it is
    used as ``rm:``, said once, stored ``rm:/abs/path`` and labelled ``rm``, as ``rm:./my_rm`` is."""
    start, elsewhere, out = tmp_path / "start", tmp_path / "elsewhere", tmp_path / "run"
    shutil.copytree(rm_dir[0], start / "my_rm")
    elsewhere.mkdir()
    flags = [
        "--max-steps",
        "1",
        "--num-generations",
        "2",
        "--prompts-per-step",
        "2",
        "--set",
        "eval_tasks=0",
        "--set",
        "max_new_tokens=8",
        "--set",
        "checkpoint_every=1",
        "--set",
        "save_model=false",
    ]
    first = agentrl_in_process(
        "train", "--model", str(tiny_model_dir), "--reward", "./my_rm:1", "--output-dir", str(out), *flags, cwd=start
    )
    assert first.returncode == 0, first.stdout + first.stderr
    note = f"note: reward './my_rm' is a folder holding a sequence-classification model: used as rm:{start / 'my_rm'}"
    assert (first.stdout + first.stderr).count("note: reward './my_rm'") == 1 and note in first.stderr, first.stderr
    assert yaml.safe_load((out / "config.yaml").read_text())["rewards"] == {f"rm:{start / 'my_rm'}": 1.0}
    for spec in ("rm:./my_rm:1", "my_rm:1"):
        shown = agentrl_in_process("train", "--reward", spec, "--print-config", cwd=start)
        assert shown.returncode == 0 and yaml.safe_load(shown.stdout)["rewards"] == {f"rm:{start / 'my_rm'}": 1.0}, (
            shown
        )
    resumed = agentrl_in_process("train", "--resume", str(out), "--max-steps", "2", cwd=elsewhere)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in steps if "reward/rm_mean" in row] == [1, 2]


def test_cli_a_causal_lm_as_reward_model_is_refused_in_one_line(tiny_model_dir, tmp_path):
    """A causal LM whose config says num_labels 1 would train against a random score head: refused
    before training, naming the folder, the architecture and the head's weight."""
    folder = tmp_path / "lm-as-rm"
    shutil.copytree(tiny_model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_labels": 1, "id2label": {"0": "LABEL_0"}}))
    result = agentrl_in_process(
        "train", "--model", str(tiny_model_dir), "--reward", f"rm:{folder}", "--output-dir", str(tmp_path / "r"), *TINY
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert (
        f"error: rm: {folder} is a causal LM (LlamaForCausalLM) with no trained score head: score.weight would be "
        "freshly initialised; give a sequence-classification reward model (AutoModelForSequenceClassification, "
        "num_labels 1)"
    ) in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr and not (tmp_path / "r" / "metrics.jsonl").exists()


def test_cli_a_causal_lm_folder_as_a_bare_reward_suggests_judge(tiny_model_dir, tmp_path):
    """A folder given as it is must be a reward model; a causal LM's folder is refused in one line
    naming the form that takes it, before any model loads, by --print-config and train alike."""
    for args in (["--print-config"], ["--model", str(tiny_model_dir), "--output-dir", str(tmp_path / "r"), *TINY]):
        result = agentrl_in_process("train", "--reward", f"{tiny_model_dir}:0.5", *args)
        assert result.returncode == 2, result.stdout + result.stderr
        assert (
            f"error: reward '{tiny_model_dir}' is a folder holding a causal LM (LlamaForCausalLM); a bare folder is "
            f"used only when it holds a sequence-classification model (as rm:): use judge:{tiny_model_dir}"
        ) in " ".join(result.stderr.split())
        assert "Traceback" not in result.stderr and not (tmp_path / "r" / "config.yaml").exists()


def test_a_model_alias_is_no_reward_model(tokenizer):
    """Every alias is a causal LM: ``rm:ALIAS`` and ``prm:ALIAS`` are refused naming the alias, before
    anything is converted or loaded."""
    from agentrl_rewards.process_reward_model import ProcessRewardModel, ProcessRewardModelError

    with pytest.raises(
        ConfigError,
        match=re.escape(
            "rm: smollm2-135m is a model alias of a causal LM, not a sequence-classification model; give a "
            "sequence-classification reward model"
        ),
    ):
        RewardModel("smollm2-135m", RewardModelConfig())
    with pytest.raises(ProcessRewardModelError, match="prm: smollm2-135m is a model alias of a causal LM, not a token"):
        ProcessRewardModel("smollm2-135m", policy_tokenizer=tokenizer, device="cpu").load_model()
