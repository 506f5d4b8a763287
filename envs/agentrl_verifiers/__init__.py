"""``verifiers``: environments written for the verifiers library (its classic API) as multi-turn envs.

    agentrl train --env verifiers --set env_args.env_id=my_env --set env_args.env_kwargs.difficulty=easy

``env_id`` names an installed verifiers environment: a module with ``load_environment(**kwargs)``
returning a ``verifiers.Environment`` (``SingleTurnEnv``, ``MultiTurnEnv``, ``ToolEnv``...), loaded
with ``verifiers.load_environment(env_id, **env_kwargs)`` exactly as ``vf-eval`` loads it.

verifiers owns the rollout loop: ``env.run_rollout(row, client, ...)`` runs the conversation and asks
its client for every model reply. Here that loop is turned inside out. ``reset`` starts verifiers' own
``run_rollout`` for the task (a dataset row) as a task on a private event loop, with a client whose
``get_native_response`` hands the messages it is asked with to agentrl and waits; the loop runs
only until that request (or the rollout's end), so the request's messages are ``reset``'s
observation. ``step(text)`` answers the pending request with ``text`` (verifiers records it as the
assistant message) and runs the loop until the next request: the messages verifiers appended after
that assistant message (its ``env_response``: user or tool messages) are ``step``'s observation.
When the rollout ends instead, verifiers has scored it with the env's rubric: that reward ends the
episode, with the rubric's per-function scores in ``info["metrics"]`` and ``info["success"]`` meaning
reward >= the env's ``pass_threshold``. agentrl's engine samples every turn and keeps its own token
ids; verifiers only ever sees text (its ``sampling_args`` are not used). A prompt must only grow
between turns (each request = the previous one + the reply + new messages): an env that rewrites
earlier messages is refused with EnvError, since the sampled tokens could no longer match it.

Tasks are the env's dataset rows (``prompt``, ``answer``, ``info``, ``example_id``...). The held-out
split is the env's ``eval_dataset`` (its first ``num_eval`` rows) if it has one; else ``num_eval``
rows (at most half the dataset) are drawn with a fixed seed and held out of training.

Supported: chat-format envs (``message_type="chat"``) with text content and rubrics of individual
reward functions. ``ToolEnv``: the tools are described in the system message (unless the chat
template renders ``tools=``) and the model's calls are read with ``env_args.tool_parser`` (a registered
parser: ``xml_json``, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, by default;
``llama3_json``, ``mistral``, ``qwen3_coder``, ``harmony`` or another plugin's; the description's
example call is written in its syntax) into verifiers tool calls; verifiers runs the tools.
``max_turns`` is the env's own (10 where it sets none) and is set on the verifiers env, so verifiers itself ends and
scores an episode at the limit. Errors verifiers records on a rollout (``vf.Error``: a tool that failed with a
stop error...) are data, as in verifiers: the episode ends, scored, with ``info["error"]``; an
exception escaping verifiers raises EnvError naming verifiers and the env id. Refused with a clear
error: the completion format, images/audio in messages, group-level reward functions (agentrl
scores each episode on its own), prompts that rewrite history.

Versions: verifiers 0.2.x has the classic API at ``verifiers.*``; 0.3.x keeps it (under
``verifiers.legacy``, aliased at the old paths); 0.4.0 removed it (only ``verifiers.v1``, whose
tasksets run agent programs that talk to an OpenAI-compatible HTTP endpoint), so the extra pins
``verifiers>=0.2,<0.4`` and 0.4 is refused with that reason (docs/guides/agents.md shows a 0.4 taskset
run through the ``openai_agent`` rollout instead). verifiers is imported when the env is
built, so this plugin loads without it (install it with ``pip install 'agentrl[verifiers]'``).
The verifiers env is loaded once per process for the same arguments and shared by every agentrl env
instance (verifiers runs concurrent rollouts on one env too); loading one installs verifiers'
SIGINT/SIGTERM handlers, and the adapter puts the host's back. Rollouts left unfinished (an episode
reset, closed or garbage-collected before its end, or cut short by agentrl's token limits, which
leaves it unscored) are cancelled; no thread is started per episode: verifiers' own ``to_thread`` calls
(one per model reply) run on the private loop's pool of at most ``EXECUTOR_THREADS`` threads named
``agentrl_verifiers``, reused for the life of the process and shut down at exit.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import copy
import functools
import importlib.util
import json
import math
import signal
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
from pydantic import Field

from agentrl import (
    ROLES,
    Allowed,
    Complaint,
    ConfigError,
    Env,
    EnvError,
    LazyTasks,
    Message,
    Task,
    ToolCallFormat,
    check_declared,
    describe,
    hookimpl,
    import_extra,
    one_line,
    parse_xml_json,
    render_tools_system_prompt,
    type_arguments,
)

Parser = Callable[[str], list[Any]]
"""A tool-call parser (``agentrl.tools.tool.ToolParser``): an assistant message's text -> its calls."""
DEFAULT_MAX_TURNS = 10
"""Turn limit for envs that set none (MultiTurnEnv's default, -1, means unlimited)."""
MODEL_NAME = "agentrl"
"""The model name verifiers records (agentrl's engine samples; verifiers never calls a model)."""
SPLIT_SEED = 0
"""Seed of the held-out draw when the env has no eval_dataset."""
INSTALL_HINT = "--env verifiers needs the verifiers package (0.2 or 0.3): pip install 'agentrl[verifiers]'"


