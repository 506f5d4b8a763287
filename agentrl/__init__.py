"""agentrl: plugin-based reinforcement learning for LLM agents.

The public API. Plugins, built-in or third-party, import only from here.
"""

from agentrl.algorithm import Algorithm, LossContext, LossOutput, SetupContext, StepTotals, TrainableModule
from agentrl.chat import ChatTokenizer
from agentrl.config import TrainConfig, build_plugin_config
from agentrl.engine import Engine, Generation, SamplingParams, stop_token_ids, token_ids
from agentrl.env import Env, Message, MessagesSpace, Task
from agentrl.errors import (
    AgentRLError,
    ConfigError,
    EngineError,
    EnvError,
    ModelError,
    PluginError,
    RewardError,
    TemplateError,
)
from agentrl.hookspecs import hookimpl
from agentrl.objectives import (
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
from agentrl.plugins import PluginManager, load_plugins
from agentrl.tasks import LazyTasks
from agentrl.tools import Tool, ToolCall, ToolEnv, ToolError, format_tool_call, tool
from agentrl.trajectory import TrainBatch, Trajectory, Turn, collate

__all__ = [
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "AgentRLError",
    "IMPORTANCE_LEVELS",
    "Algorithm",
    "ChatTokenizer",
    "ConfigError",
    "Engine",
    "EngineError",
    "Env",
    "EnvError",
    "Generation",
    "LazyTasks",
    "LossContext",
    "LossOutput",
    "Message",
    "MessagesSpace",
    "ModelError",
    "PluginError",
    "PluginManager",
    "RewardError",
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
    "step_totals",
    "stop_token_ids",
    "token_ids",
    "tool",
]
