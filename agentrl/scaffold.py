"""``agentrl new``: scaffold an installable plugin package for an env or a reward function.

``agentrl new env NAME [--dir DIR] [--multi-turn | --tools]`` and ``agentrl new reward NAME [--dir DIR]`` write a
package ``agentrl-env-NAME`` / ``agentrl-reward-NAME`` (default directory: that name, in the current
directory) holding:

* ``pyproject.toml`` with an entry point in the ``agentrl`` group, so ``pip install -e DIR`` makes
  ``--env NAME`` / ``--reward NAME`` work with no other step;
* the module ``agentrl_env_NAME`` / ``agentrl_reward_NAME``: a short documented example and the
  ``agentrl_register_envs`` / ``agentrl_register_rewards`` hook implementation;
* ``README.md`` and ``tests/test_NAME.py``, which runs ``agentrl.testing.check_env`` /
  ``check_reward`` and passes as generated (``pytest`` in DIR; no install needed).

The library functions (:func:`new_env`, :func:`new_reward`) raise :class:`agentrl.ConfigError` for
a bad name or an existing directory; the CLI prints that one line and exits 2.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from string import Template

import typer

from agentrl.errors import ConfigError, PluginError

app = typer.Typer(rich_markup_mode=None, help="Scaffold a new plugin package (an env or a reward function).", no_args_is_help=True)

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Scaffold:
    """What :func:`new_env` / :func:`new_reward` wrote, and the commands to run next."""

    kind: str
    """``env`` or ``reward``."""
    name: str
    """The component name (``--env NAME`` / ``--reward NAME``)."""
    directory: Path
    """The package directory (pass it to ``pip install -e``)."""
    module: str
    """The importable module (``agentrl_env_NAME``)."""
    files: list[Path] = field(default_factory=list)
    """Every file written, under ``directory``."""

    @property
    def next_commands(self) -> list[str]:
        """The shell commands that install, test and use the new package."""
        use = (f"agentrl train --env {self.name}" if self.kind == "env"
               else f"agentrl train --env math --reward accuracy:1.0 --reward {self.name}:0.2")
        return [f"pip install -e {self.directory}", f"pytest {self.directory / 'tests'}", use]


MAX_NAME_LENGTH = 64
"""The longest component name ``agentrl new`` takes: it names the package's folder, module and test
file (``agentrl-reward-NAME``, ``tests/test_NAME.py``), which must fit a file system's 255-byte names."""


def check_name(kind: str, name: str) -> None:
    """Raise ConfigError unless ``name`` is an ASCII Python identifier starting with a letter, of at
    most :data:`MAX_NAME_LENGTH` characters."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(f"{kind} name {name!r} is not valid: use a Python identifier (ASCII letters, digits "
                          "and underscores, starting with a letter), e.g. 'countdown'")
    if len(name) > MAX_NAME_LENGTH:
        raise ConfigError(f"{kind} name {name[:20]!r}... is {len(name)} characters long: at most {MAX_NAME_LENGTH} "
                          "(it names the package's folder and files)")


def class_name(name: str) -> str:
    """``my_game`` -> ``MyGame``: the CamelCase stem of the generated class."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part)


