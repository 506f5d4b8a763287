"""``textarena``: TextArena's single-player games as multi-turn envs.

    agentrl train --env textarena --set env_args.game=GuessTheNumber-v0

Each episode builds the game with ``textarena.make(game)`` (its default wrappers: the LLM
observation wrapper, and the action wrapper that brackets a bare reply, "7" -> "[7]") and plays it
as player 0 of a one-player game. TextArena's observation is cumulative (the whole history every
turn), so the first user message is the whole opening observation and each later one only the part
that is new since the last turn, less the echo of the model's own move. The reward comes at the end:
the game's own reward for player 0 (TextArena's single-player games pay 1.0 for a win and a share
of progress otherwise); ``info["success"]`` means won (reward >= 1).

Tasks are seeds: training seeds 0, 1, 2, ... and held-out seeds from :data:`EVAL_SEED` on, so the
splits never share a seed (two seeds can still deal the same game where a game has few layouts:
GuessTheNumber has 20 secrets). TextArena games draw from Python's process-wide ``random`` (and a few
from numpy's), and the rollout steps many env instances in turn, so every call into TextArena runs
on this env's own saved RNG state (:class:`agentrl.PrivateGlobalRandom`), seeded by the task
seed: an episode is the same whatever other episodes are interleaved with it.

``max_turns`` is the game's own turn limit (20 where it has none) unless set; a retry after an
invalid move counts as a turn here, and an episode cut off by ``max_turns`` scores 0. Two-player and
multi-player games are refused. Games whose data must be downloaded (Wordle, Hangman, SpellingBee and
the other word games need NLTK's ``words`` corpus) or that call a hosted LLM (TwentyQuestions,
GuessWho need an OpenRouter key) fail when built, with TextArena's reason. An exception inside
TextArena during ``reset`` or ``step`` is an :class:`agentrl.EnvLibraryError` naming the game and
the call, which ``on_call_error`` skips or fails; the swapped arguments of a few games' invalid-move
penalty are put right (:func:`final_result`).

TextArena is imported when the env is built, so this plugin loads without it (install it with
``pip install 'agentrl[textarena]'``).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field

from agentrl import (
    Allowed,
    ConfigError,
    Env,
    EnvError,
    Message,
    PrivateGlobalRandom,
    SeedTasks,
    Task,
    check_declared,
    hookimpl,
    import_extra,
    library_call,
    one_line,
)

TRAIN_SIZE = 1_000_000
"""Training seeds are 0 .. TRAIN_SIZE - 1."""
EVAL_SEED = 2**31
"""Held-out seeds start here."""
DEFAULT_MAX_TURNS = 20
"""Turn limit for games that set none."""
SINGLE_PLAYER_EXAMPLES = (
    "GuessTheNumber-v0",
    "Mastermind-v0",
    "TowerOfHanoi-v0",
    "FrozenLake-v0",
    "Minesweeper-v0",
    "Sudoku-v0-very-easy",
    "Blackjack-v0",
    "Countdown-v0",
    "LightsOut-v0",
    "2048-v0-ultra-easy",
)
"""Single-player games checked to run offline (named in errors)."""
INVALID_MOVE = "Invalid Move: "
"""How TextArena's single-player state starts the reason of a game lost to invalid moves."""
INSTALL_HINT = "--env textarena needs the textarena package: pip install 'agentrl[textarena]'"


def import_textarena() -> Any:
    """The ``textarena`` module, or EnvError naming the extra that installs it."""
    return import_extra("textarena", INSTALL_HINT)


def _base(game: Any) -> Any:
    """The innermost TextArena env under its wrappers."""
    while hasattr(game, "env"):
        game = game.env
    return game


def final_result(reward: Any, reason: str) -> tuple[float, str]:
    """Player 0's final reward and reason as TextArena's game meant them.

    Some TextArena 0.7 games (Countdown, Cryptarithm, Slitherlink, ThreeCardMonte) call
    ``set_invalid_move(progress, reason)`` with the arguments swapped, so a game lost to invalid
    moves reports the reason's text as its reward and ``"Invalid Move: <progress>"`` as its reason:
    swapped back here. Any other reward that is not a number raises."""
    if isinstance(reward, str) and reason.startswith(INVALID_MOVE):
        return float(reason[len(INVALID_MOVE) :]), INVALID_MOVE + reward
    return float(reward), reason


@dataclass(frozen=True)
class TextArenaArgs:
    """The ``textarena`` env's ``env_args`` besides ``game`` (see :class:`TextArenaEnv`), each
    checked against its declared rule when made: a bad one is a one-line ConfigError
    ``textarena: KEY must be ..., got VALUE``."""

    game_args: Annotated[dict[Any, Any] | None, Allowed("a mapping of keyword arguments")]
    num_eval: Annotated[int, Field(ge=1), Allowed("an int >= 1")]
    max_turns: Annotated[Annotated[int, Field(ge=1)] | None, Allowed("an int >= 1")]

    def __post_init__(self) -> None:
        """Raise ConfigError naming the first bad argument, its value and what is allowed."""
        check_declared(self, prefix="textarena: ")


