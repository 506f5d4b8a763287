"""The ``openai_agent`` rollout itself: per step, the endpoint up, one agent call per episode, the
records turned into trajectories (the whole story: :mod:`agentrl_openai_agent`)."""

from __future__ import annotations

import functools
import os
import sys
import warnings
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn

from agentrl import (
    AgentRLError,
    CallGuard,
    ChatTokenizer,
    ConfigError,
    Engine,
    EngineError,
    EnvError,
    GenerationRequest,
    SamplingParams,
    Trajectory,
    build_plugin_config,
    import_extra,
    one_line,
    ray_options,
    render_tools_system_prompt,
    sample_here,
    sample_label,
    turn_seed,
)
from agentrl_openai_agent.calls import CallLog, rebuilt
from agentrl_openai_agent.config import DEFAULT_WORKERS, SECTION, OpenAIAgentConfig, check_agent, load_agent
from agentrl_openai_agent.messages import (
    assistant_message,
    call_format,
    check_roles,
    cut_at_stop,
    normalized,
    render,
    with_tool_prompt,
)
from agentrl_openai_agent.record import EpisodeRecord, count_calls
from agentrl_openai_agent.remote import RemoteAgentWorkers, WorkerLost
from agentrl_openai_agent.scoring import score_with_env, with_final_answer, with_final_messages
from agentrl_openai_agent.server import (
    RequestError,
    caller_episode,
    completion_body,
    make_app,
    run_secret,
)
from agentrl_openai_agent.serving import open_endpoint
from agentrl_openai_agent.signature import call_shown
from agentrl_openai_agent.step import Step, open_step
from agentrl_openai_agent.tools import call_opener, resolve_tool_parser_name
from agentrl_openai_agent.workers import RESULTS, AgentLoadError, AgentWorkers, TaskNotSent

INSTALL = "the openai_agent rollout needs fastapi, uvicorn and openai: pip install 'agentrl[agents]'"
PLACEHOLDER = [{"role": "user", "content": ""}]
"""The prompt of an episode whose agent never called the model (so its trajectory still has tokens)."""


