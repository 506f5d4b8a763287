/* agentrl view: the Episodes tab. A run's training or evaluation episodes in a paged table, with
   filters (step, reward range, group, zero-spread groups, truncated, tool errors, unscored, text);
   a row opens the episode below the table (detail.js). */
"use strict";

AV.PAGE_SIZE = 100;

/* Per episode set, computed once: what the filters and the table read. */
AV.summaries = new Map();
AV.summaryOf = function (runIndex, set) {
  const key = runIndex + "/" + set;
  if (AV.summaries.has(key)) return AV.summaries.get(key);
  const episodes = AV.episodesOf(runIndex, set);
  const rewards = new Map(); // (point, group) -> the set of its rewards
  const groupKey = (ep) => AV.pointOf(ep) + "/" + ep.group;
  for (const ep of episodes) {
    const k = groupKey(ep);
    if (!rewards.has(k)) rewards.set(k, new Set());
    rewards.get(k).add(ep.reward === null ? "null" : ep.reward);
  }
  const summary = episodes.map((ep) => ({
    point: AV.pointOf(ep),
    zeroSpread: rewards.get(groupKey(ep)).size === 1,
    turns: (ep.turns || []).length,
    tokens: ep.tokens ? (ep.tokens.prompt || 0) + (ep.tokens.sampled || 0) + (ep.tokens.env || 0) : 0,
    text: null, // lower-cased messages, built when a text filter first needs it
  }));
  AV.summaries.set(key, summary);
  return summary;
};

AV.searchText = function (ep, s) {
  if (s.text === null) s.text = (ep.messages || []).map((m) => AV.contentText(m.content)).join("\n").toLowerCase();
  return s.text;
};

/* The filter's values from the controls: {point, rmin, rmax, group, zero, truncated, toolErrors, unscored, text}. */
AV.readFilter = function () {
  const value = (id) => document.getElementById(id).value.trim();
  const number = (id) => (value(id) === "" ? null : Number(value(id)));
  const checked = (id) => document.getElementById(id).checked;
  return {
    point: value("f-step"), rmin: number("f-rmin"), rmax: number("f-rmax"), group: number("f-group"),
    zero: checked("f-zero"), truncated: checked("f-trunc"), toolErrors: checked("f-toolerr"), unscored: checked("f-unscored"),
    text: value("f-text").toLowerCase(),
  };
};

/* The indices of the episodes that pass every filter of `f`. */
AV.filterEpisodes = function (runIndex, set, f) {
  const episodes = AV.episodesOf(runIndex, set), summary = AV.summaryOf(runIndex, set), out = [];
  for (let i = 0; i < episodes.length; i++) {
    const ep = episodes[i], s = summary[i];
    if (f.point !== "" && s.point !== f.point) continue;
    if (f.rmin !== null && !(ep.reward !== null && ep.reward >= f.rmin)) continue;
    if (f.rmax !== null && !(ep.reward !== null && ep.reward <= f.rmax)) continue;
    if (f.group !== null && ep.group !== f.group) continue;
    if (f.zero && !s.zeroSpread) continue;
    if (f.truncated && !ep.truncated) continue;
    if (f.toolErrors && !(ep.tool_errors > 0)) continue;
    if (f.unscored && !ep.unscored) continue;
    if (f.text && !AV.searchText(ep, s).includes(f.text)) continue;
    out.push(i);
  }
  return out;
};

