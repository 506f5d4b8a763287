"""What the ``multi_turn`` rollout keeps per episode, and how each episode's model turns are seeded,
batched and named when the engine fails: the parts of its loop that do not call envs.

Each model turn is one :class:`agentrl.GenerationRequest` (its own token cap and seed, ``order`` the
episode's index) on the run's :func:`agentrl.request_queue`; ``plugins.multi_turn.batch_wait_s``
(:class:`MultiTurnConfig`) bounds how long a batch waits for the episodes whose env has not
answered yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import Field

from agentrl import AgentRLError, Engine, EngineError, Env, Generation, SamplingParams, Turn, one_line, turn_seed

SECTION = "multi_turn"


@dataclass(frozen=True)
class MultiTurnConfig:
    """The ``plugins.multi_turn`` section: how the ``multi_turn`` rollout batches its episodes' turns."""

    batch_wait_s: Annotated[float, Field(ge=0)] = 0.5
    """After an episode asks for its next turn, at most how long the engine waits for the other
    running episodes (those whose env has not answered yet) before sampling what is pending; it
    starts at once when every running episode has asked. 0.5 s is far above the time the rollout
    takes to hand a turn's instant env answers back (milliseconds per episode), so with fast envs
    every episode makes the batch and the batches are the lockstep ones; and well below a slow
    env's latency (a sandbox, a web call: seconds), so the episodes that are ready go ahead after at
    most half a second instead of waiting for the slowest env."""


def episode_seed(seeds: list[int] | None, sampling_seed: int | None, index: int, turn: int) -> int | None:
    """The seed of episode ``index``'s turn ``turn`` (its own count, 0-based): ``turn_seed(seeds[index],
    turn)``; without ``seeds``, the seed the engine gave the prompt at position ``index`` of a batch
    seeded ``turn_seed(sampling_seed, turn)`` (:meth:`agentrl.SamplingParams.seeds_for`), so a
    rollout whose episodes all live draws what the lockstep one drew; None when both are None."""
    if seeds is not None:
        return turn_seed(seeds[index], turn)
    batch = turn_seed(sampling_seed, turn)
    return None if batch is None else (batch * 1_000_003 + index) % 2**63


@dataclass
class Episode:
    """One episode as the rollout builds it: its token ids, mask and sampler logprobs so far."""

    index: int
    env: Env
    task: dict[str, Any]
    group: int
    messages: list[dict[str, Any]]
    token_ids: list[int]
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    done: bool = False
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] | None = None

    @property
    def sampled(self) -> int:
        """Model tokens sampled so far."""
        return sum(self.loss_mask)


@dataclass
class Reply:
    """A model turn just appended to its episode, waiting for the env's answer."""

    start: int
    ids: list[int]
    reason: str
    assistant: dict[str, Any]
    history: list[dict[str, Any]]
    """The episode's messages before this turn."""
    version: int | None = None
    """The policy version that sampled it (``Generation.policy_version``)."""
    token_versions: list[int] | None = None
    """Per sampled id, its version, when the weights changed during the turn (``Generation.token_versions``)."""


class EngineExit(Exception):
    """Carries what engine code raised that is not an ``Exception`` (a KeyboardInterrupt or
    SystemExit it raised itself, in the thread serving the request queue) to the rollout, which raises it
    as it was (the run then names it as a plugin's failure)."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(repr(exc))
        self.exc = exc


class NamedEngine:
    """The rollout's engine as its request queue calls it: a failing ``generate`` raises an
    EngineError naming the engine, the turn(s) and the batch (prompt count and lengths), or an
    :class:`EngineExit` for what is not an ``Exception``. ``turns``
    maps ``id(prompt)`` (an episode's token id list) to that episode's turn, 1-based. An engine with
    its own ``request_queue`` keeps it (:func:`agentrl.request_queue` uses it)."""

    def __init__(self, engine: Engine, name: str, turns: dict[int, int]) -> None:
        self.engine, self.name, self.turns = engine, name, turns
        own = getattr(engine, "request_queue", None)
        if callable(own):
            self.request_queue = own

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Generation]:
        """``engine.generate``; any failure becomes an EngineError naming the engine and the batch."""
        try:
            generations = self.engine.generate(prompts, sampling)
            if len(generations) != len(prompts):
                raise EngineError(f"returned {len(generations)} generations for {len(prompts)} prompts")
            return generations
        except Exception as exc:
            turns = sorted({self.turns.get(id(p), 0) for p in prompts})
            at = f"turn {turns[0]}" if len(turns) == 1 else f"turns {turns[0]}-{turns[-1]}"
            lengths = [len(p) for p in prompts]
            detail = str(exc) if isinstance(exc, AgentRLError) else one_line(exc)
            raise EngineError(
                f"engine {self.name} failed at {at} on {len(prompts)} prompts of "
                f"{min(lengths, default=0)}-{max(lengths, default=0)} tokens (max_new_tokens="
                f"{sampling.max_new_tokens}, temperature={sampling.temperature}): {detail}"
            ) from exc
        except BaseException as exc:  # the serving thread hands only Exceptions to the requests' futures
            raise EngineExit(exc) from None
