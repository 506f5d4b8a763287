"""How an agent function is called, decided from its signature once, in the trainer.

An agent is written as agents are written: ``def solve(task, client)`` (the task dict and an
OpenAI client) as well as a script's ``def run_agent(question: str, base_url: str, model: str =
"gpt-4o-mini", max_turns: int = 5) -> str``. :func:`agent_call` reads the signature and returns
the call plan the worker follows (:func:`agentrl_openai_agent.agent_process.call_arguments`), a
plain dict, or refuses the function in one line with the fix:

* the first parameter gets the task: the whole dict when it is named ``task``, annotated as a
  mapping, or has any other name that is not a task field; the value of one field when it is
  named after a field of the tasks (``question``, ``prompt``), annotated ``str``, or when
  ``plugins.openai_agent.task_field`` names the field;
* the parameters after it are filled by name: ``base_url`` (the episode's URL), ``client`` (an
  ``openai.OpenAI``, or ``AsyncOpenAI`` for an ``async def``), ``model`` (the run's model name),
  ``max_turns`` and ``api_key`` (the episode's key); a second positional parameter with another
  name gets the client, as ``def solve(task, llm)`` always has (unless it has a default while the
  first parameter takes a field); any other parameter keeps its default;
* a required parameter agentrl cannot fill, a first parameter that names a field the tasks do not
  have, or a ``task_field`` the tasks do not have is a ConfigError naming the function, its
  parameters, what agentrl passes and the fix.
"""

from __future__ import annotations

import collections.abc
import inspect
import typing
from collections.abc import Collection, Iterable
from typing import Any

from agentrl import ConfigError

FILLED = ("base_url", "client", "model", "max_turns", "api_key")
"""The parameters agentrl fills by name (module docstring)."""
PASSES = (
    "the task first (whole, or the field the first parameter names), then base_url, client, model, max_turns "
    "and api_key by name"
)
TEXT_NAMES = ("question", "prompt", "problem", "query", "instruction", "input", "text")
"""First-parameter names that say the agent takes a task field, not the task dict."""
TASK_FIELD = "plugins.openai_agent.task_field"
_MAPPINGS = (dict, collections.abc.Mapping, collections.abc.MutableMapping, typing.Dict)  # noqa: UP006
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def legacy_call(second: str = "client", field: str | None = None) -> dict[str, Any]:
    """The plan of ``fn(task, client)`` (``second``: ``base_url``): how a function whose signature
    cannot be read (a builtin) or that takes ``*args`` is called."""
    return {"field": field, "positional": [second], "keywords": []}


