"""The ``multi_turn`` rollout: drives many env episodes together, one batched generation per turn.

Every live episode contributes its whole token sequence as a prompt; the engine samples one turn
for all of them at once; the envs answer, all at once (:class:`agentrl.EnvWorkers`: ``env_workers``
threads for sync ``reset``/``step``, one event loop for ``async def`` ones); each answer, taken in
episode order whichever env was first, is appended as chat-template delta ids (loss mask 0), so
the tokens do not depend on env latency. Single-turn envs are the case where the env terminates
after the first turn.

Limits, kept apart (TRAPS 27): ``max_new_tokens`` per turn, ``max_sampled_tokens`` per episode
(model tokens), ``max_total_tokens`` per episode (everything), and the env's ``max_turns``
(the env truncates itself). Whichever ends an episode, ``Trajectory.truncated`` records it.

Randomness (TRAPS 40): turn 0 samples with ``sampling.seed``; turn k > 0 with a seed derived from
``(sampling.seed, k)`` (:func:`turn_seed`), so every turn draws fresh random numbers and a whole
rollout stays reproducible from the one seed. Reusing the seed each turn would repeat turn 0's
draws on every turn: episodes would no longer be samples of the policy. With per-episode
``seeds`` (the trainer's: one per episode of the global batch), each episode also samples from its
own seed (``SamplingParams.prompt_seeds``, turn-derived the same way), so its tokens do not depend
on which episodes share its batch or its process.

An episode whose prompt alone fills ``max_total_tokens`` ends before the model speaks: it has no
turns (so it scores as an empty reply), ``info["prompt_too_long"]`` is set, and the rollout warns.

Failures (a bad rollout is data, not a crash). ``reset`` and ``step`` run under the run's
:class:`agentrl.CallGuard` (``call_timeout_s``, ``on_call_error``). An exception or a timeout
inside env code (an :class:`agentrl.EnvLibraryError` included: the library an adapter wraps failed,
named with its env id and call) ends that episode with ``skip``: ``info["error"]`` holds
``method``, ``exception`` (``Type: message``, or the EnvLibraryError's line) and ``timed_out``; the
scorer leaves it unscored. A reset that failed leaves a placeholder prompt (one empty user message)
and no turns. With ``fail``, or for a broken contract (wrong shapes, non-finite reward, any other
AgentRLError), the run stops with an EnvError naming the env, the method and the sample. An engine
that raises stops the run with an EngineError naming the engine, the turn and the batch (prompt
count and lengths).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

from agentrl import (
    AgentRLError,
    CallGuard,
    CallTimeout,
    ChatTokenizer,
    Engine,
    EngineError,
    Env,
    EnvCall,
    EnvError,
    EnvLibraryError,
    EnvWorkers,
    Generation,
    SamplingParams,
    Trajectory,
    Turn,
    check_reset_result,
    check_step_result,
    hookimpl,
    one_line,
    sample_label,
)

PLACEHOLDER = [{"role": "user", "content": ""}]
"""The prompt of an episode whose ``reset`` failed (so its trajectory still has tokens)."""


def turn_seed(seed: int | None, turn: int) -> int | None:
    """The sampling seed of turn ``turn`` (0-based): ``seed`` itself for turn 0, else a distinct
    deterministic mix of both (64-bit, within any generator's range); None stays None."""
    if seed is None or turn == 0:
        return seed
    return (seed * 6364136223846793005 + turn * 1442695040888963407) % (2**63 - 1)


@dataclass
class _Episode:
    index: int
    env: Env
    task: dict[str, Any]
    group: int
    messages: list[dict[str, Any]]
    token_ids: list[int]
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    done: bool = False
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] | None = None

    @property
    def sampled(self) -> int:
        return sum(self.loss_mask)


@dataclass
class _Reply:
    """A model turn just appended to its episode, waiting for the env's answer."""

    start: int
    ids: list[int]
    reason: str
    assistant: dict[str, Any]
    history: list[dict[str, Any]]
    """The episode's messages before this turn."""


