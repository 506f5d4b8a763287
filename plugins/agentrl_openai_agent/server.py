"""The OpenAI-compatible ``POST /{run}/{episode}/v1/chat/completions`` endpoint of the ``openai_agent`` rollout.

A FastAPI app served by uvicorn in a background thread, for one rollout step, on
``plugins.openai_agent.host`` (127.0.0.1 by default: this machine only; ``0.0.0.0`` or an
interface's IP for agent programs on other machines) at ``port`` (0: a free one); the URLs agents
are given name ``advertise_host`` (:func:`agentrl_openai_agent.address.advertised_host`). A request
body is validated against the declared Chat Completions request
(:mod:`agentrl_openai_agent.request`): any body that is not valid gets a 400 in OpenAI's error shape,
``{"error": {"message", "type": "invalid_request_error", "param", "code"}}``, ``param``
naming the field (``messages[0].role``). The rollout answers a valid one
(:meth:`agentrl_openai_agent.rollout.OpenAIAgentRollout.complete`) in a worker thread while the
server keeps taking other episodes' requests, so calls that arrive together are sampled in one
batch. With ``stream: true`` the finished reply is sent as OpenAI ``chat.completion.chunk``
server-sent events (:func:`completion_chunks`): sampled whole, then streamed.

No traceback reaches the run's log: an unexpected exception while answering is a 500 in the same
shape and one line on stderr per distinct error; a refused request is one line per kind
(status and field), said once per process; uvicorn's own loggers go through a filter that
flattens any exception to one line (:func:`uvicorn_log_config`). The rollout counts each
episode's refused requests in its metrics (``on_error``).

Whose call is it. Every URL starts with the run's secret (``run``: 128 random bits, ``secrets``,
one per rollout): a request without it, to any path, is a 404 that names nothing, so an endpoint
other machines can reach answers no stranger (``GET /{run}/health`` is how a remote agent worker
checks it can reach the endpoint). Each episode has its own base URL,
``http://HOST:PORT/<run>/episode-<i>-<key>/v1``, ``key`` another 128 random bits: a URL cannot be
guessed, only handed on. The OpenAI client
the rollout builds for an episode carries that episode's own api key, ``agentrl-episode-<i>-<key>``
(another 192 random bits): a request bearing an api key of this form must come with the URL of the
episode it was issued to, else it is a 401 (``invalid_api_key``): a client of one episode pointed
at another episode's URL (a URL leaked through a global, an environment variable, a shared cache)
cannot write that episode's record. A request with any other api key (an agent given a bare
``base_url`` that builds its own client: ``"EMPTY"``, ``"sk-..."``) is taken on the URL's word.
Once an episode's agent has returned (or timed out), its URL answers 410 (``episode_finished``)
and records nothing: a thread the agent left running cannot add calls to a finished trajectory.
These checks guard against mistakes, not against an agent program that reads its worker's
memory. The traffic is plain HTTP: across machines keep it on a network you trust (a non-loopback
``host`` is said once at start-up).
"""

# No ``from __future__ import annotations``: FastAPI reads the endpoint's annotations at definition time.

import asyncio
import json
import logging
import secrets
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Container
from typing import Any

from agentrl import one_line
from agentrl_openai_agent.address import advertised_host, url_host
from agentrl_openai_agent.request import RequestError, parse_request, request_options

API_KEY_PREFIX = "agentrl-episode-"
"""How the api keys the endpoint issues begin: a request bearing one must use its episode's URL."""
MAX_BODY_BYTES = 16 * 1024 * 1024
"""The largest request body taken (413 above)."""
_said: set[Any] = set()
"""The endpoint lines already printed in this process (each kind once)."""


def episode_key(index: int) -> str:
    """A fresh URL key of episode ``index`` (128 random bits)."""
    return f"episode-{index}-{secrets.token_urlsafe(16)}"