def new_env(name: str, directory: str | Path | None = None, multi_turn: bool = False,
            tools: bool = False) -> Scaffold:
    """Write the package ``agentrl-env-NAME`` into ``directory`` (default ``./agentrl-env-NAME``):
    a single-turn env, a multi-turn one (``multi_turn``) or a tool-using ``ToolEnv`` (``tools``)."""
    check_name("env", name)
    if multi_turn and tools:
        raise ConfigError("--multi-turn and --tools are exclusive: a tool env is multi-turn already "
                          "(one turn per round of tool calls); pick one")
    module = f"agentrl_env_{name}"
    values = {"name": name, "module": module, "dist": f"agentrl-env-{name}", "Class": f"{class_name(name)}Env",
              "kind": "env", "entry": f"{name}_env"}
    if tools:
        source, test, howto = _TOOL_ENV, _TOOL_ENV_TEST, _TOOL_ENV_HOWTO
        summary = "a tool-using environment (a typed tool the reward needs)"
    else:
        source, test, howto = (_MULTI_TURN_ENV if multi_turn else _SINGLE_TURN_ENV), _ENV_TEST, _ENV_HOWTO
        summary = ("a multi-turn environment (feedback and another try after a wrong reply)" if multi_turn
                   else "a single-turn environment")
    readme = Template(_ENV_README).safe_substitute(howto=howto)
    return _write("env", name, directory, module, values, {
        "pyproject.toml": _PYPROJECT, f"{module}/__init__.py": source, "README.md": readme,
        f"tests/test_{name}.py": test,
    }, summary)


def new_reward(name: str, directory: str | Path | None = None) -> Scaffold:
    """Write the package ``agentrl-reward-NAME`` into ``directory`` (default ``./agentrl-reward-NAME``)."""
    check_name("reward", name)
    module = f"agentrl_reward_{name}"
    values = {"name": name, "module": module, "dist": f"agentrl-reward-{name}", "fn": f"{name}_reward",
              "kind": "reward", "entry": f"{name}_reward"}
    return _write("reward", name, directory, module, values, {
        "pyproject.toml": _PYPROJECT, f"{module}/__init__.py": _REWARD, "README.md": _REWARD_README,
        f"tests/test_{name}.py": _REWARD_TEST,
    }, "a reward function")


def _write(kind: str, name: str, directory: str | Path | None, module: str, values: dict[str, str],
           templates: dict[str, str], summary: str) -> Scaffold:
    """Render ``templates`` (relative path -> text) into a new directory; refuse an existing one."""
    target = Path(directory if directory is not None else values["dist"]).expanduser()
    if os.path.lexists(target):
        raise ConfigError(f"directory {str(target)!r} already exists; agentrl new never overwrites: "
                          "pass another --dir or remove it")
    values = {**values, "summary": summary}
    written: list[Path] = []
    path = target
    try:
        target.mkdir(parents=True)
        for relative, template in templates.items():
            path = target / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(Template(template).substitute(values))
            written.append(path)
    except OSError as exc:  # a name too long for the file system, no space, no permission
        if path != target:  # this call created target: leave nothing half-written
            shutil.rmtree(target, ignore_errors=True)
        raise ConfigError(f"could not write {str(path)!r}: {exc.strerror or exc}; nothing was kept") from None
    return Scaffold(kind=kind, name=name, directory=target, module=module, files=written)


def registered_owner(kind: str, name: str) -> str | None:
    """The plugin that already registers ``name`` of ``kind`` (or a plugin named like the new
    package's entry point), or None; None too when the installed plugins fail to load."""
    from agentrl.plugins import load_plugins

    try:
        manager = load_plugins()
    except PluginError:
        return None
    if name in manager.registry.names(kind):
        return manager.registry.get(kind, name).plugin
    entry = f"{name}_{kind}"
    return entry if entry in manager.plugins else None


def _report(scaffold: Scaffold) -> None:
    """Print what was written and the commands to run next."""
    typer.echo(f"wrote {scaffold.directory}/ ({scaffold.kind} {scaffold.name!r}, module {scaffold.module}):")
    for path in scaffold.files:
        typer.echo(f"  {path.relative_to(scaffold.directory)}")
    typer.echo("next:")
    for command in scaffold.next_commands:
        typer.echo(f"  {command}")


def _scaffold_command(kind: str, name: str, make: Callable[[], Scaffold]) -> None:
    """Run ``make`` under the CLI's error handling (one line, exit 2) after checking the name."""
    from agentrl.cli import _run

    def run() -> None:
        check_name(kind, name)
        owner = registered_owner(kind, name)
        if owner is not None:
            raise ConfigError(f"{kind} name {name!r} is taken: plugin {owner!r} already registers it; pick "
                              "another name (agentrl plugins lists the registered ones)")
        _report(make())

    _run(run)


