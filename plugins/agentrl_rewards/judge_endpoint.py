"""``judge:openai``: judge prompts sent to an OpenAI-compatible endpoint, each under a deadline.

A request gets ``timeout_s`` from start to finished reply, however the server sends it: a server
that trickles a byte every few seconds resets an HTTP client's read timeout forever, so the
deadline is an ``asyncio`` timeout around the whole request, which cancels it (closing its
connection) when it passes. The requests run on an event loop in a daemon thread, at most
``max_concurrency`` at once, and the caller waits for them with a deadline of its own: nothing a
slow or silent server does can keep the caller past it, and no thread of this module is ever
joined, so a process whose judge server hangs still exits when the run ends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import os
import threading
from typing import Any

GRACE_S = 5.0
"""Seconds the caller waits past the requests' own deadlines before giving up on the loop too."""


class EndpointTimeout(TimeoutError):
    """A judge request got no complete reply within ``timeout_s`` and was cancelled."""


class EndpointBackend:
    """``backend(prompts) -> list[str | Exception]``: one chat completion per prompt (module docstring)."""

    def __init__(self, openai: Any, options: Any) -> None:
        self.options = options
        self.loop = asyncio.new_event_loop()
        # A daemon thread: never joined at interpreter exit, whatever a request is waiting on.
        threading.Thread(target=self.loop.run_forever, name="agentrl-judge-endpoint", daemon=True).start()
        self.client = openai.AsyncOpenAI(
            base_url=options.base_url,
            api_key=os.environ.get(options.api_key_env) or "EMPTY",
            timeout=options.timeout_s,
            max_retries=0,
        )

    def __call__(self, prompts: list[str]) -> list[str | Exception]:
        """The replies in order; a request that failed or passed its deadline is its exception."""
        if not prompts:
            return []
        future = asyncio.run_coroutine_threadsafe(self._ask_all(prompts), self.loop)
        waves = math.ceil(len(prompts) / self.options.max_concurrency)
        try:
            return future.result(timeout=waves * self.options.timeout_s + GRACE_S)
        except concurrent.futures.TimeoutError:  # the loop itself is stuck: abandon it, cancelled
            future.cancel()
            return [self._timeout() for _ in prompts]

    async def _ask_all(self, prompts: list[str]) -> list[str | Exception]:
        slots = asyncio.Semaphore(self.options.max_concurrency)
        return list(await asyncio.gather(*(self._ask(prompt, slots) for prompt in prompts)))

    async def _ask(self, prompt: str, slots: asyncio.Semaphore) -> str | Exception:
        async with slots:
            try:
                response = await asyncio.wait_for(self._request(prompt), self.options.timeout_s)
                return response.choices[0].message.content or ""
            except TimeoutError:
                return self._timeout()
            except Exception as exc:  # the request's failure (a malformed reply too): on_call_error decides
                return exc

    def _request(self, prompt: str) -> Any:
        return self.client.chat.completions.create(
            model=self.options.model,
            messages=[{"role": "user", "content": prompt}],
            temperature=0.0,
            max_tokens=self.options.max_new_tokens,
        )

    def _timeout(self) -> EndpointTimeout:
        return EndpointTimeout(
            f"no complete reply from {self.options.base_url} within plugins.judge.timeout_s="
            f"{self.options.timeout_s:g} s; the request was cancelled"
        )
