"""The sandbox's child programs as modules: stdlib-only, and their pieces checked one by one.

tests/tools/test_sandbox.py runs them for real (every layer on and off); these check the parts a
whole run cannot single out: the audit hook's rules, which groups it guards, the seccomp filter.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.tools import _sandbox_run, _sandbox_setup, sandbox

SCRATCH, READABLE = "/tmp/agentrl-sandbox-x", ("/usr",)
WRITABLE = (SCRATCH, "/dev/null")
ALL = frozenset({"files", "net", "procs"})


@pytest.mark.parametrize("module", ["_sandbox_setup.py", "_sandbox_run.py"])
def test_child_modules_load_with_the_standard_library_alone(module: str) -> None:
    """They run under ``python -I -S -B``: no site-packages, no agentrl on the path."""
    path = Path(sandbox.__file__).parent / module
    load = (
        "import importlib.util, sys; spec = importlib.util.spec_from_file_location('child', sys.argv[1]); "
        "spec.loader.exec_module(importlib.util.module_from_spec(spec)); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('agentrl', 'typing', 'pydantic')))"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-S", "-B", "-c", load, str(path)],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stdout.strip(), result.stderr) == (0, "[]", "")


def test_the_code_interpreter_runs_this_modules_text() -> None:
    assert sandbox._run_source() == Path(_sandbox_run.__file__).read_text(encoding="utf-8")
    assert sandbox._SETUP == Path(_sandbox_setup.__file__).resolve()


def refused(event: str, *args: object, groups: frozenset[str] = ALL) -> bool:
    return _sandbox_run.refused(event, args, groups, READABLE, WRITABLE)


def test_audit_rules_for_files() -> None:
    assert refused("open", "/etc/passwd", None, os.O_RDONLY)  # not readable
    assert not refused("open", "/usr/lib/os.py", None, os.O_RDONLY)
    assert refused("open", "/usr/lib/os.py", None, os.O_WRONLY)  # readable is not writable
    assert refused("open", "/usr", None, os.O_RDONLY)  # a directory opened outside the scratch dir
    assert not refused("open", SCRATCH + "/out.txt", None, os.O_WRONLY | os.O_CREAT)
    assert refused("os.listdir", "/home") and not refused("os.listdir", "/usr")
    assert refused("os.remove", "/usr/x", None) and not refused("os.remove", SCRATCH + "/x", None)
    assert refused("os.rename", SCRATCH + "/a", "/usr/a", None, None)  # both paths must be inside
    assert refused("os.chmod", 3, 0o777, None)  # no path: a file descriptor
    assert refused("os.chmod", "/dev/null", 0o777, None)  # writable, but not the scratch dir
    assert refused("import", "ctypes", None, None, None, None)
    assert not refused("import", "json", None, None, None, None)
    assert not refused("open", "/etc/passwd", None, os.O_RDONLY, groups=frozenset({"net", "procs"}))


def test_audit_rules_for_network_and_processes() -> None:
    assert refused("socket.__new__", None, socket.AF_INET, socket.SOCK_STREAM, 0)
    assert not refused("socket.__new__", None, socket.AF_UNIX, socket.SOCK_STREAM, 0)
    assert refused("socket.getaddrinfo", "example.com", 80, 0, 0, 0)
    assert refused("os.fork") and refused("os.forkpty")
    assert refused("subprocess.Popen", "/bin/sh", ["sh"], None, None)
    assert not refused("subprocess.Popen", "/bin/sh", ["sh"], None, None, groups=frozenset({"net"}))
    assert not any(
        refused(event, "/etc/passwd", 2, os.O_WRONLY, groups=frozenset())
        for event in ("open", "os.fork", "socket.__new__", "os.system", "import")
    )


@pytest.mark.parametrize(
    "layers, groups",
    [
        ([], ["files", "net", "procs"]),
        (["landlock", "net", "pid"], []),
        (["seccomp"], ["files"]),
        (["uid", "net"], ["files"]),
        (["landlock", "uid"], ["net"]),
    ],
)
def test_the_audit_hook_guards_only_what_no_stronger_layer_covers(layers: list[str], groups: list[str]) -> None:
    assert _sandbox_setup.audit_groups(layers) == groups


def test_seccomp_filter_per_architecture() -> None:
    assert _sandbox_setup.seccomp_program("riscv64") is None
    for machine in ("x86_64", "aarch64"):
        program = _sandbox_setup.seccomp_program(machine)
        assert program is not None and len(program) == 18 and all(len(op) == 8 for op in program)
    x86, arm = _sandbox_setup.seccomp_program("x86_64"), _sandbox_setup.seccomp_program("aarch64")
    assert x86 != arm