@app.command("env")
def env_command(
    name: str = typer.Argument(..., help="Env name, a Python identifier: what --env NAME selects."),
    directory: str = typer.Option(None, "--dir", help="Package directory to create. [default: ./agentrl-env-NAME]"),
    multi_turn: bool = typer.Option(False, "--multi-turn", help="A multi-turn example (feedback, another try)."),
    tools: bool = typer.Option(False, "--tools", help="A tool-using example: a ToolEnv with a typed tool the "
                               "reward needs."),
) -> None:
    """Scaffold an installable env package: pyproject entry point, module, README, passing test."""
    _scaffold_command("env", name, lambda: new_env(name, directory, multi_turn, tools))


@app.command("reward")
def reward_command(
    name: str = typer.Argument(..., help="Reward name, a Python identifier: what --reward NAME selects."),
    directory: str = typer.Option(None, "--dir", help="Package directory to create. [default: ./agentrl-reward-NAME]"),
) -> None:
    """Scaffold an installable reward-function package: pyproject entry point, module, README, passing test."""
    _scaffold_command("reward", name, lambda: new_reward(name, directory))


# -- templates (string.Template: $name, $module, $dist, $Class / $fn, $entry, $summary) -----------

_PYPROJECT = '''\
[build-system]
requires = ["setuptools>=69"]
build-backend = "setuptools.build_meta"

[project]
name = "$dist"
version = "0.1.0"
description = "agentrl plugin: $summary ($kind '$name')"
readme = "README.md"
requires-python = ">=3.10"
dependencies = ["agentrl"]

[project.optional-dependencies]
test = ["pytest>=8"]

# agentrl finds plugins through this entry-point group: once the package is installed,
# `agentrl plugins` lists it and `--$kind $name` selects what it registers.
[project.entry-points.agentrl]
$entry = "$module"

[tool.setuptools]
packages = ["$module"]

[tool.pytest.ini_options]
testpaths = ["tests"]
pythonpath = ["."]
'''

_SINGLE_TURN_ENV = r'''"""$dist: the ``$name`` environment for agentrl.

Installed (``pip install -e .``), it is found through the ``agentrl`` entry point in
pyproject.toml: ``agentrl train --env $name``. The example below is a single-turn task; replace
its tasks, prompt and scoring with yours, and keep ``tests/`` passing (``agentrl.testing.check_env``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from agentrl import Env, Message, Task, hookimpl

_INTEGER = re.compile(r"-?\d+")


def make_task(n: int) -> Task:
    """One task: the question the model sees and the answer the env checks."""
    return {"question": f"What number comes after {n}? Put it in \\boxed{{}}.", "answer": str(n + 1)}


class $Class(Env):
    """Example: say the number after ``n``. One reply, reward 1.0 if its last number is right.

    ``train_tasks`` and ``eval_tasks`` are disjoint: evaluation measures held-out accuracy.
    """

    max_turns = 1

    def train_tasks(self) -> Sequence[Task]:
        """Tasks to train on (any indexable sequence of dicts)."""
        return [make_task(n) for n in range(100, 1000)]

    def eval_tasks(self) -> Sequence[Task]:
        """Held-out tasks, never trained on."""
        return [make_task(n) for n in range(10, 100)]

    def start(self, task: Task) -> list[Message]:
        """The messages that open an episode on ``task``."""
        return [{"role": "user", "content": task["question"]}]

    def respond(self, text: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """Score the model's reply: (messages to append, reward, terminated, info)."""
        numbers = _INTEGER.findall(text)
        correct = bool(numbers) and numbers[-1] == self.task["answer"]
        return [], float(correct), True, {"success": correct}


@hookimpl
def agentrl_register_envs(register: Callable[..., None]) -> None:
    """Register the env under the name ``--env`` selects."""
    register("$name", $Class)
'''

