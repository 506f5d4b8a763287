"""``agentrl view`` without a browser: the page's data read from real run dirs, the JSON inlined
safely, the page written where asked (or served, until Ctrl-C), the static files shipped as package
data, and bad input as one line."""

from __future__ import annotations

import fnmatch
import functools
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from cli_in_process import agentrl_in_process, assert_one_line, cli
from conftest import HOSTILE, lines

from agentrl.viewer import build_payload, render_page
from agentrl.viewer.page import SCRIPTS, STYLES
from agentrl.viewer.payload import page_json

ROOT = Path(__file__).resolve().parents[2]


def _data(html: str) -> dict:
    found = re.search(r'<script type="application/json" id="viewer-data">(.*?)</script>', html, flags=re.S)
    assert found
    return json.loads(found.group(1))


def test_the_payload_holds_every_episode_and_every_metric_by_step(runs):
    payload = build_payload([runs["guess"], runs["ppo"]])
    guess, ppo = payload["runs"]
    assert (guess["name"], ppo["name"]) == ("guess", "ppo")
    assert [json.loads(e) for e in guess["episodes"]] == lines(runs["guess"] / "completions.jsonl")
    assert [json.loads(e) for e in guess["eval_episodes"]] == lines(runs["guess"] / "eval_completions.jsonl")
    rows = lines(runs["guess"] / "metrics.jsonl")
    assert guess["metrics"]["steps"] == sorted({row["step"] for row in rows}) == [1, 2]
    for row in rows:
        at = guess["metrics"]["steps"].index(row["step"])
        for key, value in row.items():
            if key != "step" and isinstance(value, float):
                assert guess["metrics"]["series"][key][at] == value, key
    assert "critic/values_mean" in ppo["metrics"]["series"] and "critic/values_mean" not in guess["metrics"]["series"]
    assert guess["config"] == (runs["guess"] / "config.yaml").read_text()
    assert guess["evals"]["before"]["eval/num_tasks"] == 2


def test_the_inlined_json_cannot_end_its_script_element_and_reads_back_whole(synthetic, tmp_path):
    run = tmp_path / "odd"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "loss/total": NaN, "kl": 0.5, "note": "</script>"}\n')
    episode = lines(synthetic / "completions.jsonl")[3]
    text = json.dumps(episode)
    (run / "completions.jsonl").write_text(
        text + "\n" + text.replace('"advantage": ', '"advantage": NaN, "x": ') + "\n"
    )
    (run / "eval.json").write_text('{"before": {"eval/accuracy": NaN}, "after": {}}')
    payload = build_payload([run])
    html = render_page(payload)
    assert html.lower().count("</script") == len(SCRIPTS) + 1  # the scripts' own ends and the data's
    assert HOSTILE not in html and "<!--" not in html
    data = _data(html)
    [shown] = data["runs"]
    assert shown["metrics"]["series"] == {"kl": [0.5]}  # NaN and text are no points
    assert shown["episodes"][0] == episode and shown["episodes"][0]["messages"][0]["content"] == HOSTILE
    assert shown["episodes"][1]["advantage"] is None  # NaN in a line: null
    assert shown["evals"]["before"] == {"eval/accuracy": None}
    assert json.loads(page_json(payload)) == data


def test_view_writes_one_page_into_the_first_run_dir_and_prints_its_url(runs):
    result = agentrl_in_process("view", str(runs["guess"]), str(runs["ppo"]))
    assert result.returncode == 0, result.stdout + result.stderr
    page = runs["guess"] / "view.html"
    said = result.stdout.splitlines()
    files = [
        run / name for run in (runs["guess"], runs["ppo"]) for name in ("completions.jsonl", "eval_completions.jsonl")
    ]
    assert said[0].startswith(f"wrote {page} (") and said[0].endswith(
        f" MB, {sum(len(lines(f)) for f in files)} episodes)"
    )
    assert said[1] == page.as_uri()
    html = page.read_text()
    assert [run["name"] for run in _data(html)["runs"]] == ["guess", "ppo"]
    assert "uPlot" in html and "AV.start" in html  # the scripts are inlined, not linked
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", html)


def test_view_out_writes_where_asked_and_replaces_a_link_instead_of_writing_through_it(runs, tmp_path):
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep me")
    out = tmp_path / "page.html"
    out.symlink_to(target)
    result = agentrl_in_process("view", str(runs["agent"]), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert not out.is_symlink() and "agentrl view: agent" in out.read_text()
    assert target.read_text() == "keep me"


def test_bad_input_is_one_line_naming_it(runs, tmp_path):
    assert_one_line(
        cli("view", str(tmp_path / "nope")), f"{str(tmp_path / 'nope')!r} is not a run dir: it does not exist"
    )
    assert_one_line(cli("view", str(tmp_path)), "is not a run dir: it has no metrics.jsonl")
    assert_one_line(cli("view", str(runs["guess"] / "config.yaml")), "is not a run dir: it is not a folder")
    missing = tmp_path / "no" / "x.html"
    assert_one_line(
        cli("view", str(runs["guess"]), "--out", str(missing)), f"folder {str(missing.parent)!r} does not exist"
    )
    assert_one_line(cli("view", str(runs["guess"]), "--serve", "--port", "70000"), "--port 70000: must be 0-65535")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "metrics.jsonl").write_text('{"step": 1}\n')
    (broken / "completions.jsonl").write_text('{"step": 1}\n{"step": 1, "gro\n{"step": 2}\n')
    assert_one_line(cli("view", str(broken)), "completions.jsonl, line 2: not a JSON object")


def test_a_half_written_last_line_is_left_out(tmp_path):
    run = tmp_path / "live"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "completions.jsonl").write_text('{"step": 1, "group": 0}\n{"step": 1, "gro')
    [shown] = build_payload([run])["runs"]
    assert shown["episodes"] == ['{"step": 1, "group": 0}'] and shown["eval_episodes"] == []


def test_serve_answers_with_the_page_until_ctrl_c(runs):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "plugins"), str(ROOT / "envs")])}
    command = [sys.executable, "-m", "agentrl.cli.app", "view", str(runs["ppo"]), "--serve", "--port", "0"]
    ignore = functools.partial(signal.signal, signal.SIGINT, signal.SIG_IGN)  # as some launchers start it
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=ignore
    )
    try:
        line = process.stdout.readline()
        found = re.fullmatch(r"serving (http://127\.0\.0\.1:\d+/) \(Ctrl-C stops\)\n", line)
        assert found, line + process.stderr.read() if process.poll() is not None else line
        with urllib.request.urlopen(found.group(1) + "anything", timeout=30) as answer:
            html = answer.read().decode()
        assert [run["name"] for run in _data(html)["runs"]] == ["ppo"]
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 0 and out.strip() == "stopped" and not err, (out, err)
    assert not (runs["ppo"] / "view.html").exists()  # --serve alone writes no file


def test_every_static_file_is_package_data():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["agentrl"]
    static = sorted(p.relative_to(ROOT / "agentrl").as_posix() for p in (ROOT / "agentrl/viewer/static").iterdir())
    assert {f"viewer/static/{name}" for name in SCRIPTS + STYLES} | {"viewer/static/uPlot.LICENSE"} == set(static)
    assert all(any(fnmatch.fnmatch(path, p) for p in patterns) for path in static), (static, patterns)
