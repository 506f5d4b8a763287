"""The env-library adapters (reasoning-gym, TextArena, GEM) with the real libraries installed:
each passes ``check_env``, keeps its own semantics (scorer, observations, RNG), names the extra
when its library is missing, and trains 2 steps through the CLI on the tiny model."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from typing import Any

import pytest
from cli_in_process import agentrl_in_process

from agentrl import ConfigError, Env, EnvError, EnvLibraryError
from agentrl.testing import check_env

pytest.importorskip("reasoning_gym")
pytest.importorskip("textarena")
pytest.importorskip("gem")

from agentrl_gem import GemEnv  # noqa: E402
from agentrl_reasoning_gym import ReasoningGymEnv  # noqa: E402
from agentrl_textarena import TextArenaEnv  # noqa: E402

ADAPTERS: dict[str, Callable[[], Env]] = {
    "reasoning_gym-task": lambda: ReasoningGymEnv(task="leg_counting", num_eval=8),
    "reasoning_gym-mix": lambda: ReasoningGymEnv(
        tasks={"leg_counting": 1, "basic_arithmetic": {"weight": 2}}, num_eval=8
    ),
    "textarena-guess": lambda: TextArenaEnv("GuessTheNumber-v0", num_eval=4),
    "textarena-2048": lambda: TextArenaEnv("2048-v0-ultra-easy", num_eval=4),
    "gem-guess": lambda: GemEnv("game:GuessTheNumber-v0-easy", num_eval=4),
    "gem-rg": lambda: GemEnv("rg:leg_counting", num_eval=4),
}


@pytest.mark.parametrize("name", list(ADAPTERS))
def test_adapter_passes_check_env(name: str) -> None:
    check_env(ADAPTERS[name])


# -- reasoning-gym ----------------------------------------------------------------------------------


def test_reasoning_gym_scores_with_the_datasets_own_score_answer() -> None:
    import reasoning_gym

    env = ReasoningGymEnv(task="leg_counting", num_eval=4)
    task = env.eval_tasks()[0]
    dataset = reasoning_gym.create_dataset("leg_counting", seed=0, size=1)
    for reply, tagged in [
        (f"So: <answer>{task['answer']}</answer>", task["answer"]),
        (f"<answer>{int(task['answer']) + 1}</answer>", str(int(task["answer"]) + 1)),
        (f"\\boxed{{{task['answer']}}}", None),
    ]:
        env.reset(options={"task": task})
        _, reward, terminated, _, info = env.step(reply)
        assert terminated and info["answer"] == tagged
        assert reward == dataset.score_answer(tagged, task)
        assert info["success"] == (reward >= 1.0)
    assert env.gold_reply(task) == f"<answer>{task['answer']}</answer>"
    assert env.start(task)[0]["role"] == "system" and "<answer>" in env.start(task)[0]["content"]


def test_reasoning_gym_split_is_seeded_and_disjoint() -> None:
    first, again = (
        ReasoningGymEnv(task="basic_arithmetic", num_eval=32),
        ReasoningGymEnv(task="basic_arithmetic", num_eval=32),
    )
    other_seed = ReasoningGymEnv(task="basic_arithmetic", seed=1, num_eval=32)
    train = [first.train_tasks()[i]["question"] for i in range(200)]
    assert train == [again.train_tasks()[i]["question"] for i in range(200)]
    assert train != [other_seed.train_tasks()[i]["question"] for i in range(200)]
    held_out = {t["question"] for t in first.eval_tasks()}
    assert held_out == {t["question"] for t in other_seed.eval_tasks()}  # the held-out split never moves
    assert not held_out & set(train)


def test_reasoning_gym_mix_draws_every_task() -> None:
    env = ReasoningGymEnv(tasks={"leg_counting": 1, "basic_arithmetic": 1}, num_eval=4)
    sources = {env.train_tasks()[i]["metadata"]["source_dataset"] for i in range(40)}
    assert sources == {"leg_counting", "basic_arithmetic"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"task": "leg_countin"}, "reasoning_gym: unknown task 'leg_countin'; did you mean 'leg_counting'"),
        (
            {"task": "leg_counting", "config": {"max_animals": -3}},
            "reasoning_gym task 'leg_counting': config {'max_animals': -3} is invalid",
        ),
        ({"task": "leg_counting", "config": {"seed": 3}}, "set env_args.seed / env_args.num_eval, not seed or size"),
        ({"tasks": {"leg_counting": 0}}, "reasoning_gym: tasks.leg_counting weight must be a number > 0, got 0"),
        ({"task": "leg_counting", "seed": -1}, "reasoning_gym: seed must be an int in [0, 1000000000), got -1"),
    ],
)
def test_reasoning_gym_bad_settings_are_one_clear_line(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        ReasoningGymEnv(**kwargs)


def test_reasoning_gym_redraws_an_item_the_library_fails_to_make() -> None:
    """codeio's training item 9775 (seed 0) makes reasoning-gym ``json.dumps`` a sympy Integer."""
    import reasoning_gym

    with pytest.raises(TypeError, match="Object of type Integer is not JSON serializable"):
        reasoning_gym.create_dataset("codeio", seed=0, size=10**5)[9775]
    task = ReasoningGymEnv(task="codeio", num_eval=1).train_tasks()[9775]
    assert json.dumps(task) and task["question"]


