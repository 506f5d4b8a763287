"""agentrl.sandbox against hostile code: the trainer survives and nothing leaks or lingers.

Tests of an optional layer (uid drop, private mounts, no network) are skipped where this machine
cannot give it; ``SandboxResult.isolation`` says which layers were applied.
"""

from __future__ import annotations

import ast
import os
import socket
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agentrl import EnvError
from agentrl.sandbox import run_python

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def isolation() -> tuple[str, ...]:
    result = run_python("pass")
    assert result.exit_code == 0, result
    return result.isolation


def _gone(pid: int) -> bool:
    """True if ``pid`` no longer runs (a zombie waiting for init to reap it counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


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
    code = ("import subprocess\np = subprocess.Popen(['sleep', '60'])\nprint(p.pid, flush=True)\n"
            "while True:\n    pass")
    start = time.monotonic()
    result = run_python(code, timeout_s=1.0)
    assert time.monotonic() - start < 4
    assert result.timed_out and result.exit_code == -9
    assert result.error == "timed out after 1 s; the process group was killed"
    assert _gone(int(result.stdout.split()[0]))


def test_processes_that_leave_the_group_die_too(isolation: tuple[str, ...]) -> None:
    if "uid" not in isolation:
        pytest.skip("only a per-call uid finds processes that called setsid()")
    code = ("import subprocess\n"
            "p = subprocess.Popen(['sleep', '60'], start_new_session=True)\nprint(p.pid)")
    result = run_python(code, timeout_s=2.0)
    assert result.exit_code == 0 and not result.timed_out
    assert _gone(int(result.stdout.split()[0]))


def test_fork_bomb_is_bounded(isolation: tuple[str, ...]) -> None:
    if os.geteuid() == 0 and "uid" not in isolation:
        pytest.skip("running as root without a uid drop: RLIMIT_NPROC does not apply")
    code = ("import os, time\nn = 0\ntry:\n    for n in range(1000):\n        if os.fork() == 0:\n"
            "            time.sleep(30)\n            os._exit(0)\nexcept OSError as exc:\n"
            "    print('limited', n, type(exc).__name__)")
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


def test_environment_is_minimal_and_secrets_do_not_leak(monkeypatch: pytest.MonkeyPatch,
                                                        isolation: tuple[str, ...]) -> None:
    monkeypatch.setenv("AGENTRL_TEST_SECRET", "hunter2")
    code = ("import os\nprint(sorted(os.environ))\nprint('hunter2' in repr(os.environ))\n"
            "try:\n    print(open(f'/proc/{os.getppid()}/environ', 'rb').read().count(b'hunter2'))\n"
            "except OSError as exc:\n    print(type(exc).__name__)")
    names, leaked, parent_environ = run_python(code).stdout.splitlines()
    allowed = {"PATH", "HOME", "TMPDIR", "PYTHONDONTWRITEBYTECODE", "LC_CTYPE"}
    assert set(ast.literal_eval(names)) <= allowed
    assert leaked == "False"
    if "uid" in isolation:
        assert parent_environ == "PermissionError"


def _snapshot(root: Path) -> dict[str, tuple[int, float, bytes]]:
    return {str(p): (p.stat().st_mode, p.stat().st_mtime, p.read_bytes() if p.is_file() else b"")
            for p in [root, *root.rglob("*")]}


def test_writes_outside_the_scratch_dir_change_nothing(isolation: tuple[str, ...]) -> None:
    if "uid" not in isolation:
        pytest.skip("no uid drop here (not root, or Python is closed to other users and mount "
                    "namespaces are unavailable): the code has the trainer's own permissions")
    outside = Path(tempfile.mkdtemp(prefix="agentrl-test-outside-"))
    (outside / "data.txt").write_text("original")
    probe = f"agentrl-sandbox-probe-{os.getpid()}"
    targets = [outside / "data.txt", outside / "new.txt", REPO / probe, REPO / "agentrl" / probe,
               Path("/tmp") / probe]
    code = (f"import os, shutil\nfor path in {[str(t) for t in targets]!r}:\n"
            "    try:\n        open(path, 'w').write('pwned')\n        print('wrote', path)\n"
            "    except OSError as exc:\n        print(type(exc).__name__, path)\n"
            f"shutil.rmtree({str(outside)!r}, ignore_errors=True)")
    before = _snapshot(outside)
    try:
        result = run_python(code)
        assert result.exit_code == 0, result
        assert _snapshot(outside) == before
        assert not (REPO / probe).exists() and not (REPO / "agentrl" / probe).exists()
        assert (REPO / "agentrl" / "sandbox.py").exists()
        if "fs" in isolation:
            assert not (Path("/tmp") / probe).exists()
    finally:
        for leftover in (REPO / probe, REPO / "agentrl" / probe, Path("/tmp") / probe):
            leftover.unlink(missing_ok=True)
        for path in sorted(outside.rglob("*"), reverse=True):
            path.unlink()
        outside.rmdir()


def test_no_network(isolation: tuple[str, ...]) -> None:
    if "net" not in isolation:
        pytest.skip("no network namespace available here")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.5)
        port = server.getsockname()[1]
        code = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                "    print('connected')\nexcept OSError as exc:\n    print('blocked', exc)")
        result = run_python(code)
        assert result.stdout.startswith("blocked"), result
        with pytest.raises(TimeoutError):
            server.accept()


def test_calls_in_parallel_threads() -> None:
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: run_python(f"print({i} ** 2)"), range(8)))
    assert [r.stdout for r in results] == [f"{i ** 2}\n" for i in range(8)]


@pytest.mark.parametrize("kwargs, message", [
    ({"timeout_s": 0}, "timeout_s must be at least 0.01, got 0"),
    ({"memory_mb": 1}, "memory_mb must be at least 64, got 1"),
])
def test_bad_limits_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(EnvError, match=message):
        run_python("pass", **kwargs)
