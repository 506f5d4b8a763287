"""The ``plugins.openai_agent`` section of the ``openai_agent`` rollout, and the agent function it names."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from agentrl import ConfigError, one_line

SECTION = "openai_agent"


@dataclass(frozen=True)
class OpenAIAgentConfig:
    """The ``plugins.openai_agent`` section (used by ``--set rollout=openai_agent``)."""

    agent: str = ""
    """The agent function: ``path/to/file.py:solve`` or ``module:solve`` (:mod:`agentrl_openai_agent`)."""
    tool_parser: str = "auto"
    """Registered tool-call parser reading the model's calls into OpenAI ``tool_calls``; ``auto``: the
    one the model's chat template or special tokens show (``xml_json`` when they show none)."""
    max_concurrency: Annotated[int, Field(ge=0)] = 0
    """Episodes whose agent runs at once (0: every episode of the step)."""
    batch_wait_s: Annotated[float, Field(ge=0)] = 0.02
    """After a call arrives, at most how long the engine waits for the other running agents' calls
    before sampling what is pending together (it starts at once when every running agent has one)."""
    timeout_s: Annotated[float, Field(ge=0)] = 600.0
    """Seconds of its own time one episode's agent may take, its waits for the model NOT counted
    (:mod:`agentrl_openai_agent.clock`; 0: no limit); past it the episode is handled by
    ``on_call_error`` (``call_timeout_s`` is for env and reward calls)."""
    env_scores: bool = True
    """The run's env scores the final answer of an agent that returns messages or None (its reward
    the episode's env return, its info the held-out accuracy: :mod:`agentrl_openai_agent.scoring`);
    False: the reward functions alone score agent episodes."""


def load_agent(spec: str) -> Any:
    """The function ``spec`` names (``file.py:name`` or ``module:name``); ConfigError when it cannot."""
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise ConfigError(f"plugins.{SECTION}.agent={spec!r} must be 'path/to/file.py:function' or 'module:function'")
    try:
        if where.endswith(".py"):
            module_spec = importlib.util.spec_from_file_location(f"agentrl_agent_{Path(where).stem}", where)
            if module_spec is None or module_spec.loader is None or not Path(where).is_file():
                raise FileNotFoundError(f"no such file: {where}")
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[module_spec.name] = module
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
        fn = getattr(module, name)
    except Exception as exc:
        raise ConfigError(f"plugins.{SECTION}.agent={spec!r} cannot be loaded: {one_line(exc)}") from exc
    if not callable(fn):
        raise ConfigError(f"plugins.{SECTION}.agent={spec!r} is not a function")
    return fn
