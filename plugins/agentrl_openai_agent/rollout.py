"""The ``openai_agent`` rollout itself: per step, the endpoint up, one agent call per episode, the
records turned into trajectories (the whole story: :mod:`agentrl_openai_agent`)."""

from __future__ import annotations

import threading
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NoReturn

from agentrl import (
    MAX_ABS_REWARD,
    AgentRLError,
    CallGuard,
    ChatTokenizer,
    ConfigError,
    Engine,
    EngineError,
    EnvError,
    GenerationRequest,
    RequestQueue,
    SamplingParams,
    Trajectory,
    build_plugin_config,
    import_extra,
    one_line,
    render_tools_system_prompt,
    request_queue,
    sample_label,
    turn_seed,
)
from agentrl_openai_agent.clock import ModelWaits
from agentrl_openai_agent.config import SECTION, OpenAIAgentConfig, check_agent, load_agent
from agentrl_openai_agent.messages import (
    assistant_message,
    call_format,
    cut_at_stop,
    normalized,
    with_tool_prompt,
)
from agentrl_openai_agent.record import EpisodeRecord, count_calls
from agentrl_openai_agent.scoring import score_with_env
from agentrl_openai_agent.server import BackgroundServer, RequestError, completion_body, make_app
from agentrl_openai_agent.tools import call_opener, resolve_tool_parser_name
from agentrl_openai_agent.workers import RESULTS, AgentLoadError, AgentWorkers, Outcome, TaskNotSent

INSTALL = "the openai_agent rollout needs fastapi, uvicorn and openai: pip install 'agentrl[agents]'"
API_KEY = "agentrl"
"""The API key an episode's client is given."""
PLACEHOLDER = [{"role": "user", "content": ""}]
"""The prompt of an episode whose agent never called the model (so its trajectory still has tokens)."""


@dataclass
class _Step:
    """What one step's episodes share while their agents run: the tasks, seeds and sampling, the
    request queue, each episode's record, lock and waits for the model, and the engine's failures."""

    tasks: list[dict[str, Any]]
    seeds: list[int | None]
    sampling: SamplingParams
    batcher: RequestQueue
    keys: dict[str, int]
    records: list[EpisodeRecord]
    locks: list[threading.Lock]
    waits: ModelWaits
    """Each episode's time waiting for the model (not counted against ``timeout_s``)."""
    engine_errors: list[BaseException] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    """Episodes whose agent returned (no more calls from them)."""


