"""agentrl.tools.sandbox against hostile code: the trainer survives and nothing leaks or lingers.

Tests of an optional layer (uid drop, private mounts) are skipped where this machine cannot give
it; ``SandboxResult.isolation`` says which layers were applied. The escapes (reading outside the
scratch dir, network, processes outliving the call) are tried with every layer this machine has,
then with the namespaces and the uid drop turned off (Landlock and seccomp left), then with only
the audit-hook fallback, and from a trainer running as an ordinary user (``unshare -U``): each
must be blocked whichever layer is left. Processes are found from the trainer's side by the call's
scratch path (pids printed inside a PID namespace mean nothing outside it).
"""

from __future__ import annotations

import ast
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agentrl import EnvError
from agentrl.tools import sandbox
from agentrl.tools.sandbox import THREATS, SandboxResult, protections, run_python
from agentrl.tools.tool import ToolError

REPO = Path(__file__).resolve().parents[2]
NAMESPACES = frozenset({"uid", "fs", "net", "pid"})
MODES = {
    "all-layers": frozenset(),
    "no-namespaces-no-uid": NAMESPACES,
    "audit-hook-only": NAMESPACES | {"landlock", "seccomp"},
}


@pytest.fixture(scope="module")
def isolation() -> tuple[str, ...]:
    result = run_python("pass")
    assert result.exit_code == 0, result
    return result.isolation


@pytest.fixture(params=list(MODES))
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Turn layers off (``sandbox._DISABLED``) to exercise what is left."""
    monkeypatch.setattr(sandbox, "_DISABLED", MODES[request.param])
    return request.param


def _check_mode(mode: str, result: SandboxResult) -> None:
    """The layers turned off were off (so the test exercised the fallback it names)."""
    assert not MODES[mode] & set(result.isolation), result
    if mode == "audit-hook-only":
        assert result.isolation == ("audit",), result


def _survivors(scratch: str, wait_s: float = 3.0) -> list[int]:
    """Live processes (zombies aside) started for the call whose scratch dir was ``scratch``: its
    path is in the command line of the sandbox's interpreters and the environment (HOME, TMPDIR)
    of whatever they start. Waits up to ``wait_s`` for killed ones to go."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                seen = b"".join(Path(f"/proc/{pid}/{f}").read_bytes() for f in ("cmdline", "environ"))
            except OSError:
                continue
            if scratch.encode() in seen and state not in ("Z", "X"):
                alive.append(int(pid))
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def test_normal_code_returns_stdout_and_cleans_up() -> None:
    code = "import os\nopen('out.txt', 'w').write('kept?')\nprint(6 * 7)\nprint(os.getcwd())"
    result = run_python(code)
    assert result.exit_code == 0 and result.error is None and not result.timed_out
    answer, scratch = result.stdout.splitlines()
    assert answer == "42"
    assert "agentrl-sandbox-" in scratch and not os.path.exists(scratch)


def test_exceptions_come_back_as_stderr() -> None:
    result = run_python("def f():\n    raise ValueError('bad input')\nf()")
    assert result.exit_code == 1 and result.error is None
    assert 'File "main.py", line 3' in result.stderr
    assert result.stderr.rstrip().endswith("ValueError: bad input")


def test_infinite_loop_times_out_and_its_process_group_dies() -> None:
    code = (
        "import os, subprocess\nprint(os.getcwd(), flush=True)\n"
        "p = subprocess.Popen(['sleep', '60'])\nwhile True:\n    pass"
    )
    start = time.monotonic()
    result = run_python(code, timeout_s=1.0)
    assert time.monotonic() - start < 15  # killed at 1 s (the loop never ends; margin for a loaded machine)
    assert result.timed_out and result.exit_code == -9
    assert result.error == "timed out after 1 s; the process group was killed"
    assert _survivors(result.stdout.split()[0]) == []


def test_processes_that_leave_the_group_die_too() -> None:
    code = (
        "import os, subprocess\nprint(os.getcwd())\ntry:\n"
        "    subprocess.Popen(['sleep', '60'], start_new_session=True)\n"
        "except OSError as exc:\n    print('refused', exc)"
    )
    result = run_python(code, timeout_s=2.0)
    assert result.exit_code == 0 and not result.timed_out, result
    assert _survivors(result.stdout.split()[0]) == []