def test_reasoning_gym_item_failing_on_every_redraw_is_one_clear_line(monkeypatch) -> None:
    monkeypatch.setattr("agentrl_reasoning_gym.RETRIES", 1)
    with pytest.raises(
        EnvLibraryError,
        match=re.escape(
            "reasoning_gym env 'codeio' failed in training item 9775: TypeError: Object of type Integer is not JSON "
            "serializable (1 draw for training item 9775: each failed or was held out)"
        ),
    ):
        ReasoningGymEnv(task="codeio", num_eval=1).train_tasks()[9775]


# -- TextArena and GEM: multi-turn games ----------------------------------------------------------


def test_textarena_sends_only_the_new_part_of_its_cumulative_observation() -> None:
    env = TextArenaEnv("GuessTheNumber-v0", num_eval=4)
    opening, _ = env.reset(options={"task": {"id": "t", "seed": 3}})
    assert "Guess The Number" in opening[0]["content"]
    replies = []
    for move in ["[10]", "[5]", "no number here"]:
        messages, reward, terminated, truncated, _ = env.step(move)
        assert not (terminated or truncated) and reward == 0.0 and len(messages) == 1
        replies.append(messages[0]["content"])
    assert all("Guess The Number" not in reply for reply in replies)  # the opening is not repeated
    assert all("[Player 0]" not in reply for reply in replies)  # nor the model's own move
    assert re.fullmatch(r"\[GAME\] The target number is (higher|lower)\.", replies[0])
    assert "invalid move" in replies[2]


def test_textarena_win_pays_one_and_counts_as_success() -> None:
    env = TextArenaEnv("GuessTheNumber-v0", num_eval=4)
    env.reset(options={"task": {"id": "t", "seed": 3}})
    low, high = 1, 20
    for _ in range(env.max_turns):
        guess = (low + high) // 2
        messages, reward, terminated, _, info = env.step(f"[{guess}]")
        if terminated:
            break
        if "higher" in messages[0]["content"]:
            low = guess + 1
        else:
            high = guess - 1
    assert terminated and reward == 1.0 and info["success"] and info["metrics"] == {"won": 1.0}


@pytest.mark.parametrize(
    ("game", "move", "reason"),
    [
        ("Countdown-v0", "hello", "Invalid action format. Use `[i j op]` where i,j are indices and op is +,-,*,/"),
        ("Cryptarithm-v0", "hello", "Bad action format. Use `[A 5]`."),
        ("Slitherlink-v0", "hello", "Bad action format. Use [h row col] or [v row col]."),
        ("ThreeCardMonte-v0", "[7]", "Index out of range 0-2."),
    ],
)
def test_textarena_games_with_swapped_invalid_move_arguments_end_with_their_progress(
    game: str, move: str, reason: str
) -> None:
    """These games call ``set_invalid_move(progress, reason)`` with the arguments swapped: their
    reward is the reason's text (``float()`` of it raised ValueError); the adapter swaps them back."""
    env = TextArenaEnv(game, num_eval=1)
    env.reset(options={"task": {"id": "t", "seed": 1}})
    _, reward, terminated, _, _ = env.step(move)  # one invalid move is forgiven
    assert not terminated and reward == 0.0
    _, reward, terminated, _, info = env.step(move)
    assert terminated and 0.0 <= reward < 1.0 and not info["success"] and info["invalid_move"]
    assert info["reason"] == f"Invalid Move: {reason}"


def test_a_library_failure_in_reset_or_step_is_one_line_naming_the_library_the_env_and_the_call() -> None:
    textarena = TextArenaEnv("GuessTheNumber-v0", num_eval=1)
    textarena.reset(options={"task": {"id": "t", "seed": 3}})
    with pytest.raises(
        EnvLibraryError,
        match=re.escape(  # TextArena's int() of a 5,000-digit guess
            "textarena env 'GuessTheNumber-v0' failed in step: ValueError: Exceeds the limit (4300 digits) for "
            "integer string conversion"
        ),
    ) as caught:
        textarena.step("[" + "9" * 5000 + "]")
    gem = GemEnv("game:GuessTheNumber-v0-easy", num_eval=1)
    with pytest.raises(
        EnvLibraryError,
        match=re.escape(  # GEM seeds numpy's global RNG with the task's seed
            "gem env 'game:GuessTheNumber-v0-easy' failed in reset: ValueError: Seed must be between 0 and 2"
        ),
    ):
        gem.reset(options={"task": {"id": "t", "seed": 2**32}})
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "make, moves",
    [
        (lambda: TextArenaEnv("2048-v0-ultra-easy", num_eval=2), ["[up]", "[left]", "[down]", "[right]"] * 2),
        (
            lambda: GemEnv("game:Game2048-v0-easy", num_eval=2),
            ["\\boxed{up}", "\\boxed{left}", "\\boxed{down}", "\\boxed{right}"] * 2,
        ),
    ],
    ids=["textarena", "gem"],
)
def test_interleaved_episodes_do_not_share_the_librarys_global_rng(make: Callable[[], Env], moves: list[str]) -> None:
    """2048 draws a new tile from the process-wide RNG every move: an episode stepped alone and the
    same episode stepped in turn with another must see the same boards."""

    def play(interleaved: bool) -> list[Any]:
        env = make()
        env.reset(options={"task": {"id": "a", "seed": 3}})
        other = make()
        if interleaved:
            other.reset(options={"task": {"id": "b", "seed": 4}})
        boards = []
        for move in moves:
            boards.append(env.step(move)[0])
            if interleaved:
                other.step(move)
        return boards

    assert play(interleaved=False) == play(interleaved=True)


