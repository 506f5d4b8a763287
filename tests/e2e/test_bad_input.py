"""Hostile input: every config key, CLI flag, env argument and file gets one agentrl error line
naming the key, the value and what is allowed; never a library traceback, never a silent no-op."""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from pathlib import Path
from typing import Annotated, Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import Field
from typer.testing import CliRunner

from agentrl import AgentRLError, ConfigCheck, ConfigError, ModelError, OneOf, PluginError, build_plugin_config
from agentrl.cli.app import app
from agentrl.config.startup import check_startup, resolve_settings
from agentrl.config.train import TrainConfig, build_config, field_names
from agentrl.plugins import load_plugins
from agentrl.rundir.paths import check_output_dir
from agentrl_grpo import GRPOConfig
from agentrl_gspo import GSPOConfig
from agentrl_hf_engine import HFEngineConfig
from agentrl_openai_agent.config import OpenAIAgentConfig
from agentrl_ppo import PPOConfig
from agentrl_rewards.judge import JudgeConfig
from agentrl_rewards.process_reward_model import ProcessRewardModelConfig
from agentrl_rewards.reward_model import RewardModelConfig
from agentrl_rollouts import MultiTurnConfig
from agentrl_sampler_correction import SamplerCorrectionConfig
from agentrl_trackers import TrackersConfig
from agentrl_vllm_engine.engine import VLLMEngineConfig
from agentrl_vllm_engine.server import VLLMServerConfig

PLUGIN_CONFIGS = {
    GRPOConfig: "algorithm",
    GSPOConfig: "algorithm",
    PPOConfig: "algorithm",
    SamplerCorrectionConfig: "plugins.sampler_correction",
    HFEngineConfig: "engine_args",
    VLLMEngineConfig: "engine_args",
    VLLMServerConfig: "engine_args",
    OpenAIAgentConfig: "plugins.openai_agent",
    RewardModelConfig: "plugins.reward_model",
    JudgeConfig: "plugins.judge",
    MultiTurnConfig: "plugins.multi_turn",
    ProcessRewardModelConfig: "plugins.process_reward_model",
    TrackersConfig: "plugins.trackers",
}
FREE_SECTIONS = ("env_args", "algorithm", "engine_args", "plugins")
"""TrainConfig sections that their plugin's own config class validates."""


@functools.cache
def plugins() -> Any:
    """The installed plugins, loaded once (~0.2 s a load: most of a property example's time)."""
    return load_plugins()


def registry() -> Any:
    return plugins().registry


def floats_in(data: Any) -> list[float]:
    """Every float in nested dicts and lists."""
    if isinstance(data, float):
        return [data]
    if isinstance(data, dict):
        return [f for v in data.values() for f in floats_in(v)]
    if isinstance(data, (list, tuple)):
        return [f for v in data for f in floats_in(v)]
    return []


