"""The ``plugins.openai_agent`` section of the ``openai_agent`` rollout, and the agent function it names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field

from agentrl import ConfigError, one_line
from agentrl_openai_agent.agent_process import import_agent
from agentrl_openai_agent.signature import agent_call as check_agent

SECTION = "openai_agent"


DEFAULT_WORKERS = 32
"""Worker processes when ``max_concurrency`` is 0: a step's episodes, at most this many."""


@dataclass(frozen=True)
class OpenAIAgentConfig:
    """The ``plugins.openai_agent`` section (used by ``--set rollout=openai_agent``)."""

    agent: str = ""
    """The agent function: ``path/to/file.py:solve`` or ``module:solve`` (:mod:`agentrl_openai_agent`)."""
    task_field: str | None = None
    """The task field the agent's first parameter gets (``question``: ``def run(q, base_url)`` is
    called with ``task["question"]``); null: decided by its signature (the whole task dict, or the
    field it is named after: :mod:`agentrl_openai_agent.signature`)."""
    max_turns: Annotated[int, Field(ge=1)] | None = None
    """What an agent that declares a ``max_turns`` parameter is given; null: the env's
    ``max_turns``."""
    tool_parser: str = "auto"
    """Registered tool-call parser reading the model's calls into OpenAI ``tool_calls``; ``auto``: the
    one the model's chat template or special tokens show (``xml_json`` when they show none)."""
    max_concurrency: Annotated[int, Field(ge=0)] = 0
    """Episodes whose agent runs at once, each in a worker process of its own (0: every episode of
    the step, at most 32): the number of worker processes (:mod:`agentrl_openai_agent.workers`)."""
    batch_wait_s: Annotated[float, Field(ge=0)] = 0.02
    """After a call arrives, at most how long the engine waits for the other running agents' calls
    before sampling what is pending together (it starts at once when every running agent has one)."""
    timeout_s: Annotated[float, Field(ge=0)] = 600.0
    """Seconds of its own time one episode's agent may take, its waits for the model NOT counted
    (:mod:`agentrl_openai_agent.clock`; 0: no limit); past it the episode is handled by
    ``on_call_error`` (``call_timeout_s`` is for env and reward calls)."""
    host: str | None = None
    """The address the endpoint binds: ``127.0.0.1`` (agent programs on this machine only), ``0.0.0.0``
    (every interface) or one interface's IP (other machines reach it; the traffic is plain HTTP:
    keep it on a network you trust). null: ``127.0.0.1``, or this node's IP when agent programs run
    in Ray env workers on other nodes (``ray.env_workers``)."""
    port: Annotated[int, Field(ge=0, le=65535)] = 0
    """The endpoint's port (0: a free one, a new one each step); a fixed port for a firewall rule."""
    advertise_host: str | None = None
    """The address in the base URLs agent programs are given (a name or IP their machine reaches
    this one by); null: ``host``, or this machine's IP when ``host`` is ``0.0.0.0``."""
    env_scores: bool = True
    """The run's env scores the final answer of an agent that returns a str, messages or None (its reward
    the episode's env return, its info the held-out accuracy: :mod:`agentrl_openai_agent.scoring`);
    False: the reward functions alone score agent episodes."""


def load_agent(spec: str) -> Any:
    """The function ``spec`` names (``file.py:name`` or ``module:name``); ConfigError when it cannot.
    The trainer imports it to check its signature (:func:`check_agent`); it runs in worker
    processes, which import it the same way (:mod:`agentrl_openai_agent.workers`)."""
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise ConfigError(f"plugins.{SECTION}.agent={spec!r} must be 'path/to/file.py:function' or 'module:function'")
    try:
        fn = import_agent(spec)
    except Exception as exc:
        raise ConfigError(f"plugins.{SECTION}.agent={spec!r} cannot be loaded: {one_line(exc)}") from exc
    if not callable(fn):
        raise ConfigError(f"plugins.{SECTION}.agent={spec!r} is not a function")
    return fn


__all__ = ["DEFAULT_WORKERS", "SECTION", "OpenAIAgentConfig", "check_agent", "load_agent"]
