"""``agentrl train --num-processes N``: re-run the same command under ``accelerate launch``.

The parent process checks the config and prepares the model once (an alias is converted into the
cache before N processes would race to do it), then runs
``python -m agentrl.model.launcher --num_processes N --multi_gpu [--config_file F] -m agentrl train ...``
(accelerate's own launcher, :mod:`agentrl.model.launcher`; ``--multi_gpu`` is its torchrun launcher;
without a GPU the processes use gloo) with the same options and waits for it.
``accelerate launch -m agentrl train ...`` by hand works too.

No process outlives the run. The launcher and each training process ask the kernel for SIGKILL when
their parent ends (Linux's ``PR_SET_PDEATHSIG``, :func:`die_with_parent`), then check that the
parent they were started by is still theirs (it may have ended before they asked); a thread in
each also watches its parent id (the same where ``prctl`` is missing). So ``kill -9`` of the
``agentrl train`` a user sees ends the launcher at once, and the launcher's end the training
processes (each of which torchrun starts in a session of its own, out of reach of a process
group's signal). A kill leaves no time to save (as for one process): ``--resume`` continues from
the newest checkpoint. The run dir's lock is held by every process of the run
(:meth:`agentrl.rundir.lock.RunLock.share`) and goes with the last of them.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shlex
import signal
import socket
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.errors import ConfigError, one_line
from agentrl.rundir import lock as run_lock

if TYPE_CHECKING:
    from agentrl.config.train import TrainConfig

LAUNCHED = "AGENTRL_LAUNCHED"
"""Set in the launched processes, so they train instead of launching again."""
OWN_ERRORS = "AGENTRL_OWN_ERRORS"
"""Set in a trainer process on a Ray node: it says its config errors itself (process 0, on another
node, may not find them); otherwise only process 0 says an error every process finds."""
PARENT_PID = "AGENTRL_PARENT_PID"
"""The pid of the process that started this one (the top one for the launcher, the launcher for a
training process): :func:`die_with_parent` ends this one when that one ends."""
PROCESSES = "AGENTRL_NUM_PROCESSES"
"""How many processes agentrl's launcher started the run in: each checks that it is one of them
(:func:`check_world`)."""
RESUME_FLAGS = "AGENTRL_RESUME_FLAGS"
"""The flags ``agentrl train --resume RUN_DIR`` of this run needs (:func:`resume_command`)."""
WATCH_INTERVAL_S = 1.0
"""How often the thread of :func:`die_with_parent` looks at the parent's id."""


def inside_launch() -> bool:
    """Whether this process is one of several started by ``accelerate launch`` / torchrun."""
    return bool(os.environ.get(LAUNCHED)) or int(os.environ.get("WORLD_SIZE", "1")) > 1


def process_rank() -> int:
    """This process's rank as the launcher set it (0 when not launched)."""
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    """How many processes this one trains with, as torchrun (``WORLD_SIZE``) or an MPI launcher
    (the variables accelerate reads too) says; 1 when nothing says."""
    for name in ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 1


ONE_HOST = (
    "agentrl's launcher starts processes on this host only; for several machines use --ray "
    "(docs/guides/multi-node.md) or `torchrun --nnodes` on each machine (docs/guides/scaling.md)"
)


