"""What works with what: one declared table of the run's main choices, checked at start-up.

A run's **combination** is one value of each dimension in :data:`DIMENSIONS` (engine, rollout,
algorithm, async, lora, processes, precision). The table says which combinations are refused:

* :data:`REFUSED`: rules, each ``Refused(when={dimension: value or values}, because=...)``; a
  combination that agrees with every key of a rule's ``when`` is refused, with its ``because``.
  **Everything no rule refuses is supported.**
* :data:`TESTED`: which tests exercise which values together. A whole-run test names the values it
  sets (the rest are :data:`DEFAULTS`); a test of one part (an engine, a queue) names the values its
  part stands for.
* :data:`INDEPENDENT`: pairs of dimensions that do not meet in the code, with the reason.

A supported combination is **covered** when every pair of its values, in dimensions that are not
independent, was run together by some test (pairwise coverage); tests/config/test_capabilities.py
checks that every supported combination is, that every named test exists, and that every refused one
fails at start-up with its reason. ``python -m agentrl.cli.capabilitydoc`` writes
docs/reference/capabilities.md from this table.

:func:`check_combination` runs in :func:`agentrl.config.startup.check_startup`, before any model
loads (and in ``agentrl train --num-processes N`` before the processes start). A third-party
engine, rollout or algorithm declares its own refusals as a class attribute,
``unsupported = (Refused(when={"processes": ("n", "sharded")}, because="..."),)``: they apply when
it is chosen. The built-in plugins' names are only in this table.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentrl.errors import ConfigError

DIMENSIONS: dict[str, tuple[str, ...]] = {
    "engine": ("hf", "vllm", "vllm_server"),
    "rollout": ("multi_turn", "openai_agent"),
    "algorithm": ("grpo", "gspo", "ppo"),
    "async": ("off", "on"),
    "lora": ("off", "on"),
    "processes": ("1", "n", "sharded"),
    "precision": ("auto", "bf16", "fp32"),
}
"""Each dimension's built-in values. ``async``: ``async_steps`` 0 (off) or >= 1 (on); ``lora``:
``lora`` null (off) or a mapping (on); ``processes``: one process, several with replicated weights
(``--num-processes N``: DDP, ZeRO-2), or sharded weights (FSDP, ZeRO-3, any count)."""

DEFAULTS: dict[str, str] = {
    "engine": "hf",
    "rollout": "multi_turn",
    "algorithm": "grpo",
    "async": "off",
    "lora": "off",
    "processes": "1",
    "precision": "auto",
}
"""The values of a run that does not choose (a whole-run test runs them unless it names others)."""

WHERE: dict[str, str] = {
    "engine": "--engine NAME",
    "rollout": "rollout: NAME (--set rollout=NAME)",
    "algorithm": "--algo NAME",
    "async": "async_steps: 0 (off), >= 1 (on)",
    "lora": "lora: null (off), a mapping (on)",
    "processes": "--num-processes N, --accelerate-config fsdp / zero3 (sharded)",
    "precision": "precision: auto, bf16, fp32",
}
"""Where a run sets each dimension."""


@dataclass(frozen=True)
class Refused:
    """A rule: the combinations agreeing with every key of ``when`` (a value, or a tuple of values
    any of which agrees) are not supported, ``because``."""

    when: Mapping[str, str | tuple[str, ...]]
    because: str

    def matches(self, combination: Mapping[str, str]) -> bool:
        """Whether ``combination`` agrees with every key of :attr:`when`."""
        return all(combination.get(key) in _values(value) for key, value in self.when.items())


@dataclass(frozen=True)
class Independent:
    """Two dimensions that do not meet in the code: their pairs of values need no test of their own."""

    first: str
    second: str
    because: str


@dataclass(frozen=True)
class Tested:
    """``tests`` (``path::function`` node ids; ``path::function[id]`` for one parametrized case)
    exercise the values of ``when`` together; a ``whole_run`` test runs :data:`DEFAULTS` for the
    dimensions it does not name."""

    tests: tuple[str, ...]
    when: Mapping[str, str] = field(default_factory=dict)
    whole_run: bool = True
    note: str = ""

    @property
    def point(self) -> dict[str, str]:
        """The values the tests run: :attr:`when`, over :data:`DEFAULTS` for a whole run."""
        return {**DEFAULTS, **self.when} if self.whole_run else dict(self.when)


NOT_TESTED = "not tested together yet"

REFUSED: tuple[Refused, ...] = (
    Refused(
        {"engine": ("vllm", "vllm_server"), "processes": ("n", "sharded")},
        f"{NOT_TESTED} (each process would run its own vLLM beside its trainer; no test launches one)",
    ),
    Refused({"engine": "vllm_server", "lora": "on"}, f"{NOT_TESTED} (LoRA runs are tested with --engine hf and vllm)"),
    Refused(
        {"rollout": "openai_agent", "processes": "sharded"},
        f"{NOT_TESTED} (agent runs in several processes are tested with replicated weights)",
    ),
    Refused({"algorithm": "gspo", "processes": "sharded"}, f"{NOT_TESTED} (sharded runs are tested with grpo and ppo)"),
    Refused({"async": "on", "processes": "sharded"}, f"{NOT_TESTED} (sharded runs are tested synchronously)"),
    Refused(
        {"lora": "on", "processes": "sharded"},
        "LoRA on sharded weights is not implemented yet (the adapter's merged copy needs the whole weights)",
    ),
)
"""The built-in refusals; everything else is supported."""

INDEPENDENT: tuple[Independent, ...] = (
    Independent("algorithm", "engine", "the algorithm sees scored trajectories only, whichever engine sampled them"),
    Independent("algorithm", "rollout", "the algorithm sees scored trajectories only, whichever rollout made them"),
    Independent("rollout", "lora", "the rollout calls the engine only; LoRA changes which weights train and sync"),
    *(
        Independent(
            "precision",
            other,
            "precision is the learner's forward (autocast over fp32 master weights) whatever samples or "
            "trains; an engine samples in its own engine_args.dtype (the hf engine's auto follows precision)",
        )
        for other in ("engine", "rollout", "algorithm", "async", "lora", "processes")
    ),
)
"""Pairs of dimensions whose values need not be tested together."""

_MP = "tests/e2e/test_multiprocess.py"
_VLLM = "tests/plugins/test_vllm_engine.py"
_AGENT = "tests/plugins/test_openai_agent.py::test_grpo_trains_the_agent_through_the_cli"
_PAIRS = "tests/e2e/test_combinations.py::test_two_steps_train_the_combination"
TESTED: tuple[Tested, ...] = (
    Tested(
        ("tests/training/test_trainer.py::test_gradient_does_not_depend_on_micro_batch_size",), {"precision": "fp32"}
    ),
    Tested(
        ("tests/training/test_trainer.py::test_in_process_eval_equals_fresh_load_of_saved_run",), {"precision": "bf16"}
    ),
    Tested((_AGENT,), {"rollout": "openai_agent"}),
    Tested(("tests/plugins/test_gspo.py::test_gspo_trains_end_to_end_on_a_tiny_model",), {"algorithm": "gspo"}),
    Tested(("tests/plugins/test_ppo.py::test_two_steps_through_the_cli_save_the_critic",), {"algorithm": "ppo"}),
    Tested(
        ("tests/training/test_async_training.py::test_each_step_is_sampled_by_the_version_its_bound_allows",),
        {"async": "on"},
    ),
    Tested(
        ("tests/training/test_lora.py::test_only_the_adapter_trains_and_the_base_stays_bit_identical",), {"lora": "on"}
    ),
    Tested((f"{_PAIRS}[gspo-async]",), {"algorithm": "gspo", "async": "on", "precision": "fp32"}),
    Tested((f"{_PAIRS}[ppo-lora]",), {"algorithm": "ppo", "lora": "on", "precision": "fp32"}),
    Tested((f"{_PAIRS}[gspo-lora]",), {"algorithm": "gspo", "lora": "on", "precision": "fp32"}),
    Tested((f"{_PAIRS}[async-lora]",), {"async": "on", "lora": "on", "precision": "fp32"}),
    Tested((f"{_PAIRS}[openai_agent-async]",), {"rollout": "openai_agent", "async": "on", "precision": "fp32"}),
    Tested(
        (f"{_MP}::test_ctrl_c_stops_every_process_at_one_step_and_resumes",), {"processes": "n", "precision": "fp32"}
    ),
    Tested(
        ("tests/e2e/test_multiprocess_combinations.py::test_gspo_with_lora_and_an_agent_in_two_processes_equals_one",),
        {"rollout": "openai_agent", "algorithm": "gspo", "lora": "on", "processes": "n", "precision": "fp32"},
    ),
    Tested(
        (f"{_MP}::test_ppo_async_two_processes_with_resume_equal_one",),
        {"algorithm": "ppo", "async": "on", "processes": "n", "precision": "fp32"},
    ),
    Tested(
        (f"{_MP}::test_fsdp_two_processes_equal_one",),
        {"algorithm": "ppo", "processes": "sharded", "precision": "fp32"},
    ),
    Tested(
        ("tests/e2e/test_cuda.py::test_one_gpu_process_trains_under_each_shipped_config",),
        {"processes": "sharded"},
        note="GPU only: one process under the shipped fsdp config",
    ),
    Tested((f"{_VLLM}::test_train_with_vllm_end_to_end_on_the_default_model",), {"engine": "vllm"}),
    Tested((f"{_VLLM}::test_train_asynchronously_with_vllm_on_the_default_model",), {"engine": "vllm", "async": "on"}),
    Tested(
        ("tests/e2e/test_combinations.py::test_lora_with_the_vllm_engine_samples_the_merged_weights",),
        {"engine": "vllm", "lora": "on", "precision": "fp32"},
    ),
    Tested(
        (f"{_VLLM}::test_server_engine_samples_over_http_and_takes_pushed_weights",),
        {"engine": "vllm_server", "rollout": "multi_turn", "async": "on", "lora": "off", "processes": "1"},
        whole_run=False,
        note="the engine contract (generate, sync_weights) and partial rollouts' pushes through its request queue",
    ),
    Tested(
        (f"{_VLLM}::test_server_engine_samples_over_http_and_takes_pushed_weights",),
        {"engine": "vllm_server", "async": "off", "lora": "off", "processes": "1"},
        whole_run=False,
        note="generate and sync_weights as a synchronous run calls them",
    ),
    Tested(
        (f"{_VLLM}::test_the_request_queue_samples_what_generate_samples_with_the_same_seeds", _AGENT),
        {"engine": "vllm", "rollout": "openai_agent"},
        whole_run=False,
        note="the seam between them, the request queue: vLLM's queue, and the agent rollout through the hf engine's",
    ),
    Tested(
        (f"{_VLLM}::test_server_engine_samples_over_http_and_takes_pushed_weights", _AGENT),
        {"engine": "vllm_server", "rollout": "openai_agent"},
        whole_run=False,
        note="the seam between them, the request queue: the server's (batching generate), and the agent rollout's",
    ),
)
"""Which tests run which values together."""


def _values(value: str | tuple[str, ...]) -> tuple[str, ...]:
    return value if isinstance(value, tuple) else (value,)


def combinations() -> Iterator[dict[str, str]]:
    """Every combination of the built-in values, in :data:`DIMENSIONS` order."""
    for values in itertools.product(*DIMENSIONS.values()):
        yield dict(zip(DIMENSIONS, values))


def refusal(combination: Mapping[str, str], rules: tuple[Refused, ...] = REFUSED) -> Refused | None:
    """The first of ``rules`` refusing ``combination``, or None when it is supported."""
    return next((rule for rule in rules if rule.matches(combination)), None)


def _independent(first: str, second: str) -> bool:
    return any({first, second} == {pair.first, pair.second} for pair in INDEPENDENT)


def covering(combination: Mapping[str, str]) -> dict[tuple[tuple[str, str], ...], list[Tested]]:
    """For each value (alone) and each pair of values in dimensions that meet, the tests that run
    them together: an empty list is a gap."""
    out: dict[tuple[tuple[str, str], ...], list[Tested]] = {}
    items = [(key, combination[key]) for key in DIMENSIONS]
    groups = [(item,) for item in items] + [
        (a, b) for a, b in itertools.combinations(items, 2) if not _independent(a[0], b[0])
    ]
    for group in groups:
        out[group] = [t for t in TESTED if all(t.point.get(key) == value for key, value in group)]
    return out


def words(dimension: str, value: str) -> str:
    """How a message names ``value`` of ``dimension`` (``--engine vllm``, ``async_steps >= 1``)."""
    fixed = {
        ("async", "on"): "async_steps >= 1",
        ("async", "off"): "async_steps=0",
        ("lora", "on"): "lora",
        ("lora", "off"): "no lora",
        ("processes", "1"): "one process",
        ("processes", "n"): "--num-processes > 1",
        ("processes", "sharded"): "sharded weights (--accelerate-config fsdp / zero3)",
    }
    flags = {"engine": "--engine ", "algorithm": "--algo ", "rollout": "rollout=", "precision": "precision="}
    return fixed.get((dimension, value)) or f"{flags.get(dimension, dimension + '=')}{value}"


def message(combination: Mapping[str, str], rule: Refused, rules: tuple[Refused, ...] = REFUSED) -> str:
    """One line: the refused values, why, and which single change is supported instead."""
    named = [words(key, combination[key]) for key in DIMENSIONS if key in rule.when]
    options = [
        words(key, other)
        for key in DIMENSIONS
        if key in rule.when
        for other in DIMENSIONS[key]
        if other != combination[key] and refusal({**combination, key: other}, rules) is None
    ]
    instead = f"supported instead: {', or '.join(options)}" if options else "no single change of these is supported"
    return f"{' with '.join(named)} is not supported: {rule.because}; {instead} (docs/reference/capabilities.md)"


def processes_from_environment() -> str:
    """This process's ``processes`` value as a launcher set it up (``accelerate launch`` / torchrun)."""
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        return "sharded"
    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
    if deepspeed and os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE") == "3":
        return "sharded"
    return "n" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else "1"


