"""What a run keeps on disk: resumable checkpoints, the exported model, the best policy.

:class:`RunCheckpoints` writes and restores everything ``--resume`` needs to continue exactly
(weights, optimizer moments and schedules of every trained module, RNG and engine state of every
process, algorithm and plugin state) and exports the final model. Where the weights live is behind
one small interface: :class:`WholeWeights` (one process, DDP, ZeRO-2: every process holds the whole
model) or :class:`ShardedWeights` (FSDP: states gathered whole, loaded back sharded). The folder
layout and file formats are :mod:`agentrl.rundir.checkpoints`'s.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from agentrl.algorithms import reference
from agentrl.errors import CheckpointError, ConfigError, one_line
from agentrl.model import distributed, lora, sharding
from agentrl.rundir import checkpoints as ckpt
from agentrl.rundir.directory import file_size
from agentrl.rundir.saved import Saved, read_checkpoint, weights_folder
from agentrl.rundir.state_files import save_json, save_tensors
from agentrl.rundir.state_schema import module_problem, optimizer_problem, structure_problem
from agentrl.training.async_rollouts import Collected
from agentrl.training.build import Run, Trained
from agentrl.training.optimizers import load_optimizer_state
from agentrl.training.rng import rng_states, set_rng_states
from agentrl.training.schedules import reapply_schedule


class WholeWeights:
    """Every process holds the whole of every trained module: states are read and loaded as they are."""

    sharded = False

    def __init__(self, run: Run) -> None:
        self.run = run

    def optimizer_state(self, trained: Trained) -> dict[str, Any]:
        return trained.optimizer.state_dict()

    def module_state(self, trained: Trained) -> dict[str, torch.Tensor]:
        return self.run.accelerator.unwrap_model(trained.module).state_dict()

    def policy_model(self) -> torch.nn.Module:
        """The model ``save_pretrained`` writes (the policy, with LoRA its adapted model)."""
        return self.run.model

    def load_policy(self, run_dir: Path, folder: Path, optimizer_state: dict[str, Any] | None) -> None:
        if lora.is_adapted(self.run.model):  # the adapter alone: the base is config.model, unchanged
            lora.load_adapter(self.run.model, folder / "adapter")
        else:
            load_weights(self.run.model, weights_folder(run_dir, folder))
        self._load_optimizer(self.run.trained["policy"], optimizer_state)

    def load_module(
        self, trained: Trained, state: dict[str, torch.Tensor], optimizer_state: dict[str, Any] | None
    ) -> None:
        self.run.accelerator.unwrap_model(trained.module).load_state_dict(state)
        self._load_optimizer(trained, optimizer_state)

    @staticmethod
    def _load_optimizer(trained: Trained, state: dict[str, Any] | None) -> None:
        if state is not None:  # None: a finished run's slimmed checkpoint (the moments restart from zero)
            load_optimizer_state(trained.optimizer, state)


class ShardedWeights:
    """FSDP: no process holds a whole module; every process gathers whole states (a collective)
    and loads whole states back into its shards."""

    sharded = True

    def __init__(self, run: Run) -> None:
        self.run = run

    def optimizer_state(self, trained: Trained) -> dict[str, Any]:
        return sharding.whole_optimizer_state(trained.module, trained.optimizer)

    def module_state(self, trained: Trained) -> dict[str, torch.Tensor]:
        return sharding.whole_module_state(trained.module)

    def policy_model(self) -> torch.nn.Module:
        run = self.run
        sharding.gather_into(run.accelerator, run.policy, run.replica, prefix="model.")  # the whole policy
        return run.replica

    def load_policy(self, run_dir: Path, folder: Path, optimizer_state: dict[str, Any] | None) -> None:
        replica, policy = self.run.replica, self.run.trained["policy"]
        load_weights(replica, weights_folder(run_dir, folder))
        whole = {f"model.{key}": value for key, value in replica.state_dict().items()}
        sharding.load_whole_state(policy.module, policy.optimizer, whole, optimizer_state)

    def load_module(
        self, trained: Trained, state: dict[str, torch.Tensor], optimizer_state: dict[str, Any] | None
    ) -> None:
        sharding.load_whole_state(trained.module, trained.optimizer, state, optimizer_state)


class RunCheckpoints:
    """Checkpoints, export and the end-of-run clean-up of one run dir."""

    def __init__(self, run: Run, run_dir: Path) -> None:
        self.run, self.run_dir = run, run_dir
        self.weights = ShardedWeights(run) if run.replica is not None else WholeWeights(run)

    def save(self, step: int, progress: dict[str, Any]) -> Path:
        """Write everything ``--resume`` needs to continue after ``step`` exactly (atomically);
        ``progress``: the loop's own state (task cursor, skip counters, the first evaluation).
        Every process calls it (each one's RNG and engine state is kept); the main one writes."""
        run, weights = self.run, self.weights
        processes = distributed.gather_objects(
            {"rng": rng_states(), "engine": run.engine.state_dict(), "async": progress.get("async")}
        )  # each process's own batches
        policy_model = weights.policy_model() if weights.sharded else None  # a collective under FSDP
        optim_states = {name: weights.optimizer_state(t) for name, t in run.trained.items()}
        module_states = {name: weights.module_state(t) for name, t in run.trained.items() if name != "policy"}
        if not run.is_main:
            distributed.barrier()  # returns once the checkpoint is complete on disk
            return ckpt.checkpoint_dir(self.run_dir, step)

        def write(folder: Path) -> None:
            if lora.is_adapted(run.model):  # the adapter alone: the base is config.model, unchanged
                lora.save_adapter(run.model, folder / "adapter")
            else:
                (policy_model or weights.policy_model()).save_pretrained(folder / "model")
                run.tokenizer.save_pretrained(folder / "model")
            save_tensors(module_states, folder / ckpt.MODULES)
            if run.ref_model is not None and reference.has_been_reset(step, run.algorithm.reference_reset[0]):
                reference.save_reference(run.ref_model, folder)
            save_tensors(optim_states, folder / ckpt.OPTIMIZERS)
            plugins: dict[str, Any] = {}
            run.hook.agentrl_save_state(state=plugins)
            save_json(
                {
                    "schedules": {name: t.scheduler.state_dict() for name, t in run.trained.items()},
                    "processes": processes,
                    "algorithm": run.algorithm.state_dict(),
                    "plugins": plugins,
                },
                folder / ckpt.EXTRA,
            )
            (folder / ckpt.STATE).write_text(
                json.dumps(
                    {
                        "step": step,
                        "task_cursor": progress["task_cursor"],
                        "metrics_bytes": file_size(self.run_dir / "metrics.jsonl"),
                        "completions_bytes": file_size(self.run_dir / "completions.jsonl"),
                        "eval_completions_bytes": file_size(self.run_dir / "eval_completions.jsonl"),
                        "nonfinite_skips": progress["nonfinite_skips"],
                        "skipped_in_a_row": progress["skipped_in_a_row"],
                        "eval_before": progress["eval_before"],
                        "sharded": weights.sharded,
                        "config": run.config.to_dict(),
                    },
                    indent=1,
                )
            )

        folder = ckpt.write_atomically(self.run_dir, step, write, run.config.keep_checkpoints)
        distributed.barrier()
        return folder

    def load(self, folder: Path) -> dict[str, Any]:
        """Restore a checkpoint written by :meth:`save`; returns its trainer state (the loop's
        ``progress`` and the step)."""
        run, weights = self.run, self.weights
        saved = read_checkpoint(folder)  # a CheckpointError naming a file that cannot be read safely
        state, optim = saved.trainer, saved.optimizers
        if bool(state.get("sharded", False)) != weights.sharded:
            written, needed = (
                ("an FSDP run", "--accelerate-config fsdp")
                if state.get("sharded")
                else ("a run without sharded weights", "the accelerate config it was written with (not fsdp)")
            )
            raise ConfigError(f"checkpoint {str(folder)!r} was written by {written}; resume it with {needed}")
        processes = saved.processes
        if len(processes) != run.num_processes:
            raise ConfigError(
                f"checkpoint {str(folder)!r} was written by {len(processes)} process(es); resume it with "
                f"the same count, not {run.num_processes} (each process's sampling state is in it)"
            )
        self.check(folder, saved)  # every value fits before anything is loaded: a CheckpointError naming file and key
        if run.is_main and any(moments is None for moments in optim.values()):  # slimmed (a finished run's)
            print(
                f"note: {folder.name} is a finished run's checkpoint without optimizer state: the AdamW moments "
                "restart from zero (keep_finished_checkpoints: true keeps them)",
                flush=True,
            )
        weights.load_policy(self.run_dir, folder, optim["policy"])
        for name, trained in run.trained.items():
            if name != "policy":
                weights.load_module(trained, saved.modules[name], optim[name])
        if run.ref_model is not None:
            reference.load_reference(
                run.ref_model, folder, reference.has_been_reset(int(state["step"]), run.algorithm.reference_reset[0])
            )
        for name, trained in run.trained.items():
            trained.scheduler.load_state_dict(saved.schedules[name])
            reapply_schedule(trained.scheduler)  # --resume --max-steps N: the rate of the schedule as now configured
        own = processes[run.accelerator.process_index]
        run.engine.load_state_dict(own["engine"])  # its weights: the run's batches put them in
        run.algorithm.load_state_dict(saved.algorithm)
        run.hook.agentrl_load_state(state=saved.plugins)
        set_rng_states(own["rng"])
        return {**state, "async": own.get("async")}

    def load_intact(self, folder: Path, say: Callable[[str], None] = ckpt.say) -> dict[str, Any]:
        """:meth:`load` ``folder``, or when a value in it does not fit the run (a CheckpointError),
        the newest older intact checkpoint, ``say`` naming what was wrong with each one passed
        over; a CheckpointError in one line when none can be loaded."""
        step = int(folder.name.removeprefix("step-"))
        older = [f for f in reversed(ckpt.complete_checkpoints(self.run_dir)) if int(f.name[5:]) < step]
        states: dict[Path, dict[str, Any]] = {}

        def problem_of(candidate: Path) -> str | None:
            problem = ckpt.damage(self.run_dir, candidate) if candidate is not folder else None
            if problem is None:
                try:
                    states[candidate] = self.load(candidate)
                except CheckpointError as exc:
                    return str(exc)
            return problem

        return states[ckpt.newest_intact(self.run_dir, [folder, *older], problem_of, say, "cannot be resumed")]

    def check(self, folder: Path, saved: Saved) -> None:
        """A CheckpointError naming the file and key of the first value of ``saved`` (read from
        ``folder``) that does not fit the run: optimizer states, modules, schedules, engine,
        algorithm and asynchronous state, checked against the live objects (nothing is loaded)."""
        run, processes = self.run, saved.processes
        problems = (
            *(
                optimizer_problem(
                    saved.optimizers[name], t.optimizer, f"{ckpt.OPTIMIZERS} key {name!r}", not self.weights.sharded
                )
                for name, t in run.trained.items()
                if saved.optimizers.get(name) is not None
            ),
            *(
                module_problem(
                    saved.modules.get(name), run.accelerator.unwrap_model(t.module), f"{ckpt.MODULES} key {name!r}"
                )
                for name, t in run.trained.items()
                if name != "policy" and not self.weights.sharded
            ),
            *(
                structure_problem(
                    saved.schedules.get(name), t.scheduler.state_dict(), f"{ckpt.EXTRA} key 'schedules.{name}'"
                )
                for name, t in run.trained.items()
            ),
            structure_problem(
                processes[run.accelerator.process_index]["engine"],
                run.engine.state_dict(),
                f"{ckpt.EXTRA} key 'engine'",
            ),
            structure_problem(saved.algorithm, run.algorithm.state_dict(), f"{ckpt.EXTRA} key 'algorithm'"),
            _async_problem(processes[run.accelerator.process_index].get("async")),
        )
        problem = next((p for p in problems if p), None)
        if problem is not None:
            raise CheckpointError(f"{problem}: the checkpoint does not fit this run") from None

    def finish(self, completed_step: int, exported: str | None) -> None:
        """At the end of a run that finished normally: keep only the checkpoint of its last step
        (when one was written), slimmed by :func:`agentrl.rundir.checkpoints.slim_finished`, unless
        ``keep_finished_checkpoints``; ``exported``: the run dir's folder the last policy went to."""
        final = ckpt.checkpoint_dir(self.run_dir, completed_step)
        if (final / ckpt.COMPLETE).is_file() and not self.run.config.keep_finished_checkpoints:
            ckpt.slim_finished(self.run_dir, final, exported)

    def save_policy(self, folder: Path) -> None:
        """The policy as a ``from_pretrained``-loadable folder with its tokenizer (LoRA merged)."""
        run = self.run
        policy = run.accelerator.unwrap_model(run.policy).model
        (run.replica if run.replica is not None else lora.sampling_model(policy)).save_pretrained(folder)
        run.tokenizer.save_pretrained(folder)

    def gather_owned(self) -> dict[str, torch.nn.Module]:
        """The algorithm's modules whole, by name, when the run shards weights (every process calls
        this: the gather is a collective); empty otherwise (they are whole already)."""
        run = self.run
        return {
            name: sharding.unsharded(run.owned_templates[name], sharding.full_state_dict(run.accelerator, t.module))
            for name, t in run.trained.items()
            if name in run.owned_templates
        }

    def export(self, name: str = "model", gathered: dict[str, torch.nn.Module] | None = None) -> None:
        """The final model in ``run_dir/name`` (``from_pretrained``-loadable, with its tokenizer; with
        LoRA merged, plus the adapter alone in ``adapter/``) and the algorithm's modules (``gathered``:
        their whole copies under FSDP / ZeRO-3, from :meth:`gather_owned`)."""
        run = self.run
        policy = run.accelerator.unwrap_model(run.policy).model
        self.save_policy(self.run_dir / name)
        if lora.is_adapted(policy):
            lora.save_adapter(policy, self.run_dir / "adapter")
        for module_name, trained in run.trained.items():
            if module_name != "policy":
                whole = (gathered or {}).get(module_name)
                save_module(
                    whole if whole is not None else run.accelerator.unwrap_model(trained.module),
                    self.run_dir / module_name,
                )


def load_weights(model: torch.nn.Module, folder: Path) -> None:
    """Load a ``save_pretrained`` folder's safetensors into ``model`` in place (exact values);
    only keys tied to a loaded one (an LM head sharing the embedding) may be missing."""
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(
            f"{str(folder)!r} holds no *.safetensors weights file: resume from another checkpoint, "
            "or start the run again"
        )
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            weights.update(load_file(file))
        except Exception as exc:  # safetensors raises its own error type for a cut or garbled file
            raise CheckpointError(
                f"{file} is unreadable ({one_line(exc)}): resume from another checkpoint, or start the run again"
            ) from None
    own = model.state_dict()
    for key, value in weights.items():
        if key in own and value.shape != own[key].shape:
            raise CheckpointError(
                f"{folder} key {key!r}: shape {list(value.shape)}, but the model's is {list(own[key].shape)}: "
                "the weights do not fit the model"
            )
    missing, unexpected = model.load_state_dict(weights, strict=False)
    loaded = {p.data_ptr() for name, p in model.named_parameters(remove_duplicate=False) if name in weights}
    params = dict(model.named_parameters(remove_duplicate=False))
    untied = [k for k in missing if k not in params or params[k].data_ptr() not in loaded]
    if untied or unexpected:
        raise ConfigError(
            f"checkpoint {str(folder)!r} does not fit the model: missing {untied[:5]}, unexpected {unexpected[:5]}"
        )


def _async_problem(state: Any) -> str | None:
    """What keeps an asynchronous run's collected batches from being taken over, None if nothing."""
    for i, ready in enumerate((state or {}).get("ready") or []):
        try:
            Collected.from_state(ready)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            return f"{ckpt.EXTRA} key 'processes.async.ready.{i}': {one_line(exc)}"
    return None


def save_module(module: torch.nn.Module, folder: Path) -> None:
    """Save an algorithm-owned module: ``save_pretrained`` if it has one, else ``state_dict.pt``."""
    folder.mkdir(parents=True, exist_ok=True)
    if hasattr(module, "save_pretrained"):
        module.save_pretrained(folder)
    else:
        torch.save(module.state_dict(), folder / "state_dict.pt")
