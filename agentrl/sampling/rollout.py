"""The rollout contract: what the training loop and evaluation call to turn tasks into episodes.

A rollout plugin (``agentrl_register_rollouts``) registers a factory
``factory(engine=, tokenizer=, config=)`` returning an object of this shape. The built-in
``multi_turn`` rollout drives env instances turn by turn through the run's engine; an agent
rollout drives an agent program instead.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from agentrl.env.base import Env
from agentrl.env.tasks import Task
from agentrl.sampling.engine import SamplingParams
from agentrl.trajectory import Trajectory


@runtime_checkable
class Rollout(Protocol):
    """Runs one episode per env to its end and returns each as a :class:`agentrl.Trajectory`.

    A rollout holding resources of its own (processes, servers) may also define ``close()``:
    ``agentrl train`` calls it once when the run ends, however it ends."""

    def run(
        self,
        envs: list[Env],
        tasks: list[Task],
        groups: list[int],
        sampling: SamplingParams,
        seeds: list[int] | None = None,
    ) -> list[Trajectory]:
        """Episode ``i`` runs ``tasks[i]`` in ``envs[i]`` (``envs``, ``tasks`` and ``groups`` have one
        entry per episode) and returns its trajectory, in order.

        ``groups[i]``: the group episode ``i`` belongs to (the episodes of one task in a training
        step share a group; each evaluation episode is a group of its own). ``sampling``: how the
        engine samples every turn. ``seeds``: one per episode, or None. The training loop passes
        them, derived from each episode's place in the global batch: episode ``i`` resets its env
        with ``seeds[i]`` and samples its turns from seeds derived from it alone, so it samples the
        same tokens on any process count and beside any other episodes. Evaluation passes None:
        ``sampling.seed`` seeds the batch.
        """
