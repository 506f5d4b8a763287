/* agentrl view: the Evaluation tab. A table of each held-out task's reward at each evaluation
   point (before, step N, after), and the same task at two points side by side. The evaluation
   episodes are also browsable in the Episodes tab ("evaluation"). */
"use strict";

AV.evals = {
  run: 0,

  /* task -> point -> its episodes, and the points and tasks in order of first appearance. */
  index(runIndex) {
    const byTask = new Map(), points = [], tasks = [];
    for (const ep of AV.runs[runIndex].eval_episodes) {
      const task = AV.taskKey(ep), point = AV.pointOf(ep);
      if (!points.includes(point)) points.push(point);
      if (!byTask.has(task)) { byTask.set(task, new Map()); tasks.push(task); }
      const at = byTask.get(task);
      if (!at.has(point)) at.set(point, []);
      at.get(point).push(ep);
    }
    return { byTask, points, tasks };
  },

  build(section) {
    this.section = section;
    this.render();
  },

  render() {
    const section = this.section, { byTask, points, tasks } = this.index(this.run);
    section.textContent = "";
    const runSelect = AV.select({ id: "cmp-run" }, AV.runOptions(), this.run);
    runSelect.addEventListener("change", () => { this.run = Number(runSelect.value); this.render(); });
    section.append(AV.el("div", { class: "filters" }, AV.el("label", {}, "run ", runSelect)));
    if (!tasks.length) { section.append(AV.el("p", { class: "hint" }, "This run wrote no evaluation episodes (eval_completions.jsonl).")); return; }
    const pointOptions = points.map((p) => [p, p]);
    const task = AV.select({ id: "cmp-task" }, tasks.map((t) => [t, t]), tasks[0]);
    const a = AV.select({ id: "cmp-a" }, pointOptions, points[0]);
    const b = AV.select({ id: "cmp-b" }, pointOptions, points[points.length - 1]);
    const left = AV.el("div", { id: "cmp-left", class: "side" }), right = AV.el("div", { id: "cmp-right", class: "side" });
    const show = () => {
      for (const [holder, point] of [[left, a.value], [right, b.value]]) {
        holder.textContent = "";
        holder.append(AV.el("h3", {}, point));
        const episodes = byTask.get(task.value).get(point) || [];
        if (!episodes.length) holder.append(AV.el("p", { class: "hint" }, "not evaluated at this point"));
        for (const ep of episodes) holder.append(AV.renderEpisode(ep));
      }
    };
    for (const control of [task, a, b]) control.addEventListener("change", show);
    section.append(this.matrix(byTask, points, tasks, (t, p) => { task.value = t; b.value = p; show(); }));
    section.append(AV.el("h3", {}, "Side by side"),
      AV.el("div", { class: "filters" }, AV.el("label", {}, "task ", task), AV.el("label", {}, "at ", a), AV.el("label", {}, "and at ", b)),
      AV.el("div", { class: "side-by-side" }, left, right));
    show();
  },

  /* Rows: tasks; columns: points; cells: the reward (the mean over the task's episodes there). */
  matrix(byTask, points, tasks, pick) {
    const mean = (eps) => { const r = eps.map((e) => e.reward).filter((v) => v !== null); return r.length ? r.reduce((x, y) => x + y, 0) / r.length : null; };
    const rows = tasks.map((t) => AV.el("tr", {}, AV.el("th", { class: "task" }, t), points.map((p) => {
      const eps = byTask.get(t).get(p);
      if (!eps) return AV.el("td", {}, "");
      const r = mean(eps);
      return AV.el("td", { class: "num pick", "data-task": t, "data-point": p, style: r === null ? null : `background: hsl(${Math.round(120 * Math.max(0, Math.min(1, r)))}, 60%, 85%)`, onclick: () => pick(t, p) }, AV.fmt(r));
    })));
    return AV.el("div", { class: "table-wrap short" }, AV.el("table", { id: "eval-matrix", class: "episodes" }, AV.el("thead", {}, AV.el("tr", {}, AV.el("th", {}, "task \\ reward at"), points.map((p) => AV.el("th", {}, p)))), AV.el("tbody", {}, rows)));
  },
};
