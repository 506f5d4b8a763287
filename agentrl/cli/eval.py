"""``agentrl eval``: held-out accuracy of a model or run dir, evaluated as the run evaluated."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer

from agentrl.cli.support import (
    DisablePluginOption,
    PluginOption,
    console,
    plugin_manager,
    quiet_library_progress,
    run_guarded,
)

# What ``agentrl eval RUN_DIR`` takes from the run's config.yaml (below --set and the flags): how it
# evaluated (env, rewards, lengths, rollout, engine and its dtype, precision, seed, temperature).
RUN_EVAL_KEYS = (
    "env",
    "env_args",
    "rewards",
    "env_reward_weight",
    "reward_completion_format",
    "rollout",
    "max_new_tokens",
    "max_sampled_tokens",
    "max_total_tokens",
    "engine",
    "engine_args",
    "precision",
    "seed",
    "eval_temperature",
    "call_timeout_s",
    "on_call_error",
)
ENV_KEYS = ("env", "env_args", "rewards")  # not taken from the run when --env names another env


def eval_(
    run_dir: str | None = typer.Argument(
        None,
        metavar="RUN_DIR",
        show_default=False,
        help="Run dir (or HF folder, hub id, alias) to evaluate; as --model.",
    ),
    model: str | None = typer.Option(
        None, "--model", help="HF folder, run dir, hub id or alias. [default: smollm2-135m]"
    ),
    env: str | None = typer.Option(
        None, "--env", help="Environment name or path/file.py:Class. [default: the run's env for a run dir, else math]"
    ),
    num_tasks: int = typer.Option(64, "--num-tasks", help="Held-out tasks to evaluate."),
    max_new_tokens: int | None = typer.Option(
        None, "--max-new-tokens", help="Tokens per turn. [default: the run's, else 64]"
    ),
    temperature: float | None = typer.Option(
        None, "--temperature", help="0 = greedy. [default: the run's eval_temperature, else 0]"
    ),
    engine: str | None = typer.Option(None, "--engine", help="Generation engine. [default: the run's, else hf]"),
    set_: list[str] | None = typer.Option(
        None, "--set", help="Override key=value (e.g. env_args.difficulty=..., engine_args.dtype=float32)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print metrics as JSON."),
    save_episodes: Path | None = typer.Option(
        None,
        "--save-episodes",
        metavar="FILE",
        help="Write each episode to FILE, a JSON line each, as a run's eval_completions.jsonl.",
    ),
    plugin: PluginOption = None,
    disable_plugin: DisablePluginOption = None,
) -> None:
    """Accuracy of a model or run dir on an env's held-out split. A run dir (agentrl eval RUN_DIR)
    is evaluated as the run evaluated it: its env, env_args and rewards (unless --env is given),
    engine and engine_args (dtype included), precision, lengths, seed and eval temperature, from its
    config.yaml; --set and the flags override them."""
    given = {
        "RUN_DIR": run_dir,
        "--model": model,
        "--env": env,
        "--num-tasks": num_tasks,
        "--max-new-tokens": max_new_tokens,
        "--temperature": temperature,
        "--engine": engine,
        "--set": set_,
    }
    run_guarded(lambda: run_eval(given, as_json, plugin, disable_plugin, save_episodes))


def run_eval(
    given: dict[str, Any],
    as_json: bool,
    plugin: list[str] | None,
    disable_plugin: list[str] | None,
    save_episodes: Path | None = None,
) -> None:
    """The body of ``agentrl eval`` (``given``: flag -> value, None where not given; ``save_episodes``:
    the file its episodes go to, :mod:`agentrl.rundir.episodes`)."""
    from agentrl.training.build import build_sampler, make_env
    from agentrl.training.evaluate import evaluate

    target, cfg, run_config = _eval_config(given)
    _save_episodes(save_episodes, None)  # a folder that is not there fails now, before the evaluation
    num_tasks, env = given["--num-tasks"], given["--env"]
    heat = cfg.eval_temperature if given["--temperature"] is None else given["--temperature"]
    manager = plugin_manager(disable_plugin, plugin)
    envs = [make_env(manager, cfg) for _ in range(min(max(num_tasks, 1), 64))]
    tasks = list(envs[0].eval_tasks())[:num_tasks]
    source = "the run's env" if run_config and env is None else "--env" if env else "the default env"
    args = f" {cfg.env_args}" if cfg.env_args else ""
    engine_args = f" {cfg.engine_args}" if cfg.engine_args else ""
    typer.echo(
        f"evaluating {target} on {cfg.env}{args} ({source}): {len(tasks)} held-out tasks, "
        f"temperature {heat:g}, engine {cfg.engine}{engine_args}, precision {cfg.precision}",
        err=as_json,
    )
    quiet_library_progress()
    sampler = build_sampler(cfg, manager, envs)
    records: list[dict[str, Any]] = []
    metrics, evaluated = evaluate(
        sampler.rollout,
        envs,
        tasks,
        max_new_tokens=cfg.max_new_tokens,
        temperature=heat,
        seed=cfg.seed,
        reward_fns=sampler.reward_fns,
        batch_size=len(envs),
        guard=sampler.call_guard,
        env_weight=cfg.env_reward_weight,
        records=records,
    )
    _save_episodes(save_episodes, records, evaluated, sampler.tokenizer if cfg.log_tokens != "none" else None)
    if as_json:
        print(
            json.dumps(
                {
                    "model": target,
                    "env": cfg.env,
                    "env_args": cfg.env_args,
                    "engine": cfg.engine,
                    "engine_args": cfg.engine_args,
                    "precision": cfg.precision,
                    **metrics,
                }
            )
        )
    else:
        _print_metrics(metrics)


def _save_episodes(
    path: Path | None, records: list[dict[str, Any]] | None, evaluated: list[Any] = (), tokenizer: Any = None
) -> None:
    """Write ``records`` to ``path`` (``--save-episodes``), one JSON line each with ``when: eval``
    (with ``tokenizer``: each with the ``token_view`` of its trajectory in ``evaluated``);
    ``records`` None: only check that ``path`` can be written. A ConfigError naming it when not."""
    from agentrl.errors import ConfigError
    from agentrl.rundir.episodes import token_texts, with_token_views
    from agentrl.rundir.links import write_text

    if path is None:
        return
    if not path.parent.is_dir():
        raise ConfigError(f"--save-episodes {str(path)!r}: its folder does not exist (name a file in one that does)")
    if records is None:
        return
    if tokenizer is not None:
        records = with_token_views(records, list(evaluated), token_texts(tokenizer))
    lines = "".join(json.dumps({"when": "eval", **r}, separators=(",", ":")) + "\n" for r in records)
    try:
        write_text(path, lines)
    except OSError as exc:
        raise ConfigError(f"--save-episodes {str(path)!r}: not writable ({exc.strerror or exc})") from None


def _print_metrics(metrics: dict[str, float]) -> None:
    """One ``key: value`` line per metric; the accuracy of an evaluation that scored no episode
    reads ``0 of N scored (why)``, one with unscored episodes says how many (counted unsolved)."""
    from agentrl.api.progress import scored_text, unscored_of

    why = unscored_of(metrics, "eval/")
    for key, value in metrics.items():
        if key == "eval/accuracy" and why is not None and not why.scored:
            console.print(f"{key}: {scored_text(why)}", highlight=False)
        elif key == "eval/accuracy" and why is not None and why.unscored:
            note = f"{why.unscored} of {why.episodes} unscored, counted unsolved: {why.causes()}"
            console.print(f"{key}: {value:.4f} ({note})", highlight=False)
        else:
            console.print(f"{key}: {value:.4f}", highlight=False)


def _eval_config(given: dict[str, Any]) -> tuple[str, Any, dict[str, Any]]:
    """(model or run dir evaluated, its eval config, the run's saved config or {}): the run's values,
    then --set, then the flags."""
    from agentrl.config.train import build_config, refuse_flag_conflicts
    from agentrl.errors import ConfigError
    from agentrl.model.loading import DEFAULT_MODEL

    run_dir, model, env, set_ = given["RUN_DIR"], given["--model"], given["--env"], given["--set"]
    num_tasks, temperature = given["--num-tasks"], given["--temperature"]
    if run_dir is not None and model is not None and run_dir != model:
        raise ConfigError(f"eval: give the model once, as RUN_DIR or --model, not both ({run_dir!r}, {model!r})")
    target = run_dir or model or DEFAULT_MODEL
    if num_tasks < 1:
        raise ConfigError(f"--num-tasks must be >= 1, got {num_tasks}")
    if temperature is not None and not (math.isfinite(temperature) and temperature >= 0):
        raise ConfigError(f"--temperature must be a finite number >= 0 (0: greedy), got {temperature}")
    run_config = _run_config(target)
    base = {k: run_config[k] for k in RUN_EVAL_KEYS if k in run_config and (env is None or k not in ENV_KEYS)}
    _refuse_run_dir_code(base, Path(target).expanduser(), [env, *(set_ or [])])
    overrides = {
        "model": target,
        "env": env,
        "engine": given["--engine"],
        "max_new_tokens": given["--max-new-tokens"],
        "eval_tasks": num_tasks,
    }
    refuse_flag_conflicts(
        {
            "model": ("RUN_DIR/--model", run_dir or model),
            "env": ("--env", env),
            "engine": ("--engine", given["--engine"]),
            "max_new_tokens": ("--max-new-tokens", given["--max-new-tokens"]),
        },
        set_,
    )
    cfg = build_config(
        overrides={k: v for k, v in overrides.items() if v is not None}, sets=[*_as_sets(base), *(set_ or [])]
    )  # the run's values, then --set, then flags
    return target, cfg, run_config


def _refuse_run_dir_code(taken: dict[str, Any], run_dir: Path, command_line: list[Any]) -> None:
    """Code the run's config names (``taken``: what eval takes from it) runs only when it is
    outside the run dir and the user's, or the command line names it (:mod:`agentrl.rundir.trust`)."""
    from agentrl.rundir.trust import named_files, refuse_run_dir_code

    refuse_run_dir_code(
        taken,
        run_dir,
        named_files(command_line),
        f"eval {str(run_dir)!r}",
        lambda key, spec: f"--env {spec}" if key == "env" else f"--set 'rewards={{\"{spec}\": 1.0}}'",
    )


def _as_sets(values: dict[str, Any]) -> list[str]:
    """``values`` as ``--set key=value`` items (JSON is YAML), so that later --set items refine
    them key by key (``--set engine_args.dtype=float32`` keeps the run's other engine_args)."""
    return [f"{key}={json.dumps(value)}" for key, value in values.items()]


def _run_config(model: str) -> dict[str, Any]:
    """The saved config of a run dir (``model`` points at one), else {}."""
    from agentrl.config.yaml_text import load_yaml
    from agentrl.errors import ConfigError

    path = Path(model).expanduser() / "config.yaml"
    if not model or not path.is_file():
        return {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"run config {str(path)!r} could not be read as UTF-8 text: {exc}") from None
    data = load_yaml(text, f"run config {str(path)!r}")
    return data if isinstance(data, dict) else {}
