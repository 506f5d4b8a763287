"""``agentrl train --num-processes N``: the combination checked with the processes it would launch,
then this command run again in N processes (:mod:`agentrl.model.launch`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrl.cli.support import console


def check_launch(cfg: Any, registry: Any, num_processes: int, accelerate_config: str | None) -> None:
    """The run's combination with the processes it would launch, refused before any process starts
    (:mod:`agentrl.config.capabilities`)."""
    from agentrl.config.capabilities import launch_processes
    from agentrl.config.train import check_startup
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
    args: list[str] = []
    for flag, value in given.items():
        for item in value if isinstance(value, list) else [value]:
            if item is not None:
                args += [flag, str(item)]
    command = launch_command(num_processes, accelerate_config, args, cpu=not torch.cuda.is_available())
    console.print(f"launching {num_processes} processes: {' '.join(command[1:4])} ...", highlight=False)
    return run_launched(command, Path(given["--resume"] or given["--output-dir"]), processes=num_processes)
