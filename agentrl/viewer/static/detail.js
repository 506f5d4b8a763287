/* agentrl view: one episode in full. Its facts, the conversation message by message (coloured by
   source: prompt / sampled / env / tool, each model turn's reward and finish reason beside its
   message), the token view (each token coloured by kind or by a per-token number), the endpoint
   calls of an agent episode, and the judges' verdicts. */
"use strict";

AV.SOURCES = { prompt: "prompt", sampled: "sampled (trained)", env: "env", tool: "tool" };
AV.KINDS = { p: "prompt", s: "sampled (loss mask 1)", e: "env / tool" };

AV.facts = function (ep) {
  const t = ep.tokens || {};
  const rows = [
    ["point", AV.pointOf(ep)], ["group / index", `${ep.group} / ${ep.index}`], ["task", AV.taskKey(ep)],
    ["answer", ep.task && ep.task.answer !== undefined ? String(ep.task.answer) : null],
    ["reward", AV.fmt(ep.reward)],
    ["rewards", Object.entries(ep.rewards || {}).map(([k, v]) => `${k}: ${AV.fmt(v)}`).join(", ") || null],
    ["advantage", ep.advantage === undefined ? null : AV.fmt(ep.advantage)],
    ["unscored", ep.unscored], ["ended", [ep.terminated && "terminated", ep.truncated && "truncated"].filter(Boolean).join(", ") || "-"],
    ["tokens", `prompt ${t.prompt}, sampled ${t.sampled}, env ${t.env}`],
    ["tool calls / errors", `${ep.tool_calls} / ${ep.tool_errors}`],
    ["policy version", ep.policy_version], ["earlier segments", ep.segments],
  ];
  return AV.el("table", { class: "facts" }, rows.filter(([, v]) => v !== null && v !== undefined).map(([k, v]) => AV.el("tr", {}, AV.el("th", {}, k), AV.el("td", { "data-fact": k }, String(v)))));
};

AV.turnNote = function (turn, k) {
  const parts = [`turn ${k + 1}`, `${turn.tokens} tokens`, `reward ${AV.fmt(turn.reward)}`, `finish ${turn.finish_reason}`];
  if (turn.tool_calls) parts.push(`${turn.tool_calls} tool calls`);
  if (turn.tool_errors) parts.push(`${turn.tool_errors} tool errors`);
  if (turn.policy_version !== undefined) parts.push(`policy v${turn.policy_version}`);
  return AV.el("span", { class: "turn-note", "data-turn": k }, parts.join(" \u00b7 "));
};

AV.renderMessage = function (m, i, turns) {
  const source = m.source || "prompt";
  const head = AV.el("div", { class: "msg-head" }, AV.el("b", {}, m.role), " \u00b7 " + (AV.SOURCES[source] || source), m.unseen ? " \u00b7 unseen (the episode ended first)" : "", ...turns.map(([turn, k]) => [" ", AV.turnNote(turn, k)]));
  const body = [AV.el("div", { class: "msg-body" }, AV.contentText(m.content))];
  if (m.tool_calls) body.push(AV.el("pre", { class: "tool-calls" }, JSON.stringify(m.tool_calls, null, 1)));
  return AV.el("div", { class: `msg src-${source}`, "data-source": source, "data-role": m.role, "data-message": i, "data-unseen": m.unseen ? true : null }, head, ...body);
};

AV.renderConversation = function (messages, turnsOf) {
  return AV.el("div", { class: "conversation" }, (messages || []).map((m, i) => AV.renderMessage(m, i, turnsOf ? turnsOf.get(i) || [] : [])));
};

/* Token colour modes: kind, or a per-token number (those present in the episode's segments). */
AV.TOKEN_MODES = [
  ["kind", "kind", null],
  ["sampler", "sampler logprob", (s, i) => s.sampler_logprob && s.sampler_logprob[i]],
  ["trainer", "trainer logprob", (s, i) => s.trainer_logprob && s.trainer_logprob[i]],
  ["diff", "trainer \u2212 sampler logprob", (s, i) => (s.trainer_logprob && s.sampler_logprob && s.trainer_logprob[i] !== null && s.sampler_logprob[i] !== null && s.trainer_logprob[i] !== undefined ? s.trainer_logprob[i] - s.sampler_logprob[i] : null)],
  ["entropy", "entropy", (s, i) => s.entropy && s.entropy[i]],
];

/* The background of a token whose number is `v` in mode `mode` (`top`: the largest entropy shown). */
AV.tokenColour = function (mode, v, top) {
  if (v === null || v === undefined || Number.isNaN(v)) return "";
  if (mode === "sampler" || mode === "trainer") return `hsl(${Math.round(120 * Math.exp(Math.min(0, v)))}, 75%, 78%)`; // red: unlikely, green: likely
  if (mode === "diff") { const a = Math.min(1, Math.abs(v)); return v >= 0 ? `rgba(33, 102, 172, ${a})` : `rgba(214, 39, 40, ${a})`; }
  return `rgba(148, 103, 189, ${Math.min(1, v / (top || 1))})`;
};

