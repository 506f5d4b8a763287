"""The rollout phase of a step: which tasks, the episodes, their scores, the batch to learn from.

:class:`RolloutPhase` walks the tasks (:class:`TaskCursor`), runs each task's group of episodes
through the run's rollout and engine, scores them, keeps the groups dynamic sampling asks for, and
collates this process's share; it also evaluates the policy on held-out tasks. It knows nothing of
optimizers: the learner takes what :meth:`RolloutPhase.collect` returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentrl.algorithms.dynamic_sampling import GroupSelector, has_spread
from agentrl.model import distributed
from agentrl.rewards.scoring import popped_metrics, score
from agentrl.rewards.unscored import Unscored, why_unscored
from agentrl.rundir.episodes import due, episode_record, token_texts, with_token_views
from agentrl.rundir.metrics import reward_metrics, rollout_metrics
from agentrl.sampling.engine import SamplingParams
from agentrl.training.build import Run
from agentrl.training.evaluate import evaluate, unscored_cause
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


@dataclass
class StepBatch:
    """One step's batch to learn from, with what the loop records of it."""

    batch: TrainBatch
    """This process's collated batch."""
    episodes: list[Any]
    """The whole batch's kept trajectories (every process's, in group order)."""
    metrics: dict[str, float]
    """The step's metrics so far: rewards, rollouts, dynamic sampling."""
    rewards: list[float]
    """The kept episodes' total rewards, as collated (every process's, in group order)."""
    records: list[dict[str, Any]] = field(default_factory=list)
    """The kept episodes' lines for ``completions.jsonl`` (:func:`agentrl.rundir.episodes.episode_record`,
    no ``step`` or ``advantage`` yet), in the order of ``episodes``."""


@dataclass
class _Sampled:
    """What a step sampled and kept: one process's share, or every process's (:meth:`gathered`)."""

    episodes: list[Trajectory] = field(default_factory=list)
    """Every episode sampled, kept or not."""
    totals: list[float] = field(default_factory=list)
    components: dict[str, np.ndarray] = field(default_factory=dict)
    """Per reward function, its score of each sampled episode."""
    nonfinite: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    kept: list[Trajectory] = field(default_factory=list)
    kept_totals: list[float] = field(default_factory=list)
    filled: int = 0
    """Groups without a reward spread kept to fill the batch (dynamic sampling)."""

    def records(self) -> list[dict[str, Any]]:
        """Each kept episode's line (:func:`agentrl.rundir.episodes.episode_record`): its place in
        its group, its total and each reward function's score, why it went unscored."""
        where = {id(t): i for i, t in enumerate(self.episodes)}
        seen: dict[int, int] = {}
        out = []
        for trajectory, total in zip(self.kept, self.kept_totals, strict=True):
            i = where.get(id(trajectory))
            scores = {} if i is None else {name: float(v[i]) for name, v in self.components.items()}
            index = seen[trajectory.group] = seen.get(trajectory.group, -1) + 1
            cause = unscored_cause(trajectory, total)
            out.append(episode_record(trajectory, index=index, total=total, components=scores, unscored=cause))
        return out

    def gathered(self, group: Any) -> _Sampled:
        """Every process's share, in group order (this one in a one-process run)."""
        shares = distributed.gather_objects(self, group)
        if len(shares) == 1:
            return self
        return _Sampled(
            [t for share in shares for t in share.episodes],
            [x for share in shares for x in share.totals],
            {name: np.concatenate([share.components[name] for share in shares]) for name in self.components},
            _summed([share.nonfinite for share in shares]),
            _summed([share.errors for share in shares]),
            [t for share in shares for t in share.kept],
            [x for share in shares for x in share.kept_totals],
            sum(share.filled for share in shares),
        )


