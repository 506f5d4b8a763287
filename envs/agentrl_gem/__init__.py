"""``gem``: the text environments of GEM (``gem-llm``, ``import gem``) as multi-turn envs.

    agentrl train --env gem --set env_args.env_id=game:GuessTheNumber-v0-easy

GEM envs already speak text in and text out: ``reset(seed=) -> (observation, info)`` and
``step(text) -> (observation, reward, terminated, truncated, info)``, each observation only the new
text. Each episode builds the env with ``gem.make(env_id)`` and resets it on the task's seed; the
opening observation is the user message, and every later observation (with GEM's ``info["suffix"]``,
e.g. the current board, appended as GEM's own chat wrapper does) is the next one. GEM's per-step
rewards are the env's per-turn rewards (its games pay 1.0 for a win, -0.1 for an unparseable move,
which ends the game); GEM's own turn limit ends the episode (``info["truncated_by_game"]``).
``info["success"]`` means the episode ended on a reward >= 1.

Tasks are seeds: training seeds 0, 1, 2, ... and held-out seeds from :data:`EVAL_SEED` on. GEM's
``reset`` seeds Python's and numpy's process-wide RNGs and its games draw from them while playing,
so every call into GEM runs on this env's own RNG state (:class:`agentrl.PrivateGlobalRandom`):
an episode is the same whatever other episodes are interleaved with it.

What runs offline: the ``game:*`` ids (GuessTheNumber, Mastermind, Minesweeper, FifteenPuzzle, Sudoku,
TowerofHanoi, Game2048, Sokoban) and ``rg:*`` (reasoning-gym through GEM; prefer ``--env
reasoning_gym``, whose held-out split is disjoint by question). ``math:``, ``code:``, ``qa:``,
``logic:`` and ``eval:`` ids download their Hugging Face dataset when built (the ``gem`` extra
installs the ``datasets`` and ``pylatexenc`` they import, so offline they fail on the download);
Hangman, Wordle and WordSearch need NLTK's ``words`` corpus; ``game:FifteenPuzzle-v0-random`` and
``game:Crosswords-v0-random`` fail inside GEM 0.1 itself. These fail when built, with GEM's reason.
An exception inside GEM during ``reset`` or ``step`` is an :class:`agentrl.EnvLibraryError` naming
the env id and the call, which ``on_call_error`` skips or fails.

GEM is imported when the env is built, so this plugin loads without it (install it with
``pip install 'agentrl[gem]'``). Importing GEM calls ``logging.basicConfig(level=INFO)``; the adapter
undoes that, so the host's logging is unchanged.
"""

from __future__ import annotations

import difflib
import logging
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
"""Turn limit for envs that set none."""
EXAMPLES = (
    "game:GuessTheNumber-v0-easy",
    "game:Mastermind-v0-easy",
    "game:TowerofHanoi-v0-easy",
    "game:Sudoku-v0-easy",
    "game:Game2048-v0-easy",
    "game:Minesweeper-v0-easy",
    "rg:leg_counting",
)
"""Ids checked to run offline (named in errors)."""
INSTALL_HINT = "--env gem needs the gem-llm package: pip install 'agentrl[gem]'"


