// Experiments list: refresh the state of the visible rows every 10 s.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const main = document.getElementById("experiments");
  marin.poll(async () => {
    const data = await marin.getJSON(main.dataset.api);
    for (const e of data.items) {
      const row = [...document.querySelectorAll("tr[data-id]")].find((r) => r.dataset.id === e.id);
      if (row) marin.setBadge(row.querySelector('[data-field="state"]'), e.state);
    }
  }, 10000, () => true);
});
