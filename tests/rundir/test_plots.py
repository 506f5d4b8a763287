"""``agentrl plot``: one PNG per run, with a panel for the env's own figures when it logs any."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image
import matplotlib.pyplot as plt
import pytest

from agentrl.rundir.plots import plot_run, run_figure


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def write_run(run_dir: Path, rows: list[dict]) -> Path:
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def test_env_figures_get_their_own_panel(tmp_path: Path) -> None:
    plain = [{"step": s, "reward/total_mean": s / 10, "rollout/turns_mean": 1.0} for s in range(1, 6)]
    with_env = [{**r, "env/consistent_frac": r["step"] / 5} for r in plain]
    narrow = matplotlib.image.imread(plot_run(write_run(tmp_path / "plain", plain)))
    wide = matplotlib.image.imread(plot_run(write_run(tmp_path / "env", with_env)))
    assert narrow.shape[:2] == (8 * 90, 15 * 90) and wide.shape[:2] == (8 * 90, 20 * 90)


def texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def titles(fig) -> list[str]:
    return [ax.get_title() for ax in fig.axes if ax.get_visible() and ax.get_title()]


def ppo_rows() -> list[dict]:
    """Rows as PPO logs them (plugins/agentrl_ppo): the critic's loss and explained variance."""
    return [
        {
            "step": s,
            "reward/total_mean": s / 10,
            "loss/value": 1 / s,
            "critic/explained_variance": 1 - 2 / s,
            "eval/accuracy": 0.2 + s / 20,
        }
        for s in range(1, 6)
    ]


def test_ppo_runs_get_a_critic_panel_with_its_loss_and_explained_variance(tmp_path: Path) -> None:
    fig = run_figure(write_run(tmp_path / "ppo", ppo_rows()))
    assert titles(fig) == [
        "reward",
        "held-out accuracy",
        "sampled tokens",
        "policy",
        "critic (PPO)",
        "turns and tools",
        "seconds per step",
    ]
    critic = next(ax for ax in fig.axes if ax.get_title() == "critic (PPO)")
    twin = next(ax for ax in fig.axes if ax is not critic and ax.get_shared_x_axes().joined(ax, critic))
    assert [line.get_label() for line in critic.lines] == ["loss/value"]
    assert [line.get_label() for line in twin.lines] == ["critic/explained_variance"]  # its own scale
    assert list(twin.lines[0].get_ydata()) == [1 - 2 / s for s in range(1, 6)]
    for axis, line in ((critic, critic.lines[0]), (twin, twin.lines[0])):  # each scale named, in its colour
        assert (axis.get_ylabel(), axis.yaxis.label.get_color()) == (line.get_label(), line.get_color())
    assert critic.lines[0].get_color() != twin.lines[0].get_color()
    assert fig.get_size_inches().tolist() == [20, 8]  # 7 panels: 4 columns
    grpo = run_figure(
        write_run(
            tmp_path / "grpo",
            [{k: v for k, v in r.items() if "value" not in k and "critic" not in k} for r in ppo_rows()],
        )
    )
    assert "critic (PPO)" not in titles(grpo)
    constant = run_figure(
        write_run(tmp_path / "constant", [{**r, "critic/explained_variance": None} for r in ppo_rows()])
    )
    critic = next(ax for ax in constant.axes if ax.get_title() == "critic (PPO)")  # NaN: Var(returns) = 0
    assert texts(critic) == ["explained variance undefined:\nthe returns never varied"]
    assert texts(next(ax for ax in fig.axes if ax.get_title() == "critic (PPO)")) == []


def test_the_held_out_panel_says_why_it_is_empty(tmp_path: Path) -> None:
    rows = [{"step": s, "reward/total_mean": s / 10} for s in range(1, 4)]
    unevaluated = write_run(tmp_path / "no-eval", rows)
    (unevaluated / "config.yaml").write_text("env: math\neval_tasks: 0\n")
    (unevaluated / "eval.json").write_text(json.dumps({"before": {}, "after": {}}))
    held_out = next(ax for ax in run_figure(unevaluated).axes if ax.get_title() == "held-out accuracy")
    assert texts(held_out) == ["no evaluation: eval_tasks=0"] and not held_out.lines
    running = write_run(tmp_path / "running", rows)
    (running / "config.yaml").write_text("env: math\neval_tasks: 64\n")
    held_out = next(ax for ax in run_figure(running).axes if ax.get_title() == "held-out accuracy")
    assert texts(held_out) == ["no evaluation recorded yet"]
    evaluated = write_run(tmp_path / "evaluated", ppo_rows())
    held_out = next(ax for ax in run_figure(evaluated).axes if ax.get_title() == "held-out accuracy")
    assert texts(held_out) == [] and [line.get_label() for line in held_out.lines] == ["eval/accuracy"]