def import_gem() -> Any:
    """The ``gem`` module (its import-time logging setup undone), or EnvError naming the extra."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        return import_extra("gem", INSTALL_HINT)
    finally:
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
        root.setLevel(level)


@dataclass(frozen=True)
class GemArgs:
    """The ``gem`` env's ``env_args`` besides ``env_id`` (see :class:`GemEnv`), each checked
    against its declared rule when made: a bad one is a one-line ConfigError
    ``gem: KEY must be ..., got VALUE``."""

    env_kwargs: Annotated[dict[Any, Any] | None, Allowed("a mapping of keyword arguments")]
    num_eval: Annotated[int, Field(ge=1), Allowed("an int >= 1")]
    max_turns: Annotated[Annotated[int, Field(ge=1)] | None, Allowed("an int >= 1")]

    def __post_init__(self) -> None:
        """Raise ConfigError naming the first bad argument, its value and what is allowed."""
        check_declared(self, prefix="gem: ")


class GemEnv(Env):
    """A GEM text env played turn by turn (see the module docstring).

    Args:
        env_id: a GEM id (``game:GuessTheNumber-v0-easy``, ``game:Sudoku-v0-easy``, ``rg:leg_counting``...).
        max_turns: the episode's turn limit (default: the GEM env's own ``max_turns`` for that
            episode, else 20).
        env_kwargs: keyword arguments for ``gem.make`` (``{max_turns: 5}``...).
        num_eval: held-out seeds for ``agentrl eval``.
    """

    concurrent_safe = False
    """GEM draws from the process-wide RNGs, swapped per instance (PrivateGlobalRandom): calls
    are made one at a time."""

    def __init__(
        self,
        env_id: str = "game:GuessTheNumber-v0-easy",
        max_turns: int | None = None,
        env_kwargs: dict[str, Any] | None = None,
        num_eval: int = 64,
    ) -> None:
        super().__init__()
        gem = import_gem()
        from gem.envs.registration import ENV_REGISTRY

        if not isinstance(env_id, str) or env_id not in ENV_REGISTRY:
            close = difflib.get_close_matches(str(env_id), list(ENV_REGISTRY), n=3)
            hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
            raise ConfigError(f"gem: unknown env_id {env_id!r}; {hint}offline ids include {', '.join(EXAMPLES)}")
        GemArgs(env_kwargs=env_kwargs, num_eval=num_eval, max_turns=max_turns)
        self.env_id, self.env_kwargs, self.fixed_max_turns = env_id, dict(env_kwargs or {}), max_turns
        self._make = gem.make
        self._rng = PrivateGlobalRandom(0)
        self.game: Any = None
        try:
            game, _ = self._new_game(0)
        except Exception as exc:
            raise EnvError(
                f"gem env {env_id!r} could not be built: {one_line(exc)} (offline ids include {', '.join(EXAMPLES)})"
            ) from exc
        self.max_turns = self._turn_limit(game)
        self._train = SeedTasks(env_id, "train", 0, TRAIN_SIZE)
        self._eval = SeedTasks(env_id, "eval", EVAL_SEED, num_eval)

    def _new_game(self, seed: int) -> tuple[Any, str]:
        """A fresh GEM env reset on ``seed`` and its opening message (some GEM envs keep state
        across resets, so each episode gets its own)."""
        self._rng.seed(seed)
        with self._rng.active():
            game = self._make(self.env_id, **self.env_kwargs)
            observation, info = game.reset(seed=seed)
        return game, self._message_text(observation, info)

    def _turn_limit(self, game: Any) -> int:
        """``max_turns`` if set, else the GEM env's own (``-random`` ids draw it per episode), else 20."""
        if self.fixed_max_turns is not None:
            return self.fixed_max_turns
        own = getattr(game, "max_turns", None)
        return own if isinstance(own, int) and not isinstance(own, bool) and own > 0 else DEFAULT_MAX_TURNS

    @staticmethod
    def _message_text(observation: Any, info: Any) -> str:
        """GEM's observation with its ``info["suffix"]`` appended, as its chat wrapper shows it."""
        text = str(observation)
        suffix = info.get("suffix") if isinstance(info, dict) else None
        if suffix:
            text = (text if not text or text.endswith("\n") else text + "\n") + str(suffix)
        return text.strip()

    def train_tasks(self) -> Sequence[Task]:
        """Training seeds 0 .. 999,999."""
        return self._train

    def eval_tasks(self) -> Sequence[Task]:
        """``num_eval`` held-out seeds from EVAL_SEED on."""
        return self._eval

    def start(self, task: Task) -> list[Message]:
        """A fresh GEM env on ``task["seed"]``; its opening observation as the user message."""
        seed = task.get("seed")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise EnvError(f"gem: a task needs a non-negative int 'seed', got {task!r}")
        with library_call("gem", self.env_id, "reset"):
            self.game, text = self._new_game(seed)
        self.max_turns = self._turn_limit(self.game)
        return [{"role": "user", "content": text}]

    def respond(self, text: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """Step GEM with ``text``; its next observation as a user message, its reward as this turn's.
        A failure inside GEM is an EnvLibraryError naming the env id (``on_call_error`` applies)."""
        if self.game is None:
            raise EnvError("gem: respond() called before reset() or after the episode ended")
        with library_call("gem", self.env_id, "step"):
            with self._rng.active():
                observation, reward, terminated, truncated, step_info = self.game.step(text)
            reward, done = float(reward), bool(terminated or truncated)
            message = None if done else self._message_text(observation, step_info)
        info = {
            "success": done and reward >= 1.0,
            "truncated_by_game": bool(truncated),
            "metrics": {"won": float(done and reward >= 1.0)},
        }
        if done:
            self.game = None
            return [], reward, True, info
        return [{"role": "user", "content": message}], reward, False, info


@hookimpl
def agentrl_register_envs(register: Callable[..., None]) -> None:
    """Register ``gem``."""
    register("gem", GemEnv)


__all__ = ["GemArgs", "GemEnv"]
