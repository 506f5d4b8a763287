"""How fast ``agentrl view``'s page is on a big run: a synthetic run dir of N training episodes
(default 10,000; ~6 messages and a ~200-token token view each, some with endpoint calls and
judgements) and its evaluations, written as the page, opened in headless Chromium.

    python bench/viewer_load.py [--episodes 10000] [--keep DIR]

Prints the page's size, the load time (navigation until the page sets ``window.viewerReady``),
the time to open the Episodes tab, to apply a filter over every episode (reward >= 0.5, then a text
search), and to open one episode. ``synthetic_run`` is also what tests/viewer builds its synthetic
runs with.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
"""How the bench and tests/viewer launch Debian's Chromium (no sandbox: containers have none)."""
WORDS = "the of a to in is it that for on with as was at by an be this are from or have not but".split()
WORDS += "answer tool call result number guess higher lower python print value error list sum".split()


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _token_view(rng: random.Random, messages: list[dict[str, Any]], segments: int = 1) -> dict[str, Any]:
    """A token view of ``messages``: a token per word (a leading space each), kinds by source."""
    out = []
    for _ in range(segments):
        text, kind = [], []
        for m in messages:
            tokens = [" " + w for w in m["content"].split()] + ["\n"]
            text += tokens
            kind.append({"prompt": "p", "sampled": "s"}.get(m["source"], "e") * len(tokens))
        kinds = "".join(kind)
        sampler = [round(-rng.expovariate(1.5), 4) if k == "s" else None for k in kinds]
        trainer = [None if v is None else round(v + rng.gauss(0, 0.05), 4) for v in sampler]
        entropy = [round(rng.uniform(0, 4), 4) if k == "s" else None for k in kinds]
        out.append(
            {"text": text, "kind": kinds, "sampler_logprob": sampler, "trainer_logprob": trainer, "entropy": entropy}
        )
    return {"segments": out}


def synthetic_episode(rng: random.Random, step: int, group: int, index: int, reward: float | None) -> dict[str, Any]:
    """One episode line as ``completions.jsonl`` holds it: a prompt, three model turns, a tool
    result and an env reply between them (~200 tokens), a token view of it; every 10th has two
    endpoint calls (a cut between them), every 7th a judgement."""
    sources = ["prompt", "sampled", "tool", "sampled", "env", "sampled"]
    roles = {"prompt": "user", "sampled": "assistant", "tool": "tool", "env": "user"}
    messages = [{"role": roles[s], "content": _text(rng, 60 if s == "prompt" else 30), "source": s} for s in sources]
    tool_errors = int(rng.random() < 0.1)
    record: dict[str, Any] = {
        "step": step,
        "group": group,
        "index": index,
        "task": {"id": f"task-{step}-{group}", "answer": str(rng.randint(1, 100))},
        "reward": reward,
        "rewards": {"accuracy": reward, "env": reward},
        "advantage": None if reward is None else round(rng.gauss(0, 1), 4),
        "unscored": "raised" if reward is None else None,
        "terminated": True,
        "truncated": rng.random() < 0.2,
        "tokens": {"prompt": 61, "sampled": 93, "env": 62},
        "tool_calls": 1,
        "tool_errors": tool_errors,
        "info": {"solved": bool(reward)},
        "turns": [
            {"message": m, "tokens": 31, "reward": 0.0, "finish_reason": "stop", "tool_calls": 0, "tool_errors": 0}
            for m in (1, 3, 5)
        ],
        "messages": messages,
        "token_view": _token_view(rng, messages),
    }
    if (step * 100 + group * 10 + index) % 10 == 0:
        record["segments"] = 1
        record["token_view"] = _token_view(rng, messages, segments=2)
        record["calls"] = [
            {"segment": k, "prefix_messages": 0, "messages": messages[:1]}
            | {"reply": {"role": "assistant", "content": _text(rng, 10)}}
            | {"prompt_tokens": 61, "sampled_tokens": 10, "cut": "history rewritten" if k else None}
            for k in range(2)
        ]
    if (step * 100 + group * 10 + index) % 7 == 0:
        record["judgements"] = [{"reward": "judge", "prompt": _text(rng, 20), "reply": "Score: 7", "score": 0.7}]
    return record


