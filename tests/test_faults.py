"""agentrl.faults: plugin code that would end or hang the run is named instead. SystemExit and
KeyboardInterrupt raised by a call under the run's guard, a reward, an env, engine code, a hook or a
plugin module are that plugin's failure (``PluginExit``, under ``on_call_error`` where the call is
guarded) while a real Ctrl-C still interrupts (``raised_by_signal``); a plugin whose import hangs is
named within ``AGENTRL_PLUGIN_IMPORT_TIMEOUT`` (``import_deadline``, ``import_timeout_s``)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from cli_in_process import assert_one_line, cli
from faulty_plugin import run_config, run_metrics

from agentrl.env import call_with_timeout
from agentrl.errors import ConfigError, EnvError, PluginError, RewardError, TrainingError, TrainingInterrupted
from agentrl.faults import PluginExit
from agentrl.plugins import load_plugins
from agentrl.training.interrupts import InterruptGuard
from agentrl.training.trainer import Trainer

HOOK_PLUGIN = """
from agentrl import hookimpl


@hookimpl
def agentrl_on_step_end(step, metrics):
    raise {exception}
"""


# -- SystemExit / KeyboardInterrupt in guarded calls -----------------------------------------------------
def _exit_zero() -> None:
    raise SystemExit(0)


def _interrupt() -> None:
    raise KeyboardInterrupt


@pytest.mark.parametrize("timeout_s", [None, 5.0], ids=["caller-thread", "worker-thread"])
@pytest.mark.parametrize("fn", [_exit_zero, _interrupt], ids=["SystemExit", "KeyboardInterrupt"])
def test_exits_raised_by_a_call_are_its_failure(fn, timeout_s):
    with (
        InterruptGuard().installed(),
        pytest.raises(
            PluginExit,
            match=r"raised by plugin code \(it would have "
            r"ended the run\) at .*in _",
        ),
    ):
        call_with_timeout(fn, timeout_s)


@pytest.mark.parametrize("timeout_s", [None, 5.0], ids=["caller-thread", "worker-thread"])
def test_a_real_ctrl_c_during_a_call_still_interrupts(timeout_s):
    def slow() -> None:
        time.sleep(10)

    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    start = time.perf_counter()
    with InterruptGuard().installed(), pytest.raises(KeyboardInterrupt) as caught:
        call_with_timeout(slow, timeout_s)
    assert not isinstance(caught.value, PluginExit) and time.perf_counter() - start < 5


def test_a_reward_raising_system_exit_with_skip_is_counted_and_the_run_finishes(tiny_model_dir, tmp_path, faults):
    config = run_config(
        tiny_model_dir,
        tmp_path,
        env=f"{faults}:Tasks",
        rewards={f"{faults}:exits": 1.0},
        max_steps=2,
        on_call_error="skip",
    )
    with pytest.warns(
        RuntimeWarning,
        match=r"reward function 'exits' raised on sample \d \(task 'bad': 'Say 2\.'\): "
        r"PluginExit: SystemExit\(0\) raised by plugin code",
    ):
        Trainer(config, load_plugins()).train()
    rows = run_metrics(tmp_path)
    assert [r["errors/reward/exits"] for r in rows] == [2.0, 2.0]
    assert [r["reward/scored_frac"] for r in rows] == [0.5, 0.5]


def test_a_reward_raising_system_exit_with_fail_exits_non_zero_naming_it(tiny_model_dir, tmp_path, faults):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentrl.cli.app",
            "train",
            "--model",
            str(tiny_model_dir),
            "--env",
            f"{faults}:Tasks",
            "--reward",
            f"{faults}:exits",
            "--output-dir",
            str(tmp_path / "run"),
            "--max-steps",
            "1",
            "--num-generations",
            "2",
            "--prompts-per-step",
            "2",
            "--set",
            "max_new_tokens=4",
            "--set",
            "eval_tasks=0",
            "--set",
            "precision=fp32",
            "--set",
            "on_call_error=fail",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert re.search(
        r"^error: reward function 'exits' raised on sample \d \(task 'bad': 'Say 2\.'\): PluginExit: "
        r"SystemExit\(0\) raised by plugin code .* in exits \(on_call_error=fail",
        lines[0],
    ), lines[0]


def test_a_reward_raising_keyboard_interrupt_is_its_failure_not_an_interrupt(tiny_model_dir, tmp_path, faults):
    config = run_config(
        tiny_model_dir, tmp_path, env=f"{faults}:Tasks", rewards={f"{faults}:interrupts": 1.0}, on_call_error="fail"
    )
    with pytest.raises(
        RewardError,
        match=r"^reward function 'interrupts' raised on sample 0 .*: PluginExit: "
        r"KeyboardInterrupt\(\) raised by plugin code",
    ):
        Trainer(config, load_plugins()).train()


@pytest.mark.parametrize("on_call_error", ["skip", "fail"])
def test_an_env_raising_system_exit_is_its_failure(tiny_model_dir, tmp_path, faults, on_call_error):
    trainer = Trainer(
        run_config(tiny_model_dir, tmp_path, env=f"{faults}:StepExits", on_call_error=on_call_error), load_plugins()
    )
    if on_call_error == "fail":
        with pytest.raises(
            EnvError,
            match=r"^StepExits\.step raised on sample \d \(task 'bad': 'Say 2\.'\): "
            r"PluginExit: SystemExit\(3\) raised by plugin code",
        ):
            trainer.rollout_step(1)
        return
    with pytest.warns(RuntimeWarning, match=re.escape("StepExits.step raised on sample")):
        _, trajectories, metrics = trainer.rollout_step(1)
    assert metrics["errors/env"] == 2.0
    assert all(
        t.info["error"]["exception"].startswith("PluginExit: SystemExit(3)")
        for t in trajectories
        if t.task["id"] == "bad"
    )


def test_a_real_ctrl_c_while_a_reward_runs_still_interrupts_the_run(tiny_model_dir, tmp_path, faults):
    config = run_config(
        tiny_model_dir, tmp_path, env=f"{faults}:Tasks", rewards={f"{faults}:hangs": 1.0}, call_timeout_s=60.0
    )
    trainer = Trainer(config, load_plugins())
    timer = threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(TrainingInterrupted, match="before the first step completed"):
            trainer.train()
    finally:
        timer.cancel()


def test_a_keyboard_interrupt_raised_by_engine_code_is_a_training_error_not_an_interrupt(
    tiny_model_dir, tmp_path, faults
):
    trainer = Trainer(run_config(tiny_model_dir, tmp_path, env=f"{faults}:Tasks"), load_plugins())

    def generate(*args: Any, **kwargs: Any) -> Any:  # engine code on the main thread, as a plugin's would be
        raise KeyboardInterrupt

    trainer.engine.generate = generate
    with pytest.raises(
        TrainingError,
        match=r"^the run stopped: KeyboardInterrupt\(\) raised by plugin code .* in "
        r"generate$",
    ):
        trainer.train()


@pytest.mark.parametrize("exception", ["SystemExit(0)", "KeyboardInterrupt"])
def test_a_hook_raising_an_exit_stops_the_run_naming_the_plugin_and_the_hook(
    tiny_model_dir, tmp_path, faults, exception
):
    plugin = tmp_path / "quitter.py"
    plugin.write_text(HOOK_PLUGIN.format(exception=exception))
    trainer = Trainer(run_config(tiny_model_dir, tmp_path, env=f"{faults}:Tasks"), load_plugins(modules=[str(plugin)]))
    with pytest.raises(
        PluginError,
        match=re.escape(
            f"plugin {str(plugin)!r} raised in hook agentrl_on_step_end: "
            f"{exception if '(' in exception else exception + '()'} raised by "
            "plugin code"
        ),
    ):
        trainer.train()


def test_system_exit_from_other_plugin_code_is_one_line_never_a_silent_exit(tiny_model_dir, tmp_path, faults):
    line = assert_one_line(
        cli(
            "train", "--model", str(tiny_model_dir), "--output-dir", str(tmp_path / "r"), "--env", f"{faults}:TasksExit"
        ),
        f"error: SystemExit(4) raised at {faults}:",
    )
    assert line.endswith(" in train_tasks: plugin code may not end the run"), line


@pytest.mark.parametrize("statement", ["import sys; sys.exit(0)", "raise KeyboardInterrupt"])
def test_a_plugin_module_ending_the_process_at_import_is_named(tmp_path, statement):
    plugin = tmp_path / "bye.py"
    plugin.write_text(statement + "\n")
    line = assert_one_line(
        cli("plugins", "--plugin", str(plugin)),
        f"plugin {str(plugin)!r}: {str(plugin)!r} failed to import: PluginExit(",
    )
    assert "raised by plugin code" in line


# -- plugin imports under a time limit ---------------------------------------------------------------------
def _install_dist(site: Path, dist: str, module: str, entry: str, source: str) -> None:
    """A real installed distribution (dist-info with entry points) in the folder ``site`` on PYTHONPATH."""
    info = site / f"{dist.replace('-', '_')}-0.1.dist-info"  # the folder name's own form (no '-' in the name)
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[agentrl]\n{entry} = {module}\n")
    (site / f"{module}.py").write_text(source)


def test_a_plugin_whose_import_hangs_is_named_within_the_time_limit(tmp_path):
    site = tmp_path / "site"
    _install_dist(site, "agentrl-hang", "agentrl_hang_plugin", "hang", "import time\ntime.sleep(3600)\n")
    env = {**os.environ, "PYTHONPATH": str(site), "AGENTRL_PLUGIN_IMPORT_TIMEOUT": "2"}
    # agentrl's own plugins import under the same limit; on a busy 2-core machine one can take over 2 s
    builtins = [
        arg
        for ep in importlib.metadata.entry_points(group="agentrl")
        if ep.dist and ep.dist.name == "agentrl"
        for arg in ("--disable-plugin", ep.name)
    ]
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "agentrl.cli.app", "plugins", *builtins],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines == [
        "error: plugin 'hang' (entry point 'agentrl_hang_plugin' of agentrl-hang) did not finish importing within "
        "2 s: it hangs (or is very slow) at import. Fix or uninstall it, or disable it with --disable-plugin hang. "
        "Raise AGENTRL_PLUGIN_IMPORT_TIMEOUT (now 2; 0: no limit) if it is only slow"
    ], result.stderr
    assert time.perf_counter() - start < 90  # start-up on a busy 2-core machine, then 2 s
    disabled = subprocess.run(
        [sys.executable, "-m", "agentrl.cli.app", "plugins", "--json", "--disable-plugin", "hang"],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert disabled.returncode == 0 and "hang" not in {row["name"] for row in json.loads(disabled.stdout)}


def test_a_plugin_file_whose_import_hangs_is_interrupted_in_process(tmp_path, monkeypatch):
    plugin = tmp_path / "slow_plugin.py"
    plugin.write_text("import time\ntime.sleep(3600)\n")
    monkeypatch.setenv("AGENTRL_PLUGIN_IMPORT_TIMEOUT", "1")
    previous = signal.getsignal(signal.SIGINT)
    start = time.perf_counter()
    with pytest.raises(PluginError, match=re.escape(f"plugin {str(plugin)!r} did not finish importing within 1 s")):
        load_plugins(modules=[str(plugin)])
    assert time.perf_counter() - start < 30 and signal.getsignal(signal.SIGINT) is previous


def test_a_bad_import_timeout_is_named(monkeypatch):
    monkeypatch.setenv("AGENTRL_PLUGIN_IMPORT_TIMEOUT", "soon")
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "AGENTRL_PLUGIN_IMPORT_TIMEOUT='soon' is invalid: expected a number of seconds >= 0 (0: no limit)"
        ),
    ):
        load_plugins()
