/* agentrl view: the Curves tab. Every metric any run logged, chosen by search box and checkboxes;
   a chart per metric with a line per run, or (overlay) every chosen metric of every run in one chart. */
"use strict";

AV.KEY_METRICS = ["reward/total_mean", "eval/accuracy", "loss/total", "policy/entropy", "train/grad_norm", "rollout/sampled_tokens_mean"];

AV.curves = {
  chosen: new Set(),
  charts: [],

  metricNames() {
    const names = new Set();
    for (const run of AV.runs) for (const key of Object.keys(run.metrics.series)) names.add(key);
    return [...names].sort();
  },

  build(section) {
    const names = this.metricNames();
    const defaults = AV.KEY_METRICS.filter((m) => names.includes(m));
    for (const m of defaults.length ? defaults : names.slice(0, 4)) this.chosen.add(m);
    const search = AV.el("input", { id: "metric-search", type: "search", placeholder: "search metrics" });
    const list = AV.el("div", { id: "metric-list" });
    for (const name of names) {
      const box = AV.el("input", { type: "checkbox", class: "metric-check", "data-metric": name, checked: this.chosen.has(name) });
      box.addEventListener("change", () => {
        box.checked ? this.chosen.add(name) : this.chosen.delete(name);
        this.render();
      });
      list.append(AV.el("label", { class: "metric-item", "data-metric": name }, box, " " + name));
    }
    search.addEventListener("input", () => {
      const words = search.value.toLowerCase().split(/\s+/).filter(Boolean);
      for (const item of list.children) item.hidden = !words.every((w) => item.dataset.metric.toLowerCase().includes(w));
    });
    const overlay = AV.el("input", { type: "checkbox", id: "overlay" });
    overlay.addEventListener("change", () => this.render());
    const clear = AV.el("button", { id: "metric-none", onclick: () => { this.chosen.clear(); for (const b of list.querySelectorAll("input")) b.checked = false; this.render(); } }, "none");
    const runs = AV.el("div", { class: "legend-runs" }, AV.runs.map((run, i) => AV.el("span", { class: "run-swatch", style: `color:${AV.PALETTE[i % AV.PALETTE.length]}` }, "\u25a0 " + run.name)));
    section.append(
      AV.el("div", { class: "curves" },
        AV.el("div", { class: "metric-panel" }, search, AV.el("div", { class: "row" }, AV.el("label", {}, overlay, " overlay in one chart"), clear), list),
        AV.el("div", { class: "chart-panel" }, runs, AV.el("div", { id: "charts" }))));
    this.overlay = overlay;
    window.addEventListener("resize", () => { clearTimeout(this.resizing); this.resizing = setTimeout(() => this.render(), 150); });
  },

  /* x: every step any run logged; y: a value per step (null where not logged) for each (run, metric). */
  alignedData(pairs) {
    const steps = new Set();
    for (const [runIndex] of pairs) for (const s of AV.runs[runIndex].metrics.steps) steps.add(s);
    const xs = [...steps].sort((a, b) => a - b);
    const at = new Map(xs.map((s, i) => [s, i]));
    const ys = pairs.map(([runIndex, metric]) => {
      const run = AV.runs[runIndex], values = run.metrics.series[metric], out = new Array(xs.length).fill(null);
      if (values) run.metrics.steps.forEach((s, i) => { out[at.get(s)] = values[i]; });
      return out;
    });
    return [xs, ...ys];
  },

  chart(title, pairs, width) {
    const many = new Set(pairs.map(([, m]) => m)).size > 1;
    const series = [{ label: "step" }].concat(pairs.map(([runIndex, metric], i) => ({
      label: many ? `${AV.runs[runIndex].name}: ${metric}` : AV.runs[runIndex].name,
      stroke: AV.PALETTE[(many ? i : runIndex) % AV.PALETTE.length],
      width: 1.5,
      spanGaps: true,
      points: { show: AV.runs[runIndex].metrics.steps.length < 60 },
    })));
    const box = AV.el("div", { class: "chart", "data-metrics": pairs.map(([, m]) => m).filter((m, i, a) => a.indexOf(m) === i).join(","), "data-series": pairs.length });
    box.append(AV.el("div", { class: "chart-title" }, title));
    const opts = { width: width, height: 220, series, scales: { x: { time: false } }, axes: [{ label: "step" }, {}] };
    this.charts.push(new uPlot(opts, this.alignedData(pairs), box));
    return box;
  },

  render() {
    const holder = document.getElementById("charts");
    for (const chart of this.charts) chart.destroy();
    this.charts = [];
    holder.textContent = "";
    const metrics = this.metricNames().filter((m) => this.chosen.has(m));
    if (!metrics.length) { holder.append(AV.el("p", { class: "hint" }, "Choose metrics on the left.")); return; }
    const width = Math.max(320, holder.clientWidth - 8);
    const present = (m) => AV.runs.map((_, i) => i).filter((i) => m in AV.runs[i].metrics.series).map((i) => [i, m]);
    if (this.overlay.checked) holder.append(this.chart(metrics.join(", "), metrics.flatMap(present), width));
    else for (const m of metrics) holder.append(this.chart(m, present(m), Math.min(width, Math.max(420, width / 2 - 24))));
  },
};
