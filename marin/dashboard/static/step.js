// Step page: follow the log tail, refresh status and events while the step runs, and draw the charts.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const main = document.getElementById("step");
  const path = main.dataset.path;
  let active = main.dataset.active === "true";
  const logEl = document.getElementById("log"), info = document.getElementById("log-info");
  const attemptSel = document.getElementById("log-attempt");
  const MAX_SHOWN = 256 * 1024;
  let logEnd = null;
  let shownFrom = 0;  // byte offset of the first byte on screen
  let raw = "";  // the log text received since shownFrom, as written

  // A carriage return (a tqdm progress bar) redraws its line, as in a terminal: each line shows the last of
  // its redraws that is not empty ("\r\n" is a plain line end).
  function latestState(text) {
    return text.replace(/\r\n/g, "\n").split("\n").map((line) => {
      const redraws = line.split("\r");
      for (let i = redraws.length - 1; i >= 0; i--) if (redraws[i]) return redraws[i];
      return "";
    }).join("\n");
  }

  async function loadLog(reset) {
    if (reset) { logEnd = null; raw = ""; logEl.textContent = ""; }
    let url = marin.url("/api/logs/", path) + "?max_bytes=65536";
    if (attemptSel.value) url += "&attempt=" + encodeURIComponent(attemptSel.value);
    if (logEnd !== null) url += "&offset=" + logEnd;
    const tail = await marin.getJSON(url);
    if (!tail.path) { info.textContent = "no log yet"; return; }
    if (logEnd === null || tail.start !== logEnd) {  // first load, or fell behind: start from the tail
      raw = "";
      shownFrom = tail.start;
    }
    const atBottom = logEl.scrollTop + logEl.clientHeight >= logEl.scrollHeight - 4;
    raw += tail.text;
    if (raw.length > MAX_SHOWN) {
      raw = raw.slice(-MAX_SHOWN);
      shownFrom = Math.max(shownFrom, tail.end - MAX_SHOWN);  // approximate: characters, not bytes
    }
    logEl.textContent = latestState(raw);
    logEnd = tail.end;
    info.textContent = `${tail.size} bytes` + (shownFrom > 0 ? `, showing the end from byte ${shownFrom}` : "");
    if (atBottom || reset) logEl.scrollTop = logEl.scrollHeight;
  }

  function renderEvents(events) {
    const body = document.querySelector("#events tbody");
    body.replaceChildren(...events.map((e) => {
      const tr = marin.el("tr");
      const badge = marin.el("span", { class: "badge " + marin.stateClass(e.event) }, e.event);
      const cells = [marin.el("td", { class: "nowrap" }, marin.ts(e.ts)), marin.el("td"), marin.el("td", {}, e.attempt || ""),
        marin.el("td", {}, e.executor || ""), marin.el("td", {}, (e.message || "") + (e.previous_owner ? ` (previous owner ${e.previous_owner})` : ""))];
      cells[1].appendChild(badge);
      tr.append(...cells);
      return tr;
    }));
  }

  function renderAttempts(attempts) {
    const body = document.querySelector("#attempts tbody");
    body.replaceChildren(...attempts.map((a) => {
      const tr = marin.el("tr");
      const outcome = marin.el("td");
      outcome.appendChild(marin.el("span", { class: "badge " + marin.stateClass(a.outcome) }, a.outcome || ""));
      const log = marin.el("td");
      if (a.log) {
        log.appendChild(marin.el("a", { href: marin.url("/files/", a.log) }, a.log.split("/").pop()));
        log.appendChild(marin.el("span", { class: "muted small" }, " " + a.log_size + " B"));
      }
      const dur = a.started && a.ended ? marin.duration(a.ended - a.started) : "";
      tr.append(marin.el("td", {}, a.attempt), outcome, marin.el("td", { class: "nowrap" }, marin.ts(a.started)),
        marin.el("td", { class: "nowrap" }, marin.ts(a.ended)), marin.el("td", {}, dur), marin.el("td", {}, a.executor || ""), log);
      return tr;
    }));
  }

  async function refreshStep() {
    const step = await marin.getJSON(marin.url("/api/steps/", path));
    marin.setBadge(document.getElementById("step-state"), step.status.status);
    renderEvents(step.events);
    renderAttempts(step.attempts);
    const err = step.status.error;
    document.getElementById("error-box").hidden = !err;
    document.getElementById("error-type").textContent = err ? err.type || "" : "";
    document.getElementById("error-message").textContent = err ? err.message || "" : "";
    const have = new Set([...attemptSel.options].map((o) => o.value));
    for (const a of step.attempts) {
      if (!have.has(String(a.attempt))) attemptSel.insertBefore(marin.el("option", { value: a.attempt }, a.attempt), attemptSel.firstChild);
    }
    if ((step.has_metrics || step.has_eval) && main.dataset.metrics !== "true") {
      main.dataset.metrics = "true";
      document.getElementById("charts-section").hidden = false;
    }
    active = step.active;
  }

  async function drawCharts() {
    if (main.dataset.metrics !== "true") return;
    const m = await marin.getJSON(marin.url("/api/metrics/", path) + "?max_points=800");
    const s = m.series, xs = m.steps;
    const q = (id) => document.getElementById(id);
    if (s.loss) charts.line(q("chart-loss"), "training loss", xs, [{ name: "loss", values: s.loss }], { xLabel: "step" });
    if (s.lr) charts.line(q("chart-lr"), "learning rate", xs, [{ name: "lr", values: s.lr }], { xLabel: "step" });
    const norms = ["grad_norm", "update_norm"].filter((k) => s[k]).map((k) => ({ name: k, values: s[k] }));
    if (norms.length) charts.line(q("chart-norms"), "gradient and update norms (log scale)", xs, norms, { logY: true, xLabel: "step" });
    if (m.expert_load && m.expert_load.layers.length) {
      charts.heatmap(q("chart-expert-load"), `expert load per layer (step ${m.expert_load.step})`, m.expert_load.layers, "layer", "expert");
    }
    const ev = m.eval && m.eval.domains ? m.eval : (m.eval_history.length ? m.eval_history[m.eval_history.length - 1] : null);
    if (ev) {
      const groups = Object.keys(ev.domains).sort().map((d) => ({ label: d, values: ev.domains[d] }));
      charts.bars(q("chart-eval"), "per-domain eval (bits per byte, loss)", groups, ["bpb", "loss"]);
    }
    if (m.eval_history.length > 1) {
      const domains = [...new Set(m.eval_history.flatMap((p) => Object.keys(p.domains)))].sort();
      const ex = m.eval_history.map((p) => p.step);
      charts.line(q("chart-eval-history"), "eval bits per byte by domain", ex,
        domains.map((d) => ({ name: d, values: m.eval_history.map((p) => (p.domains[d] ? p.domains[d].bpb : null)) })), { xLabel: "step" });
    }
  }

  attemptSel.addEventListener("change", () => loadLog(true).catch(console.error));
  loadLog(true).catch(console.error);
  drawCharts().catch(console.error);
  marin.poll(async () => { await refreshStep(); await loadLog(false); }, 2000, () => active);
  marin.poll(drawCharts, 10000, () => active);
});