# ---------------------------------------------------------------------------------------------
# Config builders: a table of hostile values.


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["max_grad_norm=.nan"], "max_grad_norm must be a finite number or null, got nan"),
        (["max_grad_norm=.inf"], "max_grad_norm must be a finite number or null, got inf"),
        (["learning_rate=.nan"], "learning_rate must be a finite number, got nan"),
        (["learning_rate=.inf"], "learning_rate must be a finite number, got inf"),
        (["temperature=.inf"], "temperature must be a finite number, got inf"),
        (["eval_temperature=.nan"], "eval_temperature must be a finite number, got nan"),
        (["eval_temperature=-1"], "eval_temperature must be >= 0 (0: greedy), got -1"),
        (["weight_decay=-0.1"], "weight_decay must be >= 0, got -0.1"),
        (["weight_decay=-.inf"], "weight_decay must be a finite number, got -inf"),
        (["adam_betas=[1.5, 0.9]"], "adam_betas must be two numbers in [0, 1), got [1.5, 0.9]"),
        (["adam_betas=[0.9]"], "adam_betas must be a list of 2 finite numbers, got (0.9,)"),
        (["adam_betas=[.nan, 0.9]"], "adam_betas must be a list of 2 finite numbers"),
        (["call_timeout_s=.nan"], "call_timeout_s must be a finite number, got nan"),
        (["call_timeout_s=0"], "call_timeout_s must be > 0, got 0"),
        (["on_call_error=explode"], "on_call_error must be one of skip, fail; got 'explode'"),
        (["checkpoint_every=-1"], "checkpoint_every must be >= 0, got -1"),
        (["keep_checkpoints=0"], "keep_checkpoints must be >= 1, got 0"),
        (["max_nonfinite_steps=0"], "max_nonfinite_steps must be >= 1, got 0"),
        (["seed=-1"], "seed must be an integer in [0, 2**32), got -1"),
        (["seed=4294967296"], "seed must be an integer in [0, 2**32), got 4294967296"),
        (
            ["rewards={a: 1"],
            "--set 'rewards={a: 1' is not valid YAML: expected ',' or '}', but got '<stream end>' (line 1, column 6)",
        ),
        (["model=[1"], "--set 'model=[1' is not valid YAML"),
        (["model=!!python/object/apply:os.system [ls]"], "is not valid YAML: could not determine a constructor"),
        (["model=*a"], "is not valid YAML: found undefined alias 'a' (line 1, column 1)"),
        (["max_steps=2024-13-45"], "--set 'max_steps=2024-13-45' is not valid YAML: ValueError: month must be"),
        (["env_args=&a {x: *a}"], "an anchor that refers to itself (&a ... *a) is not supported"),
        (["rewards={1: 1}"], "rewards must be a mapping of names to finite numbers or null, got {1: 1}"),
        (["env_reward_weight=0", "rewards={}"], "env_reward_weight=0 with rewards={} leaves nothing to reward"),
        (["model=''"], "model must be a non-empty name, got ''"),
        (["output_dir=''"], "output_dir must be a folder path or null"),
        (['env="\\0.py:X"'], "env: '\\x00.py:X' is not a usable path"),
        (["max_total_tokens=64"], "max_total_tokens=64 must be > max_new_tokens=64"),
        (["algorithm.loss_type=[dapo]"], "algorithm.loss_type must be a string, got ['dapo']"),
        (["algorithm.kl_estimator={a: 1}"], "algorithm.kl_estimator must be a string, got {'a': 1}"),
        (["algorithm.epsilon_high=.nan"], "algorithm.epsilon_high must be a finite number, got nan"),
        (["algorithm.beta=.inf"], "algorithm.beta must be a finite number, got inf"),
        (["algorithm.std_epsilon=.inf"], "algorithm.std_epsilon must be a finite number, got inf"),
        (["algorithm.delta=.inf"], "algorithm.delta must be a finite number or null, got inf"),
        (["algo=gspo", "algorithm.beta=.inf"], "algorithm.beta must be a finite number, got inf"),
        (["algo=ppo", "algorithm.loss_type=[dapo]"], "algorithm.loss_type must be a string, got ['dapo']"),
        (["algo=ppo", "algorithm.kl_estimator=[k1]"], "algorithm.kl_estimator must be a string or null, got ['k1']"),
        (["engine_args.dtype=[bfloat16]"], "engine_args.dtype must be a string, got ['bfloat16']"),
        (["engine=vllm", "engine_args.kv_cache_gb=.inf"], "engine_args.kv_cache_gb must be a finite number or null"),
        (["engine=vllm_server", "engine_args.kv_cache_gb=.inf"], "engine_args.kv_cache_gb must be a finite number"),
        (["num_generations=1"], "num_generations=1 is too small for algorithm 'grpo'"),
        (["num_generations=1", "algo=gspo"], "num_generations=1 is too small for algorithm 'gspo'"),
        (["warmup_steps=40"], "warmup_steps=40 must be < the run's 40 optimizer steps"),
        (["warmup_steps=100", "lr_scheduler=cosine"], "warmup_steps=100 must be < the run's 40 optimizer steps"),
        (
            ["lr_decay_fraction=0"],
            "lr_decay_fraction must be in (0, 1] (the share of the run the wsd decay lasts), got 0",
        ),
        (["lr_decay_fraction=1.5"], "lr_decay_fraction must be in (0, 1]"),
        (["lr_decay_steps=15"], "unknown config key 'lr_decay_steps'; did you mean 'lr_decay_fraction'?"),
        (
            ["algo=ppo", "algorithm.critic_warmup_steps=40"],
            "algorithm 'ppo' with these options never updates the policy",
        ),
    ],
)
def test_hostile_config_values_are_one_named_error(sets: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        start_up(sets)


def start_up(sets: list[str]) -> None:
    """What a run builds from its config before loading a model: sections, algorithm, engine options."""
    config = build_config(sets=sets)
    resolve_settings(config, registry())  # builds the algorithm's config and refuses impossible combinations
    engine = registry().get("engine", config.engine).factory
    build_plugin_config(engine.config_class, config.engine_args, "engine_args")


def test_integral_floats_are_integers_and_1e9_steps_are_fine() -> None:
    config = build_config(sets=["max_steps=1e9", "algorithm.num_iterations=2.0"])
    assert config.max_steps == 10**9 and isinstance(config.max_steps, int)
    assert build_plugin_config(GRPOConfig, config.algorithm, "algorithm").num_iterations == 2
    with pytest.raises(ConfigError, match=re.escape("max_steps must be an integer, got 1.5")):
        build_config(sets=["max_steps=1.5"])


def test_config_files_that_cannot_be_read(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"config file {str(tmp_path)!r} is a folder, not a file")):
        build_config(tmp_path)
    binary = tmp_path / "c.yaml"
    binary.write_bytes(b"max_steps: \xff\xfe\n")
    with pytest.raises(ConfigError, match="could not be read as UTF-8 text"):
        build_config(binary)
    numbered = tmp_path / "n.yaml"
    numbered.write_text("1: 2\n")
    with pytest.raises(ConfigError, match=re.escape("unknown config key 1 (`agentrl train --print-config` lists")):
        build_config(numbered)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"env_args": {"seed": -1}}, "math env: seed must be an int >= 0, got -1"),
        ({"env_args": {"difficulty": ["x"]}}, "math env: difficulty ['x'] is not one of"),
        ({"env": "guess", "env_args": {"turn_cost": "x"}}, "GuessEnv: turn_cost must be in [0, 1], got 'x'"),
        ({"env": "guess", "env_args": {"demonstration": "maybe"}}, "GuessEnv: demonstration must be true or false"),
        ({"env": "calculator", "env_args": {"task_seed": True}}, "task_seed must be a non-negative int"),
        ({"env": "calculator", "env_args": {"tool_parser": ["x"]}}, "tool_parser must be a registered parser name"),
        ({"env": "python", "env_args": {"timeout_s": math.nan}}, "PythonEnv: timeout_s must be a number of seconds"),
        ({"env": "python", "env_args": {"timeout_s": -1}}, "PythonEnv: timeout_s must be a number of seconds"),
        ({"env": "python", "env_args": {"memory_mb": "abc"}}, "PythonEnv: memory_mb must be an integer >= 64"),
        (
            {"env_args": {"nope": 1}},
            "do not fit env 'math': got an unexpected keyword argument 'nope'; it takes "
            "difficulty, data_file, seed, num_eval",
        ),
    ],
)
def test_env_arguments_are_checked_when_the_env_is_built(kwargs: dict, message: str) -> None:
    from agentrl.training.build import make_env

    with pytest.raises(AgentRLError, match=re.escape(message)):
        make_env(load_plugins(), TrainConfig(**kwargs))


