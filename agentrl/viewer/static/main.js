/* agentrl view: the page's frame (title, tabs) and start-up; sets window.viewerReady when drawn. */
"use strict";

AV.runTab = function (section) {
  for (const run of AV.runs) {
    const evals = ["before", "after"].filter((w) => Object.keys(run.evals[w] || {}).length);
    const keys = [...new Set(evals.flatMap((w) => Object.keys(run.evals[w])))].sort();
    section.append(AV.el("h3", {}, run.name), AV.el("p", { class: "path" }, run.path),
      AV.el("p", {}, `${run.metrics.steps.length} steps logged, ${run.episodes.length} training and ${run.eval_episodes.length} evaluation episodes stored`),
      keys.length ? AV.el("table", { class: "facts" }, AV.el("tr", {}, AV.el("th", {}, "eval.json"), evals.map((w) => AV.el("th", {}, w))), keys.map((k) => AV.el("tr", {}, AV.el("th", {}, k), evals.map((w) => AV.el("td", {}, AV.fmt(run.evals[w][k])))))) : null,
      AV.el("details", {}, AV.el("summary", {}, "config.yaml"), AV.el("pre", {}, run.config || "(none)")));
  }
};

AV.start = function () {
  const app = document.getElementById("app");
  app.textContent = "";
  const nav = AV.el("nav", { class: "tabs" }, AV.el("span", { class: "brand" }, "agentrl view"));
  const sections = {};
  for (const [name, label] of [["curves", "Curves"], ["episodes", "Episodes"], ["evals", "Evaluation"], ["run", "Runs"]]) sections[name] = AV.el("section", { id: "tab-" + name, class: "tab" });
  AV.addTab("curves", "Curves", sections.curves, () => AV.curves.render());
  AV.addTab("episodes", "Episodes", sections.episodes, () => AV.browser.build(sections.episodes));
  AV.addTab("evals", "Evaluation", sections.evals, () => AV.evals.build(sections.evals));
  AV.addTab("run", "Runs", sections.run, () => AV.runTab(sections.run));
  for (const tab of AV.tabs) {
    tab.button = AV.el("button", { class: "tab-button", "data-tab": tab.name, onclick: () => AV.showTab(tab.name) }, tab.label);
    nav.append(tab.button);
  }
  nav.append(AV.el("span", { class: "run-names" }, AV.runs.map((r) => r.name).join(" \u00b7 ")));
  app.append(nav, ...Object.values(sections));
  AV.curves.build(sections.curves);
  AV.showTab("curves");
  window.viewerReady = true;
};

AV.start();