_MULTI_TURN_ENV = r'''"""$dist: the ``$name`` environment for agentrl.

Installed (``pip install -e .``), it is found through the ``agentrl`` entry point in
pyproject.toml: ``agentrl train --env $name``. The example below is multi-turn: a wrong reply
gets a hint as a user message and the model tries again. Replace its tasks, prompt and scoring
with yours, and keep ``tests/`` passing (``agentrl.testing.check_env``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from agentrl import Env, EnvError, Message, Task, hookimpl

WORDS = ("apple", "river", "stone", "cloud", "tiger", "piano", "lemon", "candle", "garden", "rocket",
         "silver", "window", "planet", "forest", "bottle", "castle", "dragon", "pencil", "orange", "guitar")


def make_task(word: str) -> Task:
    """One task: the question the model sees and the answer the env checks."""
    return {"question": f"Spell the word {word!r} backwards. Reply with just the result.", "answer": word[::-1]}


class $Class(Env):
    """Example: spell a word backwards in at most ``max_turns`` tries.

    A wrong reply gets a hint ("Not quite: it starts with 'e'. Try again.") and another turn;
    the reward is ``1 - 0.25 * (turn - 1)`` on the turn that gets it right, 0 otherwise.
    ``info["metrics"]`` is logged as ``env/solved`` and ``env/turns``.
    """

    def __init__(self, max_turns: int = 3) -> None:
        super().__init__()
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or not 1 <= max_turns <= 4:
            raise EnvError(f"$Class: max_turns must be an integer in 1..4, got {max_turns!r}")
        self.max_turns = max_turns

    def train_tasks(self) -> Sequence[Task]:
        """Tasks to train on (any indexable sequence of dicts)."""
        return [make_task(word) for word in WORDS[4:]]

    def eval_tasks(self) -> Sequence[Task]:
        """Held-out tasks, never trained on."""
        return [make_task(word) for word in WORDS[:4]]

    def start(self, task: Task) -> list[Message]:
        """The messages that open an episode on ``task``."""
        return [{"role": "user", "content": task["question"]}]

    def gold_reply(self, task: Task) -> str:
        """The reply that earns full marks (``check_env`` steps it)."""
        return task["answer"]

    def respond(self, text: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """Score the reply; a wrong one gets a hint and the episode goes on (until ``max_turns``)."""
        answer = self.task["answer"]
        solved = answer in re.findall(r"[a-z]+", text.lower())
        info = {"success": solved, "metrics": {"solved": float(solved), "turns": float(self.turn)}}
        if solved:
            return [], 1.0 - 0.25 * (self.turn - 1), True, info
        hint = f"Not quite: it starts with {answer[0]!r}. Try again."
        return [{"role": "user", "content": hint}], 0.0, False, info


@hookimpl
def agentrl_register_envs(register: Callable[..., None]) -> None:
    """Register the env under the name ``--env`` selects."""
    register("$name", $Class)
'''

_ENV_TEST = '''"""$dist meets agentrl's env contract (the same checks agentrl runs on its own envs)."""

from agentrl import PluginManager
from agentrl.testing import check_env

import $module
from $module import $Class


def test_passes_check_env():
    check_env($Class)


def test_gold_reply_earns_full_marks_and_a_wrong_one_nothing():
    env = $Class()
    task = env.eval_tasks()[0]
    env.reset(seed=0, options={"task": task})
    assert env.step("I do not know.")[1] == 0.0
    env.reset(seed=0, options={"task": task})
    assert env.step(env.gold_reply(task))[1:3] == (1.0, True)


def test_registers_the_env_by_name():
    manager = PluginManager()
    manager.register_plugin($module, name="$entry")
    assert manager.registry.get("env", "$name").factory is $Class
'''