def test_a_tool_parser_named_in_env_args_is_the_registered_one() -> None:
    from agentrl.tools.tool import parse_xml_json
    from agentrl.training.build import make_env

    env = make_env(load_plugins(), TrainConfig(env="calculator", env_args={"tool_parser": "xml_json"}))
    assert env.tool_parser is parse_xml_json
    with pytest.raises(PluginError, match=re.escape("'xml_jsn'; did you mean 'xml_json'?")):
        make_env(load_plugins(), TrainConfig(env="calculator", env_args={"tool_parser": "xml_jsn"}))


def test_unknown_disabled_plugin_suggests_the_nearest() -> None:
    with pytest.raises(PluginError, match=re.escape("unknown plugin 'grpoo'; did you mean 'grpo'?")):
        load_plugins(disabled=["grpoo"])


def test_any_algorithm_declares_its_smallest_group() -> None:
    from agentrl import Algorithm

    class Pairs(Algorithm):
        config_class = GRPOConfig
        min_group_size = 4

        def compute_advantages(self, batch: Any, metrics: Any) -> Any: ...

        def loss(self, context: Any) -> Any: ...

    manager = load_plugins()
    manager.registry.add("algorithm", "pairs", Pairs, "test")
    with pytest.raises(ConfigError, match=re.escape("num_generations=3 is too small for algorithm 'pairs'")):
        check_startup(TrainConfig(algo="pairs", num_generations=3), manager.registry)
    check_startup(TrainConfig(algo="pairs", num_generations=4), manager.registry)


