"""``check_env`` plays an env's gold episode through its real ``reset``/``step``: one reply, a list
of replies (one per assistant turn) or a function that plays the episode from the messages so far.
A tool env whose answer needs two tool calls passes with the right gold episode and fails, naming
the turn, with a wrong one; an env without a gold says what was not checked."""

from __future__ import annotations

import re
from typing import Any

import pytest

from agentrl import EnvError, ToolEnv, format_tool_call
from agentrl.env.checks import play_gold_episode
from agentrl.testing import GoldUncheckedWarning, check_env, check_gold_answer
from agentrl.tools.tool import Tool

ROOMS = {"A1": "north", "A2": "north", "B1": "east", "B2": "east", "C1": "south", "C2": "west"}
CODES = {"north": "4711", "east": "0815", "south": "2718", "west": "3141"}


class DoorCodes(ToolEnv):
    """What is the door code of room R? ``wing(room)`` names the room's wing and ``code(wing)``
    gives the wing's code: the answer takes both calls, and only an episode that made them (no
    guessing the code from the task) earns 1."""

    instructions = "Find the room's wing with the wing tool, then its code with the code tool; answer \\boxed{CODE}."
    max_turns = 4

    def __init__(self) -> None:
        super().__init__(tools=[Tool(self.wing), Tool(self.code)])
        self.called: set[str] = set()

    def wing(self, room: str) -> str:
        """The wing a room is in.

        Args:
            room: The room's name, e.g. "A1".
        """
        self.called.add("wing")
        return ROOMS[room]

    def code(self, wing: str) -> str:
        """The door code of a wing.

        Args:
            wing: The wing, e.g. "north".
        """
        self.called.add("code")
        return CODES[wing]

    def start(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        self.called = set()
        return super().start(task)

    def train_tasks(self) -> list[dict[str, Any]]:
        return [self.task_for(room) for room in ROOMS if room != "C2"]

    def eval_tasks(self) -> list[dict[str, Any]]:
        return [self.task_for("C2")]

    @staticmethod
    def task_for(room: str) -> dict[str, Any]:
        return {"id": room, "question": f"What is the door code of room {room}?", "answer": CODES[ROOMS[room]]}

    def score_answer(self, text: str) -> float:
        boxed = re.findall(r"\\boxed\{([^{}]*)\}", text)
        return float(self.called == {"wing", "code"} and bool(boxed) and boxed[-1] == self.task["answer"])


def right_replies(task: dict[str, Any]) -> list[str]:
    wing = ROOMS[task["id"]]
    return [format_tool_call("wing", room=task["id"]), format_tool_call("code", wing=wing), f"\\boxed{{{CODES[wing]}}}"]


def play_from_messages(messages: list[dict[str, Any]]) -> str:
    """Plays like a model: reads the question and the tool results from the conversation."""
    last = messages[-1]
    if last["role"] == "user":
        return format_tool_call("wing", room=re.search(r"room (\w+)\?", last["content"]).group(1))
    if last.get("name") == "wing":
        return format_tool_call("code", wing=last["content"])
    return f"The code is \\boxed{{{last['content']}}}."


def with_gold(gold: Any) -> type[DoorCodes]:
    """DoorCodes whose ``gold_reply(task)`` is ``gold(task)``."""
    return type("DoorCodes", (DoorCodes,), {"gold_reply": lambda self, task: gold(task)})


def test_the_right_gold_episode_passes_as_a_list_of_replies_or_a_function() -> None:
    check_env(with_gold(right_replies))
    check_env(with_gold(lambda task: play_from_messages))
    episode = play_gold_episode(DoorCodes(), DoorCodes.task_for("B1"), play_from_messages)
    assert episode.rewards == [0.0, 0.0, 1.0] and episode.ended == "terminated"
    assert [m["content"] for answer in episode.answers for m in answer] == ["east", "0815"]  # run by the env's tools


def test_one_reply_cannot_earn_it_and_a_wrong_gold_episode_fails_naming_the_turn() -> None:
    with pytest.raises(EnvError, match=re.escape("DoorCodes: the gold reply '\\\\boxed{4711}' earned 0.0")):
        check_env(DoorCodes)  # the default gold, \boxed{answer}, skips the tools
    skips_the_code_tool = with_gold(lambda task: [right_replies(task)[0], right_replies(task)[2]])
    with pytest.raises(EnvError) as caught:
        check_env(skips_the_code_tool)
    assert str(caught.value).startswith(
        "DoorCodes: turn 2 of the gold episode (task 'A1') ends it with return 0, expected the max reward 1.0: "
        "turn 1 replied '<tool_call>"
    ), caught.value
    wrong_argument = with_gold(lambda task: [right_replies(task)[0], format_tool_call("code", wing="up"), "\\boxed{1}"])
    with pytest.raises(
        EnvError, match=r"DoorCodes: turn 2 of the gold episode \(task 'A1'\) made a tool call that failed"
    ):
        check_env(wrong_argument)
    too_many = with_gold(lambda task: [*right_replies(task), "\\boxed{0}"])
    with pytest.raises(
        EnvError, match=re.escape("turn 3 of the gold episode (task 'A1') ended it (terminated) with 1 of 4")
    ):
        check_env(too_many)
    not_text = with_gold(lambda task: lambda messages: 42)
    with pytest.raises(EnvError, match=re.escape("turn 1 of the gold episode (task 'A1') has reply an int 42")):
        check_env(not_text)
    with pytest.raises(EnvError, match=re.escape("DoorCodes.gold_reply must return a str, a non-empty list")):
        check_env(with_gold(lambda task: []))


def test_an_env_without_a_gold_is_named_not_skipped_silently() -> None:
    with pytest.warns(GoldUncheckedWarning, match=re.escape("DoorCodes.gold_reply is None for 3 of the 3 tasks tried")):
        check_env(with_gold(lambda task: None))
    with pytest.warns(GoldUncheckedWarning, match="is None for 1 of the 3 tasks tried"):
        assert check_gold_answer(with_gold(lambda task: None if task["id"] == "A2" else right_replies(task))()) == 2