def check_world() -> None:
    """A ConfigError unless this process is one of as many as its launcher meant to start: one
    started by agentrl's launcher checks the count that launcher passed (:data:`PROCESSES`); one
    that ``accelerate launch`` started for several processes or machines (``MASTER_ADDR`` set)
    but alone (no ``WORLD_SIZE``: accelerate's one-process launcher, for a ``MULTI_CPU`` or ``NO``
    config, expects ``mpirun`` to start the rest) is refused too, instead of training as a
    separate one-process run on each machine."""
    world = world_size()
    expected = os.environ.get(PROCESSES, "") if os.environ.get(LAUNCHED) else ""
    if expected.isdigit() and int(expected) != world:
        raise ConfigError(
            f"agentrl's launcher started this run in {expected} processes, but this one sees a world of "
            f"{world} (WORLD_SIZE={os.environ.get('WORLD_SIZE', 'unset')}): its accelerate config did not "
            f"start them as one run on this host; {ONE_HOST}"
        )
    started_alone = not any(
        name in os.environ for name in ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
    )
    if not expected and started_alone and "MASTER_ADDR" in os.environ and "ACCELERATE_DYNAMO_BACKEND" in os.environ:
        raise ConfigError(
            f"accelerate launch started this process for several processes or machines (MASTER_ADDR="
            f"{os.environ['MASTER_ADDR']}) but alone (no WORLD_SIZE): for a MULTI_CPU or NO config it starts "
            "one process per machine and expects mpirun to start the rest; on one host use "
            "`agentrl train --num-processes N` or distributed_type: MULTI_GPU (gloo on a CPU); for several "
            "machines use --ray or `torchrun --nnodes` on each machine (docs/guides/scaling.md)"
        )


def check_accelerate_settings(settings: dict[str, Any], num_processes: int, name: str) -> None:
    """A ConfigError for an accelerate config agentrl's launcher would not start ``num_processes``
    processes on this host with: several machines (``num_machines`` > 1), or, for more than one
    process, a ``distributed_type`` whose accelerate launcher starts one process (``NO``,
    ``MULTI_CPU``: it expects ``mpirun``)."""
    where = f"--accelerate-config {name!r}"
    machines = settings.get("num_machines") or 1
    if str(machines).strip().isdigit() and int(machines) > 1:
        raise ConfigError(f"{where} sets num_machines: {machines}, but {ONE_HOST}")
    kind = str(settings.get("distributed_type") or "NO").upper()
    if num_processes > 1 and kind in ("NO", "MULTI_CPU"):
        raise ConfigError(
            f"{where} sets distributed_type: {kind}, for which accelerate starts one process on this host "
            f"(it expects mpirun), not {num_processes}: use distributed_type: MULTI_GPU (agentrl joins the "
            "processes over gloo on a CPU), FSDP or DEEPSPEED, or --accelerate-config ddp"
        )


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
        "agentrl.model.launcher",
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


def run_launched(command: list[str], run_dir: Path | None = None, processes: int | None = None) -> int:
    """Run ``command`` with :data:`LAUNCHED` set; its exit status, or 128 + the signal that
    stopped the run (130 after Ctrl-C, 143 after SIGTERM, 129 after SIGHUP).

    The launcher runs in a session of its own and gets the first stop signal from here, once
    (sent to its process group: the launcher and, for one process, accelerate's simple launcher's
    child), whether it was sent to this process alone (a scheduler, ``kill``, ``timeout``) or to its
    whole group (a terminal's Ctrl-C or hang-up). torchrun passes the signal on to the training
    processes (each in a session of its own) and waits for them to stop at one step boundary and
    save; this process waits with it (Python's default would kill this process, and with it the
    rest of the run). Later signals are not passed on: the processes are already stopping, and a
    second one would break torchrun's own shutdown. The lock this process holds on ``run_dir`` is
    shared with every process of the run (:meth:`agentrl.rundir.lock.RunLock.share`). Each
    process checks that it is one of ``processes`` (:func:`check_world`; None: not checked)."""
    env = {**os.environ, LAUNCHED: "1", PARENT_PID: str(os.getpid())}
    if processes is not None:
        env[PROCESSES] = str(processes)
    env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(SHUTDOWN_TIMEOUT_S))
    held = run_lock.held_lock(run_dir) if run_dir is not None else None
    if held is not None:
        env[run_lock.SHARED_LOCK] = held.share()
    received: list[int] = []

    def note(signum: int, frame: object) -> None:
        if signum == getattr(signal, "SIGHUP", None):
            detach_hung_up_terminal()
        received.append(signum)

    main = threading.current_thread() is threading.main_thread()
    previous = {signum: signal.signal(signum, note) for signum in STOP_SIGNALS} if main else {}
    try:
        fds = (held.fileno(),) if held is not None else ()  # the launcher holds the lock too
        proc = subprocess.Popen(command, env=env, start_new_session=main, pass_fds=fds)
        forwarded = False
        while True:
            if received and not forwarded:
                _signal_group(proc, received[0])
                forwarded = True
            try:
                returncode = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                continue
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if returncode < 0:  # the launcher itself was killed
        returncode = 128 - returncode
    return 128 + received[0] if received and returncode != 0 else returncode


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
    """``signum`` to ``proc``'s process group when it leads one, else to ``proc`` alone."""
    try:
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, signum)
            return
    except OSError:
        pass
    with contextlib.suppress(OSError):
        proc.send_signal(signum)


