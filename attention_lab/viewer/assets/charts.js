// Line charts in plain SVG for the training film: series over steps, a cursor at the shown step, vertical
// marks for phase changes; a click picks the step under the pointer.

const SVG_NS = "http://www.w3.org/2000/svg";

function svg(tag, attrs = {}, text = null) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) if (v != null) node.setAttribute(k, v);
  if (text != null) node.textContent = text;
  return node;
}

// About n round numbers spanning [lo, hi]: steps of 1, 2 or 5 times a power of ten.
function niceTicks(lo, hi, n = 5) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / n, mag = 10 ** Math.floor(Math.log10(raw));
  // the step whose tick count comes closest to n
  const count = (s) => Math.floor(hi / s) - Math.ceil(lo / s) + 1;
  const step = [1, 2, 5, 10].map((m) => m * mag).reduce((a, b) => (Math.abs(count(b) - n) < Math.abs(count(a) - n) ? b : a));
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toPrecision(12));
  return out;
}

function fmtTick(v) {
  if (Math.abs(v) >= 10000) return `${+(v / 1000).toPrecision(4)}k`;
  return `${+v.toPrecision(4)}`;
}

class LineChart {
  // svgNode: an <svg viewBox="0 0 W H">; onPick(step) is called with the step under a click.
  constructor(svgNode, onPick) {
    this.node = svgNode;
    const box = svgNode.viewBox.baseVal;
    this.W = box.width; this.H = box.height;
    this.m = { l: 46, r: 112, t: 10, b: 26 };
    this.onPick = onPick;
    svgNode.addEventListener("click", (e) => {
      if (!this.x) return;
      const rect = svgNode.getBoundingClientRect();
      const px = ((e.clientX - rect.left) / rect.width) * this.W;
      this.onPick(this.x.invert(px));
    });
  }

  // series: [{name, colour, width, dash, points: [[step, value], ...], legend}]; marks: [{step, label, title}]
  draw(series, marks = [], yRange = null) {
    const node = this.node;
    node.replaceChildren();
    const pts = series.flatMap((s) => s.points).filter((p) => p[1] != null && Number.isFinite(p[1]));
    this.series = series;
    if (!pts.length) {
      node.append(svg("text", { x: this.W / 2, y: this.H / 2, "text-anchor": "middle", class: "empty-note" },
                      "nothing recorded"));
      this.x = null;
      return;
    }
    const xs = pts.map((p) => p[0]).concat(marks.map((m) => m.step));
    const ys = pts.map((p) => p[1]);
    let [x0, x1] = [Math.min(...xs), Math.max(...xs)];
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    let [y0, y1] = yRange || [Math.min(...ys), Math.max(...ys)];
    if (!yRange) { const pad = (y1 - y0) * 0.06 || 0.5; y0 -= pad; y1 += pad; }
    const { l, r, t, b } = this.m, w = this.W - l - r, h = this.H - t - b;
    const sx = (v) => l + ((v - x0) / (x1 - x0)) * w;
    const sy = (v) => t + (1 - (v - y0) / (y1 - y0)) * h;
    sx.invert = (px) => x0 + ((px - l) / w) * (x1 - x0);
    this.x = sx; this.y = sy;

    const axes = svg("g", { class: "axes" });
    for (const v of niceTicks(y0, y1, 4)) {
      axes.append(svg("line", { x1: l, x2: l + w, y1: sy(v), y2: sy(v), class: "grid" }));
      axes.append(svg("text", { x: l - 4, y: sy(v) + 3, "text-anchor": "end" }, fmtTick(v)));
    }
    for (const v of niceTicks(x0, x1, 5)) {
      axes.append(svg("text", { x: sx(v), y: t + h + 14, "text-anchor": "middle" }, fmtTick(v)));
    }
    axes.append(svg("text", { x: l + w, y: t + h + 24, "text-anchor": "end" }, "step"));
    axes.append(svg("rect", { x: l, y: t, width: w, height: h, class: "frame" }));
    node.append(axes);

    for (const m of marks) {
      const g = svg("g", { class: "mark" });
      g.append(svg("line", { x1: sx(m.step), x2: sx(m.step), y1: t, y2: t + h }));
      g.append(svg("title", {}, m.title || m.label));
      node.append(g);
    }
    const lines = svg("g", { class: "lines" });
    for (const s of series) {
      const p = s.points.filter((q) => q[1] != null && Number.isFinite(q[1]));
      if (!p.length) continue;
      const attrs = { class: "series", "data-name": s.name, stroke: s.colour, "stroke-width": s.width || 1.5,
                      "stroke-dasharray": s.dash || null, fill: "none" };
      const line = p.length > 1
        ? svg("polyline", { ...attrs, points: p.map((q) => `${sx(q[0]).toFixed(1)},${sy(q[1]).toFixed(1)}`).join(" ") })
        : svg("circle", { ...attrs, cx: sx(p[0][0]), cy: sy(p[0][1]), r: 2.5, fill: s.colour });
      line.append(svg("title", {}, s.name));
      lines.append(line);
    }
    node.append(lines);
    const legend = svg("g", { class: "legend" });
    let row = 0;
    for (const s of series) {
      if (!s.legend || row >= 12) continue;
      const y = t + 8 + row * 14;
      legend.append(svg("line", { x1: l + w + 8, x2: l + w + 24, y1: y - 3, y2: y - 3, stroke: s.colour,
                                  "stroke-width": Math.max(2, s.width || 1.5), "stroke-dasharray": s.dash || null }));
      legend.append(svg("text", { x: l + w + 28, y }, s.legend === true ? s.name : s.legend));
      row++;
    }
    node.append(legend);
    this.cursor = svg("line", { class: "cursor", y1: t, y2: t + h, x1: -10, x2: -10 });
    node.append(this.cursor);
  }

  setCursor(step) {
    if (!this.x || step == null) return;
    const x = this.x(step);
    this.cursor.setAttribute("x1", x); this.cursor.setAttribute("x2", x);
  }
}