def import_verifiers() -> Any:
    """The ``verifiers`` module with its classic API, or EnvError naming the extra that installs it."""
    verifiers = import_extra("verifiers", INSTALL_HINT)
    version = str(getattr(verifiers, "__version__", "?"))
    try:
        for name in ("load_environment", "Environment", "Client"):  # lazy attributes: import them now
            getattr(verifiers, name)
        import verifiers.types  # noqa: F401
    except (AttributeError, ImportError) as exc:
        if not version.startswith(("0.2.", "0.3.")):
            raise EnvError(
                f"verifiers {version} has no classic API (load_environment, Environment, Client; "
                "0.4 removed it): pip install 'agentrl[verifiers]' (verifiers>=0.2,<0.4)"
            ) from exc
        cause = exc.__cause__ if isinstance(exc.__cause__, Exception) else exc  # 0.2 wraps a missing dependency
        raise EnvError(f"verifiers {version}: its classic API failed to import: {one_line(cause, limit=300)}") from exc
    return verifiers


# -- the private event loop ------------------------------------------------------------------------
# One loop for every verifiers rollout in the process, as in verifiers' own generate(): it runs only
# inside reset/step, until the episode being stepped asks for its next reply or ends; every other
# episode stays parked on its pending request meanwhile.
_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()
EXECUTOR_THREADS = 4
"""The most threads the private loop's default executor (verifiers' ``asyncio.to_thread``) starts."""


def _private_loop() -> asyncio.AbstractEventLoop:
    global _loop
    if _loop is None or _loop.is_closed():
        _loop = asyncio.new_event_loop()
        _loop.set_default_executor(
            concurrent.futures.ThreadPoolExecutor(max_workers=EXECUTOR_THREADS, thread_name_prefix="agentrl_verifiers")
        )
        atexit.register(_close_loop, _loop)
    return _loop