_REWARD = r'''"""$dist: the ``$name`` reward function for agentrl.

Installed (``pip install -e .``), it is found through the ``agentrl`` entry point in
pyproject.toml: ``agentrl train --reward $name:0.2`` (``--reward`` replaces the env's default
rewards: list those again to keep them). Replace the example with your scoring, and keep
``tests/`` passing (``agentrl.testing.check_reward``).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from agentrl import Trajectory, hookimpl

_TOKEN = re.compile(r"-?\d+(?:\.\d+)?|\w+")


def $fn(trajectories: list[Trajectory]) -> list[float | None]:
    """Example: 1.0 when the task's answer is a word or number of the final reply, else 0.0.

    Called once per rollout batch with whole episodes; returns one score per trajectory. ``None``
    means "not scored" (here: the task has no ``answer``): it is left out of this reward's mean
    instead of counting as 0.
    """
    scores: list[float | None] = []
    for trajectory in trajectories:
        answer = trajectory.task.get("answer")
        if answer is None:
            scores.append(None)
            continue
        scores.append(1.0 if str(answer) in _TOKEN.findall(trajectory.completion_text) else 0.0)
    return scores


@hookimpl
def agentrl_register_rewards(register: Callable[..., None]) -> None:
    """Register the reward under the name ``--reward`` selects."""
    register("$name", $fn)
'''

_REWARD_TEST = '''"""$dist meets agentrl's reward contract (the same checks agentrl runs on its own rewards)."""

from agentrl import PluginManager
from agentrl.testing import check_reward, make_trajectory

import $module
from $module import $fn


def episode(reply, task):
    return make_trajectory([{"role": "user", "content": task["question"]},
                            {"role": "assistant", "content": reply}], task)


ADDITION = {"question": "What is 2 + 2?", "answer": "4"}


def test_passes_check_reward():
    check_reward($fn, [episode("It is 4.", ADDITION), episode("No idea.", ADDITION)])


def test_scores_right_wrong_and_unscorable_episodes():
    no_answer = {"question": "Write a haiku."}
    replies = [episode("It is 4.", ADDITION), episode("It is 44.", ADDITION), episode("Snow falls.", no_answer)]
    assert $fn(replies) == [1.0, 0.0, None]


def test_registers_the_reward_by_name():
    manager = PluginManager()
    manager.register_plugin($module, name="$entry")
    assert manager.registry.get("reward", "$name").factory is $fn
'''

_ENV_README = '''# $dist

An agentrl plugin: $summary, registered as `--env $name`.

```bash
pip install -e .          # registers the entry point; `agentrl plugins` lists it
pytest                    # agentrl.testing.check_env and the example's own tests
agentrl train --env $name
agentrl eval --model runs/<run> --env $name
```

$howto
Constructor arguments come from the run config: `agentrl train --env $name --set env_args.KEY=VALUE`.
'''

_REWARD_README = '''# $dist

An agentrl plugin: $summary, registered as `--reward $name`.

```bash
pip install -e .          # registers the entry point; `agentrl plugins` lists it
pytest                    # agentrl.testing.check_reward and the example's own tests
agentrl train --env math --reward accuracy:1.0 --reward $name:0.2
```

The reward is `$fn` in `$module/__init__.py`: it receives whole episodes
(`list[agentrl.Trajectory]`: messages, task, turns, tool calls) and returns one `float` or `None`
(not scored) per episode. `--reward` replaces the env's default rewards, so list those again to
keep them; the weight after the colon multiplies this reward in the total.
'''

_ENV_HOWTO = '''The env is `$Class` in `$module/__init__.py`: replace the example's tasks (`train_tasks`,
`eval_tasks`, kept disjoint), opening messages (`start`) and scoring (`respond`).'''

