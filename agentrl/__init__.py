"""agentrl: plugin-based reinforcement learning for LLM agents.

The public API. Plugins, built-in or third-party, import only from here.
"""

from agentrl.algorithm import Algorithm, LossOutput, StepTotals
from agentrl.engine import Engine, Generation, SamplingParams
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
from agentrl.plugins import PluginManager, load_plugins
from agentrl.tasks import LazyTasks
from agentrl.tools import Tool, ToolCall, ToolEnv, ToolError, format_tool_call, tool
from agentrl.trajectory import TrainBatch, Trajectory, Turn, collate

__all__ = [
    "AgentRLError",
    "Algorithm",
    "ConfigError",
    "Engine",
    "EngineError",
    "Env",
    "EnvError",
    "Generation",
    "LazyTasks",
    "LossOutput",
    "Message",
    "MessagesSpace",
    "ModelError",
    "PluginError",
    "PluginManager",
    "RewardError",
    "SamplingParams",
    "StepTotals",
    "Task",
    "TemplateError",
    "Tool",
    "ToolCall",
    "ToolEnv",
    "ToolError",
    "TrainBatch",
    "Trajectory",
    "Turn",
    "collate",
    "format_tool_call",
    "hookimpl",
    "load_plugins",
    "tool",
]
