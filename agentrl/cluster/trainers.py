"""Trainer processes across nodes: ``agentrl train --ray --num-processes N``.

Process 0 is the ``agentrl train`` process itself (it holds the run dir's lock, prints, and stops
on Ctrl-C as a one-host run does). Processes 1..N-1 are Ray actors placed by
``ray.trainer_resources``; each writes the run's config to a file on its own node and runs
``python -m agentrl train --config FILE --output-dir RUN_DIR`` (or ``--resume RUN_DIR``) as a
subprocess with torch.distributed's rendezvous variables (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``/``MASTER_PORT`` = process 0's node and a free port there), as processes started
by hand under torchrun are. Process 0 forms the process group before its trainer builds (the
Accelerator then uses it), watching the other processes meanwhile: one that ends first stops the
run with one line naming it, its node and its last line on stderr.

No process outlives the run: a subprocess ends with its actor (``PR_SET_PDEATHSIG`` and
:func:`agentrl.model.launch.die_with_parent`), and an actor with the driver that owns it (Ray's
owner semantics), so ``kill -9`` of ``agentrl train`` ends every process of the run within seconds.
"""

from __future__ import annotations

import collections
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

from agentrl.cluster import runtime
from agentrl.config.cluster import RayConfig
from agentrl.errors import ConfigError, TrainingError, one_line