_TOOL_ENV_HOWTO = '''The env is `$Class` in `$module/__init__.py`, an `agentrl.ToolEnv`: the model calls the
typed tool `price` with `<tool_call>{"name": "price", "arguments": {...}}</tool_call>`, gets its result
as a `tool` message, and ends the episode with an answer that calls no tool, which `score_answer`
scores. Each task carries its own prices and the prompt never shows them, so only the tool can tell
the model what it needs. Replace the tool (any function with type hints and an `Args:` docstring),
the tasks (`train_tasks`, `eval_tasks`, kept disjoint), `instructions` and `score_answer`. Its
default rewards add `tool_use` (0.2), a small bonus for a tool call that ran, so a model that
rarely calls tools at first still gets a signal.'''

_TOOL_ENV = r'''"""$dist: the ``$name`` environment for agentrl, a tool-using env.

Installed (``pip install -e .``), it is found through the ``agentrl`` entry point in
pyproject.toml: ``agentrl train --env $name``. The example is a ``ToolEnv``: the model asks the
typed tool ``price`` for what the question leaves out, gets each result back as a ``tool``
message, and ends the episode with an answer that calls no tool (reward 1.0 if its final number
is the right total). Every task has its own prices and the prompt never shows them, so the
reward needs the tool: without it the model can only guess. Replace the tool, the tasks and
``score_answer`` with yours, and keep ``tests/`` passing (``agentrl.testing.check_env``).
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Callable, Sequence
from typing import Any

from agentrl import Task, Tool, ToolEnv, ToolError, format_tool_call, hookimpl

ITEMS = ("apple", "bottle", "candle", "lemon", "notebook", "pencil", "rope", "towel")
NUM_EVAL = 64
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_INTEGER = re.compile(r"-?\d+")


def _units(count: int, item: str) -> str:
    return f"{count} {item}" + ("s" if count != 1 else "")


def make_tasks(seed: int = 0) -> list[Task]:
    """Every task, shuffled: two items, how many of each, and that task's own prices."""
    rng = random.Random(seed)
    tasks = []
    for (first, second), a, b in itertools.product(itertools.combinations(ITEMS, 2), range(1, 6), range(1, 6)):
        prices = {item: rng.randint(2, 30) for item in ITEMS}
        question = (f"What do {_units(a, first)} and {_units(b, second)} cost in total at today's prices? "
                    "Give the final answer as \\boxed{N}.")
        tasks.append({"id": f"$name-{first}-{a}-{second}-{b}", "question": question, "order": {first: a, second: b},
                      "prices": prices, "answer": str(a * prices[first] + b * prices[second])})
    rng.shuffle(tasks)
    return tasks


def final_number(text: str) -> str | None:
    """The last integer in the last ``\\boxed{}``, else in the whole text; None if there is none."""
    boxed = _BOXED.findall(text)
    numbers = _INTEGER.findall(boxed[-1] if boxed else text)
    return numbers[-1] if numbers else None


class $Class(ToolEnv):
    """Example: the total price of two items, whose prices only the ``price`` tool knows.

    A turn with tool calls gets one ``tool`` message per call (a bad call: ``"Error: ..."``) and
    reward 0; the first turn without one is the answer: 1.0 if right, else 0. At most
    ``max_turns`` (4) turns.
    """

    instructions = ("Answer the question. Prices change every day: look each one up with the price "
                    "tool, then give the total as \\boxed{N}.")
    demonstrations = ((
        {"role": "user", "content": "What do 2 lemons and 1 towel cost in total at today's prices? "
                                    "Give the final answer as \\boxed{N}."},
        {"role": "assistant", "content": format_tool_call("price", item="lemon", quantity=2) + "\n"
                                         + format_tool_call("price", item="towel", quantity=1)},
        {"role": "tool", "name": "price", "content": "14"},
        {"role": "tool", "name": "price", "content": "9"},
        {"role": "assistant", "content": "14 + 9 = 23, so the total is \\boxed{23}."},
    ),)
    """A worked example in the prompt: a small model copies a call format it has seen."""
    default_rewards = {"tool_use": 0.2}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(tools=[Tool(self.price)], **kwargs)
        tasks = make_tasks()
        self._eval, self._train = tasks[:NUM_EVAL], tasks[NUM_EVAL:]

    def train_tasks(self) -> Sequence[Task]:
        """Tasks to train on (any indexable sequence of dicts)."""
        return self._train

    def eval_tasks(self) -> Sequence[Task]:
        """Held-out tasks, never trained on."""
        return self._eval

    def price(self, item: str, quantity: int = 1) -> int:
        """Look up what some units of an item cost at today's prices.

        Args:
            item: The item, e.g. "apple".
            quantity: How many units of it.
        """
        prices = self.task["prices"] if self.task else {}
        name = item.strip().lower()
        name = name if name in prices else name.removesuffix("s")
        if name not in prices:
            raise ToolError(f"no item {item!r}; the shop sells {', '.join(prices)}")
        if quantity < 1:
            raise ToolError(f"quantity must be at least 1, got {quantity}")
        return quantity * prices[name]

    def score_answer(self, text: str) -> float:
        """1.0 if the final number is the total at this task's prices, else 0.0."""
        return float(self.task is not None and final_number(text) == self.task["answer"])


@hookimpl
def agentrl_register_envs(register: Callable[..., None]) -> None:
    """Register the env under the name ``--env`` selects."""
    register("$name", $Class)
'''