def agent_call(
    spec: str,
    fn: Any,
    fields: Collection[str] | None = None,
    task_field: str | None = None,
    fillable: Iterable[str] = FILLED,
) -> dict[str, Any]:
    """The call plan of agent ``fn`` (``spec``: how the config names it): ``field`` (the task
    field its first parameter gets; None: the whole task dict), ``positional`` (the names whose
    values follow it positionally) and ``keywords`` (the names passed by keyword), or ConfigError
    with the fix (module docstring). ``fields``: the tasks' fields (None: not known yet, the
    field checks wait for them); ``task_field``: the setting; ``fillable``: the names of
    :data:`FILLED` with a value in this run (``max_turns`` may have none)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or an extension function: called as it always was
        return legacy_call(field=task_field)
    params = list(signature.parameters.values())
    takes = f"agent {spec} takes ({', '.join(p.name for p in params)})"
    positional = [p for p in params if p.kind in _POSITIONAL]
    if not positional:
        if any(p.kind is p.VAR_POSITIONAL for p in params):
            return legacy_call(field=task_field)
        raise ConfigError(
            f"{takes}: it has no positional parameter for the task: agentrl passes {PASSES}; "
            f"write def {_name(fn)}(task, client) or def {_name(fn)}(question, base_url)"
        )
    first = positional[0]
    field = _first_field(takes, first, fields, task_field)
    plan: dict[str, Any] = {"field": field, "positional": [], "keywords": []}
    fillable, missing, in_order = set(fillable), [], True
    for index, param in enumerate(params[1:]):
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        name = param.name if param.name in fillable else None
        if name is None and index == 0 and param.kind in _POSITIONAL and (param.default is param.empty or not field):
            name = "client"  # the second positional parameter, as always: the episode's client
        if name is None:
            in_order = False
            if param.default is param.empty:
                missing.append(param.name)
        elif param.kind is param.POSITIONAL_ONLY or (name != param.name):
            if in_order:
                plan["positional"].append(name)
        else:
            plan["keywords"].append(name)
    if missing:
        unknown = ", ".join(missing)
        raise ConfigError(
            f"{takes}: agentrl cannot fill {unknown}: it passes {PASSES}; give {missing[0]} a default value or "
            "compute it inside the function (from the task, os.environ)"
        )
    return plan


SHOWN = {"base_url": "<episode URL>", "client": "<episode client>", "api_key": "<episode key>"}


def call_shown(spec: str, call: dict[str, Any]) -> str:
    """The call of agent ``spec`` as ``call`` (a plan with its ``values``) makes it, for the run's
    log: ``run_agent(task['question'], base_url=<episode URL>, model='smollm2-135m', max_turns=1)``."""
    shown = {**SHOWN, **{name: repr(value) for name, value in call.get("values", {}).items()}}
    first = "task" if call["field"] is None else f"task[{call['field']!r}]"
    args = [first, *(shown[name] for name in call["positional"])]
    args += [f"{name}={shown[name]}" for name in call["keywords"]]
    return f"{spec.rpartition(':')[2]}({', '.join(args)})"


def _first_field(
    takes: str, first: inspect.Parameter, fields: Collection[str] | None, task_field: str | None
) -> str | None:
    """The task field the first parameter gets (None: the whole task dict); ConfigError when it
    names a field the tasks do not have, or conflicts with ``task_field``."""
    mapping = _is_mapping(first.annotation)
    if task_field:
        if mapping:
            raise ConfigError(
                f"{takes}: its first parameter {first.name} is annotated as the task dict, but {TASK_FIELD}="
                f"{task_field!r} passes that field's value: drop the annotation or the setting"
            )
        if fields is not None and task_field not in fields:
            raise ConfigError(
                f"{TASK_FIELD}={task_field!r} is not a field of the tasks (they have {_shown(fields)}): set it to the "
                f"field {takes.split(' takes')[0]}'s first parameter {first.name} takes"
            )
        return task_field
    if first.name == "task" or mapping:
        return None
    text = first.annotation in (str, "str")
    if fields is None:  # not known yet: a field name or str annotation is checked when they are
        return first.name if text or first.name in TEXT_NAMES else None
    if first.name in fields:
        return first.name
    if not (text or first.name in TEXT_NAMES):
        return None  # any other name: the whole task dict, as always
    guess = next((name for name in TEXT_NAMES if name in fields), None) or next(iter(sorted(fields)), "question")
    what = f"{first.name}: str" if text else first.name
    raise ConfigError(
        f"{takes}: its first parameter {what} takes a task field, but the tasks have no {first.name!r} field "
        f"(they have {_shown(fields)}): rename it to the field it takes or set {TASK_FIELD}={guess} "
        "(or name it task, unannotated, for the whole task dict)"
    )


def _is_mapping(annotation: Any) -> bool:
    """Whether a parameter annotation says a mapping (``dict``, ``dict[str, Any]``, ``Mapping``, as text too)."""
    if isinstance(annotation, str):
        return annotation.split("[")[0].rpartition(".")[2] in ("dict", "Dict", "Mapping", "MutableMapping")
    return annotation in _MAPPINGS or typing.get_origin(annotation) in _MAPPINGS


def _shown(fields: Collection[str]) -> str:
    """The tasks' fields, sorted, at most 8 (``no fields`` for none)."""
    names = sorted(fields)
    if not names:
        return "no fields"
    return ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")


def _name(fn: Any) -> str:
    return str(getattr(fn, "__name__", "solve"))