def episode_api_key(index: int) -> str:
    """A fresh api key of episode ``index``'s client (192 random bits)."""
    return f"{API_KEY_PREFIX}{index}-{secrets.token_urlsafe(24)}"


def episode_credentials(count: int) -> tuple[dict[str, int], list[str]]:
    """Fresh credentials of ``count`` episodes: URL key -> episode, and each episode's api key."""
    return {episode_key(i): i for i in range(count)}, [episode_api_key(i) for i in range(count)]


def caller_episode(
    keys: dict[str, int], api_keys: list[str], finished: Container[int], key: str, api_key: str | None
) -> int:
    """The episode a request to URL ``key`` bearing ``api_key`` may write, else RequestError: 404
    for a URL no episode has, 401 for an issued api key of another episode, 410 once the episode's
    agent has returned."""
    index = keys.get(key)
    if index is None:
        raise RequestError(
            f"no episode {key[:60]!r} on this endpoint: use the base_url the agent was given", 404, None, "not_found"
        )
    if (
        api_key is not None
        and api_key.startswith(API_KEY_PREFIX)
        and not secrets.compare_digest(api_key.encode(), api_keys[index].encode())
    ):
        error = RequestError(
            "this api key was issued to another episode's client: an episode's client may call only its own base_url",
            401,
            None,
            "invalid_api_key",
        )
        error.episode = api_keys.index(api_key) if api_key in api_keys else None  # the caller, counted
        raise error
    if index in finished:
        raise RequestError(
            f"episode {index}'s agent has returned: its endpoint takes no more calls (a thread the agent left "
            "running?)",
            410,
            None,
            "episode_finished",
        )
    return index


def run_secret() -> str:
    """A fresh secret for a run's URLs (128 random bits)."""
    return secrets.token_urlsafe(16)


