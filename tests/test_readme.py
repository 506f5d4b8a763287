"""README.md opens with exactly two commands, and CI runs the second one verbatim."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_opens_with_train_and_test_commands_and_ci_runs_the_test_one():
    blocks = re.findall(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text(), flags=re.S)
    train, tests = blocks[0].strip(), blocks[1].strip()
    assert train.endswith("agentrl train --env math --algo grpo") and "pip install torch==2.13.0" in train
    assert "pytest" in tests
    assert tests in (ROOT / ".ci" / "run").read_text()
