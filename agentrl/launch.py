"""``agentrl train --num-processes N``: re-run the same command under ``accelerate launch``.

The parent process checks the config and prepares the model once (an alias is converted into the
cache before N processes would race to do it), then runs
``python -m accelerate.commands.launch --num_processes N --multi_gpu [--config_file F] -m agentrl train ...``
(``--multi_gpu`` is accelerate's torchrun launcher; without a GPU the processes use gloo)
with the same options and waits for it. ``accelerate launch -m agentrl train ...`` by hand works too.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

from agentrl.errors import ConfigError

LAUNCHED = "AGENTRL_LAUNCHED"
"""Set in the launched processes, so they train instead of launching again."""


def inside_launch() -> bool:
    """Whether this process is one of several started by ``accelerate launch`` / torchrun."""
    return bool(os.environ.get(LAUNCHED)) or int(os.environ.get("WORLD_SIZE", "1")) > 1


def process_rank() -> int:
    """This process's rank as the launcher set it (0 when not launched)."""
    return int(os.environ.get("RANK", "0"))


def launch_command(num_processes: int, accelerate_config: str | None, train_args: list[str],
                   cpu: bool) -> list[str]:
    """The ``accelerate launch`` command that runs ``agentrl train <train_args>`` in ``num_processes``."""
    if num_processes < 1:
        raise ConfigError(f"--num-processes must be >= 1, got {num_processes}")
    command = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(num_processes),
               "--main_process_port", str(_free_port())]
    if accelerate_config is None:  # what accelerate would otherwise warn it defaulted
        command += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    if accelerate_config is not None:
        command += ["--config_file", str(config_file(accelerate_config))]
    elif num_processes > 1:
        # torchrun's launcher; on a machine without a GPU the trainer's Accelerator(cpu=True) then
        # joins the processes over gloo (accelerate's --cpu would start a single process)
        command.append("--multi_gpu")
        if cpu:  # the CPU's cores shared out among the processes
            command += ["--num_cpu_threads_per_process", str(max(1, (os.cpu_count() or 1) // num_processes))]
    return command + ["-m", "agentrl", "train", *train_args]


SHIPPED = Path(__file__).parent / "accelerate_configs"
"""accelerate configs that come with agentrl, by name: ddp, fsdp, zero2, zero3."""


def config_file(name: str) -> Path:
    """A shipped accelerate config's path by name, or ``name`` itself when it is a file."""
    shipped = SHIPPED / f"{name}.yaml"
    if shipped.is_file():
        return shipped
    if Path(name).is_file():
        return Path(name)
    names = ", ".join(sorted(p.stem for p in SHIPPED.glob("*.yaml")))
    raise ConfigError(f"--accelerate-config {name!r} is neither a shipped config ({names}) nor a file")


SHUTDOWN_TIMEOUT_S = 900
"""How long torchrun waits for the processes after Ctrl-C before it kills them (its own default,
30 s, is shorter than a step's update plus a checkpoint of a real model). A set
``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` wins."""


def run_launched(command: list[str]) -> int:
    """Run ``command`` with :data:`LAUNCHED` set; its exit status (130 after Ctrl-C).

    Ctrl-C reaches the launcher (torchrun), which passes it on to the training processes (each in
    a session of its own) and waits for them to save and stop; this process waits with it instead
    of being interrupted (Python's default would kill the launcher and return while they run on)."""
    env = {**os.environ, LAUNCHED: "1"}
    env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(SHUTDOWN_TIMEOUT_S))
    interrupted = False

    def note(signum: int, frame: object) -> None:
        nonlocal interrupted
        interrupted = True

    previous = signal.signal(signal.SIGINT, note) if threading.current_thread() is threading.main_thread() else None
    try:
        returncode = subprocess.Popen(command, env=env).wait()
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    return 130 if interrupted and returncode != 0 else returncode


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