def launch_processes(num_processes: int, accelerate_settings: Mapping[str, Any] | None) -> str:
    """The ``processes`` value of ``--num-processes N`` with an accelerate config's settings (None: none)."""
    settings = accelerate_settings or {}
    kind = str(settings.get("distributed_type", "")).upper()
    stage = (settings.get("deepspeed_config") or {}).get("zero_stage")
    if kind == "FSDP" or (kind == "DEEPSPEED" and str(stage) == "3"):
        return "sharded"
    return "n" if num_processes > 1 else "1"


def combination_of(config: Any, processes: str) -> dict[str, str]:
    """A run config's combination (``config``: a TrainConfig) with ``processes``."""
    return {
        "engine": config.engine,
        "rollout": config.rollout,
        "algorithm": config.algo,
        "async": "on" if config.async_steps else "off",
        "lora": "off" if config.lora is None else "on",
        "processes": processes,
        "precision": config.precision,
    }


def plugin_refusals(config: Any, registry: Any) -> tuple[Refused, ...]:
    """The ``unsupported`` rules the chosen engine, rollout and algorithm classes declare, each
    narrowed to runs that choose that plugin."""
    out: list[Refused] = []
    for kind, dimension, name in (
        ("engine", "engine", config.engine),
        ("rollout", "rollout", config.rollout),
        ("algorithm", "algorithm", config.algo),
    ):
        for rule in getattr(registry.get(kind, name).factory, "unsupported", ()) or ():
            unknown = sorted(set(rule.when) - set(DIMENSIONS))
            if not isinstance(rule, Refused) or unknown:
                raise ConfigError(
                    f"{kind} {name!r} declares unsupported={rule!r}: each must be a Refused rule over "
                    f"the dimensions {', '.join(DIMENSIONS)}"
                )
            out.append(Refused({**rule.when, dimension: name}, rule.because))
    return tuple(out)


def check_combination(config: Any, registry: Any, processes: str) -> None:
    """A ConfigError naming the combination, why it is refused and what is supported instead, when
    the table (or the chosen plugins' own ``unsupported``) refuses the run's combination."""
    combination = combination_of(config, processes)
    rules = REFUSED + plugin_refusals(config, registry)
    rule = refusal(combination, rules)
    if rule is not None:
        raise ConfigError(message(combination, rule, rules))
