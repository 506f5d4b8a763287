"""agentrl.env.loading: an env class from a ``FILE.py:Class`` spec (a file may define dataclasses),
and an env whose constructor raises named in one line with the arguments it was given."""

from __future__ import annotations

from cli_in_process import assert_one_line, cli

DATACLASS_ENV = """
from __future__ import annotations

from dataclasses import dataclass

from agentrl import Env


@dataclass
class Question:
    text: str


class Asks(Env):
    def train_tasks(self):
        return [{"question": "Say 1.", "answer": "1"}]

    def eval_tasks(self):
        return [{"question": "Say 2.", "answer": "2"}]

    def start(self, task):
        return [{"role": "user", "content": Question(task["question"]).text}]

    def respond(self, text):
        return [], float(self.task["answer"] in text), True, {}

    def gold_reply(self, task):
        return task["answer"]
"""


def test_an_env_file_may_define_dataclasses(tmp_path):
    from agentrl.env import load_env_class
    from agentrl.testing import check_env

    (tmp_path / "asks.py").write_text(DATACLASS_ENV)
    check_env(load_env_class(f"{tmp_path / 'asks.py'}:Asks"))


def test_an_env_whose_constructor_raises_is_named_in_one_line(tiny_model_dir, tmp_path, faults):
    assert_one_line(
        cli(
            "train",
            "--model",
            str(tiny_model_dir),
            "--output-dir",
            str(tmp_path / "r"),
            "--env",
            f"{faults}:InitRaises",
            "--set",
            "env_args.level=moon",
        ),
        f"env '{faults}:InitRaises' failed to start: InitRaises(level='moon') raised ValueError: no level "
        "file for 'moon'",
    )