def test_fork_bomb_is_bounded(isolation: tuple[str, ...]) -> None:
    if os.geteuid() == 0 and "uid" not in isolation:
        pytest.skip("running as root without a uid drop: RLIMIT_NPROC does not apply")
    code = (
        "import os, time\nn = 0\ntry:\n    for n in range(1000):\n        if os.fork() == 0:\n"
        "            time.sleep(30)\n            os._exit(0)\nexcept OSError as exc:\n"
        "    print('limited', n, type(exc).__name__)"
    )
    result = run_python(code, timeout_s=5.0, max_processes=8)
    assert result.stdout.split()[0] == "limited", result
    assert int(result.stdout.split()[1]) <= 8
    assert not result.timed_out  # the sleeping children were killed once the script ended


def test_huge_allocation_is_a_clear_memory_error() -> None:
    result = run_python("x = bytearray(10 * 1024 ** 3)\nprint('allocated')", memory_mb=256)
    assert "allocated" not in result.stdout
    assert result.error == "memory limit exceeded (256 MB per process)"
    assert run_python("print('still fine')").stdout == "still fine\n"  # and we are alive


def test_huge_output_is_capped() -> None:
    code = "import sys\nprint('x' * 10_000_000)\nsys.stderr.write('e' * 10_000_000)"
    result = run_python(code, max_output_chars=100)
    assert result.stdout.startswith("x" * 100 + "\n[output truncated: 10000001 bytes in all")
    assert len(result.stdout) < 200 and len(result.stderr) < 200
    assert result.exit_code == 0


def test_environment_is_minimal_and_secrets_do_not_leak(
    monkeypatch: pytest.MonkeyPatch, isolation: tuple[str, ...]
) -> None:
    monkeypatch.setenv("AGENTRL_TEST_SECRET", "hunter2")
    code = (
        "import os\nprint(sorted(os.environ))\nprint('hunter2' in repr(os.environ))\n"
        "try:\n    print(open(f'/proc/{os.getppid()}/environ', 'rb').read().count(b'hunter2'))\n"
        "except OSError as exc:\n    print(type(exc).__name__)"
    )
    names, leaked, parent_environ = run_python(code).stdout.splitlines()
    allowed = {"PATH", "HOME", "TMPDIR", "PYTHONDONTWRITEBYTECODE", "LC_CTYPE"}
    assert set(ast.literal_eval(names)) <= allowed
    assert leaked == "False"
    if {"uid", "pid", "landlock"} & set(isolation):  # not ours, not visible, or not readable
        assert parent_environ in ("PermissionError", "FileNotFoundError")


def _snapshot(root: Path) -> dict[str, tuple[int, float, bytes]]:
    return {
        str(p): (p.stat().st_mode, p.stat().st_mtime, p.read_bytes() if p.is_file() else b"")
        for p in [root, *root.rglob("*")]
    }


def test_writes_outside_the_scratch_dir_change_nothing(isolation: tuple[str, ...]) -> None:
    if not {"uid", "landlock"} & set(isolation):
        pytest.skip(
            "neither Landlock nor a uid drop here: the code has the trainer's own "
            "permissions (the audit-hook fallback is tested below)"
        )
    outside = Path(tempfile.mkdtemp(prefix="agentrl-test-outside-"))
    (outside / "data.txt").write_text("original")
    probe = f"agentrl-sandbox-probe-{os.getpid()}"
    targets = [outside / "data.txt", outside / "new.txt", REPO / probe, REPO / "agentrl" / probe, Path("/tmp") / probe]
    code = (
        f"import os, shutil\nfor path in {[str(t) for t in targets]!r}:\n"
        "    try:\n        open(path, 'w').write('pwned')\n        print('wrote', path)\n"
        "    except OSError as exc:\n        print(type(exc).__name__, path)\n"
        f"shutil.rmtree({str(outside)!r}, ignore_errors=True)"
    )
    before = _snapshot(outside)
    try:
        result = run_python(code)
        assert result.exit_code == 0, result
        assert _snapshot(outside) == before
        assert not (REPO / probe).exists() and not (REPO / "agentrl" / probe).exists()
        assert (REPO / "agentrl" / "tools" / "sandbox.py").exists()
        if {"fs", "landlock"} & set(isolation):
            assert not (Path("/tmp") / probe).exists()
    finally:
        for leftover in (REPO / probe, REPO / "agentrl" / probe, Path("/tmp") / probe):
            leftover.unlink(missing_ok=True)
        for path in sorted(outside.rglob("*"), reverse=True):
            path.unlink()
        outside.rmdir()


