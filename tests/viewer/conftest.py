"""The viewer tests' runs and browser: real tiny runs made once per session by ``agentrl train``
(a multi-turn guess run, a PPO run, an ``openai_agent`` run), a synthetic run of 250 episodes with
every optional field (bench/viewer_load.py's), and headless Chromium through Playwright.

Without /usr/bin/chromium (or the playwright package) the browser tests skip, saying why, unless
``AGENTRL_REQUIRE_BROWSER=1`` (CI sets it), which makes them fail instead."""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_in_process import agentrl_in_process

from agentrl.testing import LOCKSTEP_ARGS
from agentrl.viewer import build_payload, render_page, write_page

BENCH = Path(__file__).resolve().parents[2] / "bench" / "viewer_load.py"
AGENT = """
def solve(task, client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": task["question"]}]
    first = client.chat.completions.create(model="m", messages=messages).choices[0].message.content
    summary = [{"role": "user", "content": "Summary of before: " + first[:3]}]
    client.chat.completions.create(model="m", messages=summary)
    return 0.5
"""
"""An agent that rewrites its history: two endpoint calls, the second starting a new segment."""
HOSTILE = "</script><script>window.pwned = 1</script><!-- <b>bold</b>"
"""A message no page may run or render as markup."""


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("viewer_load_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _bench()


def lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path``."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="session")
def runs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``guess`` (multi-turn, 2 steps, evaluated before, at step 1 and after), ``ppo`` (the same
    env, PPO, 1 step, the trainer's logprobs and entropies kept) and ``agent`` (math through an OpenAI-client agent of two calls, 1 step):
    2 x 2 episodes a step."""
    root = tmp_path_factory.mktemp("viewer-runs")
    agent = root / "agent.py"
    agent.write_text(AGENT)
    common = ["--model", str(tiny_model_dir), "--num-generations", "2", "--prompts-per-step", "2"]
    common += ["--set", "max_new_tokens=6", "--set", "eval_tasks=2"]
    common += ["--set", "save_model=false", "--set", "checkpoint_every=0", *LOCKSTEP_ARGS]
    kinds = {
        "guess": ["--env", "guess", "--max-steps", "2", "--set", "eval_every=1"],
        "ppo": ["--env", "guess", "--algo", "ppo", "--max-steps", "1", "--set", "log_tokens=logprobs"],
        "agent": ["--env", "math", "--max-steps", "1", "--set", "rollout=openai_agent"]
        + ["--set", f"plugins.openai_agent.agent={agent}:solve"],
    }
    out = {}
    for name, extra in kinds.items():
        out[name] = root / name
        result = agentrl_in_process("train", *common, "--output-dir", str(out[name]), *extra)
        assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """150 synthetic training episodes (token views, calls, judgements, unscored ones) and 16
    evaluation ones; one message of episode 3 is :data:`HOSTILE`."""
    run = bench.synthetic_run(tmp_path_factory.mktemp("viewer-synthetic") / "synthetic", 150, seed=1)
    episodes = lines(run / "completions.jsonl")
    episodes[3]["messages"][0]["content"] = HOSTILE
    (run / "completions.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    return run


def _browser_missing() -> str | None:
    """Why no browser test can run here (None: they can)."""
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is not installed (pip install -e '.[test]')"
    if not Path(bench.CHROMIUM).is_file():
        return f"{bench.CHROMIUM} is missing (apt-get install chromium)"
    return None


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Headless Chromium, launched once."""
    missing = _browser_missing()
    if missing:
        if os.environ.get("AGENTRL_REQUIRE_BROWSER") == "1":
            pytest.fail(f"AGENTRL_REQUIRE_BROWSER=1 but {missing}")
        pytest.skip(f"no headless browser: {missing}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=bench.CHROMIUM, args=bench.CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def open_view(browser: Any, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``open_view(run, ...)``: the page of those runs, loaded until ready; JS errors fail the test."""
    pages, errors = [], []

    def open_(*paths: Path, width: int = 1300) -> Any:
        out = write_page(render_page(build_payload(list(paths))), tmp_path / f"view{len(pages)}.html")
        page = browser.new_page(viewport={"width": width, "height": 900})
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(out.as_uri())
        page.wait_for_function("window.viewerReady === true", timeout=30_000)
        pages.append(page)
        return page

    yield open_
    for page in pages:
        page.close()
    assert not errors, errors
