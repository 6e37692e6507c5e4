// Shared helpers for the dashboard pages. Every string from the server is inserted with textContent (never
// innerHTML), so names, logs and messages cannot inject markup.
"use strict";
const marin = {
  // "/api/steps/" + encoded "a/b-1234" (each segment encoded, the slashes kept)
  url(base, path) {
    return base + path.split("/").map(encodeURIComponent).join("/");
  },
  async getJSON(url) {
    const r = await fetch(url, { headers: { accept: "application/json" }, cache: "no-store" });
    if (!r.ok) throw new Error(url + ": HTTP " + r.status);
    return r.json();
  },
  el(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  },
  STATES: ["WAITING", "RUNNING", "SUCCESS", "FAILED", "DEP_FAILED", "PREEMPTED", "NOT_STARTED", "NEVER_RUN"],
  stateClass(s) { return "state-" + (marin.STATES.includes(s) ? s : "UNKNOWN"); },
  setBadge(el, state) {
    if (!el) return;
    for (const c of [...el.classList]) if (c.startsWith("state-")) el.classList.remove(c);
    el.classList.add(marin.stateClass(state));
    if (el.tagName.toLowerCase() !== "g") el.textContent = state;
  },
  ts(t) {
    if (typeof t !== "number") return "—";
    return new Date(t * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
  },
  duration(s) {
    if (typeof s !== "number") return "—";
    if (s < 60) return s.toFixed(1) + " s";
    if (s < 3600) return Math.floor(s / 60) + " m " + Math.floor(s % 60) + " s";
    return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " m";
  },
  // Call fn every `ms` while keepGoing() says so; errors are shown in the console and polling continues.
  poll(fn, ms, keepGoing) {
    const tick = async () => {
      if (!keepGoing()) return;
      try { await fn(); } catch (e) { console.error(e); }
      setTimeout(tick, ms);
    };
    setTimeout(tick, ms);
  },
};