class TextArenaEnv(Env):
    """A TextArena single-player game played turn by turn (see the module docstring).

    Args:
        game: a TextArena env id (``GuessTheNumber-v0``, ``Mastermind-v0``, ``TowerOfHanoi-v0``...).
        max_turns: the episode's turn limit (default: the game's own, else 20).
        game_args: keyword arguments for ``textarena.make`` (``{max_turns: 5}``...).
        num_eval: held-out seeds for ``agentrl eval``.
    """

    concurrent_safe = False
    """TextArena draws from the process-wide RNGs, swapped per instance (PrivateGlobalRandom):
    calls are made one at a time."""

    def __init__(
        self,
        game: str = "GuessTheNumber-v0",
        max_turns: int | None = None,
        game_args: dict[str, Any] | None = None,
        num_eval: int = 64,
    ) -> None:
        super().__init__()
        ta = import_textarena()
        from textarena.envs.registration import ENV_REGISTRY

        if not isinstance(game, str) or game not in ENV_REGISTRY:
            close = difflib.get_close_matches(str(game), list(ENV_REGISTRY), n=3)
            hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
            raise ConfigError(
                f"textarena: unknown game {game!r}; {hint}single-player games include "
                f"{', '.join(SINGLE_PLAYER_EXAMPLES)}"
            )
        TextArenaArgs(game_args=game_args, num_eval=num_eval, max_turns=max_turns)
        self.game_id, self.game_args = game, dict(game_args or {})
        self._make = ta.make
        self._single_player_state = ta.SinglePlayerState
        self._rng = PrivateGlobalRandom(0)
        self.game: Any = None
        self._last_observation = ""
        game_turns = self._probe()
        if max_turns is None:
            max_turns = game_turns if type(game_turns) is int and game_turns > 0 else DEFAULT_MAX_TURNS
        self.max_turns = max_turns
        self._train = SeedTasks(game, "train", 0, TRAIN_SIZE)
        self._eval = SeedTasks(game, "eval", EVAL_SEED, num_eval)

    def _new_game(self, seed: int) -> tuple[Any, str]:
        """A fresh game reset on ``seed`` and its opening observation (the wrappers keep history,
        so each episode gets its own game object)."""
        self._rng.seed(seed)
        with self._rng.active():
            game = self._make(self.game_id, **self.game_args)
            game.reset(num_players=1, seed=seed)
            _, observation = game.get_observation()
        return game, observation

    def _probe(self) -> int | None:
        """Build and reset the game once; refuse games that are not single-player. Returns its turn limit."""
        try:
            game, _ = self._new_game(0)
        except Exception as exc:
            players = any(word in str(exc).lower() for word in ("player", "players"))
            if players:
                raise EnvError(
                    f"textarena game {self.game_id!r} cannot be played by one player ({one_line(exc)}); "
                    f"only single-player games are supported, e.g. "
                    f"{', '.join(SINGLE_PLAYER_EXAMPLES)}"
                ) from exc
            hint = (
                " (it needs NLTK's 'words' corpus: python -m nltk.downloader words)"
                if isinstance(exc, LookupError)
                else ""
            )
            raise EnvError(f"textarena game {self.game_id!r} could not be built: {one_line(exc)}{hint}") from exc
        state = getattr(_base(game), "state", None)
        if not isinstance(state, self._single_player_state):
            raise EnvError(
                f"textarena game {self.game_id!r} is not single-player (its state is {type(state).__name__}); "
                f"only single-player games are supported, e.g. {', '.join(SINGLE_PLAYER_EXAMPLES)}"
            )
        return getattr(state, "max_turns", None)

    def train_tasks(self) -> Sequence[Task]:
        """Training seeds 0 .. 999,999."""
        return self._train

    def eval_tasks(self) -> Sequence[Task]:
        """``num_eval`` held-out seeds from EVAL_SEED on."""
        return self._eval

    def start(self, task: Task) -> list[Message]:
        """A fresh game on ``task["seed"]``; its opening observation as the user message."""
        seed = task.get("seed")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise EnvError(f"textarena: a task needs a non-negative int 'seed', got {task!r}")
        with library_call("textarena", self.game_id, "reset"):
            self.game, self._last_observation = self._new_game(seed)
        return [{"role": "user", "content": self._last_observation.strip()}]

    def respond(self, text: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """Play ``text`` as player 0's move; the new part of the observation, or the final reward.
        A failure inside TextArena is an EnvLibraryError naming the game (``on_call_error`` applies)."""
        if self.game is None:
            raise EnvError("textarena: respond() called before reset() or after the game ended")
        with library_call("textarena", self.game_id, "step"):
            with self._rng.active():
                done, _ = self.game.step(text)
                if done:
                    rewards, game_info = self.game.close()
                else:
                    _, observation = self.game.get_observation()
            if not done:
                return (
                    [{"role": "user", "content": self._new_part(observation)}],
                    0.0,
                    False,
                    {"success": False, "metrics": {"won": 0.0}},
                )
            player = (game_info or {}).get(0, {})
            reward, reason = final_result((rewards or {}).get(0, 0.0), str(player.get("reason", "")))
        self.game = None
        return (
            [],
            reward,
            True,
            {
                "success": reward >= 1.0,
                "game_reward": reward,
                "reason": reason,
                "invalid_move": bool(player.get("invalid_move", False)),
                "metrics": {"won": float(reward >= 1.0)},
            },
        )

    def _new_part(self, observation: str) -> str:
        """What ``observation`` adds to the last one, less the echo of the model's own move."""
        previous, self._last_observation = self._last_observation, observation
        new = observation[len(previous) :] if observation.startswith(previous) else observation
        state = _base(self.game).state
        moves = [message for sender, message in state.logs if sender == 0]
        if moves:
            echo = f"\n[{state.role_mapping.get(0, 'Player 0')}] {moves[-1]}"
            new = new[len(echo) :] if new.startswith(echo) else new
        return new.strip() or "[GAME] (nothing new)"


@hookimpl
def agentrl_register_envs(register: Callable[..., None]) -> None:
    """Register ``textarena``."""
    register("textarena", TextArenaEnv)


__all__ = ["TextArenaArgs", "TextArenaEnv"]