def completion_body(
    model: str, choices: list[tuple[dict[str, Any], str]], prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    """An OpenAI ``chat.completion`` object holding ``choices``, each (message, finish reason)."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": i, "message": message, "finish_reason": finish, "logprobs": None}
            for i, (message, finish) in enumerate(choices)
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def completion_chunks(body: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a finished ``chat.completion`` ``body``, as OpenAI
    streams one: per choice its role, its content, each tool call whole (one delta per call, with
    its ``index``), then its finish reason; with ``include_usage`` every chunk has ``usage: null``
    and a last chunk with no choices carries the usage."""
    head = {"id": body["id"], "object": "chat.completion.chunk", "created": body["created"], "model": body["model"]}
    chunks = []

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> None:
        chunks.append(
            {
                **head,
                "choices": [{"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}],
                **({"usage": None} if include_usage else {}),
            }
        )

    for choice in body["choices"]:
        message, index = choice["message"], choice["index"]
        chunk(index, {"role": "assistant", "content": ""})
        if message.get("content"):
            chunk(index, {"content": message["content"]})
        for number, call in enumerate(message.get("tool_calls") or []):
            chunk(index, {"tool_calls": [{"index": number, **call}]})
        chunk(index, {}, choice["finish_reason"])
    if include_usage:
        chunks.append({**head, "choices": [], "usage": body["usage"]})
    return chunks


def error_body(exc: RequestError) -> dict[str, Any]:
    """OpenAI's error object for ``exc``."""
    kind = "invalid_request_error" if exc.status < 500 else "server_error"
    return {"error": {"message": str(exc), "type": kind, "param": exc.param, "code": exc.code}}


def say_once(kind: Any, line: str) -> None:
    """Print the endpoint's ``line`` on stderr unless a line of this ``kind`` was said in this process."""
    if kind not in _said and len(_said) < 10_000:
        _said.add(kind)
        print(f"openai_agent endpoint: {line}", file=sys.stderr, flush=True)


async def _read_json(request: Any) -> Any:
    """The request's JSON body, or RequestError: 413 past :data:`MAX_BODY_BYTES`, 400 when not JSON."""
    length = request.headers.get("content-length", "")
    too_big = RequestError(f"the request body is over {MAX_BODY_BYTES} bytes", 413, None, "request_too_large")
    if length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise too_big
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise too_big
    try:
        return json.loads(bytes(raw))
    except (ValueError, RecursionError) as exc:
        raise RequestError(f"the request body is not JSON: {one_line(exc)}") from None


def _bearer(request: Any) -> str | None:
    """The api key of an ``Authorization: Bearer KEY`` header (None without one)."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


NOT_FOUND = "this endpoint serves POST <the base_url the agent was given>/chat/completions"
"""What every path without the run's secret is told (a 404 that names nothing of the run)."""


def not_found(request: Any, status: int = 404) -> Any:
    """The answer to a path the endpoint does not serve (a 404 naming nothing: no path, no secret)."""
    from fastapi.responses import JSONResponse

    message = f"{request.method} {request.url.path if status != 404 else 'this path'}: {NOT_FOUND}"
    error = RequestError(message, status, None, "not_found" if status == 404 else None)
    return JSONResponse(status_code=status, content=error_body(error))


def make_app(
    answer: Callable[[str, dict[str, Any]], dict[str, Any]],
    on_error: Callable[[str, RequestError], None] | None = None,
    secret: str | None = None,
    model: str = "agentrl",
) -> Any:
    """The FastAPI app: ``answer(episode_key, options)`` gives the response body or raises
    RequestError (``options``: :func:`agentrl_openai_agent.request.request_options` and the
    request's ``api_key``); ``on_error(episode_key, error)`` hears of every error answered.
    ``secret``: the run's (a fresh one when None; ``app.state.secret``), the first part of every path;
    ``model``: the name ``GET /v1/models`` lists (the run's model; any name is answered by the policy)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.exceptions import HTTPException

    app = FastAPI(title="agentrl openai_agent endpoint", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.secret = secret or run_secret()

    def ours(run: str) -> bool:
        return secrets.compare_digest(run.encode(), app.state.secret.encode())

    def refuse(episode: str, exc: RequestError) -> Any:
        if on_error is not None:
            on_error(episode, exc)
        if exc.status < 500:
            say_once(
                (exc.status, exc.param, exc.code),
                f"answered {exc.status} ({exc.param or exc.code or 'request'}): {exc} [said once per kind; the "
                "rollout counts them in env/agent/*]",
            )
        return JSONResponse(status_code=exc.status, content=error_body(exc))

    @app.exception_handler(HTTPException)
    async def other_paths(request: Request, exc: HTTPException) -> Any:
        return not_found(request, exc.status_code)

    _info_routes(app, ours, model)

    @app.post("/{run}/{episode}/v1/chat/completions")
    async def chat_completions(run: str, episode: str, request: Request) -> Any:
        if not ours(run):
            return not_found(request)
        try:
            options = request_options(parse_request(await _read_json(request)))
            options["api_key"] = _bearer(request)
            reply = await asyncio.to_thread(answer, episode, options)
            if not options["stream"]:
                return JSONResponse(reply)
            chunks = completion_chunks(reply, options["include_usage"])
        except RequestError as exc:
            return refuse(episode, exc)
        except Exception as exc:  # a bug or a failure while answering: a 500, not a traceback
            say_once(("500", type(exc).__name__, str(exc)[:200]), f"answered 500: {one_line(exc)}")
            return refuse(episode, RequestError(f"internal error: {one_line(exc)}", 500, None, "internal_error"))
        events = [f"data: {json.dumps(c)}\n\n" for c in chunks] + ["data: [DONE]\n\n"]
        return StreamingResponse(iter(events), media_type="text/event-stream")

    return app


def _info_routes(app: Any, ours: Callable[[str], bool], model: str) -> None:
    """``GET <run>/health``, ``.../v1/models`` (the run's ``model``) and ``.../v1/models/NAME`` (any
    name: the policy answers whatever model a request names) on ``app``, for the run ``ours`` accepts."""
    from fastapi import Request
    from fastapi.responses import JSONResponse

    @app.get("/{run}/health")
    async def health(run: str, request: Request) -> Any:
        return JSONResponse({"status": "ok"}) if ours(run) else not_found(request)

    listed = {"id": model, "object": "model", "created": 0, "owned_by": "agentrl"}

    @app.get("/{run}/{episode}/v1/models")
    async def models(run: str, episode: str, request: Request) -> Any:
        return JSONResponse({"object": "list", "data": [listed]}) if ours(run) else not_found(request)

    @app.get("/{run}/{episode}/v1/models/{name:path}")
    async def one_model(run: str, episode: str, name: str, request: Request) -> Any:
        return JSONResponse({**listed, "id": name}) if ours(run) else not_found(request)


class OneLineFilter(logging.Filter):
    """Lets a uvicorn record through as one line: an exception it carries is flattened into its
    message (no traceback), and a line already let through in this process is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Flatten ``record``'s exception; False for a line said before."""
        line = " ".join(record.getMessage().split())
        if record.exc_info and record.exc_info[1] is not None:
            line = f"{line}: {one_line(record.exc_info[1])}"
        record.msg, record.args = line, ()
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        if ("uvicorn", line) in _said:
            return False
        _said.add(("uvicorn", line))
        return True


def uvicorn_log_config() -> dict[str, Any]:
    """uvicorn's logging: warnings and errors only, one line each through :class:`OneLineFilter`,
    no access log, nothing passed on to the root logger."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"one_line": {"()": OneLineFilter}},
        "formatters": {"plain": {"format": "openai_agent endpoint (uvicorn %(levelname)s): %(message)s"}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "formatter": "plain",
                "filters": ["one_line"],
            }
        },
        "loggers": {
            "uvicorn": {"handlers": ["stderr"], "level": "WARNING", "propagate": False},
            "uvicorn.error": {"level": "WARNING", "propagate": True},
            "uvicorn.access": {"handlers": [], "level": "WARNING", "propagate": False},
        },
    }


class BackgroundServer:
    """uvicorn serving ``app`` on ``host`` at ``port`` (0: a free one), in a daemon thread, its URLs
    naming ``advertise_host`` (:func:`advertised_host`); :meth:`close` stops it. OSError when
    ``host`` cannot be bound."""

    def __init__(
        self,
        app: Any,
        start_timeout_s: float = 30.0,
        host: str = "127.0.0.1",
        port: int = 0,
        advertise_host: str | None = None,
    ) -> None:
        import uvicorn

        family, _, _, _, address = socket.getaddrinfo(host or "0.0.0.0", port, type=socket.SOCK_STREAM)[0]
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.socket.bind(address)
        except OSError:
            self.socket.close()
            raise
        self.app, self.host, self.port = app, host, int(self.socket.getsockname()[1])
        self.advertise_host = advertised_host(host, advertise_host)
        config = uvicorn.Config(
            app, log_config=uvicorn_log_config(), log_level="warning", access_log=False, lifespan="off"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.socket]}, name="agentrl-openai-endpoint", daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + start_timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the openai_agent endpoint did not start on {url_host(host)}:{self.port}")
            time.sleep(0.01)

    def root(self, secret: bool = True) -> str:
        """``http://HOST:PORT/<run secret>`` as agents reach it (``<run-secret>`` unless ``secret``: for messages)."""
        shown = self.app.state.secret if secret else "<run-secret>"
        return f"http://{url_host(self.advertise_host)}:{self.port}/{shown}"

    def base_url(self, key: str) -> str:
        """The OpenAI ``base_url`` of episode ``key``."""
        return f"{self.root()}/{key}/v1"

    def close(self) -> None:
        """Stop serving and wait for the thread (open connections are closed)."""
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.socket.close()