class OpenAIAgentRollout:
    """Runs an OpenAI-client agent program per episode; see the module docstring."""

    def __init__(self, engine: Engine, tokenizer: Any, config: Any) -> None:
        for module in ("fastapi", "uvicorn", "openai"):
            import_extra(module, INSTALL, ConfigError)
        self.engine, self.config = engine, config
        self.chat = ChatTokenizer(tokenizer)
        self.options = build_plugin_config(
            OpenAIAgentConfig, (getattr(config, "plugins", None) or {}).get(SECTION, {}), f"plugins.{SECTION}"
        )
        self.guard = CallGuard(self.options.timeout_s or None, CallGuard.from_config(config).on_error)
        if not self.options.agent:
            raise ConfigError(f"rollout openai_agent needs plugins.{SECTION}.agent: 'path/to/file.py:function'")
        self.agent = load_agent(self.options.agent)
        check_agent(self.options.agent, self.agent)
        self.workers = AgentWorkers(self.options.agent, 0)
        """The worker processes the agent runs in, started by the first :meth:`run`."""
        self.parser_name, self.parser = resolve_tool_parser_name(self.options.tool_parser, tokenizer)
        self.batches: list[int] = []
        """Engine batch sizes of the last :meth:`run`."""

    def run(
        self,
        envs: list[Any],
        tasks: list[dict[str, Any]],
        groups: list[int],
        sampling: SamplingParams,
        seeds: list[int] | None = None,
    ) -> list[Trajectory]:
        """One agent episode per task; returns their trajectories in order (``envs[i]`` scores episode
        i's final answer, ``env_scores``; None: no env score)."""
        if not len(envs) == len(tasks) == len(groups):
            raise EnvError(f"{len(envs)} envs, {len(tasks)} tasks, {len(groups)} groups: must match")
        if seeds is None:
            seeds = [None if sampling.seed is None else sampling.seed * 1_000_003 + i for i in range(len(tasks))]
        check_agent(self.options.agent, self.agent, {k for task in tasks if isinstance(task, dict) for k in task})
        workers = max(1, self.options.max_concurrency or len(tasks))
        try:
            self.workers.grow(workers)
        except AgentLoadError as exc:
            raise ConfigError(f"plugins.{SECTION}.agent={self.options.agent!r} cannot be loaded: {exc}") from None
        step = self._open_step(tasks, seeds, sampling, workers)
        server = BackgroundServer(make_app(lambda key, options: self.complete(step, key, options)))
        try:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="agentrl-agent") as pool:
                outcomes = list(
                    pool.map(lambda item: self._episode(step, server.base_url(item[0]), item[1]), step.keys.items())
                )
        finally:
            server.close()
            step.batcher.close()
            self.batches = list(step.batcher.batches)
        if step.engine_errors:
            self._raise_engine_failure(step.engine_errors[0])
        trajectories = [self._trajectory(step.records[i], tasks[i], groups[i], *outcomes[i]) for i in range(len(tasks))]
        if self.options.env_scores:
            self._score_with_envs(envs, outcomes, trajectories)
        return trajectories

    def _open_step(
        self, tasks: list[dict[str, Any]], seeds: list[int | None], sampling: SamplingParams, workers: int
    ) -> _Step:
        """The step's shared state, its request queue open: a batch waits for the agents running now
        or about to (at most ``workers``), each episode keyed by a fresh name in its base URL."""
        finished: list[int] = []
        batcher = request_queue(
            self.engine, self.options.batch_wait_s, lambda: min(workers, len(tasks) - len(finished))
        )
        return _Step(
            list(tasks),
            list(seeds),
            sampling,
            batcher,
            {f"episode-{i}-{uuid.uuid4().hex[:12]}": i for i in range(len(tasks))},
            [EpisodeRecord() for _ in tasks],
            [threading.Lock() for _ in tasks],
            ModelWaits(len(tasks)),
            finished=finished,
        )

    def _raise_engine_failure(self, exc: BaseException) -> NoReturn:
        """Stop the run with an EngineError naming the engine that failed under an agent's call."""
        kind = getattr(self.engine, "display_name", type(self.engine).__name__)
        raise EngineError(
            f"engine {kind} failed on an agent call: {exc if isinstance(exc, AgentRLError) else one_line(exc)}"
        ) from exc

    def _score_with_envs(
        self, envs: list[Any], outcomes: list[tuple[Any, dict[str, Any] | None]], trajectories: list[Trajectory]
    ) -> None:
        """The run's envs score the final answers of the episodes whose agent returned messages or
        None without failing (``env_scores``: :mod:`agentrl_openai_agent.scoring`)."""
        judged = [
            i
            for i, (result, error) in enumerate(outcomes)
            if error is None and envs[i] is not None and not isinstance(result, (int, float))
        ]
        score_with_env(
            [envs[i] for i in judged],
            [trajectories[i] for i in judged],
            CallGuard.from_config(self.config),
            self.config.env_workers,
        )

    def _episode(self, step: _Step, base_url: str, index: int) -> tuple[Any, dict[str, Any] | None]:
        """Run the agent on task ``index`` in a worker: (what it returned, None) or (None, the error)."""
        spec, task = self.options.agent, step.tasks[index]
        try:
            outcome = self.workers.run(task, base_url, API_KEY, self.guard.timeout_s, lambda: step.waits.waited(index))
        except TaskNotSent as exc:
            raise EnvError(f"{sample_label(index, task)} cannot be sent to the agent's worker process: {exc}") from None
        finally:
            step.finished.append(index)
        if outcome.left:
            self.guard.warn_once(
                f"agent-left:{spec}",
                f"agent {spec} {outcome.left} after {sample_label(index, task)}: its worker process was ended "
                "with everything it started and a fresh one started (each costs a process start)",
            )
        if outcome.error is None:
            return self._checked(outcome, index, task), None
        error = {"method": "agent", "exception": outcome.error, "timed_out": outcome.timed_out}
        if step.engine_errors:  # the engine failed under the agent: run() raises that
            return None, error
        what = f"agent {spec} {'timed out' if outcome.timed_out else 'failed'} on {sample_label(index, task)}"
        if not self.guard.skips:
            raise EnvError(f"{what}: {outcome.error} (on_call_error=fail; with 'skip' the episode would end unscored)")
        self.guard.warn_once(
            f"agent:{spec}", f"{what}: {outcome.error}; the episode ends unscored (on_call_error=skip)"
        )
        return None, error

    def _checked(self, outcome: Outcome, index: int, task: dict[str, Any]) -> Any:
        """What the agent returned, when it is a result (a finite reward within the reward bound,
        messages or None); else EnvError naming the agent and the value."""
        weight = float(getattr(self.config, "env_reward_weight", 1.0))
        invalid = outcome.invalid
        if isinstance(outcome.result, float) and abs(outcome.result * weight) > MAX_ABS_REWARD:
            invalid = f"{outcome.result:g} (weighted rewards must be within ±{MAX_ABS_REWARD:g}: rescale it)"
        if invalid is not None:
            raise EnvError(f"agent {self.options.agent} returned {invalid} on {sample_label(index, task)}: {RESULTS}")
        return outcome.result

    def close(self) -> None:
        """End the agent's worker processes and everything they started (also done at exit)."""
        self.workers.close()

    def complete(self, step: _Step, key: str, options: dict[str, Any]) -> dict[str, Any]:
        """Answer one call of episode ``key``: render, sample, record, build the response body."""
        index = step.keys.get(key)
        if index is None:
            raise RequestError(f"no episode {key!r} on this endpoint: use the base_url the agent was given", 404)
        record = step.records[index]
        with step.locks[index]:
            tools = options["tools"] if options["tool_choice"] != "none" else None
            messages = normalized(options["messages"], record.raw_texts)
            native = bool(options["tools"]) and self.chat.renders_tools
            if options["tools"] and not native:
                messages = with_tool_prompt(
                    messages, render_tools_system_prompt(options["tools"], call_format(self.parser))
                )
            rendered_tools = options["tools"] if native else None
            opener = call_opener(self.parser_name, options["tool_choice"])  # a call's start, prefilled and masked
            rendered = self.chat.render(messages, True, tools=rendered_tools) + opener
            prompt, extends = record.prompt_ids(self.chat, rendered)
            context = (record.segments[-1].token_ids if extends else []) + prompt
            cap = min(
                options["max_tokens"] or step.sampling.max_new_tokens,
                step.sampling.max_new_tokens,
                self.config.max_total_tokens - len(context),
            )
            if cap <= 0:
                raise RequestError(
                    f"the conversation is {len(context)} tokens: it fills max_total_tokens="
                    f"{self.config.max_total_tokens}",
                    param="messages",
                )
            generations = self._generate(step, index, record, context, cap, options["temperature"], options["n"])
            replies = [self._reply(g, options["stop"], opener, tools, record) for g in generations]
            sampled = [
                (ids, logprobs, reason, messages + [{"role": "assistant", "content": text}])
                for ids, logprobs, reason, text, _ in replies
            ]
            counts = [count_calls(text, self.parser, tools) for _, _, _, text, _ in replies]
            if len(sampled) == 1:
                record.add(prompt, extends, *sampled[0], rendered_tools, counts[0])
                turns = [record.segments[-1].turns[-1]]
            else:  # n > 1: the choice the agent continues with is merged, the others are segments of their own
                record.add_choices(prompt, extends, sampled, rendered_tools, counts)
                turns = [alone.turns[-1] for _, alone in record.choices]
            for turn, generation in zip(turns, generations):  # the kept ids are the first ones sampled
                turn.policy_version = generation.policy_version
                if generation.token_versions is not None:
                    turn.token_versions = list(generation.token_versions[: turn.end - turn.start])
        choices = [
            (message, "tool_calls" if message.get("tool_calls") else reason) for _, _, reason, _, message in replies
        ]
        return completion_body(options["model"], choices, len(context), sum(len(reply[0]) for reply in replies))

    def _reply(
        self, generation: Any, stop: list[str], opener: str, tools: list[dict[str, Any]] | None, record: EpisodeRecord
    ) -> tuple[list[int], list[float], str, str, dict[str, Any]]:
        """One choice: its kept ids and logprobs (cut after a ``stop`` string), finish reason, text
        (the prefilled opener first) and OpenAI assistant message."""
        ids, logprobs, reason = generation.token_ids, generation.logprobs, generation.finish_reason
        cut = cut_at_stop(self.chat, ids, stop) if stop else None
        if cut is not None:
            ids, logprobs, reason, text = ids[: cut[0]], logprobs[: cut[0]], "stop", cut[1]
        else:
            text = self.chat.assistant_text(ids, reason == "stop")
        text = opener + text
        return ids, logprobs, reason, text, assistant_message(text, self.parser, tools, record.raw_texts)

    def _generate(
        self,
        step: _Step,
        index: int,
        record: EpisodeRecord,
        context: list[int],
        cap: int,
        temperature: float | None,
        n: int = 1,
    ) -> list[Any]:
        """Sample one call's ``n`` choices through the batcher, choice k with the call's seed mixed
        with k (choice 0: the call's seed); an engine failure is kept for :meth:`run` and answered 500."""
        if temperature is not None and temperature != step.sampling.temperature:
            self.guard.warn_once(
                "agent:temperature",
                f"the agent asked for temperature={temperature} but the run "
                f"trains at temperature={step.sampling.temperature}: its sampler logprobs then differ "
                "from the trainer's; leave temperature out of the agent's calls",
            )
        seed = turn_seed(step.seeds[index], record.calls)
        sampling = SamplingParams(
            max_new_tokens=cap,
            temperature=step.sampling.temperature if temperature is None else temperature,
            top_p=step.sampling.top_p,
            top_k=step.sampling.top_k,
        )
        requests = [
            GenerationRequest(context, sampling, seed=turn_seed(seed, choice), order=index) for choice in range(n)
        ]
        try:
            futures = [step.batcher.submit(request) for request in requests]  # n > 1: sampled in one batch
            with step.waits.waiting(index):
                return [future.result() for future in futures]
        except Exception as exc:
            step.engine_errors.append(exc)
            raise RequestError(f"the engine failed: {one_line(exc)}", 500) from exc

    def _trajectory(
        self, record: EpisodeRecord, task: dict[str, Any], group: int, result: Any, error: dict[str, Any] | None
    ) -> Trajectory:
        """The episode's last segment as its trajectory, the earlier ones in ``segments``."""
        info: dict[str, Any] = {"agent_calls": record.calls, "agent_segments": len(record.segments)}
        if error is not None:
            info["error"] = error
        rows = [
            Trajectory(
                token_ids=s.token_ids,
                loss_mask=s.loss_mask,
                sampler_logprobs=s.logprobs,
                turns=s.turns,
                messages=s.messages,
                task=task,
                group=group,
                terminated=True,
                truncated=s.turns[-1].finish_reason == "length",
                info=dict(info),
                tools=s.tools,
            )
            for s in record.segments
        ]
        if not rows:  # the agent never called the model
            ids = self.chat.prompt_ids(PLACEHOLDER)
            rows = [Trajectory(ids, [0] * len(ids), [0.0] * len(ids), [], list(PLACEHOLDER), task, group, info=info)]
        last = rows[-1]
        last.segments = rows[:-1]
        if isinstance(result, list):  # the agent's final messages (dicts from its worker): what is scored
            last.messages = [dict(m) for m in result]
        elif isinstance(result, (int, float)) and last.turns:
            last.turns[-1].reward = float(result)
        elif isinstance(result, (int, float)):
            warnings.warn(
                f"agent {self.options.agent} returned a reward but never called the model: the episode "
                "has no sampled tokens to credit",
                RuntimeWarning,
                stacklevel=2,
            )
        for row in rows:
            row.validate()
        return last