def die_with_parent() -> None:
    """End this process (SIGKILL) when the process :data:`PARENT_PID` names ends, or at once when it
    has ended already (nothing when the variable is unset: not started by agentrl's launcher).

    Linux's ``PR_SET_PDEATHSIG`` has the kernel send the signal as the parent exits, however it
    exits; a thread that looks at :func:`os.getppid` every :data:`WATCH_INTERVAL_S` does the same
    where ``prctl`` is missing (an orphan gets a new parent: init or a subreaper)."""
    expected = os.environ.get(PARENT_PID)
    if not expected or not expected.isdigit():
        return
    parent = int(expected)
    parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent:  # it ended before the line above took effect
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=_watch_parent, args=(parent,), name="agentrl-parent-watch", daemon=True).start()


def parent_death_signal(signum: int) -> bool:
    """Ask Linux to send ``signum`` to this process when its parent ends; whether it did."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(1, int(signum), 0, 0, 0)) == 0  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return False


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(WATCH_INTERVAL_S)
    os.kill(os.getpid(), signal.SIGKILL)


def join_launched_run(run_dir: Path) -> None:
    """In a training process agentrl's launcher started: end with the launcher
    (:func:`die_with_parent`) and hold ``run_dir``'s lock with the top process until this one exits
    (:func:`agentrl.rundir.lock.join`)."""
    die_with_parent()
    address = os.environ.get(run_lock.SHARED_LOCK)
    if address:
        run_lock.join(run_dir, address)


@contextlib.contextmanager
def resume_flags(given: dict[str, Any], num_processes: int | None, accelerate_config: str | None) -> Iterator[None]:
    """While it is open, :func:`resume_command` names the flags besides ``--resume`` that this
    command's run needs to continue (``given``: flag -> value, as ``agentrl train`` got them):
    ``--num-processes``, ``--accelerate-config``, ``--plugin``, ``--disable-plugin``, and a
    resume's ``--max-steps`` (a run dir's config.yaml keeps the first one). The processes this one
    launches inherit them; in one of those, the launcher's stay."""
    if RESUME_FLAGS in os.environ:
        yield
        return
    flags: list[str] = []
    world = int(os.environ.get("WORLD_SIZE", "1"))  # processes started by hand: as many again
    if num_processes is not None or world > 1:
        flags += ["--num-processes", str(num_processes or world)]
    if accelerate_config is not None:
        flags += ["--accelerate-config", accelerate_config]
    for flag in ("--plugin", "--disable-plugin"):
        for value in given.get(flag) or []:
            flags += [flag, str(value)]
    if given.get("--resume") is not None and given.get("--max-steps") is not None:
        flags += ["--max-steps", str(given["--max-steps"])]
    os.environ[RESUME_FLAGS] = shlex.join(flags)
    try:
        yield
    finally:
        os.environ.pop(RESUME_FLAGS, None)


def resume_command(run_dir: str | Path) -> str:
    """The shell command that continues the run in ``run_dir``: ``agentrl train --resume RUN_DIR``
    with the flags :func:`resume_flags` names."""
    flags = os.environ.get(RESUME_FLAGS, "")
    return " ".join(["agentrl train --resume", shlex.quote(str(run_dir)), flags]).strip()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
