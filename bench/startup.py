"""How long the CLI takes to answer when it has no model to load: ``import agentrl``, ``agentrl
--help``, ``agentrl plugins`` and a misspelt env name (``agentrl train --env maths``, which must fail
with "did you mean 'math'?"), each in a fresh Python process, the median and fastest of
``--repeats`` runs, one after another.

    python bench/startup.py [--repeats 3] [--only help plugins]

Every CLI test that starts a process pays this first, and so does a user who mistypes a name.
Timings on a shared 2-core machine are noisy: compare two versions in one sitting, not across days.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from rich.console import Console
from rich.table import Table

COMMANDS: dict[str, tuple[list[str], int, str]] = {
    "import": (["-c", "import agentrl"], 0, ""),
    "help": (["-m", "agentrl", "--help"], 0, "train"),
    "plugins": (["-m", "agentrl", "plugins"], 0, "grpo"),
    "bad-env": (["-m", "agentrl", "train", "--env", "maths"], 2, "did you mean 'math'?"),
}
"""name -> (python arguments, the exit status it must end with, text its output must hold)."""


def time_command(arguments: list[str], status: int, expect: str) -> float:
    """Seconds one fresh ``python <arguments>`` takes; fails unless it ends as expected."""
    start = time.perf_counter()
    result = subprocess.run([sys.executable, *arguments], capture_output=True, text=True, timeout=300)
    seconds = time.perf_counter() - start
    output = result.stdout + result.stderr
    if result.returncode != status or expect not in " ".join(output.split()):
        raise SystemExit(
            f"python {' '.join(arguments)}: exit {result.returncode} (wanted {status}), "
            f"output lacks {expect!r}:\n{output[-2000:]}"
        )
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="+", choices=sorted(COMMANDS), default=list(COMMANDS))
    args = parser.parse_args()
    table = Table(title=f"CLI start-up, {args.repeats} run(s) each (seconds)")
    for column in ("command", "median", "fastest"):
        table.add_column(column, justify="left" if column == "command" else "right")
    for name in args.only:
        arguments, status, expect = COMMANDS[name]
        runs = [time_command(arguments, status, expect) for _ in range(args.repeats)]
        print(f"{name}: median {statistics.median(runs):.2f} s, fastest {min(runs):.2f} s", flush=True)
        table.add_row(f"python {' '.join(arguments)}", f"{statistics.median(runs):.2f}", f"{min(runs):.2f}")
    Console().print(table)


if __name__ == "__main__":
    main()
