"""agentrl: plugin-based reinforcement learning for LLM agents.

The public API. Plugins, built-in or third-party, import only from here, or from the public
submodules listed in :data:`PUBLIC_MODULES` (tests/repo/test_public_api.py holds every built-in plugin
and env to that).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentrl.config.checks import ConfigCheck, build_plugin_config
from agentrl.config.cluster import RayConfig, ray_options
from agentrl.config.rules import Allowed, Complaint, OneOf, check_declared
from agentrl.config.train import TrainConfig
from agentrl.env import (
    MAX_ABS_REWARD,
    ROLES,
    CallGuard,
    CallTimeout,
    Env,
    EnvCall,
    EnvWorkers,
    Message,
    MessagesSpace,
    PrivateGlobalRandom,
    SeedTasks,
    Task,
    check_reset_result,
    check_step_result,
    describe,
    library_call,
    sample_label,
    seeded_rng,
)
from agentrl.env.tasks import LazyTasks
from agentrl.errors import (
    AgentRLError,
    CheckpointError,
    ConfigError,
    EngineError,
    EnvError,
    EnvLibraryError,
    ModelError,
    PluginError,
    RewardError,
    RunDirBusyError,
    TemplateError,
    TrainingError,
    TrainingInterrupted,
    one_line,
)
from agentrl.faults import PluginExit
from agentrl.hookspecs import hookimpl
from agentrl.imports import import_extra
from agentrl.model.roles import ModelFolderError, load_for_role, load_tokenizer_for_role
from agentrl.plugins import PluginManager, load_plugins
from agentrl.rewards.process import StepRewards, process_advantages, step_ends
from agentrl.rewards.schemes import RewardContext
from agentrl.rewards.scoring import Scored
from agentrl.sampling.chat import ChatTokenizer
from agentrl.sampling.engine import Engine, Generation, SamplingParams, stop_token_ids, token_ids, turn_seed
from agentrl.sampling.request_queue import BatchingQueue, GenerationRequest, RequestQueue, request_queue, sample_here
from agentrl.sampling.rollout import Rollout
from agentrl.tools.formats import HARMONY, LLAMA3_JSON, MISTRAL, QWEN3_CODER, ToolCallFormat, type_arguments
from agentrl.tools.sandbox import run_python
from agentrl.tools.tool import (
    Tool,
    ToolCall,
    ToolEnv,
    ToolError,
    format_tool_call,
    parse_xml_json,
    render_tools_system_prompt,
    tool,
)
from agentrl.trajectory import TrainBatch, Trajectory, Turn, collate

_TORCH = {
    "agentrl.algorithms.base": (
        "Algorithm",
        "LossContext",
        "LossOutput",
        "SetupContext",
        "StepTotals",
        "TrainableModule",
    ),
    "agentrl.algorithms.clipped_policy": ("ClippedPolicy", "ClippedPolicyConfig"),
    "agentrl.algorithms.group_relative": ("GroupRelative", "GroupRelativeConfig", "group_advantages"),
    "agentrl.algorithms.objectives": (
        "AGGREGATIONS",
        "IMPORTANCE_LEVELS",
        "KL_ESTIMATORS",
        "clipped_surrogate",
        "importance_log_weights",
        "masked",
        "masked_mean",
        "policy_loss",
        "step_totals",
    ),
    "agentrl.model.distributed": ("all_sum",),
    "agentrl.model.output_head": ("eval_mode", "head_matches"),
    "agentrl.model.packed_forward": ("packing_agrees", "selected_hidden_states"),
    "agentrl.model.precision": ("Precision", "resolve_precision"),
    "agentrl.api.trainer": ("train", "Trainer"),
    "agentrl.training.trainer": ("TrainResult",),
}
"""The names that need torch (or the whole training stack), by module: imported on first use, so
``import agentrl`` and the commands that load no plugin (``--help``, ``view``, ``compare``, a bad
``--set`` key) do not pay for torch."""

_LAZY = {name: module for module, names in _TORCH.items() for name in names}

if TYPE_CHECKING:
    from agentrl.algorithms.base import (
        Algorithm,
        LossContext,
        LossOutput,
        SetupContext,
        StepTotals,
        TrainableModule,
    )
    from agentrl.algorithms.clipped_policy import ClippedPolicy, ClippedPolicyConfig
    from agentrl.algorithms.group_relative import GroupRelative, GroupRelativeConfig, group_advantages
    from agentrl.algorithms.objectives import (
        AGGREGATIONS,
        IMPORTANCE_LEVELS,
        KL_ESTIMATORS,
        clipped_surrogate,
        importance_log_weights,
        masked,
        masked_mean,
        policy_loss,
        step_totals,
    )
    from agentrl.api.trainer import Trainer, train
    from agentrl.model.distributed import all_sum
    from agentrl.model.output_head import eval_mode, head_matches
    from agentrl.model.packed_forward import packing_agrees, selected_hidden_states
    from agentrl.model.precision import Precision, resolve_precision
    from agentrl.training.trainer import TrainResult


def __getattr__(name: str) -> object:
    """The names of :data:`_TORCH`, imported when first used and kept (later lookups are plain)."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'agentrl' has no attribute {name!r}")