_TOOL_ENV_TEST = r'''"""$dist meets agentrl's env contract, and its reward needs its tool."""

from agentrl import PluginManager, format_tool_call
from agentrl.testing import check_env

import $module
from $module import $Class


def test_passes_check_env():
    check_env($Class)


def test_the_prompt_describes_the_tool_but_not_the_prices():
    env = $Class()
    task = env.eval_tasks()[0]
    messages, _ = env.reset(seed=0, options={"task": task})
    assert "- price(item: string, quantity: integer): Look up" in messages[0]["content"]
    assert messages[-1]["content"] == task["question"]
    repriced = {**task, "prices": {item: price + 1 for item, price in task["prices"].items()}}
    assert env.reset(seed=0, options={"task": repriced})[0] == messages  # only the tool tells the prices


def test_asking_the_tool_then_answering_earns_full_marks():
    env = $Class()
    task = env.eval_tasks()[0]
    env.reset(seed=0, options={"task": task})
    calls = "\n".join(format_tool_call("price", item=item, quantity=n) for item, n in task["order"].items())
    messages, reward, terminated, truncated, info = env.step(calls)
    assert [m["role"] for m in messages] == ["tool", "tool"] and (reward, terminated, truncated) == (0.0, False, False)
    assert (info["tool_calls"], info["tool_errors"]) == (2, 0)
    total = sum(int(m["content"]) for m in messages)
    assert env.step(f"The total is \\boxed{{{total}}}.")[1:3] == (1.0, True)


def test_bad_calls_come_back_as_errors_and_a_wrong_total_earns_nothing():
    env = $Class()
    task = env.eval_tasks()[0]
    env.reset(seed=0, options={"task": task})
    messages, reward, _, _, info = env.step(format_tool_call("price", item="unicorn")
                                            + format_tool_call("price", item="apple", quantity="two"))
    assert messages[0]["content"].startswith("Error: no item 'unicorn'; the shop sells apple")
    assert messages[1]["content"] == "Error: price: argument 'quantity' must be integer, got 'two'"
    assert (reward, info["tool_errors"]) == (0.0, 2)
    assert env.step(f"\\boxed{{{int(task['answer']) + 1}}}")[1:3] == (0.0, True)


def test_each_task_has_its_own_prices():
    tasks = $Class().train_tasks()
    assert len({tuple(t["prices"].values()) for t in tasks[:50]}) == 50


def test_registers_the_env_by_name():
    manager = PluginManager()
    manager.register_plugin($module, name="$entry")
    assert manager.registry.get("env", "$name").factory is $Class
'''