class OpenAIAgentRollout:
    """Runs an OpenAI-client agent program per episode; see the module docstring."""

    places_env_workers = True
    """On a Ray cluster (``ray.env_workers``) the agent programs run in this rollout's own worker
    actors (:mod:`agentrl_openai_agent.remote`); the env's methods stay in the trainer process."""

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
        check_agent(self.options.agent, self.agent, None, self.options.task_field)
        self.call: dict[str, Any] | None = None
        """How the agent is called (:func:`agentrl_openai_agent.signature.agent_call` and the values it
        is given), decided at the first :meth:`run`, when the tasks' fields are known."""
        ray = ray_options(getattr(config, "ray", None))
        self.workers: AgentWorkers | RemoteAgentWorkers = (
            RemoteAgentWorkers(
                self.options.agent,
                ray,
                max(1, ray.env_workers // int(os.environ.get("WORLD_SIZE", "1"))),
                self.options.max_concurrency or DEFAULT_WORKERS,
            )
            if ray is not None and ray.env_workers
            else AgentWorkers(self.options.agent, 0)
        )
        """The worker processes the agent runs in (here, or in Ray actors: :mod:`agentrl_openai_agent.remote`),
        started by the first :meth:`run`."""
        self.secret = run_secret()
        """The run's secret, the first part of every endpoint URL (:mod:`agentrl_openai_agent.server`)."""
        self.reached = False
        """Whether remote workers have checked they reach the endpoint (before the first step)."""
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
        self._plan_call(envs, tasks)
        workers = max(1, self.options.max_concurrency or min(len(tasks), DEFAULT_WORKERS))
        try:
            self.workers.grow(workers)
        except AgentLoadError as exc:
            raise ConfigError(f"plugins.{SECTION}.agent={self.options.agent!r} cannot be loaded: {exc}") from None
        step = open_step(self.engine, self.options.batch_wait_s, tasks, seeds, sampling, workers)
        app = make_app(
            lambda key, options: self.complete(step, key, options),
            step.refused,
            self.secret,
            str(getattr(self.config, "model", "agentrl")),
        )
        server = open_endpoint(app, self.options, self.workers, self.guard.warn_once, not self.reached)
        self.reached = True

        def agents() -> list[Any]:
            try:
                with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="agentrl-agent") as pool:
                    items = list(step.keys.items())  # (URL key, episode), taken before any episode runs again
                    return list(pool.map(lambda item: self._episode(step, server.base_url, *item), items))
            finally:
                server.close()
                step.batcher.close()

        try:
            outcomes = sample_here(step.batcher, agents)  # the engine in this (the trainer's) thread
        finally:
            self.batches = list(step.batcher.batches)
        if step.engine_errors:
            self._raise_engine_failure(step.engine_errors[0])
        trajectories = [self._trajectory(step.records[i], tasks[i], groups[i], *outcomes[i]) for i in range(len(tasks))]
        if self.options.env_scores:
            self._score_with_envs(envs, outcomes, trajectories)
        self._warn_rebuilt([record.log for record in step.records])
        return trajectories

    def _warn_rebuilt(self, logs: list[CallLog]) -> None:
        """Warn once per run when the agent rebuilds its history (:func:`agentrl_openai_agent.calls.rebuilt`)."""
        found = rebuilt(logs)
        if found is not None:
            mean, cuts, later = found
            self.guard.warn_once(
                f"agent-rebuilt:{self.options.agent}",
                f"agent {self.options.agent} rewrites its message history: {cuts} of its {later} calls after an "
                f"episode's first began a new segment on a changed history ({mean:.1f} segments per episode); "
                "each segment re-encodes its whole prompt and trains as a row of its own (slower, more memory). "
                "Append each reply and tool result to the message list the agent sends instead of rebuilding it "
                "(agents in the smolagents style rebuild it on every call); each episode's calls and why each "
                "segment began are in the run's completions.jsonl (calls, cut)",
            )

    def _plan_call(self, envs: list[Any], tasks: list[dict[str, Any]]) -> None:
        """At the first step, decide how the agent is called from its signature and the tasks'
        fields (ConfigError with the fix when it cannot be: :mod:`agentrl_openai_agent.signature`),
        say it once, and give it to the workers; at every step, check each task has the field the
        agent's first parameter takes."""
        spec = self.options.agent
        if self.call is None:
            turns = self.options.max_turns or next((getattr(e, "max_turns", None) for e in envs if e is not None), None)
            values = {"model": str(getattr(self.config, "model", "agentrl")), "max_turns": turns}
            values = {name: value for name, value in values.items() if value is not None}
            fields = {k for task in tasks if isinstance(task, Mapping) for k in task}
            plan = check_agent(
                spec, self.agent, fields, self.options.task_field, ("base_url", "client", "api_key", *values)
            )
            self.call = {**plan, "values": values}
            self.workers.call = self.call
            print(f"openai_agent: calling {call_shown(spec, self.call)}", file=sys.stderr, flush=True)
        field = self.call["field"]
        for index, task in enumerate(tasks if field is not None else ()):
            if not isinstance(task, Mapping) or field not in task:
                raise EnvError(
                    f"{sample_label(index, task)} has no {field!r} field, which agent {spec}'s first parameter takes "
                    f"(plugins.{SECTION}.task_field names another, or name the parameter task for the whole dict)"
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
        """The run's envs score the final answers of the episodes whose agent returned a str,
        messages or None without failing (``env_scores``: :mod:`agentrl_openai_agent.scoring`)."""
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

    def _episode(self, step: Step, url_of: Any, key: str, index: int) -> tuple[Any, dict[str, Any] | None]:
        """Run the agent on task ``index`` in a worker (``url_of(key)``: the base URL of its URL key
        ``key``): (what it returned, None) or (None, the error). An episode whose remote worker
        died is run again from the start, with fresh credentials (:meth:`Step.again`)."""
        spec, task = self.options.agent, step.tasks[index]
        try:
            waited, returned = (
                functools.partial(step.waits.waited, index),
                functools.partial(step.finished.append, index),
            )
            while True:
                try:
                    outcome = self.workers.run(
                        task, url_of(key), step.api_keys[index], self.guard.timeout_s, waited, returned
                    )
                    break
                except WorkerLost:
                    key = step.again(index, key)
        except TaskNotSent as exc:
            raise EnvError(f"{sample_label(index, task)} cannot be sent to the agent's worker process: {exc}") from None
        finally:
            if index not in step.finished:  # said already when the agent function returned
                step.finished.append(index)
        if outcome.left:
            self.guard.warn_once(
                f"agent-left:{spec}",
                f"agent {spec} {outcome.left} after {sample_label(index, task)}: its worker process was ended "
                "with everything it started and a fresh one started (each costs a process start)",
            )
        if outcome.error is None:
            invalid = outcome.problem(float(getattr(self.config, "env_reward_weight", 1.0)))
            if invalid is not None:
                raise EnvError(f"agent {spec} returned {invalid} on {sample_label(index, task)}: {RESULTS}")
            return outcome.result, None
        error = {"method": f"agent {spec}", "exception": outcome.error, "timed_out": outcome.timed_out}
        if step.engine_errors:  # the engine failed under the agent: run() raises that
            return None, error
        what = f"agent {spec} {'timed out' if outcome.timed_out else 'failed'} on {sample_label(index, task)}"
        if not self.guard.skips:
            raise EnvError(f"{what}: {outcome.error} (on_call_error=fail; with 'skip' the episode would end unscored)")
        self.guard.warn_once(
            f"agent:{spec}", f"{what}: {outcome.error}; the episode ends unscored (on_call_error=skip)"
        )
        return None, error

    def counts(self) -> dict[str, float]:
        """Remote agent worker restarts and episodes run again since the last call (``faults/*``)."""
        return self.workers.counts() if isinstance(self.workers, RemoteAgentWorkers) else {}

    def close(self) -> None:
        """End the agent's worker processes and everything they started (also done at exit)."""
        self.workers.close()

    def complete(self, step: Step, key: str, options: dict[str, Any]) -> dict[str, Any]:
        """Answer one call of episode ``key``: render, sample, record, build the response body. A
        call its URL may not take (:func:`agentrl_openai_agent.server.caller_episode`) is refused,
        and so is one whose episode finished while it was sampled: nothing of it is recorded."""
        index = caller_episode(step.keys, step.api_keys, step.finished, key, options.get("api_key"))
        check_roles(options["messages"], self.chat)
        record = step.records[index]
        with step.locks[index]:
            tools = options["tools"] if options["tool_choice"] != "none" else None
            messages, rendered, rendered_tools, opener = self._render(options, record)
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
            generations = self._generate(step, index, record, context, cap, options)
            caller_episode(step.keys, step.api_keys, step.finished, key, None)  # finished meanwhile: 410
            replies = [self._reply(g, options["stop"], opener, tools, record) for g in generations]
            sampled = [
                (ids, logprobs, reason, messages + [{"role": "assistant", "content": text}])
                for ids, logprobs, reason, text, _ in replies
            ]
            counts = [count_calls(text, self.parser, tools) for _, _, _, text, _ in replies]
            record.add_call(prompt, extends, sampled, rendered_tools, counts, generations)
            tokens = (len(context), sum(len(reply[0]) for reply in replies))
            record.log.add(options["messages"], options["tools"], extends, [r[4] for r in replies], tokens)
        choices = [
            (message, "tool_calls" if message.get("tool_calls") else reason) for _, _, reason, _, message in replies
        ]
        return completion_body(options["model"], choices, *tokens)

    def _render(
        self, options: dict[str, Any], record: EpisodeRecord
    ) -> tuple[list[dict[str, Any]], str, list[dict[str, Any]] | None, str]:
        """The call's conversation as rendered, its prompt text (the ``tool_choice`` prefill
        last), the tools the template rendered (None: described in the system message) and the prefill."""
        messages = normalized(options["messages"], record.raw_texts)
        native = bool(options["tools"]) and self.chat.renders_tools
        if options["tools"] and not native:
            messages = with_tool_prompt(
                messages, render_tools_system_prompt(options["tools"], call_format(self.parser))
            )
        rendered_tools = options["tools"] if native else None
        opener = call_opener(self.parser_name, options["tool_choice"])  # a call's start, prefilled and masked
        return messages, render(self.chat, messages, rendered_tools) + opener, rendered_tools, opener

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
        step: Step,
        index: int,
        record: EpisodeRecord,
        context: list[int],
        cap: int,
        options: dict[str, Any],
    ) -> list[Any]:
        """Sample one call's ``n`` choices through the batcher, choice k with the call's seed mixed
        with k (choice 0: the call's seed); an engine failure is kept for :meth:`run` and answered 500."""
        asked = {name: options.get(name) for name in ("temperature", "top_p")}
        for name, value in asked.items():
            if value is not None and value != getattr(step.sampling, name):
                self.guard.warn_once(
                    f"agent:{name}",
                    f"the agent asked for {name}={value} but the run trains at {name}="
                    f"{getattr(step.sampling, name)}: its sampler logprobs then differ from the trainer's; "
                    f"leave {name} out of the agent's calls",
                )
        seed = turn_seed(step.seeds[index], record.calls)
        sampling = SamplingParams(
            max_new_tokens=cap,
            temperature=step.sampling.temperature if asked["temperature"] is None else asked["temperature"],
            top_p=step.sampling.top_p if asked["top_p"] is None else asked["top_p"],
            top_k=step.sampling.top_k,
        )
        requests = [
            GenerationRequest(context, sampling, seed=turn_seed(seed, choice), order=index)
            for choice in range(options["n"])
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
        info: dict[str, Any] = {
            "agent_calls": record.calls,
            "agent_segments": len(record.segments),
            "metrics": record.metrics(),
        }
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
        last.info["calls"] = record.log.calls
        if isinstance(result, list):  # the agent's final messages (dicts from its worker): what is scored
            last.messages = with_final_messages(last.messages, [dict(m) for m in result])
        elif isinstance(result, str):  # its final answer: scored as the last assistant message
            last.messages = with_final_answer(last.messages, result)
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