def synthetic_run(folder: Path, episodes: int, seed: int = 0, generations: int = 8) -> Path:
    """Write a run dir at ``folder``: ``episodes`` training episodes (groups of ``generations``;
    rewards 0, 0.5 or 1, a few groups all alike, a few unscored), metrics for each step, and
    ``before`` / ``after`` evaluations of 8 tasks."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    per_step = generations * 4
    lines = []
    for i in range(episodes):
        step, group, index = i // per_step + 1, (i % per_step) // generations, i % generations
        flat = (step + group) % 3 == 0  # a zero-spread group: every episode the same reward
        reward = None if rng.random() < 0.03 else 1.0 if flat else rng.choice([0.0, 0.5, 1.0])
        lines.append(synthetic_episode(rng, step, group, index, reward))
    steps = lines[-1]["step"] if lines else 0
    _write_jsonl(folder / "completions.jsonl", lines)
    evals = []
    for when, step in (("before", 0), ("after", steps)):
        for task in range(8):
            episode = synthetic_episode(rng, step, task, 0, rng.choice([0.0, 1.0]))
            evals.append({"when": when, **episode, "task": {"id": f"eval-{task}", "answer": "42"}})
    _write_jsonl(folder / "eval_completions.jsonl", evals)
    metrics = [
        {"step": s, "reward/total_mean": 0.5 + 0.4 * s / max(1, steps), "loss/total": rng.random(), "kl": rng.random()}
        for s in range(1, steps + 1)
    ]
    _write_jsonl(folder / "metrics.jsonl", metrics)
    (folder / "eval.json").write_text(json.dumps({"before": {"eval/accuracy": 0.25}, "after": {"eval/accuracy": 0.5}}))
    (folder / "config.yaml").write_text("env: synthetic\nalgo: grpo\n")
    return folder


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(row, separators=(",", ":")) + "\n" for row in rows))


def measure(page_path: Path) -> dict[str, float]:
    """Open ``page_path`` in headless Chromium; seconds to load, open the Episodes tab, filter and open one episode."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        start = time.perf_counter()
        page.goto(page_path.as_uri())
        page.wait_for_function("window.viewerReady === true", timeout=120_000)
        figures = {"load_s": time.perf_counter() - start}
        figures["episodes_tab_s"] = _in_page(page, "document.querySelector('button[data-tab=episodes]').click()")
        set_min = "const f = document.getElementById('f-rmin'); f.value = '0.5'; f.dispatchEvent(new Event('input', {bubbles: true}))"
        figures["filter_reward_s"] = _in_page(page, set_min)
        search = "document.getElementById('f-text').value = 'python error'; AV.browser.apply()"
        figures["filter_text_s"] = _in_page(page, search)
        figures["filter_text_again_s"] = _in_page(page, search)
        figures["matches"] = page.evaluate("AV.browser.matches.length")
        figures["open_episode_s"] = _in_page(page, "document.querySelector('#ep-table tbody tr').click()")
        figures["tokens_shown"] = page.evaluate("document.querySelectorAll('#ep-detail .tok').length")
        browser.close()
    return figures


def _in_page(page: Any, action: str) -> float:
    """Seconds ``action`` takes in the page, layout included."""
    ms = page.evaluate(
        f"() => {{ const t = performance.now(); {action}; document.body.offsetHeight; return performance.now() - t; }}"
    )
    return ms / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--keep", type=Path, default=None, help="build the run dir and page here (default: a temp dir)")
    args = parser.parse_args()
    from agentrl.viewer import build_payload, render_page, write_page

    with tempfile.TemporaryDirectory() as tmp:
        run = synthetic_run((args.keep or Path(tmp)) / "synthetic", args.episodes)
        start = time.perf_counter()
        page = write_page(render_page(build_payload([run])), run / "view.html")
        build_s = time.perf_counter() - start
        size = page.stat().st_size / 1e6
        figures = measure(page)
    print(f"{args.episodes} episodes: page {size:.1f} MB, built in {build_s:.2f} s")
    print(f"load (until viewerReady): {figures['load_s']:.2f} s; episodes tab: {figures['episodes_tab_s']:.3f} s")
    print(
        f"filter reward >= 0.5: {figures['filter_reward_s']:.3f} s; text search: {figures['filter_text_s']:.3f} s ",
        end="",
    )
    print(f"(again: {figures['filter_text_again_s']:.3f} s, {figures['matches']:.0f} matches)")
    print(f"open one episode: {figures['open_episode_s']:.3f} s ({figures['tokens_shown']:.0f} token spans)")


if __name__ == "__main__":
    main()
