"""The declarative field rules (agentrl.config.rules): pydantic checks, our words."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Annotated

import pytest
from pydantic import Field

from agentrl import Complaint, ConfigCheck, ConfigError, EnvError, TrainConfig
from agentrl.config.reference import ConfigKey, config_reference
from agentrl.config.rules import Allowed, Note, OneOf, allowed_words, check_declared, rule_failure


@dataclass
class _Knobs:
    count: Annotated[int, Field(ge=1)] = 1
    share: Annotated[float, Field(gt=0, le=1), Note("a fraction")] = 0.5
    cap: Annotated[int, Field(ge=1)] | None = None
    mode: Annotated[str, OneOf("a", "b")] = "a"
    flag: Annotated[int, OneOf(1, 2)] = 1
    word: Annotated[str, Allowed("a word")] = "x"
    free: int = 0


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("count", 0, ">= 1"),
        ("share", 0, "in (0, 1] (a fraction)"),
        ("share", 1.5, "in (0, 1] (a fraction)"),
        ("cap", 0, ">= 1 or null"),
        ("mode", "c", "one of a, b"),
        ("flag", True, "one of 1, 2"),
    ],
)
def test_a_value_outside_its_rule_is_described(key: str, value: object, words: str) -> None:
    assert rule_failure(_Knobs, key, value) == words


@pytest.mark.parametrize(
    ("key", "value"),
    [("count", 1), ("share", 1), ("cap", None), ("cap", 3), ("mode", "b"), ("flag", 2), ("free", -5), ("word", "y")],
)
def test_a_value_within_its_rule_passes(key: str, value: object) -> None:
    assert rule_failure(_Knobs, key, value) is None


def test_allowed_replaces_the_words_from_the_bounds() -> None:
    assert allowed_words(Annotated[int, Field(ge=0), Allowed("an integer in [0, 2**32)")]) == "an integer in [0, 2**32)"


@dataclass
class _PluginKnobs:
    rate: Annotated[float, Field(gt=0, lt=1)] | None = None
    steps: Annotated[int, Field(ge=1)] = 1
    mode: Annotated[str, OneOf("b", "a")] = "a"

    def __post_init__(self) -> None:
        ConfigCheck(self, "plugins.knobs").declared()


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"rate": 1}, "plugins.knobs.rate=1 is invalid: expected None or a number in (0, 1)"),
        ({"rate": math.inf}, "plugins.knobs.rate=inf is invalid: expected None or a finite number in (0, 1)"),
        ({"steps": True}, "plugins.knobs.steps=True is invalid: expected an integer >= 1"),
        ({"steps": 2.0}, "plugins.knobs.steps=2.0 is invalid: expected an integer >= 1"),
        ({"mode": "c"}, "plugins.knobs.mode='c' is invalid: expected one of 'a', 'b'"),
    ],
)
def test_config_check_declared_words_a_broken_rule_as_config_check_does(values: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        _PluginKnobs(**values)


@dataclass
class _NewDefaults(_PluginKnobs):
    steps: int = 5  # a new default only: the base class's rule still holds


def test_a_subclass_that_changes_a_default_keeps_the_rule() -> None:
    with pytest.raises(ConfigError, match=re.escape("plugins.knobs.steps=0 is invalid: expected an integer >= 1")):
        _NewDefaults(steps=0)
    assert _NewDefaults().steps == 5


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"count": True}, "engine_args.count must be >= 1, got True"),
        ({"mode": "c"}, "engine_args.mode must be one of a, b; got 'c'"),
        ({"cap": 0}, "engine_args.cap must be >= 1 or null, got 0"),
    ],
)
def test_check_declared_names_the_key_the_value_and_what_is_allowed(values: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_declared(_Knobs(**values), "engine_args")
    check_declared(_Knobs(), "engine_args")


@dataclass
class _EnvArgs:
    level: Annotated[str, OneOf("easy", "hard"), Complaint("{key} {value!r} is not {allowed}")] = "easy"
    seed: Annotated[int, Field(ge=0), Allowed("an int >= 0", wrong_type="an int")] = 0
    n: Annotated[int, Field(ge=2, le=100), Allowed("an integer in [2, 100]", too_low="an integer >= 2")] = 2
    rate: Annotated[float, Field(ge=0, le=1), Allowed("a number in [0, 1]", too_high="a number <= 1")] | None = None


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"level": ["x"]}, "my env: level ['x'] is not one of easy, hard"),
        ({"seed": -1}, "my env: seed must be an int >= 0, got -1"),
        ({"seed": "1"}, "my env: seed must be an int, got '1'"),
        ({"seed": True}, "my env: seed must be an int, got True"),
        ({"n": 1}, "my env: n must be an integer >= 2, got 1"),
        ({"n": 101}, "my env: n must be an integer in [2, 100], got 101"),
        ({"n": "x"}, "my env: n must be an integer in [2, 100], got 'x'"),
        ({"rate": 2}, "my env: rate must be a number <= 1 or null, got 2"),
        ({"rate": -1}, "my env: rate must be a number in [0, 1] or null, got -1"),
        ({"rate": math.nan}, "my env: rate must be a number in [0, 1] or null, got nan"),
    ],
)
def test_check_declared_words_each_failure_as_the_field_declares(values: dict, message: str) -> None:
    """A label before the key, a whole-message Complaint, and Allowed words per kind of failure."""
    with pytest.raises(EnvError, match=f"^{re.escape(message)}$"):
        check_declared(_EnvArgs(**values), prefix="my env: ", error=EnvError)
    check_declared(_EnvArgs(), prefix="my env: ", error=EnvError)


def test_config_reference_lists_every_key_with_its_type_default_range_and_docstring() -> None:
    keys = {key.name: key for key in config_reference()}
    assert list(keys) == [f.name for f in dataclasses.fields(TrainConfig)]
    assert keys["max_steps"] == ConfigKey(
        "max_steps", "int", 40, ">= 1", "Optimizer steps (one rollout batch each, times ``num_iterations``)."
    )
    assert (keys["max_grad_norm"].type, keys["max_grad_norm"].allowed) == ("float | None", "> 0 or null")
    assert (keys["rewards"].type, keys["rewards"].default, keys["rewards"].allowed) == (
        "dict[str, float] | None",
        None,
        "",
    )
    assert (keys["adam_betas"].type, keys["adam_betas"].allowed) == ("tuple[float, float]", "two numbers in [0, 1)")
    assert keys["lr_scheduler"].allowed == "one of wsd, constant, linear, cosine" and keys["env_args"].default == {}
    assert all(key.doc for key in keys.values())


def test_config_reference_of_a_plugin_section_keeps_what_its_base_classes_declare() -> None:
    from agentrl_gspo import GSPOConfig

    keys = {key.name: key for key in config_reference(GSPOConfig)}
    assert keys["importance_sampling_level"].default == "sequence"  # GSPO's default, the base class's rule
    assert keys["importance_sampling_level"].allowed == "one of token, sequence, sequence_token"
    assert keys["beta"].doc.startswith("KL coefficient to a frozen reference policy")  # documented in the base
    assert keys["epsilon_low"].doc == "Lower clip range of the sequence ratio (the paper's 3e-4)."
