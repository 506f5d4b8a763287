"""``agentrl train --num-processes N``: the combination checked with the processes it would launch,
then this command run again in N processes (:mod:`agentrl.model.launch`); with the ``ray``
section, processes 1..N-1 on Ray's nodes beside this one (:func:`on_ray`)."""

from __future__ import annotations

import contextlib
import os
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer

from agentrl.cli.support import console


def check_launch(cfg: Any, registry: Any, num_processes: int, accelerate_config: str | None) -> None:
    """The run's combination with the processes it would launch, refused before any process starts
    (:mod:`agentrl.config.capabilities`)."""
    from agentrl.config.capabilities import launch_processes
    from agentrl.config.startup import check_startup
    from agentrl.config.yaml_text import load_yaml
    from agentrl.model.launch import check_accelerate_settings, config_file

    path = config_file(accelerate_config) if accelerate_config else None
    settings = load_yaml(path.read_text(encoding="utf-8"), str(path)) if path else None
    if settings is not None:  # one host, as many processes as asked
        check_accelerate_settings(settings, num_processes, str(accelerate_config))
    check_startup(cfg, registry, processes=launch_processes(num_processes, settings))


def launch(cfg: Any, num_processes: int, accelerate_config: str | None, given: dict[str, Any]) -> int:
    """Check the split and prepare the model here, then run this command in ``num_processes``
    processes under ``accelerate launch``; their exit status."""
    import torch

    from agentrl.model.launch import check_process_split, launch_command, run_launched
    from agentrl.model.loading import resolve_model

    check_process_split(cfg, num_processes)
    if not given["--resume"]:  # every process must agree on the run dir
        from agentrl.rundir.directory import run_dir_for

        given["--output-dir"] = str(run_dir_for(cfg))
    resolve_model(cfg.model)  # an alias is converted once, here, not by every process at once
    args = _flags(given)
    command = launch_command(num_processes, accelerate_config, args, cpu=not torch.cuda.is_available())
    console.print(f"launching {num_processes} processes: {' '.join(command[1:4])} ...", highlight=False)
    return run_launched(command, Path(given["--resume"] or given["--output-dir"]), processes=num_processes)


RAY_AND_ACCELERATE = (
    "--accelerate-config with the ray section: Ray places the trainer processes (one per "
    "ray.trainer_resources); accelerate configs are for the processes of one host: drop one of them"
)


@contextlib.contextmanager
def on_ray(
    cfg: Any, manager: Any, num_processes: int | None, accelerate_config: str | None, given: dict[str, Any]
) -> Iterator[None]:
    """Process 0 of a run on Ray (``cfg.ray`` set): processes 1..N-1 placed and started as Ray actors
    (:mod:`agentrl.cluster.trainers`), the process group formed, the banner line saying where each
    runs; inside, this process trains; at the end the others finish (or are ended). One line
    instead of a collective's error when another process died."""
    from agentrl.cluster.trainers import TrainerGroup
    from agentrl.config.cluster import ray_options
    from agentrl.errors import ConfigError
    from agentrl.model.launch import RESUME_FLAGS, check_process_split, resume_command
    from agentrl.model.loading import resolve_model

    if accelerate_config is not None:
        raise ConfigError(RAY_AND_ACCELERATE)
    count = num_processes or 1
    if count > 1:
        check_launch(cfg, manager.registry, count, None)
        check_process_split(cfg, count)
        resolve_model(cfg.model)  # a bad name fails before any process starts; an alias converts once here
    flags = shlex.split(os.environ.get(RESUME_FLAGS, ""))
    if "--ray" not in flags:  # a ray section from the config file or --set: the resume names it too
        os.environ[RESUME_FLAGS] = shlex.join(["--ray", *flags])
    run_dir = Path(given["--resume"] or cfg.output_dir)
    args, config_text = trainer_args(cfg, given)
    group = TrainerGroup(ray_options(cfg.ray), count, args, config_text, resume_command(run_dir))
    finished = False  # the others finish too: wait for them
    try:
        console.print(group.start(), highlight=False)
        group.join()
        yield
        finished = True
    except typer.Exit as exc:  # a stop signal: every process stops at the same step and saves
        finished = exc.exit_code >= 128
        raise
    except Exception as exc:
        explained = group.explain(exc)
        if explained is None:
            raise
        raise explained from None
    finally:
        group.close(wait=finished)


def trainer_args(cfg: Any, given: dict[str, Any]) -> tuple[list[str], str | None]:
    """(``agentrl train`` flags, config file text) of processes 1..N-1: a resume's own flags; for a
    new run, its run dir, the plugin flags and the whole config (written to a file on each node)."""
    import yaml

    if given["--resume"]:
        return _flags({k: v for k, v in given.items() if k != "--ray"}), None
    plugins = {flag: given[flag] for flag in ("--plugin", "--disable-plugin")}
    args = ["--output-dir", str(cfg.output_dir), *_flags(plugins)]
    return args, yaml.safe_dump(cfg.to_dict(), sort_keys=False)


def _flags(given: dict[str, Any]) -> list[str]:
    """``given`` (flag -> value, a list for a repeated flag, True for a switch) as arguments."""
    args: list[str] = []
    for flag, value in given.items():
        for item in value if isinstance(value, list) else [value]:
            if item is True:
                args.append(flag)
            elif item is not None and item is not False:
                args += [flag, str(item)]
    return args