def test_gem_per_turn_messages_and_win() -> None:
    env = GemEnv("game:GuessTheNumber-v0-easy", num_eval=4)
    opening, _ = env.reset(options={"task": {"id": "t", "seed": 3}})
    assert "\\boxed{" in opening[0]["content"] and env.max_turns == 4
    low, high = 1, 10
    for turn in range(1, env.max_turns + 1):
        guess = (low + high) // 2
        messages, reward, terminated, _, info = env.step(f"\\boxed{{{guess}}}")
        if terminated:
            break
        assert messages[0]["content"].startswith(f"At turn {turn}, you guessed {guess}")
        if "higher" in messages[0]["content"]:
            low = guess + 1
        else:
            high = guess - 1
    assert terminated and reward == 1.0 and info["success"]


def test_gem_extra_installs_what_every_gem_env_imports() -> None:
    """The ``gem`` extra adds what gem-llm leaves out (``pylatexenc`` for ``math:*``, ``datasets``):
    every registered GEM env's module imports; the dataset ids still download their data when built."""
    import importlib

    from agentrl_gem import import_gem

    import_gem()
    from gem.envs.registration import ENV_REGISTRY

    modules = {str(spec.entry_point).split(":")[0] for spec in ENV_REGISTRY.values()}
    assert "gem.envs.math_env" in modules
    for module in sorted(modules):
        importlib.import_module(module)


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (
            lambda: TextArenaEnv("TicTacToe-v0"),
            EnvError,
            "textarena game 'TicTacToe-v0' cannot be played by one player",
        ),
        (
            lambda: TextArenaEnv("GuesTheNumber-v0"),
            ConfigError,
            "textarena: unknown game 'GuesTheNumber-v0'; did you mean 'GuessTheNumber-v0'",
        ),
        (
            lambda: GemEnv("game:GuessTheNumbr-v0-easy"),
            ConfigError,
            "gem: unknown env_id 'game:GuessTheNumbr-v0-easy'; did you mean 'game:GuessTheNumber-v0-easy'",
        ),
        (
            lambda: TextArenaEnv("GuessTheNumber-v0", max_turns=0),
            ConfigError,
            "textarena: max_turns must be an int >= 1, got 0",
        ),
    ],
)
def test_games_refused_with_one_clear_line(make: Callable[[], Env], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        make()


# -- through the CLI ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "module", "extra"),
    [
        ("reasoning_gym", "reasoning_gym", "reasoning-gym"),
        ("textarena", "textarena", "textarena"),
        ("gem", "gem", "gem"),
    ],
)
def test_missing_library_names_the_extra(env: str, module: str, extra: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # the library is not installed
    result = agentrl_in_process("train", "--env", env, "--output-dir", str(tmp_path / "run"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"pip install 'agentrl[{extra}]'" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "env_args",
    [
        ["--env", "reasoning_gym", "--set", "env_args.task=leg_counting", "--set", "env_args.num_eval=4"],
        [
            "--env",
            "textarena",
            "--set",
            "env_args.game=GuessTheNumber-v0",
            "--set",
            "env_args.max_turns=2",
            "--set",
            "env_args.num_eval=4",
        ],
        [
            "--env",
            "gem",
            "--set",
            "env_args.env_id=game:GuessTheNumber-v0-easy",
            "--set",
            "env_args.max_turns=2",
            "--set",
            "env_args.num_eval=4",
        ],
    ],
    ids=["reasoning_gym", "textarena", "gem"],
)
def test_adapter_trains_two_steps_through_the_cli(env_args: list[str], tiny_model_dir, tmp_path) -> None:
    out = tmp_path / "run"
    result = agentrl_in_process(
        "train",
        *env_args,
        "--model",
        str(tiny_model_dir),
        "--max-steps",
        "2",
        "--num-generations",
        "2",
        "--prompts-per-step",
        "2",
        "--output-dir",
        str(out),
        "--set",
        "eval_tasks=2",
        "--set",
        "max_new_tokens=8",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps[:2] == [1, 2]
    assert env_args[1] in (out / "config.yaml").read_text()
