"""The ``multi_turn`` rollout: drives many env episodes, each advancing as soon as its env answers.

Every episode asks for its next model turn as soon as its env has answered the last one: one
:class:`agentrl.GenerationRequest` (its whole token sequence as the prompt) on the run's
:func:`agentrl.request_queue`, which samples the pending requests together once every running
episode has one pending, or ``plugins.multi_turn.batch_wait_s`` after the first
(:class:`~agentrl_rollouts.episodes.MultiTurnConfig`). Each sampled turn goes to its env at once
(:meth:`agentrl.EnvWorkers.submit`: ``env_workers`` threads for sync ``reset``/``step``, one event
loop for ``async def`` ones); the env's answer is appended as chat-template delta ids (loss mask 0)
and the episode asks again. So one slow env holds back its own episode only: the others go on
sampling. With fast envs (all answering within ``batch_wait_s``) the batches are exactly the
lockstep ones: every live episode's turn k together, in episode order. ``reset`` is part of the
episode's chain too: each episode asks for its first turn as soon as its own env has reset.
Single-turn envs are the case where the env terminates after the first turn.

Limits, kept apart (docs/concepts/guards.md#length-limits): ``max_new_tokens`` per turn, ``max_sampled_tokens`` per
episode
(model tokens), ``max_total_tokens`` per episode (everything), and the env's ``max_turns``
(the env truncates itself). Each turn's request asks for what is left of the episode's budget
(its own ``max_new_tokens``). Whichever ends an episode, ``Trajectory.truncated`` records it.

Randomness (docs/concepts/guards.md#sampling-seeds): every request carries its own seed, so an episode's tokens depend
neither
on which episodes share its batch nor on when its env answered. With per-episode ``seeds`` (the
trainer's: one per episode of the global batch), episode i's turn k (its own count, 0-based)
samples with ``turn_seed(seeds[i], k)`` (:func:`agentrl.turn_seed`: the seed itself for turn 0, a distinct
mix for later turns, so every turn draws fresh random numbers; reusing the seed would repeat turn
0's draws on every turn and episodes would no longer be samples of the policy). Without ``seeds``,
episode i's turn k samples with ``turn_seed(sampling.seed, k) * 1_000_003 + i`` (mod 2**63): the
seed the engine gave batch position i under the batch seed ``turn_seed(sampling.seed, k)``, so
the whole rollout stays reproducible from the one seed (``sampling.seed`` None too: the engine's
own generator). With envs that answer within ``batch_wait_s`` the batches, and so every token and
logprob, are those of a turn-by-turn loop, bit for bit. When slow or jittery envs change which
episodes share a batch, the engine's numbers differ at ~1e-5 and a draw that lands on a token of
tiny probability can flip: on the default model, 32 episodes x 4 turns with latency uniform(0, 2 s),
5 of 32 episodes diverged, each at a token of logprob below -7.5 (bench/env_latency.py); on the tiny
test model none did. A large ``batch_wait_s`` keeps the turn-by-turn batches (reproducible, slower).

An episode whose prompt alone fills ``max_total_tokens`` ends before the model speaks: it has no
turns (so it scores as an empty reply), ``info["prompt_too_long"]`` is set, and the rollout warns.

Failures (a bad rollout is data, not a crash). ``reset`` and ``step`` run under the run's
:class:`agentrl.CallGuard` (``call_timeout_s``, ``on_call_error``). An exception or a timeout
inside env code (an :class:`agentrl.EnvLibraryError` included: the library an adapter wraps failed,
named with its env id and call) ends that episode with ``skip``: ``info["error"]`` holds
``method``, ``exception`` (``Type: message``, or the EnvLibraryError's line) and ``timed_out``; the
scorer leaves it unscored, and the run warns once per env class, naming the first failure (by turn,
then episode) whichever env answered first. A reset that failed leaves a placeholder prompt (one
empty user message) and no turns. With ``fail``, or for a broken contract (wrong shapes,
non-finite reward, any other AgentRLError), the run stops with an EnvError naming the env, the
method and the sample (once the env calls already running have answered: the first failure by
turn, then episode). An engine that raises stops the run with an EngineError naming the engine,
the turn and the batch (prompt count and lengths). A Ctrl-C stops the env calls not started yet
and the request queue.
"""

