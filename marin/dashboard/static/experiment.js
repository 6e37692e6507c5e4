// Experiment page: while a step is waiting or running, poll the experiment API and recolour the DAG and the
// steps table in place.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const main = document.getElementById("experiment");
  let active = main.dataset.active === "true";
  const apply = (exp) => {
    marin.setBadge(document.getElementById("exp-state"), exp.state);
    for (const s of exp.steps) {
      const node = [...document.querySelectorAll("#dag .node")].find((n) => n.dataset.hash === s.hash);
      if (node) {
        marin.setBadge(node, s.status);
        const title = node.querySelector("title");
        if (title) title.textContent = s.name + " — " + s.status;
      }
      const row = [...document.querySelectorAll("#steps tr[data-hash]")].find((r) => r.dataset.hash === s.hash);
      if (!row) continue;
      marin.setBadge(row.querySelector('[data-field="status"]'), s.status);
      row.querySelector('[data-field="attempt"]').textContent = s.attempt || "";
      row.querySelector('[data-field="started"]').textContent = marin.ts(s.started);
      row.querySelector('[data-field="duration"]').textContent = marin.duration(s.duration);
      row.querySelector('[data-field="error"]').textContent = s.error ? (s.error.type || "") + ": " + (s.error.message || "") : "";
    }
    const counts = document.getElementById("step-counts");
    counts.replaceChildren(...Object.keys(exp.step_counts).sort().map((k) => {
      const b = marin.el("span", { class: "badge " + marin.stateClass(k) }, k + " " + exp.step_counts[k]);
      return b;
    }));
  };
  marin.poll(async () => {
    const exp = await marin.getJSON(marin.url("/api/experiments/", main.dataset.id));
    apply(exp);
    active = exp.active;
  }, 3000, () => active);
});

// The DAG: fitted to its box by the stylesheet; when that would shrink it below half size (text too small to
// read) show it at actual size, scrolled to the right end where the result steps are. Buttons switch.
(() => {
  const wrap = document.getElementById("dag-wrap");
  const svg = document.getElementById("dag");
  if (!wrap || !svg) return;
  const tools = document.querySelector(".dag-tools");
  const natural = Number(svg.getAttribute("width")) || 1;
  const actual = (on) => {
    wrap.classList.toggle("actual", on);
    if (on) wrap.scrollLeft = wrap.scrollWidth;
  };
  if (wrap.clientWidth / natural < 0.5) actual(true);
  if (tools && natural > wrap.clientWidth) {
    tools.hidden = false;
    document.getElementById("dag-fit").addEventListener("click", () => actual(false));
    document.getElementById("dag-actual").addEventListener("click", () => actual(true));
  }
})();
