"""Every hook agentrl calls, with when, with what, and what it returns. Nothing else lives here.

Two kinds of hooks, as in llm and pytest:

* **Registration hooks** run once, when plugins load. Each receives a ``register(name, factory)``
  callback; the registry records which plugin owns each name and refuses a duplicate, naming both.
* **Step hooks** run inside the training step, in this order for each rollout batch:
  ``agentrl_on_rollout_end`` -> (the trainer computes trainer-old logprobs if the algorithm or any
  ``agentrl_needs_old_logprobs`` asks, and reference logprobs) -> ``agentrl_adjust_loss_mask`` ->
  (advantages; then per micro-batch of every optimizer step) ``agentrl_importance_weights`` ->
  ``agentrl_per_token_loss_factors`` -> ``agentrl_on_step_end``. ``agentrl_on_train_start`` and
  ``agentrl_on_train_end`` bracket the run.

Step hooks that change training take ``settings``: every plugin settings section (registered with
``agentrl_register_settings``) resolved from the run config's ``plugins:`` mapping, by name. A step
hook must do nothing (return ``None``) unless its own section turns it on.

Call convention: agentrl calls every hook with keyword arguments only. Implementations may take
any subset of the arguments, and must not give their parameters default values (pluggy would
silently never pass them).

The built-in plugins behind each hook are not listed here by hand: the hook reference
(docs/hooks.md, written by ``python -m agentrl.cli.hookdoc``) reads them from the plugins themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import torch

    from agentrl.config.train import TrainConfig
    from agentrl.trajectory import TrainBatch, Trajectory

PROJECT = "agentrl"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

Register = Callable[..., None]
"""``register(name, factory, **meta)``: adds one named component to a registry."""


# ---------------------------------------------------------------------------------------------
# Registration hooks: called once per plugin when plugins load.


@hookspec
def agentrl_register_envs(register: Register) -> None:
    """Register environments: ``register("math", MathEnv)``.

    Called once at load time. ``factory(**env_args)`` must return an :class:`agentrl.Env`.
    The name is what ``--env NAME`` selects.
    """


@hookspec
def agentrl_register_rewards(register: Register) -> None:
    """Register reward functions: ``register("format", format_reward)``.

    Called once at load time. A reward function is called as
    ``fn(trajectories=list[Trajectory])`` and returns one ``float | None`` per trajectory
    (``None``: not scored, kept out of means as NaN). ``--reward NAME[:WEIGHT]`` selects it.
    """


@hookspec
def agentrl_register_reward_schemes(register: Register) -> None:
    """Register reward schemes: ``register("rm", make_reward_model_reward)``.

    Called once at load time. ``--reward SCHEME:ARGUMENT[:WEIGHT]`` calls
    ``factory(argument=, context=)`` once per run, before the first rollout, with an
    :class:`agentrl.RewardContext` (config, settings sections, device, precision, task columns; the
    policy's tokenizer and engine, filled in once built: read them at call time). It returns a
    reward function as for ``agentrl_register_rewards``, which may have a ``pop_metrics()`` method
    (its counts are logged as ``<scheme>/<key>`` after each rollout). ``register("rm", factory,
    path_argument=True)`` declares the argument a local path (a predicate ``fn(argument) -> bool``
    when only some are): a new run stores a relative one that exists as an absolute path.
    ``argument="MODEL_DIR"`` is the argument's form in the error for an unknown reward;
    ``takes_folder="rm"`` (a model role, or a predicate ``fn(folder) -> bool``) with
    ``bare_folder=True`` makes a bare folder path it takes mean ``SCHEME:/abs/folder``
    (:mod:`agentrl.rewards.schemes`).
    """


@hookspec
def agentrl_register_rollouts(register: Register) -> None:
    """Register rollout functions: ``register("multi_turn", MultiTurnRollout)``.

    Called once at load time. ``factory(engine=, tokenizer=, config=)`` returns an
    :class:`agentrl.Rollout`: ``run(envs, tasks, groups, sampling, seeds)`` drives one episode per
    env to its end and returns their ``list[Trajectory]`` in order (single-turn is one turn).
    ``seeds``: one per episode from the training loop (each episode resets its env and samples from
    its own seed, the same on any process count), None from evaluation.
    """


@hookspec
def agentrl_register_algorithms(register: Register) -> None:
    """Register algorithms: ``register("grpo", GRPO)``.

    Called once at load time. The factory is an :class:`agentrl.Algorithm` subclass; its
    ``config_class`` dataclass validates the ``algorithm:`` section of the config (and
    ``--print-config`` shows it resolved). ``--algo NAME`` selects it. What the trainer calls on
    it, in order, and with what (``SetupContext``, ``LossContext``, ``TrainableModule``): the
    module docstring of :mod:`agentrl.algorithms.base`.
    """


@hookspec
def agentrl_register_engines(register: Register) -> None:
    """Register generation engines: ``register("hf", HFEngine)``.

    Called once at load time. ``factory(model=, tokenizer=, config=)`` returns an
    :class:`agentrl.Engine`; a factory with a ``config_class`` dataclass has its ``engine_args``
    shown resolved by ``--print-config``. ``--engine NAME`` selects it.
    """


@hookspec
def agentrl_register_tool_parsers(register: Register) -> None:
    """Register tool-call parsers: ``register("xml_json", parse_xml_json)``.

    Called once at load time. A parser is called as ``parser(text)`` on an assistant message
    and returns ``list[agentrl.tools.tool.ToolCall]`` (each carrying either parsed arguments or a
    parse error). Tool-using envs select one by name (``tool_parser`` env argument); ``xml_json``
    parses ``<tool_call>{json}</tool_call>``. A parser that is an ``agentrl.ToolCallFormat`` also
    writes calls in its syntax (``format_calls``), so a ``ToolEnv`` shows the model the format it
    reads; the native formats (``llama3_json``, ``mistral``, ``qwen3_coder``, ``harmony``) are ones.
    """


@hookspec
def agentrl_register_settings(register: Register) -> None:
    """Register a settings section for a step-hook plugin: ``register("sampler_correction", Cfg)``.

    Called once at load time. ``Cfg`` is a frozen dataclass whose fields (with defaults, each with a
    docstring) are the section's options and whose ``__post_init__`` raises ``agentrl.ConfigError``
    naming a bad key, value and what is allowed. The trainer builds it once at start-up from
    ``plugins.<name>`` of the run config (``--set plugins.<name>.<key>=<value>``), refuses unknown
    sections and keys, and passes every section to the step hooks as ``settings[name]``;
    ``--print-config`` lists them all resolved.
    """


# ---------------------------------------------------------------------------------------------
# Step hooks: called inside the training loop.


@hookspec
def agentrl_needs_old_logprobs(config: TrainConfig, settings: dict[str, Any]) -> bool | None:
    """Return True to make the trainer compute trainer-old logprobs (``batch.extras["old_logprobs"]``,
    the trainer's forward of the policy that sampled the batch) for every rollout batch, even when
    the algorithm takes one optimizer step per batch (then they equal the current logprobs at the
    step, but they exist before ``agentrl_adjust_loss_mask``). Asked once at start-up.
    """


@hookspec
def agentrl_on_train_start(config: TrainConfig, run_dir: str) -> None:
    """Called once before the first rollout, after models and plugins are set up (on the main
    process only in a multi-process run)."""


@hookspec
def agentrl_on_rollout_end(trajectories: list[Trajectory], step: int, metrics: dict[str, float]) -> None:
    """Called after each rollout is scored, before advantages are computed.

    ``metrics`` is the step's metric dict: add namespaced keys (``plugin/name``) to log them.
    Loggers and curriculum plugins use this. Return value ignored. In a multi-process run it is
    called on the main process only, with every process's trajectories. With ``dynamic_sampling``
    they are the groups the step trains on (the dropped ones are counted in ``metrics``).
    """


@hookspec
def agentrl_adjust_loss_mask(
    batch: TrainBatch, config: TrainConfig, settings: dict[str, Any], metrics: dict[str, float]
) -> torch.Tensor | None:
    """Called once per rollout batch after the trainer-old (when computed, see
    ``agentrl_needs_old_logprobs``) and reference logprobs are in ``batch.extras``, before
    advantages and before any loss denominator is counted.

    Return an ``(N, T)`` tensor of 0/1 multiplied into ``batch.loss_mask`` (drop tokens or whole
    sequences from the loss, e.g. DAPO overlong filtering, masked importance sampling), or
    ``None`` to leave it. Every non-None result is multiplied in; advantages and every loss
    denominator are then taken from the final mask. ``batch.sampler_logprobs`` are the engine's.
    Keys added to ``metrics`` are combined over processes: the mean, or the min / max for a key
    ending in ``_min`` / ``_max``.
    """


@hookspec(firstresult=True)
def agentrl_importance_weights(
    log_ratio: torch.Tensor,
    loss_mask: torch.Tensor,
    level: str,
    config: TrainConfig,
    settings: dict[str, Any],
    metrics: dict[str, float],
) -> torch.Tensor | None:
    """Return the log importance weights of the clipped surrogate; stops at the first non-None.

    Called per micro-batch with ``log_ratio = logprobs - old_logprobs`` ``(n, T)`` (current
    policy vs the trainer-old policy, with gradient through ``logprobs``), ``loss_mask``
    ``(n, T)`` and the algorithm's ``importance_sampling_level``. Return a tensor broadcastable
    to ``(n, T)``. The built-in default (``trylast``) is
    :func:`agentrl.algorithms.objectives.importance_log_weights`: ``token``, ``sequence`` (GSPO) or
    ``sequence_token`` (GSPO-token).
    """


@hookspec
def agentrl_per_token_loss_factors(
    batch: TrainBatch,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    config: TrainConfig,
    settings: dict[str, Any],
    metrics: dict[str, float],
) -> torch.Tensor | None:
    """Return an ``(n, T)`` (or ``(n, 1)``) factor (no gradient) multiplied into the per-token
    policy loss.

    Called per micro-batch after the clipped surrogate. ``old_logprobs`` are the trainer-old
    logprobs (the trainer's forward of the policy before this step's updates: the one that sampled
    the data in a synchronous run, a newer one with ``async_steps``); ``batch.sampler_logprobs``
    the engine's (of the version that sampled each token); ``logprobs`` the current ones. Every
    non-None result is multiplied in (e.g. truncated importance sampling of the sampler/trainer mismatch).
    """


@hookspec
def agentrl_on_step_end(step: int, metrics: dict[str, float]) -> None:
    """Called after each optimizer step with that step's metrics (loggers write them here); on
    the main process only in a multi-process run."""


@hookspec
def agentrl_save_state(state: dict[str, Any]) -> None:
    """Called when a checkpoint is written: add this plugin's resumable state to ``state`` under
    a key of its own (JSON values with string keys, and tensors; a tuple comes back as a list,
    a tensor on the CPU: checkpoints hold no pickled objects). A plugin that keeps counters or
    adaptive coefficients across steps needs this for ``--resume`` to continue it exactly."""


@hookspec
def agentrl_load_state(state: dict[str, Any]) -> None:
    """Called on ``--resume`` with what :func:`agentrl_save_state` stored (read your own key;
    it is absent when the checkpoint was written without your plugin)."""


@hookspec
def agentrl_on_train_end(run_dir: str, metrics: dict[str, float]) -> None:
    """Called once after the last step and the final evaluation, with the final metrics (on the
    main process only in a multi-process run)."""
