// Progressive enhancement of the server-rendered charts (templates/_line_chart.html): a hover read-out of
// every curve's value at the pointer, and the compare form re-submitted when an option changes. The charts
// read fine without this script. All text goes through textContent.
"use strict";
(() => {
  const NS = "http://www.w3.org/2000/svg";
  const num = (s) => s.split(",").map(Number);

  function fmt(v) {
    const a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(2);
    return String(Number(v.toPrecision(4)));
  }

  function readout(svg) {
    const [l, t, r, b] = num(svg.dataset.plot);
    const [x0, x1] = num(svg.dataset.xDomain), [y0, y1] = num(svg.dataset.yDomain);
    const logX = svg.dataset.logX === "1", logY = svg.dataset.logY === "1";
    const toX = (px) => { const v = x0 + ((px - l) / (r - l)) * (x1 - x0); return logX ? 10 ** v : v; };
    const toY = (py) => { const v = y0 + ((b - py) / (b - t)) * (y1 - y0); return logY ? 10 ** v : v; };
    const lines = [...svg.querySelectorAll("polyline.series")].map((p) => ({
      label: p.dataset.label, color: p.getAttribute("stroke"),
      pts: p.getAttribute("points").trim().split(/\s+/).map(num),
    }));
    const g = document.createElementNS(NS, "g");
    g.setAttribute("class", "hover");
    g.style.display = "none";
    const rule = document.createElementNS(NS, "line");
    rule.setAttribute("y1", t); rule.setAttribute("y2", b); rule.setAttribute("class", "hover-rule");
    g.appendChild(rule);
    const texts = lines.map((ln) => {
      const e = document.createElementNS(NS, "text");
      e.setAttribute("class", "hover-text"); e.setAttribute("fill", ln.color);
      g.appendChild(e);
      return e;
    });
    const head = document.createElementNS(NS, "text");
    head.setAttribute("class", "hover-text");
    g.appendChild(head);
    svg.appendChild(g);
    svg.addEventListener("mousemove", (ev) => {
      const m = svg.getScreenCTM();
      if (!m) return;
      const px = (ev.clientX - m.e) / m.a;
      if (px < l || px > r) { g.style.display = "none"; return; }
      g.style.display = "";
      rule.setAttribute("x1", px); rule.setAttribute("x2", px);
      const left = px > (l + r) / 2;
      const tx = left ? px - 6 : px + 6;
      head.setAttribute("x", tx); head.setAttribute("y", t + 12);
      head.setAttribute("text-anchor", left ? "end" : "start");
      head.textContent = "x " + fmt(toX(px));
      lines.forEach((ln, i) => {
        let best = null;
        for (const p of ln.pts) if (best === null || Math.abs(p[0] - px) < Math.abs(best[0] - px)) best = p;
        const e = texts[i];
        e.setAttribute("x", tx); e.setAttribute("y", t + 26 + i * 13);
        e.setAttribute("text-anchor", left ? "end" : "start");
        e.textContent = best ? `${ln.label}: ${fmt(toY(best[1]))}` : "";
      });
    });
    svg.addEventListener("mouseleave", () => { g.style.display = "none"; });
  }

  document.querySelectorAll("svg.line-chart").forEach(readout);
  const form = document.querySelector("form.compare-options");
  if (form) form.querySelectorAll("select[name=smooth], select[name=x], input[type=checkbox]").forEach((el) =>
    el.addEventListener("change", () => form.submit()));
})();
