"""The Chat Completions request the ``openai_agent`` endpoint takes, declared with pydantic.

:class:`ChatRequest` follows OpenAI's ``POST /v1/chat/completions`` body: messages of the roles
``system``, ``developer``, ``user``, ``assistant`` (``content`` and/or ``tool_calls``) and
``tool`` (``tool_call_id``), each with its own fields; ``tools`` and ``tool_choice``; the sampling
values with OpenAI's ranges. Validation is strict (no string for a number, no bool for an
integer) and refuses unknown fields. :func:`parse_request` turns any failure into one
:class:`RequestError` whose ``param`` is the field's path (``messages[0].role``).

What the endpoint does with each field:

* honoured: ``messages``, ``tools``, ``tool_choice``, ``max_tokens``/``max_completion_tokens``,
  ``temperature`` (finite, 0 to 2), ``top_p`` (0 excluded to 1), ``stop`` (up to 4 non-empty
  strings), ``n`` (1 to :data:`MAX_CHOICES`), ``stream``, ``stream_options.include_usage``;
* accepted and ignored (they do not change what is sampled): ``model`` (any name), ``seed`` (each
  call samples from its episode's seed and call number), ``user``, ``metadata``, ``store``,
  ``service_tier``, ``prompt_cache_key``, ``safety_identifier``, ``parallel_tool_calls: true``,
  ``logprobs: false``, ``top_logprobs: 0``, ``frequency_penalty``/``presence_penalty`` of 0,
  an empty ``logit_bias``, ``response_format: {"type": "text"}``, ``modalities: ["text"]``, an
  assistant message's ``refusal``, ``annotations``, and null ``audio``/``function_call``;
* refused with a 400 naming the field: any other field or value (non-zero penalties, a
  ``logit_bias``, ``logprobs: true``, ``parallel_tool_calls: false``, JSON response formats,
  ``reasoning_effort``, audio, images, the deprecated ``functions``/``function_call``): the
  endpoint would have to ignore what the agent asked for, or sample from a distribution the
  trainer does not reproduce.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

MAX_CHOICES = 16
"""The most choices (``n``) one call may ask for."""
ROLES = ("system", "developer", "user", "assistant", "tool")
"""The message roles of the Chat Completions API the endpoint takes."""


class RequestError(Exception):
    """A request the endpoint refuses: an HTTP status, a one-line message, the field's path and
    OpenAI's error ``code``."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param, self.code = status, param, code
        self.episode: int | None = None
        """The episode that made the request when it is not the URL's (its client's api key says so)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TextPart(_Strict):
    """A ``{"type": "text", "text": ...}`` content part."""

    type: Literal["text"]
    text: str


class RefusalPart(_Strict):
    """An assistant's ``{"type": "refusal", "refusal": ...}`` content part (not rendered)."""

    type: Literal["refusal"]
    refusal: str


def _text_parts_only(value: Any) -> Any:
    """Refuse a non-text content part by its type (the endpoint serves a text model)."""
    if isinstance(value, list):
        for i, part in enumerate(value):
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind not in ("text", "refusal"):
                raise ValueError(f"content part [{i}] has type {kind!r}; this endpoint takes text parts only")
    return value


Text = str
Parts = Annotated[list[TextPart], Field(min_length=1)]


class FunctionCall(_Strict):
    """The ``function`` of a tool call: its name and its arguments as a JSON string."""

    name: str
    arguments: str


class ToolCall(_Strict):
    """One ``tool_calls`` entry of an assistant message."""

    id: str
    type: Literal["function"]
    function: FunctionCall


class SystemMessage(_Strict):
    """``{"role": "system", "content": ...}``."""

    role: Literal["system"]
    content: Text | Parts
    name: str | None = None
    _parts = field_validator("content", mode="before")(_text_parts_only)


class DeveloperMessage(SystemMessage):
    """``{"role": "developer", ...}``: taken where the chat template renders that role."""

    role: Literal["developer"]  # type: ignore[assignment]


class UserMessage(SystemMessage):
    """``{"role": "user", "content": ...}`` (text content only)."""

    role: Literal["user"]  # type: ignore[assignment]


