// Experiments list: refresh the state of the visible rows every 10 s, and say when the page's rows changed
// (a new experiment started) instead of reshuffling the table under the reader.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const main = document.getElementById("experiments");
  const shown = () => [...document.querySelectorAll("tr[data-id]")].map((r) => r.dataset.id);
  marin.poll(async () => {
    const data = await marin.getJSON(main.dataset.api);
    for (const e of data.items) {
      const row = [...document.querySelectorAll("tr[data-id]")].find((r) => r.dataset.id === e.id);
      if (row) marin.setBadge(row.querySelector('[data-field="state"]'), e.state);
    }
    const now = data.items.map((e) => e.id);
    const before = shown();
    const changed = now.length !== before.length || now.some((id, i) => id !== before[i]);
    const note = document.getElementById("list-changed");
    note.hidden = !changed;
  }, 10000, () => true);
});