def __dir__() -> list[str]:
    """Every public name, the lazily imported ones included."""
    return sorted(set(globals()) | set(_LAZY))


PUBLIC_MODULES = ("agentrl", "agentrl.answers")
"""The modules plugins and envs may import from: this one and :mod:`agentrl.answers` (answer
extraction and checking, kept apart because it loads math-verify)."""

__all__ = [
    "train",
    "eval_mode",
    "head_matches",
    "selected_hidden_states",
    "packing_agrees",
    "Trainer",
    "TrainResult",
    "RayConfig",
    "ray_options",
    "PUBLIC_MODULES",
    "ClippedPolicy",
    "ClippedPolicyConfig",
    "GroupRelative",
    "GroupRelativeConfig",
    "group_advantages",
    "StepRewards",
    "Scored",
    "process_advantages",
    "step_ends",
    "ROLES",
    "PrivateGlobalRandom",
    "SeedTasks",
    "describe",
    "import_extra",
    "load_for_role",
    "load_tokenizer_for_role",
    "ModelFolderError",
    "library_call",
    "parse_xml_json",
    "render_tools_system_prompt",
    "ToolCallFormat",
    "LLAMA3_JSON",
    "MISTRAL",
    "QWEN3_CODER",
    "HARMONY",
    "type_arguments",
    "run_python",
    "BatchingQueue",
    "GenerationRequest",
    "RequestQueue",
    "request_queue",
    "sample_here",
    "seeded_rng",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "AgentRLError",
    "CallGuard",
    "CallTimeout",
    "MAX_ABS_REWARD",
    "PluginExit",
    "TrainingError",
    "TrainingInterrupted",
    "check_reset_result",
    "check_step_result",
    "one_line",
    "sample_label",
    "IMPORTANCE_LEVELS",
    "Algorithm",
    "ChatTokenizer",
    "ConfigCheck",
    "Allowed",
    "Complaint",
    "OneOf",
    "check_declared",
    "CheckpointError",
    "ConfigError",
    "Engine",
    "EngineError",
    "Env",
    "EnvCall",
    "EnvError",
    "EnvLibraryError",
    "EnvWorkers",
    "Generation",
    "LazyTasks",
    "LossContext",
    "LossOutput",
    "Message",
    "MessagesSpace",
    "ModelError",
    "PluginError",
    "PluginManager",
    "Precision",
    "RewardContext",
    "RewardError",
    "Rollout",
    "RunDirBusyError",
    "SamplingParams",
    "SetupContext",
    "StepTotals",
    "Task",
    "TemplateError",
    "Tool",
    "ToolCall",
    "ToolEnv",
    "ToolError",
    "TrainBatch",
    "TrainConfig",
    "TrainableModule",
    "Trajectory",
    "Turn",
    "all_sum",
    "build_plugin_config",
    "clipped_surrogate",
    "collate",
    "format_tool_call",
    "hookimpl",
    "importance_log_weights",
    "load_plugins",
    "masked",
    "masked_mean",
    "policy_loss",
    "resolve_precision",
    "step_totals",
    "stop_token_ids",
    "turn_seed",
    "token_ids",
    "tool",
]