class AssistantMessage(_Strict):
    """``{"role": "assistant"}`` with ``content``, ``tool_calls`` or both."""

    role: Literal["assistant"]
    content: Text | Annotated[list[TextPart | RefusalPart], Field(min_length=1)] | None = None
    tool_calls: list[ToolCall] | None = None
    name: str | None = None
    refusal: str | None = None
    annotations: list[Any] | None = None
    audio: None = None
    function_call: None = None
    _parts = field_validator("content", mode="before")(_text_parts_only)

    @model_validator(mode="after")
    def _says_something(self) -> AssistantMessage:
        if self.content is None and not self.tool_calls:
            raise ValueError("an assistant message needs 'content' or 'tool_calls'")
        return self


class ToolMessage(_Strict):
    """``{"role": "tool", "tool_call_id": ..., "content": ...}``: a tool's result. ``tool_call_id``
    may be left out and a ``name`` given: hand-written few-shot examples (an env's worked
    examples) carry the tool's name instead of a call id, and chat templates render either."""

    role: Literal["tool"]
    content: Text | Parts
    tool_call_id: str | None = None
    name: str | None = None
    _parts = field_validator("content", mode="before")(_text_parts_only)


Message = Annotated[
    SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")
]


class FunctionDef(_Strict):
    """A tool's function: name (OpenAI's ``^[a-zA-Z0-9_-]{1,64}$``), description, JSON-schema parameters."""

    name: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Strict):
    """A ``{"type": "function", "function": {...}}`` tool."""

    type: Literal["function"]
    function: FunctionDef


class StreamOptions(_Strict):
    """``stream_options``: ``include_usage`` honoured, ``include_obfuscation`` ignored."""

    include_usage: bool | None = None
    include_obfuscation: bool | None = None


class ResponseFormat(_Strict):
    """``response_format``: plain text only (the endpoint cannot constrain the model to JSON)."""

    type: Literal["text"]


Unit = Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)]
Penalty = Annotated[float, Field(ge=-2, le=2, allow_inf_nan=False)]
Positive = Annotated[int, Field(ge=1)]
_DISTRIBUTION = "it samples from a distribution the trainer does not reproduce"
REFUSED = {
    "frequency_penalty": "a non-zero penalty",
    "presence_penalty": "a non-zero penalty",
    "logit_bias": "a logit bias",
    "logprobs": "true",
    "top_logprobs": "a number above 0",
}
_WHY = {
    "frequency_penalty": _DISTRIBUTION,
    "presence_penalty": _DISTRIBUTION,
    "logit_bias": _DISTRIBUTION,
    "logprobs": "the sampled tokens' logprobs are recorded for training, not returned",
    "top_logprobs": "the sampled tokens' logprobs are recorded for training, not returned",
}
TOOL_CHOICE_FORMS = "'auto', 'none', 'required' or {'type': 'function', 'function': {'name': NAME}}"


class ChatRequest(_Strict):
    """A Chat Completions request body the endpoint takes (what each field does: the module docstring)."""

    messages: Annotated[list[Message], Field(min_length=1)]
    model: str | None = None
    tools: list[Tool] | None = None
    tool_choice: Any = None
    temperature: Unit | None = None
    top_p: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] | None = None
    max_tokens: Positive | None = None
    max_completion_tokens: Positive | None = None
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES)] | None = None
    stop: (
        Annotated[str, Field(min_length=1)]
        | Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=4)]
        | None
    ) = None
    seed: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    logit_bias: dict[str, int] | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    modalities: list[Literal["text"]] | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice_form(cls, value: Any) -> Any:
        named = (
            isinstance(value, dict)
            and set(value) == {"type", "function"}
            and value["type"] == "function"
            and isinstance(value["function"], dict)
            and set(value["function"]) == {"name"}
            and isinstance(value["function"]["name"], str)
        )
        if value is not None and value not in ("auto", "none", "required") and not named:
            raise ValueError(f"must be {TOOL_CHOICE_FORMS}")
        return value

    @field_validator("frequency_penalty", "presence_penalty", "logit_bias", "logprobs", "top_logprobs")
    @classmethod
    def _off(cls, value: Any, info: ValidationInfo) -> Any:
        if value:
            raise ValueError(f"{REFUSED[info.field_name]} is not supported: {_WHY[info.field_name]}")
        return value

    @field_validator("parallel_tool_calls")
    @classmethod
    def _parallel(cls, value: bool | None) -> bool | None:
        if value is False:
            raise ValueError("false is not supported: every call the model writes comes back (leave it out or true)")
        return value


