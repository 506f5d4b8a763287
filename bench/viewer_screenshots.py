"""The screenshots in docs/guides/viewer.md, taken by headless Chromium from ``agentrl view``'s page.

    python bench/viewer_screenshots.py RUN_DIR [RUN_DIR ...] [--out docs/images] [--episodes RUN_DIR] [--tokens RUN_DIR]

Writes ``viewer-curves.png`` (the runs' curves overlaid), then from ``--episodes`` (default: the
first run) ``viewer-episode.png`` (its first episode with a tool call, else the first: messages
coloured by source) and ``viewer-eval.png`` (one held-out task before and after training, side by
side), and from ``--tokens`` (default: the episodes' run) ``viewer-tokens.png`` (the first
episode's token view coloured by kind).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from viewer_load import CHROMIUM, CHROMIUM_ARGS  # noqa: E402 (the bench folder is not a package)


def _page(browser: Any, runs: list[Path], out: Path) -> Any:
    from agentrl.viewer import build_payload, render_page, write_page

    html = write_page(render_page(build_payload(runs)), out / ".viewer-shot.html")
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.goto(html.as_uri())
    page.wait_for_function("window.viewerReady === true")
    html.unlink()
    page.add_style_tag(content="nav.tabs { position: static; }")  # a sticky bar would cover element shots
    return page


def _changed_task(run: Path) -> str | None:
    """The first held-out task whose reward differs between the first and the last evaluation."""
    path = run / "eval_completions.jsonl"
    if not path.is_file():
        return None
    rewards: dict[str, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        e = json.loads(line)
        rewards.setdefault(str(e["task"].get("id", e["group"])), {})[e["when"]] = e["reward"]
    return next((task for task, r in rewards.items() if len(set(r.values())) > 1), None)


def _first(run: Path, want: str) -> int:
    """The index of the first training episode with field ``want`` (or with the most turns when none has)."""
    episodes = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
    found = [i for i, e in enumerate(episodes) if e.get(want)]
    return found[0] if found else max(range(len(episodes)), key=lambda i: len(episodes[i]["turns"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("docs/images"))
    parser.add_argument("--episodes", type=Path, default=None, help="the run to take episodes and evaluations from")
    parser.add_argument("--tokens", type=Path, default=None, help="the run to take the token view from")
    args = parser.parse_args()
    episodes = args.episodes or args.runs[0]
    tokens = args.tokens or episodes
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = _page(browser, args.runs, args.out)
        page.screenshot(path=str(args.out / "viewer-curves.png"))
        page = _page(browser, [episodes], args.out)
        page.click("button[data-tab=episodes]")
        page.click(f'#ep-table tr[data-index="{_first(episodes, "tool_calls")}"]')
        page.locator("#ep-detail .conversation").first.screenshot(path=str(args.out / "viewer-episode.png"))
        page.click("button[data-tab=evals]")
        changed = _changed_task(episodes)
        if changed is not None:
            page.select_option("#cmp-task", changed)
        page.locator("#tab-evals").screenshot(path=str(args.out / "viewer-eval.png"))
        page = _page(browser, [tokens], args.out)
        page.click("button[data-tab=episodes]")
        page.click(f'#ep-table tr[data-index="{_first(tokens, "token_view")}"]')
        if page.locator("#ep-detail .token-view").count():
            page.locator("#ep-detail .token-view").screenshot(path=str(args.out / "viewer-tokens.png"))
        browser.close()
    print("wrote", *sorted(str(p) for p in args.out.glob("viewer-*.png")))


if __name__ == "__main__":
    main()
