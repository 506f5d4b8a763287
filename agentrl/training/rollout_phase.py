"""The rollout phase of a step: which tasks, the episodes, their scores, the batch to learn from.

:class:`RolloutPhase` walks the tasks (:class:`TaskCursor`), runs each task's group of episodes
through the run's rollout and engine, scores them, keeps the groups dynamic sampling asks for, and
collates this process's share; it also evaluates the policy on held-out tasks. It knows nothing of
optimizers: the learner takes what :meth:`RolloutPhase.collect` returns.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from agentrl.algorithms.dynamic_sampling import GroupSelector, has_spread
from agentrl.model import distributed
from agentrl.rewards.scoring import popped_metrics, score
from agentrl.rundir.metrics import reward_metrics, rollout_metrics
from agentrl.sampling.engine import SamplingParams
from agentrl.training.build import Run, make_env
from agentrl.training.evaluate import evaluate
from agentrl.training.rng import rng_states, set_rng_states
from agentrl.trajectory import TrainBatch, Trajectory, collate, with_segments


class TaskCursor:
    """Walks a task sequence in seeded shuffled epochs; ``position`` is the resumable cursor."""

    def __init__(self, num_tasks: int, seed: int) -> None:
        self.num_tasks, self.seed, self.position = num_tasks, seed, 0
        self._epoch, self._order = -1, np.empty(0, dtype=np.int64)

    def take(self, n: int) -> list[int]:
        """The next ``n`` task indices (crossing epoch boundaries reshuffles)."""
        out = []
        for _ in range(n):
            epoch, offset = divmod(self.position, self.num_tasks)
            if epoch != self._epoch:  # one permutation per epoch, not per task
                self._epoch = epoch
                self._order = np.random.default_rng([self.seed, epoch]).permutation(self.num_tasks)
            out.append(int(self._order[offset]))
            self.position += 1
        return out


class RolloutPhase:
    """Tasks -> scored episodes -> this process's batch, for one step at a time."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.tasks = run.envs[0].train_tasks()
        self.cursor = TaskCursor(len(self.tasks), run.config.seed)
        self.step_rewards: list[float] = []
        """The last collected batch's total rewards (every process's, in group order)."""
        self.group: Any = None
        """The process group of this phase's collectives (an asynchronous run's rollout thread has its
        own, beside the learner's); None: the default one."""
        self.sampling_version: int | None = None
        """The policy version the engine holds, stamped on every sampled token (an asynchronous run;
        None: not recorded)."""

    def boundary(self) -> tuple[int, dict[str, Any]]:
        """Where the next step starts (task cursor, RNG states): :meth:`rewind` returns there."""
        return self.cursor.position, rng_states()

    def rewind(self, boundary: tuple[int, dict[str, Any]]) -> None:
        """Back to a :meth:`boundary` (a step interrupted before it trained anything)."""
        self.cursor.position = boundary[0]
        set_rng_states(boundary[1])

    def collect(self, step: int) -> tuple[TrainBatch, list[Any], dict[str, float]]:
        """Sample tasks, run this process's share of the episodes, score them; returns this
        process's collated batch, the whole batch's trajectories (every process's, in group order)
        and the step's metrics. With ``dynamic_sampling`` the batch holds the groups with a reward
        spread found over up to ``max_sampling_rounds`` rounds (:mod:`agentrl.algorithms.dynamic_sampling`);
        reward and rollout metrics cover every episode sampled, kept or not."""
        cfg = self.run.config
        share = cfg.prompts_per_step // self.run.num_processes
        first = self.run.accelerator.process_index * share  # this process's groups: first .. first + share - 1
        selector = GroupSelector(share, cfg.num_generations, filter_groups=cfg.dynamic_sampling)
        sampled: list[Trajectory] = []
        sampled_totals: list[float] = []
        sampled_components: list[dict[str, np.ndarray]] = []
        nonfinite: dict[str, int] = {}
        errors: dict[str, int] = {}
        rounds = 0
        for round_index in range(cfg.max_sampling_rounds if cfg.dynamic_sampling else 1):
            if round_index and not sum(distributed.gather_objects(selector.missing, self.group)):
                break  # every process has its groups
            indices = self.cursor.take(cfg.prompts_per_step)  # every process walks the same cursor
            mine = indices[first : first + selector.missing]  # a refill round samples only what is missing
            rounds += 1
            if not mine:
                continue
            trajectories, totals, components = self._sample_groups(step, round_index, first, mine, nonfinite, errors)
            selector.add(trajectories, totals, components)
            sampled += trajectories
            sampled_totals += totals
            sampled_components.append(components)
        filled = selector.filled
        kept, kept_totals, _ = selector.batch(first)
        rows, row_totals, row_shares = with_segments(kept, kept_totals)  # an agent episode may hold several rows
        batch = collate(
            rows,
            row_totals,
            self.run.tokenizer.pad_token_id,
            env_reward_weight=cfg.env_reward_weight,
            shares=row_shares,
        ).to(self.run.accelerator.device)
        components = {name: np.concatenate([c[name] for c in sampled_components]) for name in sampled_components[0]}
        # Metrics and hooks see the whole batch: every process's share, in group order.
        shares = distributed.gather_objects(
            (sampled, sampled_totals, components, nonfinite, errors, kept, kept_totals, filled), self.group
        )
        if len(shares) > 1:
            sampled = [t for share in shares for t in share[0]]
            sampled_totals = [x for share in shares for x in share[1]]
            components = {name: np.concatenate([share[2][name] for share in shares]) for name in components}
            nonfinite, errors = _summed([share[3] for share in shares]), _summed([share[4] for share in shares])
            kept = [t for share in shares for t in share[5]]
            kept_totals = [x for share in shares for x in share[6]]
        metrics = {
            **reward_metrics(sampled_totals, components),
            **rollout_metrics(sampled),
            **{f"reward/{name}_nonfinite": float(n) for name, n in nonfinite.items() if n},
            **{f"errors/reward/{name}": float(n) for name, n in errors.items()},
            **popped_metrics(self.run.reward_fns),
        }  # this process's counts
        if cfg.dynamic_sampling:
            spread = [
                has_spread(sampled_totals[i : i + cfg.num_generations])
                for i in range(0, len(sampled_totals), cfg.num_generations)
            ]
            metrics.update(
                {
                    "sampling/rounds": float(rounds),
                    "sampling/groups_sampled": float(len(spread)),
                    "sampling/spread_frac": float(np.mean(spread)),
                    "sampling/filled_groups": float(sum(share[7] for share in shares)),
                }
            )
        if self.run.is_main:
            self.run.hook.agentrl_on_rollout_end(trajectories=kept, step=step, metrics=metrics)
        self.step_rewards = list(kept_totals)  # the whole batch's, as collated
        return batch, kept, metrics

    def _sample_groups(
        self,
        step: int,
        round_index: int,
        first: int,
        task_indices: list[int],
        nonfinite: dict[str, int],
        errors: dict[str, int],
    ) -> tuple[list[Trajectory], list[float], dict[str, np.ndarray]]:
        """Roll out and score ``num_generations`` episodes of each task; the groups are numbered from
        ``first`` (renumbered when the batch is chosen). Every episode samples from its own seed,
        derived from its place in the global batch: the same on any process count."""
        cfg = self.run.config
        tasks = [self.tasks[i] for i in task_indices for _ in range(cfg.num_generations)]
        groups = [first + g for g in range(len(task_indices)) for _ in range(cfg.num_generations)]
        sampling = SamplingParams(
            max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            seed=cfg.seed * 1_000_003 + step,
        )
        offset = first * cfg.num_generations
        if round_index == 0:
            seeds = [cfg.seed * 1_000_003 + step * cfg.batch_size + offset + i for i in range(len(tasks))]
        else:  # refill rounds: seeds from their own stream
            seeds = [
                int(np.random.SeedSequence([cfg.seed, step, round_index, offset + i]).generate_state(1)[0])
                for i in range(len(tasks))
            ]
        trajectories = self.run.rollout.run(self.run.envs[: len(tasks)], tasks, groups, sampling, seeds=seeds)
        if self.sampling_version is not None:
            for row in (r for t in trajectories for r in (*t.segments, t)):
                row.policy_versions = _token_versions(row, self.sampling_version)
        for i, trajectory in enumerate(trajectories):  # an abandoned env call may still touch its env
            if (trajectory.info.get("error") or {}).get("timed_out"):
                self.run.envs[i] = make_env(self.run.manager, cfg)
        totals, components = score(
            trajectories,
            self.run.reward_fns,
            cfg.env_reward_weight,
            nonfinite,
            guard=self.run.call_guard,
            errors=errors,
        )
        return trajectories, totals, components

    def evaluate(self) -> dict[str, float]:
        """Held-out accuracy of the current policy (greedy by default)."""
        cfg = self.run.config
        eval_tasks = list(self.run.envs[0].eval_tasks())[: cfg.eval_tasks]
        metrics, _ = evaluate(
            self.run.rollout,
            self.run.envs,
            eval_tasks,
            max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.eval_temperature,
            seed=cfg.seed,
            reward_fns=self.run.reward_fns,
            batch_size=len(self.run.envs),
            guard=self.run.call_guard,
            env_weight=cfg.env_reward_weight,
        )
        if cfg.eval_sampled and cfg.eval_temperature != cfg.temperature:
            sampled, _ = evaluate(
                self.run.rollout,
                self.run.envs,
                eval_tasks,
                max_new_tokens=cfg.max_new_tokens,
                temperature=cfg.temperature,
                seed=cfg.seed,
                batch_size=len(self.run.envs),
            )
            metrics["eval/accuracy_sampled"] = sampled["eval/accuracy"]
        # What the reward functions counted while scoring held-out episodes is evaluation's, not the next step's.
        metrics.update({f"eval/{name}": value for name, value in popped_metrics(self.run.reward_fns).items()})
        return metrics


def _token_versions(row: Trajectory, version: int) -> list[int]:
    """Per token of ``row``: the version that sampled it (its turn's ``token_versions``, else its
    ``policy_version``, else ``version``, the collection's), -1 where the model did not sample."""
    out = [-1] * len(row.token_ids)
    for turn in row.turns:
        sampled_by = version if turn.policy_version is None else turn.policy_version
        span = turn.end - turn.start
        if turn.token_versions is not None and len(turn.token_versions) != span:
            raise ValueError(f"a turn of {span} sampled tokens has {len(turn.token_versions)} token_versions")
        out[turn.start : turn.end] = [sampled_by] * span if turn.token_versions is None else turn.token_versions
    return out


def _summed(counts: list[dict[str, int]]) -> dict[str, int]:
    """Per-name counts added over processes."""
    out: dict[str, int] = {}
    for part in counts:
        for name, n in part.items():
            out[name] = out.get(name, 0) + n
    return out