def parse_request(body: Any) -> ChatRequest:
    """``body`` as a :class:`ChatRequest`, or one RequestError naming the first bad field by its path."""
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(body).__name__}")
    try:
        request = ChatRequest.model_validate(body)
    except ValidationError as exc:
        raise _request_error(exc) from None
    if request.stream_options is not None and not request.stream:
        raise RequestError("'stream_options' is only allowed with 'stream': true", param="stream_options")
    return request


def _path(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as OpenAI's ``param`` (``messages[0].content``), the union
    branches pydantic names (a role tag, ``str``, ``list[TextPart]``, a class name) left out."""
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif not (_branch(part) or (i == 2 and loc[0] == "messages" and part in ROLES)):
            out += f".{part}" if out else part
    return out


def _branch(part: str) -> bool:
    return not part.isidentifier() or part[:1].isupper() or part in ("str", "int", "float", "bool", "none")


def _request_error(exc: ValidationError) -> RequestError:
    """One RequestError for a failed validation: the error at the deepest path (a union's
    branches that fail at one path are said together)."""
    errors = [(_path(e["loc"]), e) for e in exc.errors(include_url=False)]
    depth = max(path.count(".") + path.count("[") for path, _ in errors)
    deepest = [(path, e) for path, e in errors if path.count(".") + path.count("[") == depth]
    path = deepest[0][0]
    said = [e for p, e in deepest if p == path]
    got = said[0].get("input")
    if said[0]["type"] == "union_tag_not_found":
        return RequestError(f"{path}.role is missing: one of {', '.join(ROLES)}", param=f"{path}.role")
    if said[0]["type"] == "union_tag_invalid":
        role = said[0]["ctx"]["tag"]
        return RequestError(f"{path}.role {role!r} is not one of {', '.join(ROLES)}", param=f"{path}.role")
    if said[0]["type"] == "extra_forbidden":
        return RequestError(f"unsupported field {path!r}: this endpoint does not take it", param=path)
    if said[0]["type"] == "missing":
        return RequestError(f"{path} is required", param=path)
    kinds = [_KINDS.get(e["type"]) for e in said]
    if all(kinds):  # a union's branches refused its type: name them all
        return RequestError(f"{path} must be {' or '.join(dict.fromkeys(kinds))}, got {_short(got)}", param=path)
    reason = next(str(e["msg"]) for e, kind in zip(said, kinds) if kind is None).removeprefix("Value error, ")
    return RequestError(f"{path}: {reason} (got {_short(got)})", param=path or None)


_KINDS = {
    "string_type": "a string",
    "list_type": "a list",
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


IGNORED_IN_MESSAGES = {"refusal", "annotations", "audio", "function_call"}
"""Assistant message fields taken and dropped before rendering."""


def request_options(request: ChatRequest) -> dict[str, Any]:
    """What the rollout needs from a valid request: the messages and tools as plain dicts (fields
    the endpoint ignores dropped), the checked ``tool_choice``, ``stop`` as a list, the token cap and
    the sampling and streaming options."""
    tools = [t.model_dump(exclude_none=True) for t in request.tools or []] or None
    stop = request.stop or []
    return {
        "messages": [m.model_dump(exclude_none=True, exclude=IGNORED_IN_MESSAGES) for m in request.messages],
        "tools": tools,
        "tool_choice": check_tool_choice(request.tool_choice or "auto", tools),
        "stop": [stop] if isinstance(stop, str) else list(stop),
        "max_tokens": request.max_completion_tokens or request.max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "model": request.model or "agentrl",
        "stream": bool(request.stream),
        "include_usage": bool(request.stream_options and request.stream_options.include_usage),
        "n": request.n or 1,
    }


def check_tool_choice(choice: Any, tools: list[dict[str, Any]] | None) -> Any:
    """``choice`` (of a valid form) when ``tools`` allow it, else RequestError naming what is wrong."""
    if choice in ("auto", "none"):
        return choice
    given = [t["function"]["name"] for t in tools or []]
    what = "'required'" if choice == "required" else f"function {choice['function']['name']!r}"
    if not given:
        raise RequestError(f"'tool_choice' {what} needs 'tools'; none were given", param="tool_choice")
    if choice != "required" and choice["function"]["name"] not in given:
        raise RequestError(
            f"'tool_choice' names function {choice['function']['name']!r}, which is not among the "
            f"tools given: {', '.join(given)}",
            param="tool_choice",
        )
    return choice
