/* agentrl view: the data, shared helpers and the tabs. Every script of the page adds to the one
   global `AV`; the page's data is the JSON in <script id="viewer-data"> (see agentrl/viewer/payload.py). */
"use strict";

const AV = (window.AV = {});
AV.data = JSON.parse(document.getElementById("viewer-data").textContent);
AV.runs = AV.data.runs;
AV.PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"];

/* el("div", {class: "x", "data-k": 1, onclick: f}, child, "text", ...): an element; null/false children skipped. */
AV.el = function (tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "text") node.textContent = value;
    else if (key === "value") node.value = value;
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
};

/* A number for a table cell: 4 significant digits; "-" for null. */
AV.fmt = function (value) {
  if (value === null || value === undefined) return "-";
  if (typeof value !== "number") return String(value);
  if (Number.isInteger(value)) return String(value);
  return Math.abs(value) >= 1e4 || (Math.abs(value) < 1e-3 && value !== 0) ? value.toExponential(3) : String(+value.toPrecision(4));
};

/* A message's content as text: a string as is, a list of parts by their text. */
AV.contentText = function (content) {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map((part) => (typeof part === "string" ? part : part.text || JSON.stringify(part))).join("");
  return JSON.stringify(content);
};

/* The task an episode ran: its id, else its place ("#3"): evaluations run the same tasks in the same order. */
AV.taskKey = function (episode) {
  const task = episode.task || {};
  return task.id !== undefined && task.id !== null ? String(task.id) : "#" + episode.group;
};

/* The training step or evaluation point an episode belongs to ("3", "before", "step 5", "after"). */
AV.pointOf = function (episode) {
  return episode.when !== undefined ? episode.when : String(episode.step);
};

AV.episodesOf = function (runIndex, set) {
  const run = AV.runs[runIndex];
  return set === "eval" ? run.eval_episodes : run.episodes;
};

/* A <select> of [value, label] pairs. */
AV.select = function (attrs, options, selected) {
  const node = AV.el("select", attrs);
  for (const [value, label] of options) node.append(AV.el("option", { value: value, selected: String(value) === String(selected) }, label));
  return node;
};

AV.runOptions = function () {
  return AV.runs.map((run, i) => [i, run.name]);
};

/* The tabs: a button each, one section shown at a time; `onShow` runs when its tab is first shown. */
AV.tabs = [];
AV.addTab = function (name, label, section, onShow) {
  AV.tabs.push({ name, label, section, onShow, shown: false });
};
AV.showTab = function (name) {
  for (const tab of AV.tabs) {
    const active = tab.name === name;
    tab.section.hidden = !active;
    tab.button.classList.toggle("active", active);
    if (active && tab.onShow && !tab.shown) tab.onShow();
    if (active) tab.shown = true;
  }
  AV.currentTab = name;
};