from __future__ import annotations

import warnings
from concurrent.futures import FIRST_COMPLETED, Future, wait
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
    GenerationRequest,
    RequestQueue,
    SamplingParams,
    Trajectory,
    Turn,
    build_plugin_config,
    check_reset_result,
    check_step_result,
    hookimpl,
    one_line,
    request_queue,
    sample_here,
    sample_label,
)
from agentrl_rollouts.episodes import (
    SECTION,
    EngineExit,
    Episode,
    MultiTurnConfig,
    NamedEngine,
    Reply,
    episode_seed,
)

PLACEHOLDER = [{"role": "user", "content": ""}]
"""The prompt of an episode whose ``reset`` failed (so its trajectory still has tokens)."""
RESET = object()
"""Marks an env ``reset`` call among the rollout's pending calls."""


class MultiTurnRollout:
    """Runs episodes to the end; see the module docstring."""

    def __init__(self, engine: Engine, tokenizer: Any, config: Any) -> None:
        self.engine = engine
        self.chat = ChatTokenizer(tokenizer)
        self.config = config
        self.options = build_plugin_config(
            MultiTurnConfig, (getattr(config, "plugins", None) or {}).get(SECTION, {}), f"plugins.{SECTION}"
        )
        self.guard = CallGuard.from_config(config)
        self.workers = EnvWorkers(self.guard, config.env_workers)
        self.batches: list[int] = []
        """Engine batch sizes of the last :meth:`run`, in order."""
        self._skipped: list[tuple[tuple[int, int], str, str]] = []
        """Env failures skipped and not yet warned about: ((turn, episode), plugin, message)."""

    def run(
        self,
        envs: list[Env],
        tasks: list[dict[str, Any]],
        groups: list[int],
        sampling: SamplingParams,
        seeds: list[int] | None = None,
    ) -> list[Trajectory]:
        """One episode per env on the matching task; returns them as trajectories, in order."""
        if not len(envs) == len(tasks) == len(groups):
            raise EnvError(f"{len(envs)} envs, {len(tasks)} tasks, {len(groups)} groups: must match")
        episodes = [
            Episode(i, env, task, group, [], []) for i, (env, task, group) in enumerate(zip(envs, tasks, groups))
        ]
        try:
            max_sampled = self.config.max_sampled_tokens or self.config.max_new_tokens * max(
                env.max_turns for env in envs
            )
            self._advance(episodes, sampling, seeds, max_sampled)
        finally:
            self._warn_skipped()
        too_long = sum(bool(e.info.get("prompt_too_long")) for e in episodes)
        if too_long:
            warnings.warn(
                f"{too_long} of {len(episodes)} episodes ended before the model spoke: their prompt "
                f"alone fills max_total_tokens={self.config.max_total_tokens}; they score as empty "
                "replies. Raise max_total_tokens or shorten the prompt.",
                RuntimeWarning,
                stacklevel=2,
            )
        return [self._trajectory(e) for e in episodes]

    def _advance(
        self, episodes: list[Episode], sampling: SamplingParams, seeds: list[int] | None, max_sampled: int
    ) -> None:
        """Every episode to its end, each turn as soon as its own env has answered (module docstring).
        The engine samples in this thread (the trainer's: :func:`agentrl.sample_here`), the episodes
        advance in a helper thread."""
        turns: dict[int, int] = {}  # id(an episode's token ids) -> its turn, 1-based: names a failing batch
        queue = request_queue(
            NamedEngine(self.engine, self._engine_name(), turns),
            self.options.batch_wait_s,
            lambda: sum(not e.done for e in episodes),
            worker_thread=False,
        )
        sample_here(queue, lambda: self._episodes(queue, episodes, sampling, seeds, max_sampled, turns))

    def _episodes(
        self,
        queue: RequestQueue,
        episodes: list[Episode],
        sampling: SamplingParams,
        seeds: list[int] | None,
        max_sampled: int,
        turns: dict[int, int],
    ) -> None:
        """The episodes' loop: env calls and model turns submitted as each is due, until all end."""
        pending: dict[Future, tuple[Episode, Reply | None]] = {}  # a generation (no reply yet) or an env step
        failed: list[tuple[tuple[int, int], BaseException]] = []  # stop once the running calls answered
        tools = [self._tools(episode.env) for episode in episodes]
        try:
            for episode in episodes:
                pending[self.workers.submit(self._reset_call(episode, seeds, tools[episode.index]))] = (episode, RESET)
            while pending:
                done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
                for future in sorted(done, key=lambda f: pending[f][0].index):
                    episode, reply = pending.pop(future)
                    if reply is RESET:  # the env's first observation: the episode's first turn next
                        try:
                            self._start(episode, self._outcome(future), tools[episode.index])
                        except AgentRLError as exc:
                            episode.done = True
                            failed.append(((-1, episode.index), exc))
                        if not failed:
                            self._ask(queue, episode, sampling, seeds, max_sampled, turns, pending)
                        continue
                    if reply is None:  # the model's turn: its env answers next
                        reply = self._sampled(episode, self._generation(future, turns[id(episode.token_ids)]))
                        if not failed:
                            call = EnvCall(episode.env, "step", (reply.assistant["content"],))
                            pending[self.workers.submit(call)] = (episode, reply)
                        continue
                    try:
                        self._answered(episode, reply, self._outcome(future), max_sampled)
                    except AgentRLError as exc:
                        failed.append(((len(episode.turns), episode.index), exc))
                    if not failed:
                        self._ask(queue, episode, sampling, seeds, max_sampled, turns, pending)
        except BaseException:
            self.workers.cancel(f for f, (_, reply) in pending.items() if reply is not None)  # env calls
            raise
        finally:
            queue.close()
            self.batches = list(queue.batches)
        if failed:
            raise min(failed, key=lambda item: item[0])[1]

    def _ask(
        self,
        queue: RequestQueue,
        episode: Episode,
        sampling: SamplingParams,
        seeds: list[int] | None,
        max_sampled: int,
        turns: dict[int, int],
        pending: dict[Future, Any],
    ) -> None:
        """Queue ``episode``'s next model turn, or end it when its token budget is spent (by the
        prompt alone if it has no turn yet) or it is done."""
        if episode.done:
            return
        cap = min(
            sampling.max_new_tokens,
            max_sampled - episode.sampled,
            self.config.max_total_tokens - len(episode.token_ids),
        )
        if cap <= 0:
            episode.done = episode.truncated = True
            if not episode.turns:
                episode.info["prompt_too_long"] = True
            return
        turn = len(episode.turns)
        turns[id(episode.token_ids)] = turn + 1
        request = GenerationRequest(
            episode.token_ids,
            SamplingParams(
                max_new_tokens=cap, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k
            ),
            seed=episode_seed(seeds, sampling.seed, episode.index, turn),
            order=episode.index,
        )
        pending[queue.submit(request)] = (episode, None)

    def _generation(self, future: Future, turn: int) -> Generation:
        """The future's Generation; what engine code raised that is not an Exception is raised as it
        was; an engine's own queue's failure becomes an EngineError naming it."""
        try:
            return future.result()
        except EngineExit as exc:
            raise exc.exc from None
        except EngineError:
            raise
        except Exception as exc:
            detail = str(exc) if isinstance(exc, AgentRLError) else one_line(exc)
            raise EngineError(f"engine {self._engine_name()} failed at turn {turn}: {detail}") from exc

    @staticmethod
    def _outcome(future: Future) -> tuple[Any, BaseException | None]:
        """An env call's outcome; one that is not an ``Exception`` (a real Ctrl-C) is raised."""
        outcome = future.result()
        if outcome[1] is not None and not isinstance(outcome[1], Exception):
            raise outcome[1]
        return outcome

    def _warn_skipped(self) -> None:
        """Warn once per env class about its first skipped failure (by turn, then episode),
        whichever env answered first."""
        for _, plugin, message in sorted(self._skipped, key=lambda item: item[0]):
            self.guard.warn_once(plugin, message)
        self._skipped.clear()

    def _engine_name(self) -> str:
        name = getattr(self.config, "engine", None)
        kind = getattr(self.engine, "display_name", type(self.engine).__name__)  # a wrapper names the wrapped
        return f"{name!r} ({kind})" if name else kind

    def _tools(self, env: Env) -> list[dict[str, Any]] | None:
        """The tool schemas the chat template renders for ``env`` (None: none, or the template does
        not render tools and the env describes them in its prompt)."""
        schemas = env.tool_schemas()
        return list(schemas) if schemas and self.chat.renders_tools else None

    @staticmethod
    def _reset_call(episode: Episode, seeds: list[int] | None, tools: list[dict[str, Any]] | None) -> EnvCall:
        """``episode``'s ``env.reset`` on its task."""
        options = {"task": episode.task, "template_renders_tools": tools is not None}
        return EnvCall(
            episode.env, "reset", kwargs={"seed": None if seeds is None else seeds[episode.index], "options": options}
        )

    def _start(
        self, episode: Episode, outcome: tuple[Any, BaseException | None], tools: list[dict[str, Any]] | None
    ) -> None:
        """Give ``episode`` its prompt from its ``reset`` outcome; a reset that failed (skipped) ends
        it before it starts, with the placeholder prompt."""
        result, error = self._checked(episode.index, episode.env, episode.task, "reset", outcome, -1)
        if error is not None:
            messages, info, tools, episode.done = list(PLACEHOLDER), {"error": error}, None, True
        else:
            messages, info = check_reset_result(episode.env, result)
        episode.messages, episode.info, episode.tools = list(messages), dict(info), tools
        episode.token_ids = self.chat.prompt_ids(messages, tools=tools)
        episode.loss_mask, episode.logprobs = [0] * len(episode.token_ids), [0.0] * len(episode.token_ids)

    def _checked(
        self,
        index: int,
        env: Env,
        task: dict[str, Any],
        method: str,
        outcome: tuple[Any, BaseException | None],
        turn: int,
    ) -> tuple[Any, dict[str, Any] | None]:
        """What ``env.<method>(...)`` (at ``turn``, -1 for ``reset``), made under the guard, came to:
        ``(result, None)``, or ``(None, error)`` when env code raised (an EnvLibraryError included: a
        wrapped library failed) or timed out and ``on_call_error`` is ``skip`` (warned about at the
        end of the rollout: :meth:`_warn_skipped`). Any other AgentRLError (a broken contract)
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
            raise EnvError(
                f"{what}: {detail} (on_call_error=fail; with 'skip' the episode would "
                "end unscored and count in errors/env)"
            ) from exc
        self._skipped.append(
            (
                (turn, index),
                f"env:{type(env).__name__}",
                f"{what}: {detail}; the episode ends "
                "unscored (on_call_error=skip). Later failures of this env are only counted in errors/env",
            )
        )
        return None, {"method": where, "exception": detail, "timed_out": isinstance(exc, CallTimeout)}

    def _sampled(self, episode: Episode, generation: Generation) -> Reply:
        """Append the model's turn to ``episode``; the reply its env answers."""
        ids, logprobs, reason = list(generation.token_ids), list(generation.logprobs), generation.finish_reason
        start = len(episode.token_ids)
        episode.token_ids += ids
        episode.loss_mask += [1] * len(ids)
        episode.logprobs += logprobs
        stopped = reason == "stop"
        assistant = {"role": "assistant", "content": self.chat.assistant_text(ids, stopped)}
        return Reply(
            start, ids, reason, assistant, list(episode.messages), generation.policy_version, generation.token_versions
        )

    def _answered(
        self, episode: Episode, reply: Reply, outcome: tuple[Any, BaseException | None], max_sampled: int
    ) -> None:
        """Append the env's answer to ``reply`` (its ``step`` outcome) to ``episode``, or end it."""
        start, ids, reason, assistant, history = reply.start, reply.ids, reply.reason, reply.assistant, reply.history
        stopped = reason == "stop"
        result, error = self._checked(episode.index, episode.env, episode.task, "step", outcome, len(episode.turns))
        if error is not None:  # the env broke mid-episode: end it here, unscored
            episode.messages.append(assistant)
            episode.turns.append(
                Turn(
                    start=start,
                    end=len(episode.token_ids),
                    finish_reason=reason,
                    policy_version=reply.version,
                    token_versions=reply.token_versions,
                )
            )
            episode.info["error"] = error
            episode.done = True
            return
        new_messages, reward, terminated, truncated, info = check_step_result(episode.env, result)
        episode.messages += [assistant] + list(new_messages)
        episode.info = dict(info)
        episode.turns.append(
            Turn(
                start=start,
                end=len(episode.token_ids),
                reward=float(reward),
                finish_reason=reason,
                tool_calls=int(info.get("tool_calls", 0)),
                tool_errors=int(info.get("tool_errors", 0)),
                policy_version=reply.version,
                token_versions=reply.token_versions,
            )
        )
        if terminated or truncated:
            episode.done, episode.terminated = True, bool(terminated)
            episode.truncated = bool(truncated) or (not stopped)
            self._unseen(episode, list(new_messages))
            return
        delta = (
            []
            if episode.sampled >= max_sampled
            else self.chat.delta_ids(history, ids, assistant, list(new_messages), tools=episode.tools, stopped=stopped)
        )
        if not delta or len(episode.token_ids) + len(delta) >= self.config.max_total_tokens:
            # A token cap ends the episode before the model sees the env's answer.
            episode.done = episode.truncated = True
            self._unseen(episode, list(new_messages))
            return
        episode.token_ids += delta
        episode.loss_mask += [0] * len(delta)
        episode.logprobs += [0.0] * len(delta)

    @staticmethod
    def _unseen(episode: Episode, new_messages: list[dict[str, Any]]) -> None:
        """The episode ended before the model read ``new_messages``: move them from ``messages``
        (which stays exactly what the token ids hold) to ``info["unseen_messages"]``."""
        if new_messages:
            del episode.messages[-len(new_messages) :]
            episode.info["unseen_messages"] = new_messages

    @staticmethod
    def _trajectory(episode: Episode) -> Trajectory:
        trajectory = Trajectory(
            token_ids=episode.token_ids,
            loss_mask=episode.loss_mask,
            sampler_logprobs=episode.logprobs,
            turns=episode.turns,
            messages=episode.messages,
            task=episode.task,
            group=episode.group,
            terminated=episode.terminated,
            truncated=episode.truncated,
            info=episode.info,
            tools=episode.tools,
        )
        trajectory.validate()
        return trajectory


@hookimpl
def agentrl_register_rollouts(register: Any) -> None:
    """Register the built-in ``multi_turn`` rollout."""
    register("multi_turn", MultiTurnRollout)


@hookimpl
def agentrl_register_settings(register: Any) -> None:
    """Register the ``plugins.multi_turn`` section (how its episodes' turns are batched)."""
    register(SECTION, MultiTurnConfig)
