"""What the ``openai_agent`` endpoint needs around the engine: batching calls, shaping messages.

:class:`EngineBatcher` owns the engine in one thread: it takes the generation requests the
episodes' calls make, waits after the first for more (until every running agent has a call
pending, at most ``wait_s``), and samples every pending request in one ``engine.generate`` (one
batch per temperature); requests that arrive while a batch runs are batched next. Each request carries its own seed (``SamplingParams.prompt_seeds``), so
its tokens do not depend on which requests share its batch.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from agentrl import ChatTokenizer, Engine, Generation, SamplingParams, ToolCallFormat, type_arguments

Message = dict[str, Any]
_CALL_OPENERS = ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "<function=")


@dataclass
class GenerationRequest:
    """One call's prompt ids, its token cap, temperature and seed; ``future`` gets the Generation."""

    prompt: list[int]
    max_new_tokens: int
    temperature: float
    seed: int | None
    future: Future = field(default_factory=Future)


class EngineBatcher:
    """Runs ``engine.generate`` on batches of pending requests in a worker thread (module docstring)."""

    def __init__(self, engine: Engine, base: SamplingParams, wait_s: float, agents: int = 1,
                 concurrency: int = 1) -> None:
        self.engine, self.base, self.wait_s = engine, base, wait_s
        self.agents, self.concurrency, self.finished = agents, max(1, concurrency), 0
        self._lock = threading.Lock()
        self.queue: queue.Queue[GenerationRequest | None] = queue.Queue()
        self.batches: list[int] = []
        """Size of each batch sampled, in order (for metrics and tests)."""
        self.thread = threading.Thread(target=self._loop, name="agentrl-engine-batcher", daemon=True)
        self.thread.start()

    def submit(self, request: GenerationRequest) -> Generation:
        """Queue ``request`` and wait for its Generation (an engine failure is raised here)."""
        self.queue.put(request)
        return request.future.result()

    @property
    def running(self) -> int:
        """Agents running now or about to (``concurrency`` at most): a batch starts at once when
        each of them has a call pending, instead of waiting the whole ``wait_s``."""
        return min(self.concurrency, self.agents - self.finished)

    def agent_finished(self) -> None:
        """An agent returned: no more calls from it."""
        with self._lock:
            self.finished += 1

    def close(self) -> None:
        """Stop the worker after the batches already queued."""
        self.queue.put(None)
        self.thread.join(timeout=60)

    def _loop(self) -> None:
        while (first := self.queue.get()) is not None:
            pending, closing = [first], False
            deadline = time.monotonic() + self.wait_s
            while len(pending) < self.running:  # some running agent has no call pending yet
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:  # short polls: an agent that finishes instead of calling ends the wait too
                    item = self.queue.get(timeout=min(remaining, 0.005))
                except queue.Empty:
                    continue
                if item is None:
                    closing = True
                    break
                pending.append(item)
            for temperature in dict.fromkeys(r.temperature for r in pending):
                self._sample([r for r in pending if r.temperature == temperature])
            if closing:
                return

    def _sample(self, requests: list[GenerationRequest]) -> None:
        sampling = SamplingParams(max_new_tokens=max(r.max_new_tokens for r in requests),
                                  temperature=requests[0].temperature, top_p=self.base.top_p, top_k=self.base.top_k,
                                  seed=self.base.seed, prompt_seeds=None if any(r.seed is None for r in requests)
                                  else tuple(r.seed for r in requests))
        self.batches.append(len(requests))
        try:
            generations = self.engine.generate([r.prompt for r in requests], sampling)
            if len(generations) != len(requests):
                raise RuntimeError(f"the engine returned {len(generations)} generations for {len(requests)} prompts")
        except Exception as exc:  # every caller of the batch sees the failure
            for request in requests:
                request.future.set_exception(exc)
            return
        for request, generation in zip(requests, generations):
            ids, logprobs, reason = generation.token_ids, generation.logprobs, generation.finish_reason
            if len(ids) > request.max_new_tokens:  # the batch's cap was larger than this call's
                ids, logprobs, reason = ids[:request.max_new_tokens], logprobs[:request.max_new_tokens], "length"
            request.future.set_result(Generation(list(ids), reason, list(logprobs)))


def cut_at_stop(chat: ChatTokenizer, ids: list[int], stop: list[str]) -> tuple[int, str] | None:
    """Where a ``stop`` string first appears in the sampled text: (ids to keep, the text before
    it); None when none appears. The kept ids are the fewest whose text holds the stop string."""
    text = chat.decode(ids)
    hits = [text.find(s) for s in stop if s in text]
    if not hits:
        return None
    at = min(hits)
    for keep in range(1, len(ids) + 1):
        if any(s in chat.decode(ids[:keep]) for s in stop):
            return keep, text[:at]
    return len(ids), text[:at]


def normalized(messages: list[Message], raw_texts: dict[str, str]) -> list[Message]:
    """The conversation as the template renders it: text content parts joined, and an assistant
    message the endpoint returned (known by its tool-call ids) back to the exact sampled text."""
    out = []
    for message in messages:
        message = dict(message)
        if isinstance(message.get("content"), list):
            message["content"] = "".join(str(p.get("text", "")) for p in message["content"] if isinstance(p, dict))
        calls = message.get("tool_calls") or []
        raw = raw_texts.get(str(calls[0].get("id"))) if calls and isinstance(calls[0], dict) else None
        if message.get("role") == "assistant" and raw is not None:
            message = {"role": "assistant", "content": raw}
        if message.get("content") is None:
            message["content"] = ""
        out.append(message)
    return out


def with_tool_prompt(messages: list[Message], description: str) -> list[Message]:
    """``messages`` with agentrl's tool description appended to the system message (one is added
    first when there is none): for templates that do not render ``tools=``."""
    if messages and messages[0].get("role") == "system":
        first = messages[0]
        return [{**first, "content": f"{first.get('content') or ''}\n\n{description}".lstrip()}, *messages[1:]]
    return [{"role": "system", "content": description}, *messages]


def assistant_message(text: str, parser: Any, tools: list[dict[str, Any]] | None,
                      raw_texts: dict[str, str]) -> Message:
    """The OpenAI assistant message for the sampled ``text``: well-formed calls the run's parser
    reads become ``tool_calls`` (their ids remembered in ``raw_texts``), the text before the first
    call the ``content``; malformed calls stay in the content. ``tools=None``: no call is parsed."""
    calls = [c for c in (parser(text) if tools else []) if c.error is None and c.arguments is not None]
    if not calls:
        return {"role": "assistant", "content": text}
    schemas = {t.get("function", t).get("name"): t.get("function", t) for t in tools or []}
    tool_calls = []
    for call in calls:
        arguments = call.arguments or {}
        if call.text_values and call.name in schemas:
            arguments = type_arguments(arguments, schemas[call.name].get("parameters", {}))
        call_id = f"call_{uuid.uuid4().hex[:24]}"
        raw_texts[call_id] = text
        tool_calls.append({"id": call_id, "type": "function",
                           "function": {"name": call.name, "arguments": json.dumps(arguments)}})
    at = text.find(calls[0].raw) if calls[0].raw else -1
    before = text[:at] if at >= 0 else ""
    for opener in _CALL_OPENERS:
        before = before.rstrip().removesuffix(opener)
    return {"role": "assistant", "content": before.strip() or None, "tool_calls": tool_calls}


def call_format(parser: Any) -> ToolCallFormat | None:
    """The parser's format when it writes calls too (the tool description's example uses it)."""
    return parser if isinstance(parser, ToolCallFormat) else None
