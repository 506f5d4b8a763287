"""The trackers plugin: a real 2-step tiny-model run logged to W&B (offline), MLflow (local file
store) and trackio (local store) at once (one run shared by the three tests that read each
tracker's records); the completions table of each holds the episodes of the logged steps; a
resumed run continues each tracker's run; a missing library is one line at start-up; a tracker
that fails mid-run is turned off with one warning while the run goes on."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import struct
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_in_process import agentrl_in_process, assert_one_line, cli

import agentrl_trackers
from agentrl import ConfigError, TrainConfig, build_plugin_config
from agentrl_trackers import TrackersConfig
from agentrl_trackers.base import COLUMNS, completion_rows, split_messages


def _plugin() -> list[str]:
    """``--plugin agentrl_trackers`` unless the installed agentrl's entry points load it already."""
    names = {ep.name for ep in importlib.metadata.entry_points(group="agentrl")}
    return [] if "trackers" in names else ["--plugin", "agentrl_trackers"]


def _train(model: Path, run_dir: Path, *extra: str) -> object:
    result = agentrl_in_process(
        "train",
        "--model",
        str(model),
        "--max-steps",
        "2",
        "--num-generations",
        "2",
        "--prompts-per-step",
        "2",
        "--output-dir",
        str(run_dir),
        *_plugin(),
        *[
            arg
            for pair in (("--set", s) for s in ("max_new_tokens=4", "eval_tasks=0", "save_model=false"))
            for arg in pair
        ],
        *extra,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _completions(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "completions.jsonl").read_text().splitlines()]


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _table_rows(run_dir: Path, step: int) -> list[list]:
    """The completions.jsonl episodes of ``step`` as table rows."""
    return [
        [row[c] for c in COLUMNS] for row in completion_rows([r for r in _completions(run_dir) if r["step"] == step])
    ]


@pytest.fixture(scope="module")
def reported(tiny_model_dir, tmp_path_factory) -> Iterator[Path]:
    """One 2-step run reporting to every installed tracker of the three (a completions table each
    step); its run dir. Each tracker test reads its own tracker's records of it: a tracker logs
    what the run gives it whichever others run beside it."""
    names = [name for name in ("wandb", "mlflow", "trackio") if importlib.util.find_spec(name)]
    if not names:
        pytest.skip("no tracker library is installed")
    root = tmp_path_factory.mktemp("trackers")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_MODE", "offline")
        patch.setenv("WANDB_SILENT", "true")
        if "trackio" not in sys.modules:  # trackio reads its store folder when first imported
            patch.setenv("TRACKIO_DIR", str(root / "trackio"))
        run_dir = root / f"run-{uuid.uuid4().hex[:12]}"  # the trackio run's name: unique in a shared store
        _train(
            tiny_model_dir,
            run_dir,
            "--set",
            f"plugins.trackers.report_to=[{','.join(names)}]",
            "--set",
            "plugins.trackers.project=agentrl-tests",
            "--set",
            "log_completions_every=1",
        )
        yield run_dir


# -- W&B --------------------------------------------------------------------------------------------


def _wandb_records(path: Path) -> list:
    """The records of a ``.wandb`` transaction log (leveldb-log framing of protobuf ``Record``s)."""
    from wandb.proto import wandb_internal_pb2

    data, records, pending, pos = path.read_bytes(), [], b"", 7  # the file header: ":W&B", magic, version
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def _nested(items) -> dict:
    """W&B record items (``key`` or ``nested_key`` path, ``value_json``) as a nested dict."""
    out: dict = {}
    for item in items:
        *parents, last = [item.key] if item.key else list(item.nested_key)
        node = out
        for name in parents:
            node = node.setdefault(name, {})
        node[last] = json.loads(item.value_json)
    return out


def _wandb_log(run: Path) -> tuple[list[dict], dict]:
    """The history rows and the run config of an offline W&B run folder."""
    (log,) = run.glob("run-*.wandb")
    history, config = [], {}
    for record in _wandb_records(log):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append(_nested(record.history.item))
        elif kind == "run":
            config.update(_nested(record.run.config.update))
    return history, config