AV.browser = {
  run: 0, set: "train", page: 0, matches: [], selected: null,

  build(section) {
    const ids = (id, label, attrs) => AV.el("label", {}, label + " ", AV.el("input", Object.assign({ id }, attrs)));
    const box = (id, label) => AV.el("label", {}, AV.el("input", { id, type: "checkbox" }), " " + label);
    this.controls = AV.el("div", { class: "filters" },
      AV.el("label", {}, "run ", AV.select({ id: "ep-run" }, AV.runOptions(), 0)),
      AV.el("label", {}, "episodes ", AV.select({ id: "ep-set" }, [["train", "training"], ["eval", "evaluation"]], "train")),
      AV.el("label", {}, "step ", AV.el("select", { id: "f-step" })),
      ids("f-rmin", "reward \u2265", { type: "number", step: "any", class: "num" }),
      ids("f-rmax", "\u2264", { type: "number", step: "any", class: "num" }),
      ids("f-group", "group", { type: "number", step: "1", class: "num" }),
      box("f-zero", "zero-spread groups"), box("f-trunc", "truncated"), box("f-toolerr", "tool errors"), box("f-unscored", "unscored"),
      ids("f-text", "text", { type: "search", placeholder: "search messages" }));
    const pager = AV.el("div", { class: "pager" },
      AV.el("span", { id: "ep-count" }),
      AV.el("button", { id: "ep-prev", onclick: () => this.turnPage(-1) }, "\u2190 prev"),
      AV.el("span", { id: "ep-page" }),
      AV.el("button", { id: "ep-next", onclick: () => this.turnPage(1) }, "next \u2192"));
    const head = ["step", "group", "index", "task", "reward", "advantage", "turns", "tokens", "flags"];
    this.table = AV.el("table", { id: "ep-table", class: "episodes" }, AV.el("thead", {}, AV.el("tr", {}, head.map((h) => AV.el("th", {}, h)))), AV.el("tbody"));
    this.detail = AV.el("div", { id: "ep-detail", class: "detail" });
    section.append(this.controls, pager, AV.el("div", { class: "table-wrap" }, this.table), this.detail);
    this.controls.addEventListener("change", (event) => this.onChange(event));
    let typing = null;
    this.controls.addEventListener("input", (event) => {
      if (event.target.id === "f-text") { clearTimeout(typing); typing = setTimeout(() => this.apply(), 150); }
      else if (event.target.type === "number") this.apply();
    });
    this.table.addEventListener("click", (event) => {
      const row = event.target.closest("tr[data-index]");
      if (row) this.open(Number(row.dataset.index));
    });
    this.fillSteps();
    this.apply();
  },

  onChange(event) {
    const id = event.target.id;
    if (id === "ep-run" || id === "ep-set") {
      this.run = Number(document.getElementById("ep-run").value);
      this.set = document.getElementById("ep-set").value;
      this.selected = null;
      this.detail.textContent = "";
      this.fillSteps();
    }
    if (event.target.type !== "number") this.apply(); // numbers apply as typed; text when done (Enter, leaving the box)
  },

  /* The step filter's choices: every step (training) or evaluation point of the episodes shown. */
  fillSteps() {
    const select = document.getElementById("f-step");
    const points = [...new Set(AV.summaryOf(this.run, this.set).map((s) => s.point))];
    select.textContent = "";
    select.append(AV.el("option", { value: "" }, "all"));
    for (const p of points) select.append(AV.el("option", { value: p }, p));
    select.previousSibling.textContent = this.set === "eval" ? "evaluation " : "step ";
  },

  apply() {
    this.matches = AV.filterEpisodes(this.run, this.set, AV.readFilter());
    this.page = 0;
    this.renderPage();
  },

  turnPage(delta) {
    const last = Math.max(0, Math.ceil(this.matches.length / AV.PAGE_SIZE) - 1);
    this.page = Math.min(last, Math.max(0, this.page + delta));
    this.renderPage();
  },

  renderPage() {
    const episodes = AV.episodesOf(this.run, this.set), summary = AV.summaryOf(this.run, this.set);
    const pages = Math.max(1, Math.ceil(this.matches.length / AV.PAGE_SIZE));
    const total = episodes.length;
    document.getElementById("ep-count").textContent = `${this.matches.length} of ${total} episodes`;
    document.getElementById("ep-page").textContent = `page ${this.page + 1} / ${pages}`;
    const body = AV.el("tbody");
    for (const i of this.matches.slice(this.page * AV.PAGE_SIZE, (this.page + 1) * AV.PAGE_SIZE)) {
      const ep = episodes[i], s = summary[i];
      const flags = [ep.truncated && "truncated", ep.tool_errors > 0 && `${ep.tool_errors} tool errors`, ep.unscored && `unscored: ${ep.unscored}`, s.zeroSpread && "zero-spread"].filter(Boolean);
      body.append(AV.el("tr", { "data-index": i, class: i === this.selected ? "selected" : null },
        AV.el("td", {}, s.point), AV.el("td", {}, ep.group), AV.el("td", {}, ep.index), AV.el("td", { class: "task" }, AV.taskKey(ep)),
        AV.el("td", { class: "num" }, AV.fmt(ep.reward)), AV.el("td", { class: "num" }, AV.fmt(ep.advantage)),
        AV.el("td", { class: "num" }, s.turns), AV.el("td", { class: "num" }, s.tokens), AV.el("td", { class: "flags" }, flags.join(", "))));
    }
    this.table.replaceChild(body, this.table.tBodies[0]);
  },

  open(index) {
    this.selected = index;
    for (const row of this.table.tBodies[0].rows) row.classList.toggle("selected", Number(row.dataset.index) === index);
    this.detail.textContent = "";
    this.detail.append(AV.renderEpisode(AV.episodesOf(this.run, this.set)[index]));
  },
};