def test_third_party_config_classes_get_type_checks_and_declared_ranges() -> None:
    @dataclasses.dataclass(frozen=True)
    class Knobs:
        rate: Annotated[float, Field(ge=0, le=1)] = 0.5
        mode: Annotated[str, OneOf("a", "b")] = "a"

        def __post_init__(self) -> None:
            ConfigCheck(self, "plugins.knobs").declared()

    with pytest.raises(ConfigError, match=re.escape("plugins.knobs.rate must be a finite number, got 'x'")):
        build_plugin_config(Knobs, {"rate": "x"}, "plugins.knobs")
    with pytest.raises(ConfigError, match=re.escape("plugins.knobs.mode=['a'] is invalid: expected one of 'a', 'b'")):
        Knobs(mode=["a"])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=re.escape("plugins.knobs.rate=inf is invalid: expected a finite number")):
        Knobs(rate=math.inf)


def test_output_dir_helper_refuses_files_and_unwritable_folders(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match=re.escape(f"output_dir: {str(blocker)!r} is a file, not a folder")):
        check_output_dir(blocker)
    with pytest.raises(ConfigError, match=re.escape(f"lies under {str(blocker)!r}, which is a file")):
        check_output_dir(blocker / "run")
    with pytest.raises(ConfigError, match=re.escape("'/proc' is not writable")):
        check_output_dir("/proc/agentrl-test/run")
    check_output_dir(tmp_path / "new" / "run")
    assert not (tmp_path / "new").exists()  # checking creates nothing


def test_an_unwritable_model_cache_is_named_before_any_download(tmp_path: Path, monkeypatch) -> None:
    from agentrl.model.loading import resolve_model

    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "file" / "cache"))
    with pytest.raises(ModelError, match="Set AGENTRL_CACHE to a writable folder"):
        resolve_model("smollm2-135m")


# ---------------------------------------------------------------------------------------------
# Property-based: arbitrary values never raise anything but an agentrl error.

SPECIAL = st.sampled_from([math.nan, math.inf, -math.inf, -1, 0, 1.5, 2**32, 2**64, "", " ", "x", True, None])
SCALARS = (
    SPECIAL
    | st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6) | st.integers(), inner, max_size=3),
    max_leaves=6,
)
PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(key=st.sampled_from(field_names()), value=VALUES)
@example(key="max_grad_norm", value=math.nan)
@example(key="learning_rate", value=math.inf)
@example(key="adam_betas", value=[math.nan, 0.9])
@example(key="rewards", value={1: 1.0})
def test_any_train_config_value_builds_or_is_an_agentrl_error(key: str, value: Any) -> None:
    try:
        config = build_config(overrides={key: value})
    except AgentRLError:
        return
    data = {k: v for k, v in config.to_dict().items() if k not in FREE_SECTIONS}
    assert all(math.isfinite(f) for f in floats_in(data)), data


@PROPERTY
@given(config_class=st.sampled_from(list(PLUGIN_CONFIGS)), data=st.data(), value=VALUES)
def test_any_plugin_config_value_builds_or_is_an_agentrl_error(config_class: type, data: Any, value: Any) -> None:
    key = data.draw(st.sampled_from([f.name for f in dataclasses.fields(config_class)]))
    try:
        built = build_plugin_config(config_class, {key: value}, PLUGIN_CONFIGS[config_class])
    except AgentRLError:
        return
    assert all(math.isfinite(f) for f in floats_in(dataclasses.asdict(built)))


