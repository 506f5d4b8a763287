"""``agentrl new env|reward NAME``: the commands over :mod:`agentrl.cli.scaffold` (which writes the
package); here the name is checked against the installed plugins and the result printed."""

from __future__ import annotations

from collections.abc import Callable

import typer

from agentrl.cli.scaffold import Scaffold, check_name, new_env, new_reward
from agentrl.cli.support import run_guarded
from agentrl.errors import ConfigError, PluginError

app = typer.Typer(
    rich_markup_mode=None, help="Scaffold a new plugin package (an env or a reward function).", no_args_is_help=True
)


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

    def run() -> None:
        check_name(kind, name)
        owner = registered_owner(kind, name)
        if owner is not None:
            raise ConfigError(
                f"{kind} name {name!r} is taken: plugin {owner!r} already registers it; pick "
                "another name (agentrl plugins lists the registered ones)"
            )
        _report(make())

    run_guarded(run)


@app.command("env")
def env_command(
    name: str = typer.Argument(..., help="Env name, a Python identifier: what --env NAME selects."),
    directory: str = typer.Option(None, "--dir", help="Package directory to create. [default: ./agentrl-env-NAME]"),
    multi_turn: bool = typer.Option(False, "--multi-turn", help="A multi-turn example (feedback, another try)."),
    tools: bool = typer.Option(
        False, "--tools", help="A tool-using example: a ToolEnv with a typed tool the reward needs."
    ),
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
