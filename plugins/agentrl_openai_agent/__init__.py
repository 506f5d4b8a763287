"""The ``openai_agent`` rollout: trains an agent program written against the OpenAI client, as it is.

``--set rollout=openai_agent --set plugins.openai_agent.agent=my_agent.py:solve``. For each step
the rollout serves an OpenAI-compatible ``chat.completions`` endpoint on 127.0.0.1 (``host``: any
address, every URL behind the run's secret) backed by the run's engine
(:mod:`agentrl_openai_agent.server`) and calls the agent function once per episode, concurrently,
each in a worker process with its own client (:mod:`agentrl_openai_agent.workers`:
a worker whose agent leaves threads or processes running, crashes or times out is ended with all
it started and replaced; with ``ray.env_workers`` the workers run in Ray actors on the env
worker nodes: :mod:`agentrl_openai_agent.remote`):

* ``def solve(task, client)``: ``client`` is an ``openai.OpenAI`` for this episode;
* ``async def solve(task, client)``: an ``openai.AsyncOpenAI`` (run with ``asyncio.run`` in the
  worker);
* a script as it is written, ``def run_agent(question: str, base_url: str, model: str = "m",
  max_turns: int = 5) -> str``: the first parameter gets the task dict, or the field it is named
  after (or ``task_field``), and ``base_url``, ``client``, ``model``, ``max_turns`` and
  ``api_key`` are filled by name (:mod:`agentrl_openai_agent.signature`).

Every request body is validated (:mod:`agentrl_openai_agent.request`: a 400 in OpenAI's error
shape naming the field), an episode's URL and its client's api key are its own, and its URL
answers 410 once its agent has returned (:mod:`agentrl_openai_agent.server`).

``task`` is the env's task dict (the run's ``--env`` supplies the tasks and default rewards); a
signature that cannot be called with it is refused at start-up with the fix
(:func:`agentrl_openai_agent.signature.agent_call`). The function returns a reward (a finite
number: the episode's env return), its final answer (a str: the last assistant message, as the
reward functions and the env score it), the final messages (a list: the run's reward functions
score them; ``completion_text`` is the last assistant message), or None (the reward functions
score the last call's conversation and reply); in the last three cases the run's env also scores
the final answer (``env_scores``: :mod:`agentrl_openai_agent.scoring`),
which gives agent runs an env return and held-out accuracy. Every call's prompt ids,
sampled ids and sampler logprobs are recorded and merged into token-exact segments
(:mod:`agentrl_openai_agent.record`; a call with ``n > 1`` records each choice); each segment is
a training row with the episode's reward and group. ``tool_choice`` and the tool parser:
:mod:`agentrl_openai_agent.tools`. An agent that raises or runs past
``plugins.openai_agent.timeout_s`` is handled by ``on_call_error`` like a failing env: ``skip``
leaves the episode unscored.
"""

from __future__ import annotations

from typing import Any

from agentrl import Trajectory, hookimpl
from agentrl_openai_agent.calls import step_metrics
from agentrl_openai_agent.config import SECTION, OpenAIAgentConfig
from agentrl_openai_agent.rollout import OpenAIAgentRollout


@hookimpl
def agentrl_register_rollouts(register: Any) -> None:
    """Register the ``openai_agent`` rollout."""
    register("openai_agent", OpenAIAgentRollout)


@hookimpl
def agentrl_register_settings(register: Any) -> None:
    """Register the ``plugins.openai_agent`` section (the agent function and its endpoint's options)."""
    register(SECTION, OpenAIAgentConfig)


@hookimpl
def agentrl_on_rollout_end(trajectories: list[Trajectory], step: int, metrics: dict[str, float]) -> None:
    """Log ``agent/calls_mean`` and ``agent/segments_mean`` over the step's agent episodes."""
    metrics.update(step_metrics([t.info for t in trajectories]))
