"""``agentrl view``'s page in real headless Chromium, on real tiny runs and a synthetic one: the DOM
shows what the run dir stores (message colours = ``source``, token colours = ``token_view.kind``),
the filters pick exactly the episodes a Python filter over the JSONL picks, two runs overlay in a
chart, evaluations of one task sit side by side, an agent episode's calls and segments show."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import HOSTILE, lines

from agentrl_openai_agent.calls import sent_messages

MESSAGES = "#ep-detail .episode > .conversation > .msg"


def _episodes_tab(page: Any, run: int = 0, which: str = "train") -> None:
    page.click("button[data-tab=episodes]")
    page.select_option("#ep-run", str(run))
    page.select_option("#ep-set", which)


def _open(page: Any, index: int) -> None:
    page.click(f'#ep-table tr[data-index="{index}"]')
    page.wait_for_selector(f"#ep-table tr.selected[data-index='{index}']")


def test_messages_are_coloured_by_their_stored_source(runs, open_view):
    page = open_view(runs["guess"])
    _episodes_tab(page)
    colours: dict[str, set[str]] = {}
    for index, episode in enumerate(lines(runs["guess"] / "completions.jsonl")):
        _open(page, index)
        shown = page.eval_on_selector_all(
            MESSAGES, "ms => ms.map(m => [m.dataset.source, getComputedStyle(m).backgroundColor, m.dataset.role])"
        )
        assert [(s, r) for s, _, r in shown] == [(m["source"], m["role"]) for m in episode["messages"]]
        for source, colour, _ in shown:
            colours.setdefault(source, set()).add(colour)
    assert {"prompt", "sampled", "env"} <= set(colours)  # a multi-turn run has all three
    assert all(len(c) == 1 for c in colours.values()), colours  # one colour per source ...
    assert len({next(iter(c)) for c in colours.values()}) == len(colours)  # ... and a different one each


def _token_views(page: Any) -> list[dict[str, str]]:
    return page.eval_on_selector_all(
        "#ep-detail .tv-segment",
        "segs => segs.map(s => { const t = [...s.querySelectorAll('.tok')];"
        " return {kind: t.map(x => x.dataset.kind).join(''), text: t.map(x => x.textContent).join(''),"
        " painted: t.map(x => x.style.background ? '1' : '0').join('')}; })",
    )


def _check_token_colours(page: Any, episode: dict[str, Any]) -> None:
    segments = episode["token_view"]["segments"]
    shown = _token_views(page)
    assert [s["kind"] for s in shown] == [s["kind"] for s in segments]
    assert [s["text"] for s in shown] == ["".join(s["text"]) for s in segments]
    page.select_option("#ep-detail .tv-mode", "kind")
    colours = page.eval_on_selector_all(
        "#ep-detail .tv-segment .tok", "t => t.map(x => [x.dataset.kind, getComputedStyle(x).backgroundColor])"
    )
    by_kind: dict[str, set[str]] = {}
    for kind, colour in colours:
        by_kind.setdefault(kind, set()).add(colour)
    assert all(len(c) == 1 for c in by_kind.values()) and len({min(c) for c in by_kind.values()}) == len(by_kind)
    if any(v is not None for s in segments for v in s.get("sampler_logprob") or []):
        page.select_option("#ep-detail .tv-mode", "sampler")
        painted = "".join(s["painted"] for s in _token_views(page))
        expected = "".join("0" if v is None else "1" for s in segments for v in s["sampler_logprob"])
        assert painted == expected  # exactly the tokens with a sampler logprob are coloured by it
    for mode, key in (("trainer", "trainer_logprob"), ("entropy", "entropy")):
        if all(key in s for s in segments):
            page.select_option("#ep-detail .tv-mode", mode)
            painted = "".join(s["painted"] for s in _token_views(page))
            assert painted == "".join("0" if v is None else "1" for s in segments for v in s[key])


def test_token_colouring_equals_the_stored_kind(synthetic, runs, open_view):
    for run in (synthetic, runs["guess"], runs["ppo"], runs["agent"]):
        episodes = lines(run / "completions.jsonl")
        viewed = [i for i, e in enumerate(episodes) if e.get("token_view")][:12]
        assert viewed and len(viewed) == min(12, len(episodes))  # log_tokens: tokens, the default
        page = open_view(run)
        _episodes_tab(page)
        for index in viewed:
            _open(page, index)
            _check_token_colours(page, episodes[index])


def _python_filter(episodes: list[dict[str, Any]], f: dict[str, Any]) -> list[int]:
    rewards: dict[tuple[int, int], set[Any]] = {}
    for e in episodes:
        rewards.setdefault((e["step"], e["group"]), set()).add(e["reward"])
    text = f.get("text", "").lower()
    keep = []
    for i, e in enumerate(episodes):
        r = e["reward"]
        tests = [
            "step" not in f or e["step"] == f["step"],
            "rmin" not in f or (r is not None and r >= f["rmin"]),
            "rmax" not in f or (r is not None and r <= f["rmax"]),
            "group" not in f or e["group"] == f["group"],
            not f.get("zero") or len(rewards[(e["step"], e["group"])]) == 1,
            not f.get("truncated") or e["truncated"],
            not f.get("tool_errors") or e["tool_errors"] > 0,
            not f.get("unscored") or bool(e["unscored"]),
            not text or text in "\n".join(m["content"] for m in e["messages"]).lower(),
        ]
        if all(tests):
            keep.append(i)
    return keep


def _apply(page: Any, f: dict[str, Any]) -> list[int]:
    """Set every filter control as ``f`` says (the rest cleared); the indices of all rows shown, page by page."""
    page.select_option("#f-step", str(f.get("step", "")))
    for key, selector in (("rmin", "#f-rmin"), ("rmax", "#f-rmax"), ("group", "#f-group")):
        page.fill(selector, str(f.get(key, "")))
    for key, selector in (("zero", "#f-zero"), ("truncated", "#f-trunc"), ("tool_errors", "#f-toolerr")):
        page.set_checked(selector, bool(f.get(key)))
    page.set_checked("#f-unscored", bool(f.get("unscored")))
    page.fill("#f-text", f.get("text", ""))
    page.dispatch_event("#f-text", "change")
    shown: list[int] = []
    while True:
        shown += [int(i) for i in page.eval_on_selector_all("#ep-table tbody tr", "rs => rs.map(r => r.dataset.index)")]
        pager = page.inner_text("#ep-page")
        here, last = pager.removeprefix("page ").split(" / ")
        if here == last:
            break
        page.click("#ep-next")
    return shown


FILTERS = [
    {},
    {"step": 2},
    {"rmin": 0.5},
    {"rmin": 0.5, "rmax": 0.5},
    {"rmax": 0},
    {"group": 1},
    {"zero": True},
    {"truncated": True},
    {"tool_errors": True},
    {"unscored": True},
    {"text": "PYTHON error"},
    {"step": 3, "zero": True, "truncated": True},
    {"group": 2, "rmin": 1, "text": "the"},
]


def test_filters_pick_exactly_what_a_python_filter_over_the_jsonl_picks(synthetic, open_view):
    episodes = lines(synthetic / "completions.jsonl")
    page = open_view(synthetic)
    _episodes_tab(page)
    assert page.inner_text("#ep-count") == f"{len(episodes)} of {len(episodes)} episodes"
    assert page.inner_text("#ep-page") == "page 1 / 2"  # 100 a page
    for f in FILTERS:
        expected = _python_filter(episodes, f)
        assert expected or f.get("group") == 2, f  # every filter but the last picks something here
        assert _apply(page, f) == expected, f
        assert page.inner_text("#ep-count") == f"{len(expected)} of {len(episodes)} episodes"


def test_two_runs_overlay_in_one_chart_with_a_legend(runs, open_view):
    page = open_view(runs["guess"], runs["ppo"])
    chart = page.locator('.chart[data-metrics="reward/total_mean"]')
    assert chart.get_attribute("data-series") == "2"
    legend = chart.locator(".u-legend .u-series").all_inner_texts()
    assert any("guess" in t for t in legend) and any("ppo" in t for t in legend)
    page.fill("#metric-search", "critic/values")  # PPO only
    visible = page.eval_on_selector_all(".metric-item", "ls => ls.filter(l => !l.hidden).map(l => l.dataset.metric)")
    assert visible == ["critic/values_mean"]
    page.check('.metric-check[data-metric="critic/values_mean"]')
    assert page.locator('.chart[data-metrics="critic/values_mean"]').get_attribute("data-series") == "1"
    page.check("#overlay")
    charts = page.locator(".chart")
    assert charts.count() == 1
    metrics = charts.first.get_attribute("data-metrics").split(",")
    assert "reward/total_mean" in metrics and "critic/values_mean" in metrics
    logged = [
        {k for row in lines(runs[name] / "metrics.jsonl") for k, v in row.items() if isinstance(v, float)}
        for name in ("guess", "ppo")
    ]
    expected = sum(m in run for m in metrics for run in logged)  # a line per metric per run that logged it
    assert charts.first.get_attribute("data-series") == str(expected)


def _sampled(holder: Any) -> list[str]:
    return holder.locator(".episode > .conversation > .msg[data-source=sampled] .msg-body").all_text_contents()


@pytest.mark.parametrize("which", ["guess", "synthetic"])
def test_one_task_at_two_evaluations_side_by_side(runs, synthetic, open_view, which):
    run = synthetic if which == "synthetic" else runs[which]
    evals = lines(run / "eval_completions.jsonl")
    page = open_view(run)
    page.click("button[data-tab=evals]")
    task = evals[-1]["task"]["id"]
    page.select_option("#cmp-task", task)
    page.select_option("#cmp-a", "before")
    page.select_option("#cmp-b", "after")
    for side, when in (("#cmp-left", "before"), ("#cmp-right", "after")):
        [episode] = [e for e in evals if e["task"]["id"] == task and e["when"] == when]
        holder = page.locator(side)
        assert _sampled(holder) == [m["content"] for m in episode["messages"] if m["source"] == "sampled"]
        assert holder.locator('[data-fact="reward"]').inner_text() == f"{episode['reward']:g}"
    points = page.eval_on_selector_all("#eval-matrix thead th", "ths => ths.slice(1).map(t => t.textContent)")
    assert points == list(dict.fromkeys(e["when"] for e in evals))


def test_an_agent_episode_shows_its_segments_calls_and_judgements(runs, synthetic, open_view):
    page = open_view(runs["agent"], synthetic)
    _episodes_tab(page, run=0)
    for index, episode in enumerate(lines(runs["agent"] / "completions.jsonl")):
        _open(page, index)
        assert page.inner_text('#ep-detail [data-fact="earlier segments"]') == "1"  # the agent rewrote its history
        assert page.locator("#ep-detail .call").count() == len(episode["calls"]) == 2
        shown = page.eval_on_selector_all(
            "#ep-detail .call", "cs => cs.map(c => [...c.querySelectorAll('details .msg')].length)"
        )
        assert shown == [len(sent) for sent in sent_messages(episode["calls"])]  # each call's whole request
    _episodes_tab(page, run=1)
    episodes = lines(synthetic / "completions.jsonl")
    index = next(i for i, e in enumerate(episodes) if e.get("calls") and e.get("judgements"))
    _open(page, index)
    calls = episodes[index]["calls"]
    assert page.eval_on_selector_all("#ep-detail .call", "cs => cs.map(c => Number(c.dataset.segment))") == [
        c["segment"] for c in calls
    ]
    assert page.inner_text("#ep-detail .call[data-call='1'] .cut").endswith(calls[1]["cut"])
    assert page.locator("#ep-detail .tv-segment").count() == 2
    judgement = episodes[index]["judgements"][0]
    assert page.inner_text("#ep-detail .judgement .call-head") == f"{judgement['reward']}: score {judgement['score']}"


def test_a_message_holding_markup_is_shown_as_text_and_never_run(synthetic, open_view):
    page = open_view(synthetic)
    assert page.evaluate("window.pwned") is None
    _episodes_tab(page)
    _open(page, 3)
    assert page.locator(MESSAGES).first.locator(".msg-body").text_content() == HOSTILE
    assert page.locator("#ep-detail b:text('bold')").count() == 0


def test_the_runs_tab_shows_each_run_s_config(runs, open_view):
    page = open_view(runs["guess"], runs["ppo"])
    page.click("button[data-tab=run]")
    configs = page.locator("#tab-run details pre").all_text_contents()
    assert configs == [(runs[n] / "config.yaml").read_text() for n in ("guess", "ppo")]


def test_views_of_runs_with_the_same_name_are_told_apart(runs, tmp_path, open_view):
    twin = tmp_path / "twin" / "guess"
    twin.mkdir(parents=True)
    (twin / "metrics.jsonl").write_text((runs["guess"] / "metrics.jsonl").read_text())
    page = open_view(runs["guess"], twin)
    legend = page.locator('.chart[data-metrics="reward/total_mean"] .u-legend .u-series').all_inner_texts()
    assert any(str(twin) in t for t in legend) and any(str(runs["guess"]) in t for t in legend)


def test_the_page_needs_nothing_from_outside(runs, open_view):
    page = open_view(runs["guess"])
    assert page.evaluate("[...document.querySelectorAll('script[src], link[href], img[src]')].length") == 0
    assert Path(page.url.removeprefix("file://")).is_file()