AV.renderTokens = function (view) {
  const segments = view.segments || [];
  const modes = AV.TOKEN_MODES.filter(([name, , get]) => name === "kind" || segments.some((s) => (s.text || []).some((_, i) => { const v = get(s, i); return v !== null && v !== undefined; })));
  const select = AV.select({ class: "tv-mode" }, modes.map(([name, label]) => [name, label]), "kind");
  const legend = AV.el("span", { class: "tv-legend" });
  const holder = AV.el("div", { class: "tv-segments" });
  const spans = segments.map((segment, n) => {
    const box = AV.el("div", { class: "tv-segment", "data-segment": n }, AV.el("div", { class: "tv-segment-head" }, `segment ${n + 1} of ${segments.length}`));
    const kinds = segment.kind || "";
    const out = (segment.text || []).map((text, i) => {
      const span = AV.el("span", { class: "tok k-" + (kinds[i] || "p"), "data-kind": kinds[i] || "", "data-i": i }, text);
      box.append(span);
      return span;
    });
    holder.append(box);
    return out;
  });
  const paint = () => {
    const mode = select.value, get = AV.TOKEN_MODES.find(([name]) => name === mode)[2];
    holder.dataset.mode = mode;
    let top = 0;
    if (mode === "entropy") segments.forEach((s, n) => spans[n].forEach((_, i) => { const v = get(s, i); if (v > top) top = v; }));
    segments.forEach((s, n) => spans[n].forEach((span, i) => {
      const v = get ? get(s, i) : null;
      span.style.background = get ? AV.tokenColour(mode, v, top) : "";
      span.title = get ? (v === null || v === undefined ? "-" : AV.fmt(v)) : AV.KINDS[span.dataset.kind] || "";
    }));
    legend.textContent = mode === "kind" ? "" : mode === "diff" ? "blue: trainer higher, red: sampler higher (|\u0394| \u2265 1 full colour)" : mode === "entropy" ? `purple: up to ${AV.fmt(top)} nats` : "red: unlikely \u2192 green: likely";
  };
  select.addEventListener("change", paint);
  paint();
  const key = AV.el("span", { class: "tv-key" }, Object.entries(AV.KINDS).map(([k, label]) => AV.el("span", { class: "tok k-" + k }, label)));
  return AV.el("section", { class: "token-view" }, AV.el("h4", {}, "Tokens "), AV.el("div", { class: "row" }, "colour by ", select, " ", key, " ", legend), holder);
};

/* The whole conversation each call sent: a call stores the messages after the first
   `prefix_messages` of the previous call's (its own `messages`, all of them when the prefix is 0). */
AV.sentMessages = function (calls) {
  const out = [];
  calls.forEach((call) => out.push((out.length ? out[out.length - 1] : []).slice(0, call.prefix_messages || 0).concat(call.messages || [])));
  return out;
};

AV.renderCalls = function (calls) {
  const sent = AV.sentMessages(calls);
  return AV.el("section", { class: "calls" }, AV.el("h4", {}, `Endpoint calls (${calls.length})`), calls.map((call, i) => AV.el("div", { class: "call", "data-segment": call.segment, "data-call": i },
    AV.el("div", { class: "call-head" }, `call ${i + 1} \u00b7 segment ${call.segment + 1} \u00b7 ${call.prompt_tokens} prompt + ${call.sampled_tokens} sampled tokens`, call.cut ? AV.el("span", { class: "cut" }, ` \u00b7 new segment: ${call.cut}`) : ""),
    AV.el("details", {}, AV.el("summary", {}, `request: ${sent[i].length} messages (${(call.messages || []).length} new)`), AV.renderConversation(sent[i])),
    call.reply ? AV.renderMessage(Object.assign({ source: "sampled" }, call.reply), -1, []) : null)));
};

AV.renderJudgements = function (judgements) {
  return AV.el("section", { class: "judgements" }, AV.el("h4", {}, "Judgements"), judgements.map((j) => AV.el("div", { class: "judgement", "data-reward": j.reward },
    AV.el("div", { class: "call-head" }, `${j.reward}: score ${AV.fmt(j.score)}`),
    AV.el("details", {}, AV.el("summary", {}, "judge prompt"), typeof j.prompt === "string" ? AV.el("div", { class: "msg-body" }, j.prompt) : AV.renderConversation(j.prompt)),
    AV.el("div", { class: "msg src-sampled judge-reply" }, AV.el("div", { class: "msg-body" }, AV.contentText(j.reply))))));
};

/* The whole episode: facts, turns without a message of their own, conversation, tokens, calls, judgements, info. */
AV.renderEpisode = function (ep) {
  const turnsOf = new Map(), orphans = [];
  (ep.turns || []).forEach((turn, k) => {
    if (turn.message === null || turn.message === undefined) orphans.push(AV.turnNote(turn, k));
    else { if (!turnsOf.has(turn.message)) turnsOf.set(turn.message, []); turnsOf.get(turn.message).push([turn, k]); }
  });
  return AV.el("div", { class: "episode", "data-task": AV.taskKey(ep), "data-point": AV.pointOf(ep) },
    AV.facts(ep),
    orphans.length ? AV.el("div", { class: "orphans" }, "turns without a message: ", orphans) : null,
    AV.renderConversation(ep.messages, turnsOf),
    ep.token_view ? AV.renderTokens(ep.token_view) : null,
    Array.isArray(ep.calls) && ep.calls.length ? AV.renderCalls(ep.calls) : null,
    Array.isArray(ep.judgements) && ep.judgements.length ? AV.renderJudgements(ep.judgements) : null,
    AV.el("details", { class: "info" }, AV.el("summary", {}, "info"), AV.el("pre", {}, JSON.stringify(ep.info || {}, null, 2))));
};