def test_files_outside_the_scratch_dir_cannot_be_read(mode: str) -> None:
    secret = f"agentrl-secret-{secrets.token_hex(8)}"
    folder = Path(tempfile.mkdtemp(prefix="agentrl-test-secret-"))
    folder.chmod(0o755)
    (folder / "secret.txt").write_text(secret)
    (folder / "secret.txt").chmod(0o644)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", secret])
    targets = ["/etc/passwd", str(folder / "secret.txt"), str(REPO / "pyproject.toml")]
    code = (
        "import os\ndef read(path):\n    try:\n        with open(path, 'rb') as f:\n"
        "            return f.read()\n    except OSError as exc:\n"
        "        return type(exc).__name__.encode()\n"
        "try:\n    pids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
        "except OSError:\n    pids = []\n"
        f"seen = b''.join(read(f'/proc/{{p}}/cmdline') for p in pids + ['{holder.pid}'])\n"
        f"print('cmdline', {secret.encode()!r} in seen)\n"
        f"for path in {targets!r}:\n    print(path, read(path)[:40])"
    )
    try:
        result = run_python(code)
    finally:
        holder.kill()
        holder.wait()
        (folder / "secret.txt").unlink()
        folder.rmdir()
    _check_mode(mode, result)
    assert result.exit_code == 0, result
    lines = result.stdout.splitlines()
    assert lines[0] == "cmdline False"
    assert [line.split(" ", 1)[0] for line in lines[1:]] == targets, result
    assert all(line.endswith(("b'PermissionError'", "b'FileNotFoundError'")) for line in lines[1:]), result


def test_no_network(mode: str) -> None:
    with socket.socket() as tcp, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        for server in (tcp, udp):
            server.bind(("127.0.0.1", 0))
            server.settimeout(0.5)
        tcp.listen()
        code = (
            "import socket\ndef attempt(name, f):\n    try:\n        f()\n"
            "        print(name, 'open')\n    except OSError as exc:\n"
            "        print(name, 'blocked', type(exc).__name__)\n"
            f"attempt('tcp', lambda: socket.create_connection({tcp.getsockname()!r}, timeout=2))\n"
            "attempt('udp', lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
            f".sendto(b'query', {udp.getsockname()!r}))\n"
            "attempt('dns', lambda: socket.getaddrinfo('example.com', 443))"
        )
        result = run_python(code)
        _check_mode(mode, result)
        assert [line.split()[:2] for line in result.stdout.splitlines()] == [
            ["tcp", "blocked"],
            ["udp", "blocked"],
            ["dns", "blocked"],
        ], result
        with pytest.raises(TimeoutError):
            tcp.accept()
        with pytest.raises(TimeoutError):
            udp.recvfrom(100)


ESCAPES = {
    "background-process": "import subprocess\n    subprocess.Popen(['sleep', '100'])",
    "fork-then-parent-exits": "if os.fork() == 0:\n        time.sleep(100)",
    "daemon-double-fork-setsid": (
        "if os.fork() == 0:\n        try:\n            os.setsid()\n"
        "        except OSError:\n            pass\n"
        "        if os.fork() == 0:\n            time.sleep(100)\n"
        "        os._exit(0)"
    ),
    "new-session": "import subprocess\n    subprocess.Popen(['sleep', '100'], start_new_session=True)",
}


@pytest.mark.parametrize("escape", list(ESCAPES))
def test_no_process_outlives_the_call(mode: str, escape: str) -> None:
    code = (
        f"import os, time\nprint(os.getcwd(), flush=True)\ntry:\n    {ESCAPES[escape]}\n"
        "except OSError as exc:\n    print('refused', exc)"
    )
    result = run_python(code, timeout_s=3.0)
    _check_mode(mode, result)
    assert not result.timed_out, result
    assert _survivors(result.stdout.split()[0]) == [], result


UNPRIVILEGED = {
    "with-user-namespaces": ["--map-user=1000", "--map-group=1000"],
    "without-user-namespaces": [],
}  # unmapped: no nested user namespace allowed
_RUN_AND_DUMP = (
    "import dataclasses, json, sys\nfrom agentrl.tools.sandbox import run_python\n"
    "print(json.dumps(dataclasses.asdict(run_python(sys.argv[1], timeout_s=5))))"
)