ERROR = "error: "
"""How a one-line error starts (:func:`agentrl.cli.support.run_guarded`)."""
STOPPED_BY_SIGNAL = {128 + int(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
"""Exit statuses of a process that stopped at a step boundary after a stop signal (the run's own)."""
FINISH_TIMEOUT_S = 120.0
"""How long process 0, done, waits for the others to finish their last step before ending them."""
HANG_GRACE_S = 60.0
"""How long process 0 may stay blocked (in a collective) after another process died before it is
ended with the line saying which: a collective with a dead peer on a lost node would otherwise
wait for torch's own timeout (30 minutes)."""


class TrainerActor:
    """A Ray actor running trainer process ``rank`` (> 0) as a subprocess on its node."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None
        self.tail: collections.deque[str] = collections.deque(maxlen=20)
        self.folder = tempfile.mkdtemp(prefix="agentrl-trainer-")

    def where(self) -> tuple[str, str]:
        """(node id, node IP) of this actor."""
        import ray

        return runtime.node_id(), ray.util.get_node_ip_address()

    def start(self, args: list[str], config_text: str | None, env: dict[str, str], cwd: str) -> int:
        """Run ``python -m agentrl train ARGS`` (``--config FILE`` first when ``config_text`` is given)
        with ``env`` added, in ``cwd`` when this node has it; its pid."""
        from agentrl.model.launch import LAUNCHED, OWN_ERRORS, PARENT_PID, parent_death_signal

        if config_text is not None:
            path = os.path.join(self.folder, "config.yaml")
            with open(path, "w", encoding="utf-8") as file:
                file.write(config_text)
            args = ["--config", path, *args]
        env = {**os.environ, **env, LAUNCHED: "1", PARENT_PID: str(os.getpid()), OWN_ERRORS: "1"}
        iface = interface_of(self.where()[1])
        if iface and "GLOO_SOCKET_IFNAME" not in env:
            env["GLOO_SOCKET_IFNAME"] = iface
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agentrl", "train", *args],
            env=env,
            cwd=cwd if os.path.isdir(cwd) else self.folder,
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            preexec_fn=lambda: parent_death_signal(signal.SIGKILL),
        )
        threading.Thread(target=self._relay, daemon=True).start()
        return self.proc.pid

    def _relay(self) -> None:
        """The subprocess's stderr to this actor's (the driver's terminal), its last lines kept; its
        one-line errors only kept: process 0 says them (naming this process when it stops the run)."""
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            if line.strip():
                self.tail.append(line.rstrip())
            if not line.startswith(ERROR):
                sys.stderr.write(line)
                sys.stderr.flush()

    def wait(self) -> tuple[int, str]:
        """(exit status, last line on stderr) of the subprocess once it ends."""
        assert self.proc is not None
        code = self.proc.wait()
        time.sleep(0.2)  # the relay thread reads the last lines
        last = self.tail[-1] if self.tail else ""
        return code, last.removeprefix(ERROR)


def interface_of(ip: str) -> str | None:
    """The network interface holding ``ip`` (gloo binds the one ``GLOO_SOCKET_IFNAME`` names; its
    default, the host name's address, is a loopback one on many machines)."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(address.address == ip for address in addresses):
            return name
    return None


def free_port() -> int:
    """A TCP port free on every interface of this node (process 0's rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


@dataclass
class Placed:
    """Where trainer process ``rank`` runs."""

    rank: int
    node: str
    ip: str
    actor: Any = None
    done: Any = None
    """The actor's ``wait`` call: (exit status, last stderr line) once the process ends."""

    def describe(self) -> str:
        """``1 on node 8be1d0 (10.0.0.2)``."""
        return f"{self.rank} on {runtime.node_label(self.node)}"


class TrainerGroup:
    """The trainer processes of a run on Ray: :meth:`start` places processes 1..N-1 and starts them,
    :meth:`join` forms the process group with them in this process (process 0), :meth:`close` waits
    for them to finish (or ends them)."""

    def __init__(
        self, config: RayConfig, num_processes: int, args: list[str], config_text: str | None, resume: str
    ) -> None:
        self.config, self.num_processes = config, num_processes
        self.args, self.config_text, self.resume = args, config_text, resume
        self.placed: list[Placed] = []
        self.finished = threading.Event()

    def start(self) -> str:
        """Join the cluster, place and start processes 1..N-1; the banner line saying where each runs."""
        ray = runtime.connect(self.config, local_cpus=self.config.trainer_resources.get("CPU", 0) * self.num_processes)
        here = Placed(0, runtime.node_id(), ray.util.get_node_ip_address())
        self.placed = [here]
        if self.num_processes > 1:
            remote = ray.remote(TrainerActor)
            options = runtime.actor_options(self.config.trainer_resources)
            actors = [remote.options(**options, max_restarts=0).remote() for _ in range(self.num_processes - 1)]
            self.placed += [Placed(0, "", "", actor=actor) for actor in actors]  # ranks and nodes below
            where = runtime.wait_placed(
                [actor.where.remote() for actor in actors],
                f"{len(actors)} trainer process(es)",
                self.config.trainer_resources,
                self.config.start_timeout_s,
            )
            for rank, (placed, (node, ip)) in enumerate(zip(self.placed[1:], where), start=1):
                placed.rank, placed.node, placed.ip = rank, node, ip
            self._start_processes(ray, here.ip)
        return "trainers: " + ", ".join(placed.describe() for placed in self.placed)

    def _start_processes(self, ray: Any, master_ip: str) -> None:
        port = free_port()
        os.environ.update(rendezvous_env(0, self.num_processes, master_ip, port))
        iface = interface_of(master_ip)
        if iface and "GLOO_SOCKET_IFNAME" not in os.environ:
            os.environ["GLOO_SOCKET_IFNAME"] = iface
        address = ray.get_runtime_context().gcs_address  # a process's engines and env workers join it too
        for placed in self.placed[1:]:
            env = {**rendezvous_env(placed.rank, self.num_processes, master_ip, port), "RAY_ADDRESS": address}
            ray.get(placed.actor.start.remote(self.args, self.config_text, env, os.getcwd()))
            placed.done = placed.actor.wait.remote()

    def join(self) -> None:
        """Form the process group with processes 1..N-1 (a ConfigError when one of them ends first,
        or they have not all joined within ``ray.start_timeout_s``); then watch them."""
        if self.num_processes == 1:
            return
        import torch
        import torch.distributed as dist

        backend = "nccl" if torch.cuda.is_available() else "gloo"  # what the Accelerator would choose
        failed: list[BaseException] = []

        def form() -> None:
            try:
                dist.init_process_group(backend=backend, init_method="env://")
            except BaseException as exc:  # noqa: BLE001 (reported by the main thread)
                failed.append(exc)

        thread = threading.Thread(target=form, name="agentrl-rendezvous", daemon=True)
        thread.start()
        deadline = time.monotonic() + self.config.start_timeout_s
        while thread.is_alive():
            thread.join(0.2)
            ended = self.ended(wait_s=0, expected=(), when=" before the processes formed their group")
            if ended is not None:
                raise ConfigError(ended)
            if time.monotonic() > deadline:
                raise ConfigError(
                    f"ray: trainer processes {', '.join(str(p.rank) for p in self.placed[1:])} did not join process "
                    f"0 at {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} within "
                    f"{self.config.start_timeout_s:g}s (a firewall between the nodes? GLOO_SOCKET_IFNAME? "
                    "raise ray.start_timeout_s when each node converts the model first)"
                )
        if failed:
            raise ConfigError(f"ray: the trainer processes could not form their group: {one_line(failed[0])}")
        threading.Thread(target=self._watch, name="agentrl-trainer-watch", daemon=True).start()

    def ended(self, wait_s: float, expected: tuple[int, ...] = (0, *STOPPED_BY_SIGNAL), when: str = "") -> str | None:
        """``trainer process 1 on node ... exited with status 2: LAST LINE`` for the first process
        that ended (within ``wait_s``) with a status not ``expected``, else None."""
        import ray

        refs = [placed.done for placed in self.placed[1:] if placed.done is not None]
        if not refs:
            return None
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=wait_s)
        for placed in self.placed[1:]:
            if placed.done in ready:
                try:
                    code, last = ray.get(placed.done)
                except ray.exceptions.RayError as exc:
                    code, last = None, f"its actor died ({one_line(exc)})"
                if code not in expected:
                    status = "ended" if code is None else _status(code)
                    return f"trainer process {placed.describe()} {status}{when}: {last or 'nothing on stderr'}"
        return None

    def _watch(self) -> None:
        """End this process when another one died and this one is still blocked after
        :data:`HANG_GRACE_S` (the main thread says which otherwise)."""
        while not self.finished.is_set():
            ended = self.ended(wait_s=1.0)
            if ended is not None:
                if self.finished.wait(HANG_GRACE_S):
                    return
                sys.stderr.write(f"error: {self.stopped(ended)}\n")
                sys.stderr.flush()
                os._exit(1)

    def stopped(self, ended: str) -> str:
        """The line that stops the run when another process ``ended``."""
        return f"{ended}; the run stopped: continue it from its last checkpoint with `{self.resume}`"

    def explain(self, exc: BaseException) -> TrainingError | None:
        """A one-line error for ``exc`` of process 0 when another process died (the cause of a
        collective's error), else None."""
        if isinstance(exc, (KeyboardInterrupt, ConfigError)):
            return None
        ended = self.ended(wait_s=10.0)
        if ended is None:
            return None
        return TrainingError(self.stopped(ended))

    def close(self, wait: bool) -> None:
        """Wait (``wait``) up to :data:`FINISH_TIMEOUT_S` for processes 1..N-1 to end, then end their
        actors (a subprocess ends with its actor)."""
        self.finished.set()
        import ray

        actors = [placed for placed in self.placed[1:] if placed.actor is not None]
        if wait:
            refs = [placed.done for placed in actors if placed.done is not None]
            if refs:
                ray.wait(refs, num_returns=len(refs), timeout=FINISH_TIMEOUT_S)
        for placed in actors:
            ray.kill(placed.actor, no_restart=True)


def rendezvous_env(rank: int, world: int, master_ip: str, port: int) -> dict[str, str]:
    """torch.distributed's variables of process ``rank`` of ``world`` (one process per node slot)."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": master_ip,
        "MASTER_PORT": str(port),
    }


def _status(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"
