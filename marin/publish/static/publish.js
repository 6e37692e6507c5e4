// The published index's filters: reads the inline JSON index and hides the rows that do not match. Without
// JavaScript the full table is shown. Nothing is fetched.
"use strict";
(() => {
  const form = document.getElementById("site-filter");
  const data = document.getElementById("site-index");
  if (!form || !data) return;
  const index = JSON.parse(data.textContent);
  const rows = new Map([...document.querySelectorAll("#site-table tbody tr[data-key]")].map((r) => [r.dataset.key, r]));
  const q = document.getElementById("site-q"), state = document.getElementById("site-state");
  const verdict = document.getElementById("site-verdict"), count = document.getElementById("site-count");
  const apply = () => {
    const words = q.value.toLowerCase().split(/\s+/).filter(Boolean);
    let shown = 0;
    for (const e of index) {
      const ok = words.every((w) => e.text.includes(w)) && (!state.value || e.state === state.value)
        && (!verdict.value || e.verdict === verdict.value);
      const row = rows.get(e.key);
      if (row) row.hidden = !ok;
      if (ok) shown += 1;
    }
    count.textContent = shown + " of " + index.length;
  };
  form.hidden = false;
  for (const el of [q, state, verdict]) el.addEventListener("input", apply);
  form.addEventListener("submit", (ev) => ev.preventDefault());
  apply();
})();