@pytest.mark.parametrize(
    "config_class, key, value",
    [
        (RewardModelConfig, "batch_size", 0),
        (MultiTurnConfig, "batch_wait_s", -1.0),
        (JudgeConfig, "max_score", 0.0),
        (OpenAIAgentConfig, "batch_wait_s", -0.5),
        (ProcessRewardModelConfig, "max_length", 1),
    ],
)
def test_a_plugin_setting_outside_its_declared_range_is_refused_naming_it(config_class, key, value):
    section = PLUGIN_CONFIGS[config_class]
    with pytest.raises(ConfigError, match=rf"^{section}\.{key} must be .*got {value}$"):
        build_plugin_config(config_class, {key: value}, section)


SET_KEYS = [
    *field_names(),
    "algorithm.beta",
    "algorithm.loss_type",
    "algorithm.delta",
    "engine_args.dtype",
    "plugins.sampler_correction.cap",
    "plugins.sampler_correction.mode",
    "rewards.format",
    "env_args.seed",
]
YAMLISH = st.text(alphabet="[]{}:,'\"!&*-+.0123456789eEnaINFf \t\n#|>%@`\\", max_size=14) | st.text(max_size=14)


@PROPERTY
@given(key=st.sampled_from(SET_KEYS), raw=YAMLISH, algo=st.sampled_from(["grpo", "gspo", "ppo"]))
def test_any_raw_set_string_builds_or_is_an_agentrl_error(key: str, raw: str, algo: str) -> None:
    try:
        start_up([f"algo={algo}", f"{key}={raw}"])
    except AgentRLError:
        return


ENV_ARGS = {
    "math": ["difficulty", "seed", "num_eval", "system_prompt"],
    "guess": ["n", "max_turns", "turn_cost", "task_seed", "num_eval", "demonstration", "consistency_bonus"],
    "calculator": ["task_seed", "num_eval", "max_turns", "max_tool_output_chars"],
}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arg=st.sampled_from([(env, key) for env, keys in ENV_ARGS.items() for key in keys]), value=SCALARS)
@example(arg=("math", "seed"), value=-1)
@example(arg=("guess", "n"), value=2**64)
def test_any_env_argument_builds_a_working_env_or_is_an_agentrl_error(arg: tuple[str, str], value: Any) -> None:
    from agentrl.training.build import make_env

    env, key = arg
    try:
        built = make_env(plugins(), TrainConfig(env=env, env_args={key: value}))
    except AgentRLError:
        return
    built.train_tasks()[0], built.eval_tasks()[0]  # noqa: B018  (tasks are made lazily: make two)


# ---------------------------------------------------------------------------------------------
# The CLI end to end: exit 2 and one line on stderr naming the key.