def _run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run the private loop until ``coroutine`` is done: in this thread, or in a worker thread when
    this thread is already running an event loop (a notebook, an async caller)."""
    loop = _private_loop()

    def run() -> Any:
        with _loop_lock:
            return loop.run_until_complete(coroutine)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(run).result()


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """At exit: cancel the rollouts still parked (their cleanup handlers run), then close the loop."""

    async def cancel_all() -> None:
        pending = asyncio.all_tasks() - {asyncio.current_task()}
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await asyncio.get_running_loop().shutdown_default_executor()

    if not (loop.is_closed() or loop.is_running()):
        loop.run_until_complete(cancel_all())
        loop.close()


# -- one rollout, paused at each model request -----------------------------------------------------
class _Rollout:
    """verifiers' ``run_rollout`` for one row, on the private loop, paused whenever it asks for a reply."""

    def __init__(self, vf_env: Any, client_class: type, row: Task, parser: Parser = parse_xml_json) -> None:
        self.vf_env, self.row, self.parser = vf_env, row, parser
        self.client = client_class(self)  # the client parks its requests here (as its ``client``)
        self.task: asyncio.Task | None = None
        self.request: asyncio.Future | None = None
        self.reply: asyncio.Future | None = None
        self.problem: str | None = None

    def ask(self, prompt: Any, parse_tools: bool, reply: asyncio.Future) -> None:
        """Called by the client: park verifiers' request for a reply until ``advance`` answers it."""
        if self.request is None or self.request.done():
            self.problem = "verifiers asked for two model replies at once (agentrl answers one at a time)"
            raise RuntimeError(self.problem)
        self.request.set_result((prompt, parse_tools))
        self.reply = reply

    def advance(self, text: str | None) -> tuple[str, Any]:
        """Answer the pending request with ``text`` (None: start the rollout) and run until the next
        request, ``("request", (messages, parse_tools))``, or the end, ``("done", RolloutOutput)``."""

        async def until_next_event() -> None:
            self.request = asyncio.get_running_loop().create_future()
            if self.task is None:
                sampling_args = copy.deepcopy(getattr(self.vf_env, "sampling_args", None) or {})
                self.task = asyncio.ensure_future(
                    self.vf_env.run_rollout(self.row, self.client, MODEL_NAME, sampling_args)
                )
            elif self.reply is not None:
                self.reply.set_result(text)
            await asyncio.wait({self.task, self.request}, return_when=asyncio.FIRST_COMPLETED)

        _run(until_next_event())
        if self.problem is not None:
            raise EnvError(self.problem)
        if self.request is not None and self.request.done():
            return "request", self.request.result()
        return "done", self.task.result() if self.task is not None else None

    def cancel(self) -> None:
        """Cancel the rollout if it is still parked (verifiers' cleanup handlers run)."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
            _run(asyncio.wait({self.task}))


def _cancel_soon(rollout: _Rollout) -> None:
    """Finalizer of a garbage-collected env: cancel its parked rollout the next time the loop runs."""
    task = rollout.task
    if task is not None and not task.done() and _loop is not None and not _loop.is_closed():
        _loop.call_soon_threadsafe(task.cancel)


@functools.cache
def _client_class(vf: Any) -> type:
    """A ``verifiers.Client`` whose model is agentrl: each request is parked on the ``_Rollout``
    (passed as the client's ``client``) and answered with the text agentrl's engine sampled."""
    types = vf.types

    class AgentRLClient(vf.Client):
        """Hands verifiers' requests to agentrl and returns its replies as assistant messages."""

        def setup_client(self, config: Any) -> Any:
            raise EnvError("the agentrl client answers from agentrl's engine; it takes no ClientConfig")

        async def to_native_tool(self, tool: Any) -> Any:
            return tool

        async def to_native_prompt(self, messages: Any) -> tuple[Any, dict]:
            return messages, {}

        async def get_native_response(
            self, prompt: Any, model: str, sampling_args: Any, tools: list[Any] | None = None, **kwargs: Any
        ) -> Any:
            reply = asyncio.get_running_loop().create_future()
            self.client.ask(prompt, bool(tools), reply)
            schemas = {getattr(t, "name", None): getattr(t, "parameters", None) or {} for t in tools or []}
            return await reply, (self.client.parser, schemas) if tools else None

        async def raise_from_native_response(self, response: Any) -> None:
            return None

        async def from_native_response(self, response: Any) -> Any:
            text, parsing = response
            calls = [
                types.ToolCall(id=f"call_{uuid.uuid4().hex[:12]}", name=call.name, arguments=arguments)
                for call, arguments in (_read_calls(text, *parsing) if parsing else [])
            ]
            message = types.ResponseMessage(
                content=text,
                tool_calls=calls or None,
                is_truncated=False,
                finish_reason="tool_calls" if calls else "stop",
            )
            return types.Response(
                id=f"agentrl-{uuid.uuid4().hex}",
                created=int(time.time()),
                model=MODEL_NAME,
                usage=None,
                message=message,
            )

        async def close(self) -> None:
            return None

    return AgentRLClient


def _read_calls(text: str, parser: Parser, schemas: dict[str, Any]) -> list[tuple[Any, str]]:
    """(call, its arguments as verifiers takes them: JSON text, or the raw call when malformed) for
    each call ``parser`` reads; a text-valued format's values typed by the tool's schema."""
    calls = []
    for call in parser(text):
        arguments = call.arguments
        if arguments is not None and call.text_values and call.name in schemas:
            arguments = type_arguments(arguments, schemas[call.name])
        calls.append((call, call.raw if arguments is None else json.dumps(arguments)))
    return calls


# -- loading ----------------------------------------------------------------------------------------
_loaded: dict[tuple[str, str, int | None], Any] = {}


def _load(vf: Any, env_id: str, env_kwargs: dict[str, Any], max_turns: int | None) -> Any:
    """``verifiers.load_environment(env_id, **env_kwargs)``, once per process for the same arguments
    (the trainer builds one agentrl env per episode slot; they share the verifiers env, as
    verifiers' own concurrent rollouts do), with the host's signal handlers put back."""
    key = (env_id, json.dumps(env_kwargs, sort_keys=True, default=repr), max_turns)
    if key in _loaded:
        return _loaded[key]
    from verifiers.utils.env_utils import env_module_name

    module = env_module_name(env_id)
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ConfigError(
            f"verifiers: env_id {env_id!r} names no importable module {module!r}; install the "
            "environment's package (or put its module on sys.path) so that "
            f"verifiers.load_environment({env_id!r}) can import it"
        )
    main = threading.current_thread() is threading.main_thread()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        vf_env = vf.load_environment(env_id, **env_kwargs)
    except Exception as exc:
        cause = exc.__cause__ if isinstance(exc.__cause__, Exception) else exc
        raise EnvError(f"verifiers env {env_id!r} failed to load: {one_line(cause, limit=300)}") from exc
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    if not isinstance(vf_env, vf.Environment):
        raise EnvError(
            f"verifiers env {env_id!r}: load_environment() returned {describe(vf_env)}, not a verifiers.Environment"
        )
    if max_turns is not None and hasattr(vf_env, "max_turns"):
        vf_env.max_turns = max_turns
    elif isinstance(getattr(vf_env, "max_turns", None), int) and vf_env.max_turns <= 0:
        vf_env.max_turns = DEFAULT_MAX_TURNS  # verifiers then ends (and scores) the episode at the limit
    _loaded[key] = vf_env
    return vf_env


class _Rows(LazyTasks):
    """Rows of a verifiers dataset (a ``datasets.Dataset``) as agentrl tasks, by index."""

    def __init__(self, dataset: Any, indices: Sequence[int]) -> None:
        super().__init__(len(indices))
        self.dataset, self.indices = dataset, [int(i) for i in indices]

    def make(self, index: int) -> Task:
        """Dataset row ``indices[index]`` as a dict."""
        return dict(self.dataset[self.indices[index]])


def _text(message: Any, env_id: str) -> Message:
    """A verifiers message (pydantic or dict) as an agentrl message: role and text content only."""
    data = message.model_dump() if hasattr(message, "model_dump") else dict(message)
    role, content = data.get("role"), data.get("content")
    if isinstance(content, list):
        parts = [p.model_dump() if hasattr(p, "model_dump") else dict(p) for p in content]
        if any(p.get("type") != "text" for p in parts):
            kinds = sorted({str(p.get("type")) for p in parts} - {"text"})
            raise EnvError(
                f"verifiers env {env_id!r}: a {role} message holds {', '.join(kinds)} content; only text is supported"
            )
        content = "".join(str(p.get("text", "")) for p in parts)
    if role not in ROLES:
        raise EnvError(
            f"verifiers env {env_id!r}: a message has role {role!r}; allowed: {', '.join(ROLES)} "
            "(only the chat format is supported, not completion prompts)"
        )
    return {"role": role, "content": "" if content is None else str(content)}


def _group_reward_names(rubric: Any) -> list[str]:
    """Names of the group-level reward functions in ``rubric`` (a RubricGroup's rubrics included)."""
    if hasattr(rubric, "rubrics"):
        return [name for inner in rubric.rubrics for name in _group_reward_names(inner)]
    return [getattr(f, "__name__", repr(f)) for f in getattr(rubric, "funcs", []) if rubric._is_group_func(f)]


@dataclass(frozen=True)
class VerifiersArgs:
    """The ``verifiers`` env's ``env_args`` (see :class:`VerifiersEnv`), each checked against its
    declared rule when made: a bad one is a one-line ConfigError ``verifiers: KEY must be ..., got VALUE``."""

    env_id: Annotated[
        str,
        Field(min_length=1),
        Complaint(
            "env_args.{key} must name an installed verifiers environment (a module with load_environment()), "
            "got {value!r}"
        ),
    ]
    env_kwargs: Annotated[dict[Any, Any] | None, Allowed("a mapping of keyword arguments")]
    num_eval: Annotated[int, Field(ge=1), Allowed("an int >= 1")]
    max_turns: Annotated[Annotated[int, Field(ge=1)] | None, Allowed("an int >= 1")]
    tool_parser: Annotated[Callable[..., Any], Allowed("a registered parser name")]

    def __post_init__(self) -> None:
        """Raise ConfigError naming the first bad argument, its value and what is allowed."""
        check_declared(self, prefix="verifiers: ")


class VerifiersEnv(Env):
    """A verifiers environment driven turn by turn, its own rollout and rubric included (see the
    module docstring).

    Args:
        env_id: an installed verifiers environment (a module with ``load_environment``).
        env_kwargs: keyword arguments for its ``load_environment``.
        num_eval: held-out rows for ``agentrl eval``.
        max_turns: the episode's turn limit (default: the env's own, else 10); set on the verifiers
            env too, so verifiers ends and scores the episode there.
        tool_parser: reads the model's tool calls (``env_args.tool_parser`` names a registered one;
            ``make_env`` passes the parser itself).
    """

    concurrent_safe = False
    """Every episode runs on the one private event loop, one call at a time (its lock): calls are
    made one after another, in episode order, as verifiers' environments may draw from shared state."""

    def __init__(
        self,
        env_id: str | None = None,
        env_kwargs: dict[str, Any] | None = None,
        num_eval: int = 64,
        max_turns: int | None = None,
        tool_parser: Parser = parse_xml_json,
    ) -> None:
        super().__init__()
        vf = import_verifiers()
        VerifiersArgs(
            env_id=env_id, env_kwargs=env_kwargs, num_eval=num_eval, max_turns=max_turns, tool_parser=tool_parser
        )
        self.tool_parser = tool_parser
        self.env_id, self.env_kwargs = env_id, dict(env_kwargs or {})
        self.vf_env = _load(vf, env_id, self.env_kwargs, max_turns)
        self._client_class = _client_class(vf)
        self._check_supported()
        own = getattr(self.vf_env, "max_turns", None)
        self.max_turns = max_turns or (own if isinstance(own, int) and own > 0 else DEFAULT_MAX_TURNS)
        self._train, self._eval = self._splits(num_eval)
        self._rollout: _Rollout | None = None
        self._finalizer: weakref.finalize | None = None
        self._request: list[Message] = []

    def _check_supported(self) -> None:
        """Refuse what agentrl cannot drive: the completion format, group-level reward functions."""
        message_type = getattr(self.vf_env, "message_type", "chat")
        if message_type != "chat":
            raise EnvError(
                f"verifiers env {self.env_id!r} uses message_type={message_type!r}; only the chat format is supported"
            )
        if getattr(self.vf_env, "requires_group_rollouts", False):
            names = _group_reward_names(self.vf_env.rubric)
            raise EnvError(
                f"verifiers env {self.env_id!r}: its rubric has group-level reward functions "
                f"({', '.join(names)}); agentrl scores each episode on its own, so only individual "
                "reward functions are supported"
            )

    def _splits(self, num_eval: int) -> tuple[_Rows, _Rows]:
        """(train, held-out): the whole dataset and the eval_dataset's first rows, or a seeded held-out draw."""
        try:
            train, held_out = self.vf_env.build_dataset(), self.vf_env.build_eval_dataset()
        except Exception as exc:
            raise EnvError(
                f"verifiers env {self.env_id!r} failed to build its dataset: {one_line(exc, limit=300)}"
            ) from exc
        if train is None or len(train) == 0:
            raise EnvError(
                f"verifiers env {self.env_id!r} has no training dataset (only an eval_dataset, or an "
                "empty one); agentrl trains on its dataset rows"
            )
        if held_out is not None:
            return _Rows(train, range(len(train))), _Rows(held_out, range(min(num_eval, len(held_out))))
        order = np.random.default_rng(SPLIT_SEED).permutation(len(train))
        cut = min(num_eval, len(train) // 2)
        return _Rows(train, sorted(order[cut:])), _Rows(train, sorted(order[:cut]))

    def train_tasks(self) -> Sequence[Task]:
        """The dataset's rows (less the held-out ones when the env has no eval_dataset)."""
        return self._train

    def eval_tasks(self) -> Sequence[Task]:
        """The eval_dataset's first ``num_eval`` rows, or ``num_eval`` rows held out of the dataset."""
        return self._eval

    def gold_reply(self, task: Task) -> str | None:
        """None: what a verifiers rubric pays for depends on its parser and reward functions."""
        return None

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The verifiers env's tools (``tool_defs``) as OpenAI function schemas."""
        return [
            {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
            for t in getattr(self.vf_env, "tool_defs", None) or []
        ]

    def start(self, task: Task) -> list[Message]:
        """Start verifiers' rollout on ``task`` (a dataset row); the messages of its first request."""
        self._abandon()
        if not isinstance(task.get("prompt"), list):
            raise EnvError(
                f"verifiers env {self.env_id!r}: a task must be a dataset row whose 'prompt' is a list "
                f"of chat messages (only the chat format is supported); got {describe(task)}"
            )
        self._rollout = _Rollout(self.vf_env, self._client_class, copy.deepcopy(task), self.tool_parser)
        self._finalizer = weakref.finalize(self, _cancel_soon, self._rollout)
        kind, value = self._advance(self._rollout, None)
        if kind == "done":
            error = (value or {}).get("error")
            self._abandon()
            raise EnvError(
                f"verifiers env {self.env_id!r} ended the rollout before asking the model for a reply"
                + (f" ({error!r})" if error else "")
            )
        self._request = [_text(m, self.env_id) for m in value[0]]
        messages = [dict(m) for m in self._request]
        schemas = self.tool_schemas()
        if schemas and not self.template_renders_tools:
            description = render_tools_system_prompt(
                schemas, self.tool_parser if isinstance(self.tool_parser, ToolCallFormat) else None
            )
            if messages and messages[0]["role"] == "system":
                messages[0]["content"] = f"{messages[0]['content']}\n\n{description}"
            else:
                messages.insert(0, {"role": "system", "content": description})
        return messages

    def respond(self, text: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """Answer verifiers' request with ``text``: the messages it appends next, or its rubric's reward."""
        if self._rollout is None:
            raise EnvError(f"verifiers env {self.env_id!r}: respond() called before reset() or after the episode ended")
        kind, value = self._advance(self._rollout, text)
        sent = self._request + [{"role": "assistant", "content": text}]
        if kind == "request":
            request = [_text(m, self.env_id) for m in value[0]]
            changed = next(
                (i for i, (a, b) in enumerate(zip(sent, request)) if a != b),
                None if len(request) >= len(sent) else len(request),
            )
            if changed is not None:
                self._abandon()
                raise EnvError(
                    f"verifiers env {self.env_id!r} rewrote the conversation between turns (message "
                    f"{changed} changed); agentrl appends each turn's messages to the tokens it "
                    "sampled, so only prompts that grow by appending are supported"
                )
            self._request = request
            return request[len(sent) :], 0.0, False, {}
        self._abandon()  # the rollout is over: nothing left to cancel
        return self._finish(value)

    def _finish(self, output: Any) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """The last step: what verifiers appended after the last reply, its reward and its metrics."""
        completion = [_text(m, self.env_id) for m in output.get("completion") or []]
        last = max((i for i, m in enumerate(completion) if m["role"] == "assistant"), default=len(completion) - 1)
        reward = output.get("reward")
        reward = float(reward) if isinstance(reward, (int, float)) and math.isfinite(reward) else 0.0
        metrics = {
            str(name): float(value)
            for name, value in (output.get("metrics") or {}).items()
            if isinstance(value, (int, float)) and math.isfinite(value)
        }
        info: dict[str, Any] = {
            "success": reward >= float(getattr(self.vf_env, "pass_threshold", 0.5)),
            "metrics": metrics,
            "stop_condition": output.get("stop_condition"),
        }
        if output.get("error") is not None:
            info["error"] = str(output["error"])
        return completion[last + 1 :], reward, True, info

    def _advance(self, rollout: _Rollout, text: str | None) -> tuple[str, Any]:
        """``rollout.advance(text)``, with exceptions escaping verifiers raised as EnvError."""
        try:
            return rollout.advance(text)
        except Exception as exc:
            self._abandon()
            if isinstance(exc, EnvError):
                raise
            raise EnvError(
                f"verifiers env {self.env_id!r} raised during its rollout: {one_line(exc, limit=300)}"
            ) from exc

    def _abandon(self) -> None:
        """Cancel the current rollout, if one is parked (an episode reset or closed before its end)."""
        rollout, self._rollout = self._rollout, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if rollout is not None:
            rollout.cancel()

    def close(self) -> None:
        """Cancel a rollout left unfinished."""
        self._abandon()
        super().close()


@hookimpl
def agentrl_register_envs(register: Callable[..., None]) -> None:
    """Register ``verifiers``."""
    register("verifiers", VerifiersEnv)


__all__ = ["VerifiersArgs", "VerifiersEnv"]
