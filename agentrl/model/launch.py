"""``agentrl train --num-processes N``: re-run the same command under ``accelerate launch``.

The parent process checks the config and prepares the model once (an alias is converted into the
cache before N processes would race to do it), then runs
``python -m accelerate.commands.launch --num_processes N --multi_gpu [--config_file F] -m agentrl train ...``
(``--multi_gpu`` is accelerate's torchrun launcher; without a GPU the processes use gloo)
with the same options and waits for it. ``accelerate launch -m agentrl train ...`` by hand works too.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import termios
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from agentrl.errors import ConfigError, one_line

if TYPE_CHECKING:
    from agentrl.config.train import TrainConfig

LAUNCHED = "AGENTRL_LAUNCHED"
"""Set in the launched processes, so they train instead of launching again."""


def inside_launch() -> bool:
    """Whether this process is one of several started by ``accelerate launch`` / torchrun."""
    return bool(os.environ.get(LAUNCHED)) or int(os.environ.get("WORLD_SIZE", "1")) > 1


def process_rank() -> int:
    """This process's rank as the launcher set it (0 when not launched)."""
    return int(os.environ.get("RANK", "0"))


def check_process_split(config: TrainConfig, num_processes: int) -> None:
    """A ConfigError unless the step's groups split evenly over the processes (a group never
    straddles two processes)."""
    if config.prompts_per_step % num_processes:
        raise ConfigError(
            f"prompts_per_step={config.prompts_per_step} does not split over {num_processes} processes: "
            "each process rolls out whole groups; use a multiple of the process count"
        )


def launch_command(num_processes: int, accelerate_config: str | None, train_args: list[str], cpu: bool) -> list[str]:
    """The ``accelerate launch`` command that runs ``agentrl train <train_args>`` in ``num_processes``."""
    if num_processes < 1:
        raise ConfigError(f"--num-processes must be >= 1, got {num_processes}")
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--num_processes",
        str(num_processes),
        "--main_process_port",
        str(_free_port()),
    ]
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
        _check_config_file(Path(name))
        return Path(name)
    names = ", ".join(sorted(p.stem for p in SHIPPED.glob("*.yaml")))
    raise ConfigError(f"--accelerate-config {name!r} is neither a shipped config ({names}) nor a file")


def _check_config_file(path: Path) -> None:
    """ConfigError unless ``path`` reads as a YAML (or JSON) mapping, as accelerate's config files are."""
    from agentrl.config.yaml_text import load_yaml

    where = f"--accelerate-config {str(path)!r}"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"{where} could not be read as UTF-8 text (an accelerate config is a YAML file): {one_line(exc)}"
        ) from None
    data = load_yaml(text, where)
    if not isinstance(data, dict):
        raise ConfigError(
            f"{where} must hold a YAML mapping of accelerate settings (as `accelerate config` "
            f"writes), got {type(data).__name__}"
        )


SHUTDOWN_TIMEOUT_S = 900
"""How long torchrun waits for the processes after Ctrl-C before it kills them (its own default,
30 s, is shorter than a step's update plus a checkpoint of a real model). A set
``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` wins."""


STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
"""The signals that stop a run cleanly, each as Ctrl-C does (:class:`agentrl.training.interrupts.InterruptGuard`):
Ctrl-C's SIGINT, SIGTERM (what SLURM, Kubernetes, systemd and ``timeout`` send before SIGKILL) and
SIGHUP (a closed terminal)."""


def detach_hung_up_terminal() -> None:
    """Point stdout and stderr at /dev/null when their terminal has hung up (SIGHUP after the
    terminal closed): every write to it would fail (EIO) and break the run's save and stop."""
    for fd in (1, 2):
        try:
            termios.tcgetattr(fd)
        except termios.error as exc:
            if exc.args and exc.args[0] == errno.EIO:  # a tty that hung up (another file: ENOTTY)
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, fd)
                os.close(null)


def run_launched(command: list[str]) -> int:
    """Run ``command`` with :data:`LAUNCHED` set; its exit status, or 128 + the signal that
    stopped the run (130 after Ctrl-C, 143 after SIGTERM, 129 after SIGHUP).

    The launcher (torchrun, inside ``accelerate launch``) runs in a session of its own and gets the
    first stop signal from here, once, whether it was sent to this process alone (a scheduler,
    ``kill``, ``timeout``) or to its whole group (a terminal's Ctrl-C or hang-up). It passes the
    signal on to the training processes (each in a session of its own) and waits for them to stop
    at one step boundary and save; this process waits with it (Python's default would kill this
    process and leave them running). Later signals are not passed on: the processes are already
    stopping, and a second one would break torchrun's own shutdown, leaving them orphaned."""
    env = {**os.environ, LAUNCHED: "1"}
    env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(SHUTDOWN_TIMEOUT_S))
    received: list[int] = []

    def note(signum: int, frame: object) -> None:
        if signum == getattr(signal, "SIGHUP", None):
            detach_hung_up_terminal()
        received.append(signum)

    main = threading.current_thread() is threading.main_thread()
    previous = {signum: signal.signal(signum, note) for signum in STOP_SIGNALS} if main else {}
    try:
        proc = subprocess.Popen(command, env=env, start_new_session=main)
        forwarded = False
        while True:
            if received and not forwarded:
                proc.send_signal(received[0])
                forwarded = True
            try:
                returncode = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                continue
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 128 + received[0] if received and returncode != 0 else returncode


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
