"""The ``lora`` section of the run config: :class:`LoRAConfig` and its validation (no torch or
peft here, so the config loads without them; :mod:`agentrl.model.lora` applies it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints

from agentrl.config.checks import ConfigCheck, build_plugin_config
from agentrl.config.rules import Allowed, OneOf

LLAMA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Every linear layer of a Llama-style decoder block (SmolLM2, Llama, Qwen, Mistral)."""
LayerNames = Annotated[list[Annotated[str, StringConstraints(pattern=r"\S")]], Field(min_length=1)]
"""A non-empty list of layer names, none blank."""


@dataclass(frozen=True)
class LoRAConfig:
    """Options of LoRA (the ``lora`` section of the run config)."""

    r: Annotated[int, Field(ge=1)] = 16
    """Rank of each adapter (``B A`` is ``out x r`` times ``r x in``)."""
    alpha: Annotated[float, Field(gt=0), Allowed("expected null (2 * r) or a finite number > 0")] | None = None
    """The adapter's output is scaled by ``alpha / r``; None: ``2 * r`` (a scale of 2)."""
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """Dropout on the adapter's input. Only 0: agentrl runs the policy in eval mode, since dropout
    in the trainer's forward makes the sampler/trainer ratio differ from 1 at step 0
    (docs/concepts/guards.md#dropout)."""
    target_modules: Annotated[
        LayerNames | Literal["all-linear"],
        Allowed(f"expected 'all-linear' or a non-empty list of layer names (e.g. {', '.join(LLAMA_TARGETS)})"),
    ] = field(default_factory=lambda: list(LLAMA_TARGETS))
    """Names (suffixes) of the linear layers that get an adapter, or ``all-linear`` (every linear
    layer but the output head: the default list on Llama-style models, the choice for others)."""
    bias: Annotated[
        str,
        OneOf("none"),
        Allowed("expected 'none' (trained biases would change the base model the reference policy is)"),
    ] = "none"
    """Only ``none``: biases stay frozen, so the adapter switched off is the base model exactly."""

    def __post_init__(self) -> None:
        """Raise ConfigError naming the key, the bad value and what is allowed."""
        check = ConfigCheck(self, "lora")
        check.declared()
        if self.dropout != 0:
            check.fail(
                "dropout",
                "expected 0: the policy runs in eval mode, and dropout only in the trainer's "
                "forward would make every importance ratio differ from 1 at step 0 (docs/concepts/guards.md#dropout)",
            )

    @property
    def lora_alpha(self) -> float:
        """``alpha``, its default resolved (``2 * r``)."""
        return 2.0 * self.r if self.alpha is None else float(self.alpha)

    @property
    def scale(self) -> float:
        """``alpha / r``: the factor on ``B A``."""
        return self.lora_alpha / self.r


def lora_options(values: dict[str, Any] | None) -> LoRAConfig | None:
    """The validated ``lora`` section; None (a full fine-tune) when it is null."""
    return None if values is None else build_plugin_config(LoRAConfig, values, "lora")