@pytest.mark.parametrize("userns", list(UNPRIVILEGED))
def test_an_unprivileged_trainer_is_protected_too(userns: str) -> None:
    """The trainer as an ordinary user (``unshare -U``: a uid that is not root, with or without
    the right to make user namespaces): every escape above, in one script, still fails."""
    command = ["unshare", "-U", *UNPRIVILEGED[userns]]
    if subprocess.run([*command, "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare -U is not available here")
    secret = f"agentrl-secret-{secrets.token_hex(8)}"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", secret])
    with socket.socket() as tcp:
        tcp.bind(("127.0.0.1", 0))
        tcp.listen()
        tcp.settimeout(0.5)
        code = (
            "import os, socket, subprocess\nprint(os.getcwd())\ndef attempt(name, f):\n"
            "    try:\n        print(name, 'open', f())\n    except OSError as exc:\n"
            "        print(name, 'blocked', type(exc).__name__)\n"
            "attempt('passwd', lambda: open('/etc/passwd').read()[:4])\n"
            f"attempt('cmdline', lambda: {secret!r} in open('/proc/{holder.pid}/cmdline').read())\n"
            f"attempt('tcp', lambda: socket.create_connection({tcp.getsockname()!r}, timeout=2))\n"
            "attempt('setsid', lambda: subprocess.Popen(['sleep', '100'], start_new_session=True))"
        )
        try:
            run = subprocess.run(
                [*command, sys.executable, "-c", _RUN_AND_DUMP, code],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=120,
            )
        finally:
            holder.kill()
            holder.wait()
        result = json.loads(run.stdout.splitlines()[-1]) if run.returncode == 0 else run.stderr
        assert "uid" not in result["isolation"], result  # ran as an ordinary user
        scratch, *lines = result["stdout"].splitlines()
        assert [line.split()[:2] for line in lines] == [
            [name, "blocked"] for name in ("passwd", "cmdline", "tcp", "setsid")
        ], result
        assert _survivors(scratch) == []
        with pytest.raises(TimeoutError):
            tcp.accept()


def test_protections_name_the_layers_that_block_each_threat() -> None:
    assert protections(()) == dict.fromkeys(THREATS, ())  # nothing applied: nothing blocked
    assert set(protections(["audit"]).values()) == {("audit",)}
    strong = protections(["landlock", "seccomp", "pid", "net"])
    assert strong["network (TCP, UDP, DNS)"] == ("net", "seccomp")
    assert "audit" not in {layer for layers in strong.values() for layer in layers}
    here = protections()  # this machine: every threat blocked by some layer (audit at worst)
    assert set(here) == set(THREATS) and all(here.values()), here


def test_calls_in_parallel_threads() -> None:
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: run_python(f"print({i} ** 2)"), range(8)))
    assert [r.stdout for r in results] == [f"{i**2}\n" for i in range(8)]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"timeout_s": 0}, "run_python: timeout_s must be a number of seconds from 0.01 to 3600, got 0"),
        ({"timeout_s": -1.5}, "timeout_s must be a number of seconds from 0.01 to 3600, got -1.5"),
        ({"timeout_s": float("inf")}, "timeout_s must be a number of seconds from 0.01 to 3600, got inf"),
        ({"timeout_s": float("nan")}, "timeout_s must be a number of seconds from 0.01 to 3600, got nan"),
        ({"timeout_s": "10"}, "timeout_s must be a number of seconds from 0.01 to 3600, got '10'"),
        ({"timeout_s": True}, "timeout_s must be a number of seconds from 0.01 to 3600, got True"),
        ({"memory_mb": 1}, "run_python: memory_mb must be an integer number of MB from 64 to 1048576, got 1"),
        ({"memory_mb": float("inf")}, "memory_mb must be an integer number of MB from 64 to 1048576, got inf"),
        ({"memory_mb": 10**30}, f"memory_mb must be an integer number of MB from 64 to 1048576, got {10**30}"),
        ({"max_processes": 0}, "max_processes must be an integer number of processes from 1 to 4096, got 0"),
        ({"disk_mb": -1}, "disk_mb must be an integer number of MB from 1 to 1048576, got -1"),
        (
            {"max_output_chars": "100"},
            "max_output_chars must be an integer number of characters from 1 to 100000000, got '100'",
        ),
    ],
)
def test_bad_limits_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(EnvError, match=re.escape(message)):
        run_python("pass", **kwargs)


def test_code_that_is_not_text_is_a_tool_error() -> None:
    with pytest.raises(
        ToolError,
        match=re.escape(
            "run_python: the code is not valid text: character 7 is a lone surrogate ('\\ud800'), "
            "which UTF-8 cannot encode"
        ),
    ):
        run_python("print('\ud800')")
    with pytest.raises(ToolError, match=re.escape("run_python: code must be a str, got bytes")):
        run_python(b"print(1)")  # type: ignore[arg-type]