class MultiTurnRollout:
    """Runs episodes to the end; see the module docstring."""

    def __init__(self, engine: Engine, tokenizer: Any, config: Any) -> None:
        self.engine = engine
        self.chat = ChatTokenizer(tokenizer)
        self.config = config
        self.guard = CallGuard.from_config(config)
        self.workers = EnvWorkers(self.guard, config.env_workers)

    def run(self, envs: list[Env], tasks: list[dict[str, Any]], groups: list[int],
            sampling: SamplingParams, seeds: list[int] | None = None) -> list[Trajectory]:
        """One episode per env on the matching task; returns them as trajectories, in order."""
        if not len(envs) == len(tasks) == len(groups):
            raise EnvError(f"{len(envs)} envs, {len(tasks)} tasks, {len(groups)} groups: must match")
        episodes = self._reset(envs, tasks, groups, seeds)
        max_sampled = self.config.max_sampled_tokens or self.config.max_new_tokens * max(
            env.max_turns for env in envs)
        turn = 0
        while live := [e for e in episodes if not e.done]:
            budget = [min(sampling.max_new_tokens, max_sampled - e.sampled,
                          self.config.max_total_tokens - len(e.token_ids)) for e in live]
            for episode, cap in zip(live, budget):
                if cap <= 0:  # the token budget is spent (by the prompt alone if no turn yet)
                    episode.done = episode.truncated = True
                    if not episode.turns:
                        episode.info["prompt_too_long"] = True
            live, budget = [e for e in live if not e.done], [b for b in budget if b > 0]
            if not live:
                break
            turn_sampling = SamplingParams(
                max_new_tokens=max(budget), temperature=sampling.temperature, top_p=sampling.top_p,
                top_k=sampling.top_k, seed=turn_seed(sampling.seed, turn),
                prompt_seeds=None if seeds is None else tuple(turn_seed(seeds[e.index], turn) for e in live))
            turn += 1
            generations = self._generate([e.token_ids for e in live], turn_sampling, turn)
            replies = [self._sampled(episode, generation, cap)
                       for episode, generation, cap in zip(live, generations, budget)]
            # Every live episode's env answers at once (env_workers); the answers are taken in order.
            outcomes = self.workers.gather([EnvCall(e.env, "step", (r.assistant["content"],))
                                            for e, r in zip(live, replies)])
            for episode, reply, outcome in zip(live, replies, outcomes):
                self._answered(episode, reply, outcome, max_sampled)
        too_long = sum(bool(e.info.get("prompt_too_long")) for e in episodes)
        if too_long:
            warnings.warn(f"{too_long} of {len(episodes)} episodes ended before the model spoke: their prompt "
                          f"alone fills max_total_tokens={self.config.max_total_tokens}; they score as empty "
                          "replies. Raise max_total_tokens or shorten the prompt.", RuntimeWarning, stacklevel=2)
        return [self._trajectory(e) for e in episodes]

    def _reset(self, envs: list[Env], tasks: list[dict[str, Any]], groups: list[int],
               seeds: list[int] | None) -> list[_Episode]:
        """Every env reset on its task at once (env_workers); the episodes, in order."""
        schemas = [env.tool_schemas() for env in envs]
        native = [bool(tools) and self.chat.renders_tools for tools in schemas]
        outcomes = self.workers.gather([
            EnvCall(env, "reset", kwargs={"seed": None if seeds is None else seeds[i],
                                          "options": {"task": task, "template_renders_tools": native[i]}})
            for i, (env, task) in enumerate(zip(envs, tasks))])
        episodes = []
        for i, (env, task, group, outcome) in enumerate(zip(envs, tasks, groups, outcomes)):
            result, error = self._checked(i, env, task, "reset", outcome)
            if error is not None:  # the episode ends before it starts
                ids = self.chat.prompt_ids(PLACEHOLDER)
                episodes.append(_Episode(i, env, task, group, list(PLACEHOLDER), ids, [0] * len(ids),
                                         [0.0] * len(ids), done=True, info={"error": error}))
                continue
            messages, info = check_reset_result(env, result)
            tools = list(schemas[i]) if native[i] else None
            ids = self.chat.prompt_ids(messages, tools=tools)
            episodes.append(_Episode(i, env, task, group, list(messages), ids, [0] * len(ids),
                                     [0.0] * len(ids), info=dict(info), tools=tools))
        return episodes

    def _generate(self, prompts: list[list[int]], sampling: SamplingParams, turn: int) -> list[Generation]:
        """``engine.generate``; any failure becomes an EngineError naming the engine and the batch."""
        try:
            generations = self.engine.generate(prompts, sampling)
            if len(generations) != len(prompts):
                raise EngineError(f"returned {len(generations)} generations for {len(prompts)} prompts")
            return generations
        except Exception as exc:
            name = getattr(self.config, "engine", None)
            engine = f"{name!r} ({type(self.engine).__name__})" if name else type(self.engine).__name__
            lengths = [len(p) for p in prompts]
            detail = str(exc) if isinstance(exc, AgentRLError) else one_line(exc)
            raise EngineError(f"engine {engine} failed at turn {turn} on {len(prompts)} prompts of "
                              f"{min(lengths, default=0)}-{max(lengths, default=0)} tokens (max_new_tokens="
                              f"{sampling.max_new_tokens}, temperature={sampling.temperature}): {detail}") from exc

    def _checked(self, index: int, env: Env, task: dict[str, Any], method: str,
                 outcome: tuple[Any, BaseException | None]) -> tuple[Any, dict[str, Any] | None]:
        """What ``env.<method>(...)``, made under the guard, came to: ``(result, None)``, or ``(None,
        error)`` when env code raised (an EnvLibraryError included: a wrapped library failed) or
        timed out and ``on_call_error`` is ``skip``. Any other AgentRLError (a broken contract)
        always propagates; with ``fail`` the failure becomes an EnvError."""
        result, exc = outcome
        if exc is None:
            return result, None
        where = f"{type(env).__name__}.{method}"
        if isinstance(exc, AgentRLError) and not isinstance(exc, EnvLibraryError):
            raise exc  # a broken contract
        what = f"{where} {'timed out' if isinstance(exc, CallTimeout) else 'raised'} on {sample_label(index, task)}"
        detail = str(exc) if isinstance(exc, EnvLibraryError) else one_line(exc)
        if not self.guard.skips:
            raise EnvError(f"{what}: {detail} (on_call_error=fail; with 'skip' the episode would "
                           "end unscored and count in errors/env)") from exc
        self.guard.warn_once(f"env:{type(env).__name__}", f"{what}: {detail}; the episode ends unscored "
                             "(on_call_error=skip). Later failures of this env are only counted in errors/env")
        return None, {"method": where, "exception": detail, "timed_out": isinstance(exc, CallTimeout)}

    def _sampled(self, episode: _Episode, generation: Generation, cap: int) -> _Reply:
        """Append the model's turn to ``episode`` (cut to its own budget ``cap``); the reply its env answers."""
        ids, logprobs, reason = list(generation.token_ids), list(generation.logprobs), generation.finish_reason
        if len(ids) > cap:  # this episode had less budget than the batch's largest
            ids, logprobs, reason = ids[:cap], logprobs[:cap], "length"
        start = len(episode.token_ids)
        episode.token_ids += ids
        episode.loss_mask += [1] * len(ids)
        episode.logprobs += logprobs
        stopped = reason == "stop"
        assistant = {"role": "assistant", "content": self.chat.assistant_text(ids, stopped)}
        return _Reply(start, ids, reason, assistant, list(episode.messages))

    def _answered(self, episode: _Episode, reply: _Reply, outcome: tuple[Any, BaseException | None],
                  max_sampled: int) -> None:
        """Append the env's answer to ``reply`` (its ``step`` outcome) to ``episode``, or end it."""
        start, ids, reason, assistant, history = reply.start, reply.ids, reply.reason, reply.assistant, reply.history
        stopped = reason == "stop"
        result, error = self._checked(episode.index, episode.env, episode.task, "step", outcome)
        if error is not None:  # the env broke mid-episode: end it here, unscored
            episode.messages.append(assistant)
            episode.turns.append(Turn(start=start, end=len(episode.token_ids), finish_reason=reason))
            episode.info["error"] = error
            episode.done = True
            return
        new_messages, reward, terminated, truncated, info = check_step_result(episode.env, result)
        episode.messages += [assistant] + list(new_messages)
        episode.info = dict(info)
        episode.turns.append(Turn(start=start, end=len(episode.token_ids), reward=float(reward),
                                  finish_reason=reason, tool_calls=int(info.get("tool_calls", 0)),
                                  tool_errors=int(info.get("tool_errors", 0))))
        if terminated or truncated:
            episode.done, episode.terminated = True, bool(terminated)
            episode.truncated = bool(truncated) or (not stopped)
            self._unseen(episode, list(new_messages))
            return
        delta = [] if episode.sampled >= max_sampled else self.chat.delta_ids(
            history, ids, assistant, list(new_messages), tools=episode.tools, stopped=stopped)
        if not delta or len(episode.token_ids) + len(delta) >= self.config.max_total_tokens:
            # A token cap ends the episode before the model sees the env's answer.
            episode.done = episode.truncated = True
            self._unseen(episode, list(new_messages))
            return
        episode.token_ids += delta
        episode.loss_mask += [0] * len(delta)
        episode.logprobs += [0.0] * len(delta)

    @staticmethod
    def _unseen(episode: _Episode, new_messages: list[dict[str, Any]]) -> None:
        """The episode ended before the model read ``new_messages``: move them from ``messages``
        (which stays exactly what the token ids hold) to ``info["unseen_messages"]``."""
        if new_messages:
            del episode.messages[-len(new_messages):]
            episode.info["unseen_messages"] = new_messages

    @staticmethod
    def _trajectory(episode: _Episode) -> Trajectory:
        trajectory = Trajectory(
            token_ids=episode.token_ids, loss_mask=episode.loss_mask,
            sampler_logprobs=episode.logprobs, turns=episode.turns, messages=episode.messages,
            task=episode.task, group=episode.group, terminated=episode.terminated,
            truncated=episode.truncated, info=episode.info, tools=episode.tools)
        trajectory.validate()
        return trajectory


@hookimpl
def agentrl_register_rollouts(register: Any) -> None:
    """Register the built-in ``multi_turn`` and ``openai_agent`` rollouts."""
    from agentrl_rollouts.openai_agent import OpenAIAgentRollout

    register("multi_turn", MultiTurnRollout)
    register("openai_agent", OpenAIAgentRollout)


@hookimpl
def agentrl_register_settings(register: Any) -> None:
    """Register the ``plugins.openai_agent`` section (the agent function and its endpoint's options)."""
    from agentrl_rollouts.openai_agent import SECTION, OpenAIAgentConfig

    register(SECTION, OpenAIAgentConfig)
