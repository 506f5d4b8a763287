"""The OpenAI-compatible ``POST /{episode}/v1/chat/completions`` endpoint of the ``openai_agent`` rollout.

A FastAPI app served by uvicorn on 127.0.0.1 (a free port) in a background thread, for one
rollout. Each episode has its own base URL (``http://127.0.0.1:PORT/<episode key>/v1``); a
request checks its fields (a 400 names any field the endpoint does not support), and the rollout
answers it (:meth:`OpenAIAgentRollout.complete`) in a worker thread while the server keeps taking
other episodes' requests, so calls that arrive together are sampled in one batch.
"""

# No ``from __future__ import annotations``: FastAPI reads the endpoint's annotations at definition time.

import asyncio
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

SUPPORTED = ("messages", "model", "tools", "tool_choice", "max_tokens", "max_completion_tokens",
             "temperature", "stop", "n", "stream")
"""Request fields the endpoint takes; any other is refused with a 400 naming it."""


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
            raise RequestError(f"unsupported field {name!r}; this endpoint supports: {', '.join(SUPPORTED)}", param=name)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise RequestError("'messages' must be a non-empty list of message objects", param="messages")
    if body.get("n", 1) != 1:
        raise RequestError(f"'n' must be 1 (one completion per call), got {body['n']!r}", param="n")
    if body.get("stream"):
        raise RequestError("'stream' must be false: streaming is not supported", param="stream")
    choice = body.get("tool_choice", "auto")
    if choice not in ("auto", "none"):
        raise RequestError(f"'tool_choice' must be 'auto' or 'none', got {choice!r}", param="tool_choice")
    tools = body.get("tools") or None
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise RequestError("'tools' must be a list of tool objects", param="tools")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise RequestError(f"'stop' must be a string or a list of non-empty strings, got {body['stop']!r}", param="stop")
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise RequestError(f"'max_tokens' must be an integer >= 1, got {limit!r}", param="max_tokens")
    temperature = body.get("temperature")
    if temperature is not None and (not isinstance(temperature, (int, float)) or temperature < 0):
        raise RequestError(f"'temperature' must be a number >= 0, got {temperature!r}", param="temperature")
    return {"messages": messages, "tools": tools, "tool_choice": choice, "stop": stop, "max_tokens": limit,
            "temperature": None if temperature is None else float(temperature), "model": body.get("model") or "agentrl"}


def completion_body(model: str, message: dict[str, Any], finish_reason: str, prompt_tokens: int,
                    completion_tokens: int) -> dict[str, Any]:
    """An OpenAI ``chat.completion`` object holding one choice."""
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "message": message, "finish_reason": finish_reason,
                                          "logprobs": None}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


def _error(status: int, message: str, param: str | None) -> Any:
    from fastapi.responses import JSONResponse

    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "param": param,
                                                               "code": None}})


def make_app(answer: Callable[[str, dict[str, Any]], dict[str, Any]]) -> Any:
    """The FastAPI app: ``answer(episode_key, options)`` gives the response body or raises RequestError."""
    from fastapi import FastAPI, Request

    app = FastAPI(title="agentrl openai_agent endpoint", docs_url=None, redoc_url=None, openapi_url=None)

    @app.post("/{episode}/v1/chat/completions")
    async def chat_completions(episode: str, request: Request) -> Any:
        try:
            try:
                body = await request.json()
            except ValueError as exc:
                raise RequestError(f"the request body is not JSON: {exc}") from exc
            options = check_request(body)
            return await asyncio.to_thread(answer, episode, options)
        except RequestError as exc:
            return _error(exc.status, str(exc), exc.param)

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
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]},
                                       name="agentrl-openai-endpoint", daemon=True)
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
