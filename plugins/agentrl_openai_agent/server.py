"""The OpenAI-compatible ``POST /{episode}/v1/chat/completions`` endpoint of the ``openai_agent`` rollout.

A FastAPI app served by uvicorn on 127.0.0.1 (a free port) in a background thread, for one
rollout. Each episode has its own base URL (``http://127.0.0.1:PORT/<episode key>/v1``); a
request checks its fields (a 400 names any field the endpoint does not support), and the rollout
answers it (:meth:`agentrl_openai_agent.rollout.OpenAIAgentRollout.complete`) in a worker thread
while the server keeps taking other episodes' requests, so calls that arrive together are sampled
in one batch. With
``stream: true`` the finished reply is sent as OpenAI ``chat.completion.chunk`` server-sent
events (:func:`completion_chunks`): sampled whole, then streamed.
"""

# No ``from __future__ import annotations``: FastAPI reads the endpoint's annotations at definition time.

import asyncio
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

SUPPORTED = (
    "messages",
    "model",
    "tools",
    "tool_choice",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "stop",
    "n",
    "stream",
    "stream_options",
)
"""Request fields the endpoint takes; any other is refused with a 400 naming it."""
MAX_CHOICES = 16
"""The most choices (``n``) one call may ask for."""


class RequestError(Exception):
    """A request the endpoint refuses: an HTTP status and a one-line message."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param = status, param


def check_request(body: Any) -> dict[str, Any]:
    """The request's options, or RequestError naming the first field or value not supported."""
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(body).__name__}")
    for name in body:
        if name not in SUPPORTED:
            raise RequestError(
                f"unsupported field {name!r}; this endpoint supports: {', '.join(SUPPORTED)}", param=name
            )
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise RequestError("'messages' must be a non-empty list of message objects", param="messages")
    n = body.get("n") or 1
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_CHOICES:
        raise RequestError(f"'n' must be an integer from 1 to {MAX_CHOICES}, got {body['n']!r}", param="n")
    stream, stream_options = body.get("stream") or False, body.get("stream_options") or {}
    if not isinstance(stream, bool) or not isinstance(stream_options, dict):
        raise RequestError(
            f"'stream' must be true or false and 'stream_options' an object, got {stream!r} and {stream_options!r}",
            param="stream",
        )
    tools = body.get("tools") or None
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise RequestError("'tools' must be a list of tool objects", param="tools")
    choice = check_tool_choice(body.get("tool_choice", "auto"), tools)
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise RequestError(
            f"'stop' must be a string or a list of non-empty strings, got {body['stop']!r}", param="stop"
        )
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise RequestError(f"'max_tokens' must be an integer >= 1, got {limit!r}", param="max_tokens")
    temperature = body.get("temperature")
    if temperature is not None and (not isinstance(temperature, (int, float)) or temperature < 0):
        raise RequestError(f"'temperature' must be a number >= 0, got {temperature!r}", param="temperature")
    return {
        "messages": messages,
        "tools": tools,
        "tool_choice": choice,
        "stop": stop,
        "max_tokens": limit,
        "temperature": None if temperature is None else float(temperature),
        "model": body.get("model") or "agentrl",
        "stream": stream,
        "include_usage": bool(stream_options.get("include_usage")),
        "n": n,
    }


def check_tool_choice(choice: Any, tools: list[dict[str, Any]] | None) -> Any:
    """``choice`` when valid for ``tools``, else RequestError naming what is wrong and what is allowed."""
    if choice in ("auto", "none"):
        return choice
    named = (
        isinstance(choice, dict)
        and choice.get("type") == "function"
        and isinstance(choice.get("function"), dict)
        and isinstance(choice["function"].get("name"), str)
    )
    if choice != "required" and not named:
        raise RequestError(
            "'tool_choice' must be 'auto', 'none', 'required' or {'type': 'function', 'function': "
            f"{{'name': NAME}}}}, got {json.dumps(choice)}",
            param="tool_choice",
        )
    given = [str((t["function"] if isinstance(t.get("function"), dict) else t).get("name")) for t in tools or []]
    what = "'required'" if choice == "required" else f"function {choice['function']['name']!r}"
    if not given:
        raise RequestError(f"'tool_choice' {what} needs 'tools'; none were given", param="tool_choice")
    if named and choice["function"]["name"] not in given:
        raise RequestError(
            f"'tool_choice' names function {choice['function']['name']!r}, which is not among the "
            f"tools given: {', '.join(given)}",
            param="tool_choice",
        )
    return choice


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


def _error(status: int, message: str, param: str | None) -> Any:
    from fastapi.responses import JSONResponse

    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse(
        status_code=status, content={"error": {"message": message, "type": kind, "param": param, "code": None}}
    )


def make_app(answer: Callable[[str, dict[str, Any]], dict[str, Any]]) -> Any:
    """The FastAPI app: ``answer(episode_key, options)`` gives the response body or raises RequestError."""
    from fastapi import FastAPI, Request
    from fastapi.responses import StreamingResponse

    app = FastAPI(title="agentrl openai_agent endpoint", docs_url=None, redoc_url=None, openapi_url=None)

    @app.post("/{episode}/v1/chat/completions")
    async def chat_completions(episode: str, request: Request) -> Any:
        try:
            try:
                body = await request.json()
            except ValueError as exc:
                raise RequestError(f"the request body is not JSON: {exc}") from exc
            options = check_request(body)
            reply = await asyncio.to_thread(answer, episode, options)
        except RequestError as exc:
            return _error(exc.status, str(exc), exc.param)
        if not options["stream"]:
            return reply
        events = [f"data: {json.dumps(c)}\n\n" for c in completion_chunks(reply, options["include_usage"])]
        return StreamingResponse(iter(events + ["data: [DONE]\n\n"]), media_type="text/event-stream")

    return app


class BackgroundServer:
    """uvicorn serving ``app`` on 127.0.0.1 at a free port, in a daemon thread; :meth:`close` stops it."""

    def __init__(self, app: Any, start_timeout_s: float = 30.0) -> None:
        import uvicorn

        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(("127.0.0.1", 0))
        self.port = int(self.socket.getsockname()[1])
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.socket]}, name="agentrl-openai-endpoint", daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + start_timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the openai_agent endpoint did not start on 127.0.0.1:{self.port}")
            time.sleep(0.01)

    def base_url(self, key: str) -> str:
        """The OpenAI ``base_url`` of episode ``key``."""
        return f"http://127.0.0.1:{self.port}/{key}/v1"

    def close(self) -> None:
        """Stop serving and wait for the thread (open connections are closed)."""
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.socket.close()