def test_wandb_offline_logs_each_step_the_completions_table_and_the_config(reported):
    pytest.importorskip("wandb")
    run_dir = reported
    (run,) = (run_dir / "wandb").glob("offline-run-*")
    history, config = _wandb_log(run)
    assert [row["_step"] for row in history] == [1, 2]
    for row, logged in zip(history, _metrics(run_dir)):
        assert {k: row[k] for k in logged if k != "step"} == pytest.approx(
            {k: v for k, v in logged.items() if k != "step"}, nan_ok=True
        )
        assert row["completions"]["_type"] == "table-file"
        table = json.loads((run / "files" / row["completions"]["path"]).read_text())
        assert table["columns"] == list(COLUMNS)
        assert table["data"] == _table_rows(run_dir, row["_step"])
        assert len(table["data"]) == 4
    assert config["max_steps"] == 2 and config["num_generations"] == 2
    ids = json.loads((run_dir / "trackers.json").read_text())
    assert run.name.endswith(ids["wandb"])


def test_a_resumed_run_continues_the_same_wandb_run_id(tiny_model_dir, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run"
    _train(tiny_model_dir, run_dir, "--set", "plugins.trackers.report_to=[wandb]", "--set", "checkpoint_every=1")
    result = agentrl_in_process("train", "--resume", str(run_dir), "--max-steps", "3", *_plugin())
    assert result.returncode == 0, result.stderr[-3000:]
    runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    run_id = json.loads((run_dir / "trackers.json").read_text())["wandb"]
    assert len(runs) == 2 and all(run.name.endswith(f"-{run_id}") for run in runs)
    assert [row["_step"] for row in _wandb_log(runs[1])[0]] == [3]


# -- MLflow -----------------------------------------------------------------------------------------


def _mlflow_run(run_dir: Path) -> Path:
    (meta,) = [p for p in (run_dir / "mlruns").glob("*/*/meta.yaml") if p.parent.parent.name != ".trash"]
    return meta.parent


def test_mlflow_file_store_holds_each_metric_per_step_the_table_and_the_params(reported):
    pytest.importorskip("mlflow")
    run_dir = reported
    run = _mlflow_run(run_dir)
    logged = _metrics(run_dir)
    for key in logged[0].keys() - {"step"}:  # one file per metric: "timestamp value step" lines
        lines = [line.split() for line in (run / "metrics" / key).read_text().splitlines()]
        assert [int(step) for _, _, step in lines] == [1, 2], key
        assert [float(value) for _, value, _ in lines] == pytest.approx([m[key] for m in logged], nan_ok=True)
    assert (run / "params" / "max_steps").read_text() == "2"
    assert json.loads((run / "artifacts" / "config.json").read_text())["max_steps"] == 2
    for step in (1, 2):
        table = json.loads((run / "artifacts" / "completions" / f"step_{step:06d}.json").read_text())
        assert table["columns"] == list(COLUMNS) and table["data"] == _table_rows(run_dir, step)
    assert "status: 3" in (run / "meta.yaml").read_text()  # FINISHED


def test_a_resumed_run_continues_the_same_mlflow_run(tiny_model_dir, tmp_path):
    pytest.importorskip("mlflow")
    run_dir = tmp_path / "run"
    _train(tiny_model_dir, run_dir, "--set", "plugins.trackers.report_to=[mlflow]", "--set", "checkpoint_every=1")
    first = _mlflow_run(run_dir)
    result = agentrl_in_process("train", "--resume", str(run_dir), "--max-steps", "3", *_plugin())
    assert result.returncode == 0, result.stderr[-3000:]
    assert _mlflow_run(run_dir) == first
    steps = [int(line.split()[2]) for line in (first / "metrics" / "reward" / "total_mean").read_text().splitlines()]
    assert steps == [1, 2, 3]


def test_a_tracker_that_fails_mid_run_is_turned_off_with_one_warning(tiny_model_dir, tmp_path):
    pytest.importorskip("mlflow")
    breaker = tmp_path / "break_mlflow.py"
    breaker.write_text(
        "import shutil\n"
        "from pathlib import Path\n"
        "from agentrl import hookimpl\n"
        "RUN = {}\n"
        "@hookimpl\n"
        "def agentrl_on_train_start(run_dir):\n"
        "    RUN['dir'] = run_dir\n"
        "@hookimpl\n"
        "def agentrl_on_rollout_end(step):\n"
        "    if step == 2:\n"
        "        shutil.rmtree(Path(RUN['dir']) / 'mlruns')\n"
    )
    run_dir = tmp_path / "run"
    result = _train(tiny_model_dir, run_dir, "--plugin", str(breaker), "--set", "plugins.trackers.report_to=[mlflow]")
    warnings = [line for line in result.stderr.splitlines() if "tracker mlflow failed" in line]
    assert len(warnings) == 1 and "at step 2 and is off for the rest of the run" in warnings[0], result.stderr
    assert "Traceback" not in result.stderr
    assert [m.get("trackers/failed") for m in _metrics(run_dir)] == [None, 1.0]


def test_a_tracker_that_cannot_start_stops_the_run_in_one_line(tiny_model_dir, tmp_path):
    pytest.importorskip("mlflow")
    result = agentrl_in_process(
        "train",
        "--model",
        str(tiny_model_dir),
        "--output-dir",
        str(tmp_path / "run"),
        *_plugin(),
        "--set",
        "plugins.trackers.report_to=[mlflow]",
        "--set",
        "plugins.trackers.mlflow_tracking_uri=nosuchscheme://tracking",
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: tracker mlflow could not start: "), result.stderr
    assert "nosuchscheme" in lines[0]


# -- trackio ----------------------------------------------------------------------------------------


def test_trackio_logs_each_step_the_completions_table_and_the_config(reported):
    pytest.importorskip("trackio")
    from trackio.sqlite_storage import SQLiteStorage

    run_dir = reported
    logs = SQLiteStorage.get_logs("agentrl-tests", run_dir.name)
    assert [row["step"] for row in logs] == [1, 2]
    for row, logged in zip(logs, _metrics(run_dir)):
        assert {k: row[k] for k in logged if k != "step"} == pytest.approx(
            {k: v for k, v in logged.items() if k != "step"}, nan_ok=True
        )
        table = row["completions"]
        assert table["_type"] == "trackio.table"
        assert [[r[c] for c in COLUMNS] for r in table["_value"]] == _table_rows(run_dir, row["step"])
    assert SQLiteStorage.get_run_config("agentrl-tests", run_dir.name)["max_steps"] == 2


# -- start-up ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, package", [("wandb", "wandb"), ("mlflow", "mlflow-skinny"), ("trackio", "trackio")])
def test_a_missing_library_is_one_line_naming_the_extra(monkeypatch, tmp_path, name, package):
    monkeypatch.setitem(sys.modules, name, None)  # as if not installed: importing it fails
    with pytest.raises(ConfigError) as caught:
        build_plugin_config(TrackersConfig, {"report_to": [name]}, "plugins.trackers")
    assert str(caught.value) == (
        f"plugins.trackers.report_to names {name}, but {name} is not installed: "
        f"pip install 'agentrl[trackers]' (or pip install {package})"
    )
    result = cli("train", "--print-config", *_plugin(), "--set", f"plugins.trackers.report_to=[{name}]")
    assert_one_line(result, "pip install 'agentrl[trackers]'")


@pytest.mark.parametrize(
    "report_to, message",
    [
        (["tensorboardx"], "'tensorboardx' is not a tracker; expected a list of wandb, mlflow, trackio"),
        (["mlflow", "mlflow"], "'mlflow' is named twice; name each tracker once"),
    ],
)
def test_a_bad_report_to_is_one_line_naming_it(report_to, message, monkeypatch):
    monkeypatch.setattr(agentrl_trackers, "_installed", lambda module: True)
    with pytest.raises(ConfigError) as caught:
        build_plugin_config(TrackersConfig, {"report_to": report_to}, "plugins.trackers")
    assert str(caught.value) == f"plugins.trackers.report_to={report_to!r} is invalid: {message}"


def test_no_tracker_is_the_default_and_starts_nothing(tmp_path):
    assert TrackersConfig().report_to == []
    agentrl_trackers.agentrl_on_train_start(config=TrainConfig(), run_dir=str(tmp_path))
    agentrl_trackers.agentrl_on_step_end(step=1, metrics={"loss/total": 0.5})
    assert agentrl_trackers._session is None and list(tmp_path.iterdir()) == []


def test_a_conversation_splits_into_prompt_and_completion():
    single = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    assert split_messages(single) == ("Be brief.\n\n2+2?", "4")
    multi = [
        *single,
        {"role": "tool", "content": [{"type": "text", "text": "ok"}]},
        {"role": "assistant", "content": None},
    ]
    assert split_messages(multi) == ("Be brief.\n\n2+2?", "[assistant] 4\n\n[tool] ok\n\n[assistant] ")
