// Small SVG charts drawn by hand (no library, nothing fetched from elsewhere): line charts with nice ticks,
// a heatmap and a bar chart. All text goes through textContent.
"use strict";
const charts = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const COLORS = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#bc4c00", "#1b7c83", "#9a6700", "#e85aad"];
  const W = 460, H = 250, M = { l: 56, r: 12, t: 24, b: 30 };

  function svg(tag, attrs, text) {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = String(text);
    return e;
  }

  function niceTicks(lo, hi, n) {
    if (!(hi > lo)) { hi = lo + 1; lo = lo - 1; }
    const raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw);
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(v);
    return out;
  }

  function fmt(v) {
    const a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(1);
    return String(Number(v.toPrecision(4)));
  }

  function frame(container, title) {
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart-svg", role: "img", "aria-label": title });
    root.appendChild(svg("text", { x: M.l, y: 15, class: "title" }, title));
    container.replaceChildren(root);
    return root;
  }

  // series: [{name, values}] aligned with xs; null values are gaps.
  function line(container, title, xs, series, opts) {
    opts = opts || {};
    const root = frame(container, title);
    const pts = series.map((s) => s.values.map((v, i) => [xs[i], v]).filter(([x, y]) => x !== null && y !== null && (!opts.logY || y > 0)));
    const all = pts.flat();
    if (!all.length) { root.appendChild(svg("text", { x: W / 2, y: H / 2, class: "tick", "text-anchor": "middle" }, "no data yet")); return root; }
    const tf = opts.logY ? Math.log10 : (v) => v;
    let [x0, x1] = [Math.min(...all.map((p) => p[0])), Math.max(...all.map((p) => p[0]))];
    let [y0, y1] = [Math.min(...all.map((p) => tf(p[1]))), Math.max(...all.map((p) => tf(p[1])))];
    if (x1 === x0) x1 = x0 + 1;
    if (y1 === y0) { y0 -= Math.abs(y0) * 0.1 || 1; y1 += Math.abs(y1) * 0.1 || 1; }
    if (!opts.logY) {  // widen the y range to whole ticks so the axis starts and ends on a label
      const t = niceTicks(y0, y1, 5), step = t.length > 1 ? t[1] - t[0] : 0;
      if (step > 0) { y0 = Math.floor(y0 / step + 1e-9) * step; y1 = Math.ceil(y1 / step - 1e-9) * step; }
    }
    const sx = (x) => M.l + ((x - x0) / (x1 - x0)) * (W - M.l - M.r);
    const sy = (y) => H - M.b - ((tf(y) - y0) / (y1 - y0)) * (H - M.t - M.b);
    const yt = opts.logY ? niceTicks(y0, y1, 4).map((t) => Math.pow(10, t)) : niceTicks(y0, y1, 5);
    for (const t of yt) {
      const y = sy(t);
      if (y < M.t - 1 || y > H - M.b + 1) continue;
      root.appendChild(svg("line", { x1: M.l, x2: W - M.r, y1: y, y2: y, class: "grid" }));
      root.appendChild(svg("text", { x: M.l - 5, y: y + 3, class: "tick", "text-anchor": "end" }, fmt(t)));
    }
    for (const t of niceTicks(x0, x1, 5)) {
      const x = sx(t);
      if (x < M.l - 1 || x > W - M.r + 1) continue;
      root.appendChild(svg("text", { x, y: H - M.b + 14, class: "tick", "text-anchor": "middle" }, fmt(t)));
    }
    root.appendChild(svg("line", { x1: M.l, x2: M.l, y1: M.t, y2: H - M.b, class: "axis" }));
    root.appendChild(svg("line", { x1: M.l, x2: W - M.r, y1: H - M.b, y2: H - M.b, class: "axis" }));
    pts.forEach((p, i) => {
      if (!p.length) return;
      const d = p.map(([x, y], j) => (j ? "L" : "M") + sx(x).toFixed(1) + "," + sy(y).toFixed(1)).join("");
      root.appendChild(svg("path", { d, class: "series", stroke: COLORS[i % COLORS.length], "data-series": series[i].name }));
      if (series.length > 1) {
        const lx = W - M.r - 110, ly = M.t + 4 + i * 14;
        root.appendChild(svg("rect", { x: lx, y: ly - 8, width: 10, height: 3, fill: COLORS[i % COLORS.length] }));
        root.appendChild(svg("text", { x: lx + 14, y: ly - 4, class: "legend-text" }, series[i].name));
      }
    });
    if (opts.xLabel) root.appendChild(svg("text", { x: W - M.r, y: H - 3, class: "tick", "text-anchor": "end" }, opts.xLabel));
    return root;
  }

  // rows: [[value per column]] (e.g. per MoE layer, fraction of tokens per expert)
  function heatmap(container, title, rows, rowName, colName) {
    const root = frame(container, title);
    const nr = rows.length, nc = Math.max(...rows.map((r) => r.length), 1);
    const vmax = Math.max(...rows.flat(), 1e-12);
    const cw = (W - M.l - M.r) / nc, ch = (H - M.t - M.b) / Math.max(nr, 1);
    rows.forEach((r, i) => {
      root.appendChild(svg("text", { x: M.l - 5, y: M.t + (i + 0.5) * ch + 3, class: "tick", "text-anchor": "end" }, rowName + " " + i));
      r.forEach((v, j) => {
        const a = Math.max(0, Math.min(1, v / vmax));
        const cell = svg("rect", { x: M.l + j * cw, y: M.t + i * ch, width: Math.max(cw - 1, 0.5), height: Math.max(ch - 1, 0.5),
          fill: `rgb(${Math.round(255 - 246 * a)},${Math.round(255 - 150 * a)},${Math.round(255 - 37 * a)})`, class: "cell" });
        cell.appendChild(svg("title", {}, `${rowName} ${i}, ${colName} ${j}: ${fmt(v)}`));
        root.appendChild(cell);
      });
    });
    const step = Math.max(1, Math.ceil(nc / 16));
    for (let j = 0; j < nc; j += step) root.appendChild(svg("text", { x: M.l + (j + 0.5) * cw, y: H - M.b + 14, class: "tick", "text-anchor": "middle" }, j));
    root.appendChild(svg("text", { x: W - M.r, y: H - 3, class: "tick", "text-anchor": "end" }, colName + " (darker = more tokens, max " + fmt(vmax) + ")"));
    return root;
  }

  // groups: [{label, values: {seriesName: number}}]
  function bars(container, title, groups, names) {
    const root = frame(container, title);
    const vals = groups.flatMap((g) => names.map((n) => g.values[n])).filter((v) => typeof v === "number");
    if (!vals.length) return root;
    const vmax = Math.max(...vals, 1e-12);
    const gw = (W - M.l - M.r) / groups.length, bw = (gw * 0.8) / names.length;
    const sy = (v) => H - M.b - (v / vmax) * (H - M.t - M.b);
    for (const t of niceTicks(0, vmax, 4)) {
      if (t > vmax * 1.0001) continue;
      root.appendChild(svg("line", { x1: M.l, x2: W - M.r, y1: sy(t), y2: sy(t), class: "grid" }));
      root.appendChild(svg("text", { x: M.l - 5, y: sy(t) + 3, class: "tick", "text-anchor": "end" }, fmt(t)));
    }
    groups.forEach((g, i) => {
      names.forEach((n, k) => {
        const v = g.values[n];
        if (typeof v !== "number") return;
        const bar = svg("rect", { x: M.l + i * gw + gw * 0.1 + k * bw, y: sy(v), width: bw, height: H - M.b - sy(v), fill: COLORS[k % COLORS.length], class: "bar" });
        bar.appendChild(svg("title", {}, `${g.label} ${n}: ${fmt(v)}`));
        root.appendChild(bar);
      });
      root.appendChild(svg("text", { x: M.l + (i + 0.5) * gw, y: H - M.b + 14, class: "tick", "text-anchor": "middle" }, g.label));
    });
    root.appendChild(svg("line", { x1: M.l, x2: W - M.r, y1: H - M.b, y2: H - M.b, class: "axis" }));
    names.forEach((n, k) => {  // legend in the title row, right-aligned, clear of the bars
      const lx = W - M.r - 56 * (names.length - k);
      root.appendChild(svg("rect", { x: lx, y: 7, width: 10, height: 8, fill: COLORS[k % COLORS.length] }));
      root.appendChild(svg("text", { x: lx + 14, y: 15, class: "legend-text" }, n));
    });
    return root;
  }

  return { line, heatmap, bars };
})();