class RolloutPhase:
    """Tasks -> scored episodes -> this process's batch, for one step at a time."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.tasks = run.envs[0].train_tasks()
        self.cursor = TaskCursor(len(self.tasks), run.config.seed)
        self.group: Any = None
        """The process group of this phase's collectives (an asynchronous run's rollout thread has its
        own, beside the learner's); None: the default one."""
        self.sampling_version: int | None = None
        """The policy version the engine holds, stamped on every sampled token (an asynchronous run;
        None: not recorded)."""
        self.unscored: dict[int, Unscored] = {}
        """Step -> why its unscored episodes were not scored (:meth:`why`), until the learner asks."""
        self.eval_records: list[dict[str, Any]] = []
        """The last :meth:`evaluate`'s episodes (:func:`agentrl.rundir.episodes.episode_record`)."""
        self.decode: Any = None
        """Token ids -> their texts (:func:`agentrl.rundir.episodes.token_texts`), made when first needed."""

    def boundary(self) -> tuple[int, dict[str, Any]]:
        """Where the next step starts (task cursor, RNG states): :meth:`rewind` returns there."""
        return self.cursor.position, rng_states()

    def rewind(self, boundary: tuple[int, dict[str, Any]]) -> None:
        """Back to a :meth:`boundary` (a step interrupted before it trained anything)."""
        self.cursor.position = boundary[0]
        set_rng_states(boundary[1])

    def collect(self, step: int) -> StepBatch:
        """Sample tasks, run this process's share of the episodes, score them; returns this
        process's collated batch with the whole batch's trajectories, metrics and rewards. With
        ``dynamic_sampling`` the batch holds the groups with a reward spread found over up to
        ``max_sampling_rounds`` rounds (:mod:`agentrl.algorithms.dynamic_sampling`); reward and
        rollout metrics cover every episode sampled, kept or not."""
        cfg = self.run.config
        share = cfg.prompts_per_step // self.run.num_processes
        first = self.run.accelerator.process_index * share  # this process's groups: first .. first + share - 1
        selector = GroupSelector(share, cfg.num_generations, filter_groups=cfg.dynamic_sampling)
        mine, rounds = self._sample_rounds(step, first, selector)
        mine.filled = selector.filled
        mine.kept, mine.kept_totals, _ = selector.batch(first)
        rows, row_totals, row_shares = with_segments(mine.kept, mine.kept_totals)  # an episode may hold several rows
        batch = collate(
            rows,
            row_totals,
            self.run.tokenizer.pad_token_id,
            env_reward_weight=cfg.env_reward_weight,
            shares=row_shares,
        ).to(self.run.accelerator.device)
        whole = mine.gathered(self.group)  # metrics and hooks see the whole batch
        metrics = self._metrics(whole, rounds)
        self.unscored[step] = why_unscored(whole.episodes, whole.totals, whole.errors, whole.nonfinite)
        metrics.update(self.unscored[step].metrics("train/"))
        metrics.update(self._counts())
        if self.run.is_main:
            self.run.hook.agentrl_on_rollout_end(trajectories=whole.kept, step=step, metrics=metrics)
        return StepBatch(batch, whole.kept, metrics, list(whole.kept_totals), self.with_tokens(whole, step))

    def with_tokens(
        self, whole: _Sampled | None, step: int, evaluated: list[Trajectory] | None = None
    ) -> list[dict[str, Any]]:
        """The episode lines of ``whole`` (a step's, :meth:`_Sampled.records`) or of the
        ``evaluated`` trajectories (:attr:`eval_records`), each with its ``token_view``
        (:func:`agentrl.rundir.episodes.token_view`) when ``log_tokens`` asks and they are written
        (the main process; a training step's when ``log_completions_every`` makes it due)."""
        cfg = self.run.config
        records, trajectories = (self.eval_records, evaluated) if whole is None else (whole.records(), whole.kept)
        if (
            cfg.log_tokens == "none"
            or not self.run.is_main
            or (whole is not None and not due(cfg.log_completions_every, step))
        ):
            return records
        if self.decode is None:
            self.decode = token_texts(self.run.tokenizer)
        return with_token_views(records, trajectories or [], self.decode)

    def _counts(self) -> dict[str, float]:
        """The run's counters (:attr:`agentrl.training.build.Run.counters`) summed over the processes."""
        mine: dict[str, float] = {}
        for counter in self.run.counters:
            for key, value in counter().items():
                mine[key] = mine.get(key, 0.0) + value
        if self.run.num_processes == 1:
            return mine
        summed: dict[str, float] = {}
        for counts in distributed.gather_objects(mine, self.group):
            for key, value in counts.items():
                summed[key] = summed.get(key, 0.0) + value
        return summed

    def why(self, step: int, metrics: dict[str, float]) -> Unscored:
        """Why step ``step``'s unscored episodes were not scored: as :meth:`collect` found it, or (a
        batch restored from a checkpoint) the counts in its ``metrics`` without the first failure."""
        for older in [s for s in list(self.unscored) if s < step]:  # batches dropped unused (a rewind)
            self.unscored.pop(older, None)
        found = self.unscored.pop(step, None)
        return found if found is not None else Unscored.from_metrics([metrics], "train/")

    def _sample_rounds(self, step: int, first: int, selector: GroupSelector) -> tuple[_Sampled, int]:
        """This process's groups, sampled in rounds until every process has its groups (one round
        without dynamic sampling); returns what was sampled and the number of rounds."""
        cfg = self.run.config
        mine, parts, rounds = _Sampled(), [], 0
        for round_index in range(cfg.max_sampling_rounds if cfg.dynamic_sampling else 1):
            if round_index and not sum(distributed.gather_objects(selector.missing, self.group)):
                break  # every process has its groups
            indices = self.cursor.take(cfg.prompts_per_step)  # every process walks the same cursor
            tasks = indices[first : first + selector.missing]  # a refill round samples only what is missing
            rounds += 1
            if not tasks:
                continue
            episodes, totals, components = self._sample_groups(
                step, round_index, first, tasks, mine.nonfinite, mine.errors
            )
            selector.add(episodes, totals, components)
            mine.episodes += episodes
            mine.totals += totals
            parts.append(components)
        mine.components = {name: np.concatenate([c[name] for c in parts]) for name in parts[0]}
        return mine, rounds

    def _metrics(self, whole: _Sampled, rounds: int) -> dict[str, float]:
        """The step's reward, rollout, error and dynamic sampling metrics over the whole batch."""
        cfg = self.run.config
        metrics = {
            **reward_metrics(whole.totals, whole.components),
            **rollout_metrics(whole.episodes),
            **{f"reward/{name}_nonfinite": float(n) for name, n in whole.nonfinite.items() if n},
            **{f"errors/reward/{name}": float(n) for name, n in whole.errors.items()},
            **popped_metrics(self.run.reward_fns),
        }  # this process's counts
        if cfg.dynamic_sampling:
            spread = [
                has_spread(whole.totals[i : i + cfg.num_generations])
                for i in range(0, len(whole.totals), cfg.num_generations)
            ]
            metrics.update(
                {
                    "sampling/rounds": float(rounds),
                    "sampling/groups_sampled": float(len(spread)),
                    "sampling/spread_frac": float(np.mean(spread)),
                    "sampling/filled_groups": float(whole.filled),
                }
            )
        return metrics

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
                self.run.fresh_env(i)
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
        self.eval_records = []
        metrics, evaluated = evaluate(
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
            records=self.eval_records,
        )
        self.eval_records = self.with_tokens(None, 0, evaluated)
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