def cli(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def assert_one_line(result: Any, message: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "max_grad_norm=.nan"], "max_grad_norm must be a finite number or null, got nan"),
        (["--set", "learning_rate=.nan"], "learning_rate must be a finite number, got nan"),
        (["--set", "temperature=.inf"], "temperature must be a finite number, got inf"),
        (["--set", "weight_decay=-0.1"], "weight_decay must be >= 0, got -0.1"),
        (["--set", "adam_betas=[1.5, 0.9]"], "adam_betas must be two numbers in [0, 1)"),
        (["--set", "adam_betas=[0.9]"], "adam_betas must be a list of 2 finite numbers"),
        (["--seed", "-1"], "seed must be an integer in [0, 2**32), got -1"),
        (["--set", "seed=4294967296"], "seed must be an integer in [0, 2**32)"),
        (["--set", "rewards={a: 1"], "--set 'rewards={a: 1' is not valid YAML"),
        (["--set", "algorithm.loss_type=[dapo]"], "algorithm.loss_type must be a string, got ['dapo']"),
        (["--set", "algorithm.beta=.inf"], "algorithm.beta must be a finite number, got inf"),
        (["--set", "engine_args.dtype=[bfloat16]"], "engine_args.dtype must be a string"),
        (["--num-generations", "1"], "num_generations=1 is too small for algorithm 'grpo'"),
        (["--algo", "gspo", "--num-generations", "1"], "num_generations=1 is too small for algorithm 'gspo'"),
        (["--set", "warmup_steps=40"], "warmup_steps=40 must be < the run's 40 optimizer steps"),
        (["--set", "max_total_tokens=64"], "max_total_tokens=64 must be > max_new_tokens=64"),
        (["--set", "call_timeout_s=.nan"], "call_timeout_s must be a finite number"),
        (["--set", "on_call_error=explode"], "on_call_error must be one of skip, fail"),
        (["--model", ""], "model must be a non-empty name"),
        (["--output-dir", ""], "output_dir must be a folder path or null"),
        (["--set", "env_args.seed=-1"], "math env: seed must be an int >= 0, got -1"),
        (["--env", "python", "--set", "env_args.timeout_s=-1"], "PythonEnv: timeout_s must be a number of seconds"),
        (["--algo", "ppo", "--set", "algorithm.critic_warmup_steps=40"], "never updates the policy"),
        (["--set", "env_reward_weight=0", "--set", "rewards={}"], "leaves nothing to reward"),
        (["--disable-plugin", "grpoo"], "unknown plugin 'grpoo'; did you mean 'grpo'?"),
    ],
)
def test_train_refuses_hostile_input_in_one_line(args: list[str], message: str, tmp_path: Path) -> None:
    assert_one_line(
        cli("train", "--model", str(tmp_path / "no-model"), "--output-dir", str(tmp_path / "r"), *args), message
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--disable-plugin", "maths_env"], "unknown plugin 'maths_env'; did you mean 'math_env'?"),
        (["--temperature", "nan"], "--temperature must be a finite number >= 0 (0: greedy), got nan"),
        (["--temperature", "-1"], "--temperature must be a finite number >= 0"),
        (["--num-tasks", "0"], "--num-tasks must be >= 1, got 0"),
        (["--set", "env_args.difficulty=[1"], "--set 'env_args.difficulty=[1' is not valid YAML"),
    ],
)
def test_eval_refuses_hostile_input_in_one_line(args: list[str], message: str, tmp_path: Path) -> None:
    assert_one_line(cli("eval", "--model", str(tmp_path / "no-model"), *args), message)


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (None, "does not exist"),
        ([], "metrics.jsonl' not found: is"),
        ([""], "holds no metrics yet: nothing to plot"),
        (['{"step": 1}', '{"step": 2, "reward/total_mean"', '{"step": 3}'], "line 2: not valid JSON"),
        (['{"step": 1}', "[1, 2]"], "line 2: expected a JSON object with a numeric 'step'"),
    ],
)
def test_plot_refuses_what_it_cannot_plot_in_one_line(lines: list[str] | None, message: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    if lines is not None:
        run.mkdir()
        if lines:
            (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert_one_line(cli("plot", str(run)), message)


def test_plot_of_a_killed_run_warns_and_plots_the_whole_lines(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward/total_mean": 0.5}\n{"step": 2, "reward/tot')
    (tmp_path / "eval.json").write_text("{not json")
    result = cli("plot", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "skipped a torn last line" in result.stderr and "eval.json is unreadable" in result.stderr
    assert (tmp_path / "training.png").is_file()


def test_a_prompt_that_fills_max_total_tokens_is_refused_before_training(tiny_model_dir, tmp_path):
    from agentrl.plugins import load_plugins
    from agentrl.training.trainer import Trainer

    config = TrainConfig(
        model=str(tiny_model_dir), max_new_tokens=8, max_total_tokens=20, eval_tasks=0, output_dir=str(tmp_path / "run")
    )
    with pytest.raises(
        ConfigError,
        match=r"max_total_tokens=20 leaves no room to sample: the prompt of training "
        r"task .* alone is \d+ tokens",
    ):
        Trainer(config, load_plugins())
    assert not (tmp_path / "run").exists()
