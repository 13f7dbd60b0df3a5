// "Step inside a head": one head's attention for one query, computed here in the page from the model's own q, k
// and v (attention_lab/viewer/report.py inside_data), the way the tutorials write it out:
//   dots_j = q_i . k_j;  scaled_j = dots_j / sqrt(d_k);  + bias (ALiBi);  masked: -inf for j > i (and outside a
//   window);  weights = softmax (a sink logit joins the denominator only);  head_out = sum_j w_j v_j
// Linear attention: dots_j = phi(q_i) . phi(k_j), phi = elu + 1, weights = dots / sum(dots).
// The layer and the query follow the head view (hover or pin a token there); the head is chosen here.
//
// data.inside: {kind, hs, scale, alibi: [nh], windows: [L] (null: none), sinks: [L][nh] | null per layer,
//   denominator, out_norm, q, k, v: base64 float32 (L, H, T, hs), share_norm: [L][H][T],
//   lens: [L + 1][T][5] of [token, p], copying: [L][H], qk_pairs: [L][H][5] of [q, k, score],
//   ov_writes: [L][H]{token: [5] of [token, logit]}}

// q, k or v of every head: base64 float32 (L, H, T, hs), decoded one layer at a time when first read (the panel
// shows one layer; at 500 tokens decoding all of them would be most of a redraw); or a Float32Array already (the
// live lab fetches them as binary once the maps are drawn)
class LayerFloats {
  constructor(text, L, perLayer) { this.text = text; this.per = perLayer; this.layers = new Array(L); }

  layer(l) {
    if (this.text instanceof Float32Array) return this.text.subarray(l * this.per, (l + 1) * this.per);
    if (!this.layers[l]) {
      const a = l * this.per * 4, b = a + this.per * 4; // the layer's bytes
      const c0 = Math.floor(a / 3) * 4, c1 = Math.ceil(b / 3) * 4; // the base64 characters that hold them
      const bytes = decodeBase64(this.text.slice(c0, c1)), skip = a - (c0 / 4) * 3;
      this.layers[l] = new Float32Array(bytes.slice(skip, skip + this.per * 4).buffer);
    }
    return this.layers[l];
  }
}

function fmt(x, digits = 4) {
  if (x === -Infinity) return "\u2212\u221e";
  return x.toFixed(digits);
}

// Every number in full (a cell's tooltip): the table rounds to 4 decimals, a reader checking a value needs all.
function exact(x) { return String(x); }

// Bars of a vector: one column per channel, up for positive, down for negative, scaled to the largest |value|.
function barStrip(values, width, height, colour) {
  const canvas = el("canvas", { class: "bars", width, height });
  const ctx = canvas.getContext("2d");
  let top = 1e-12;
  for (const v of values) top = Math.max(top, Math.abs(v));
  const w = width / values.length, mid = height / 2;
  ctx.fillStyle = "#ddd";
  ctx.fillRect(0, mid, width, 1);
  values.forEach((v, c) => {
    const h = (Math.abs(v) / top) * (mid - 1);
    ctx.fillStyle = v >= 0 ? colour : "#c0392b";
    ctx.fillRect(c * w, v >= 0 ? mid - h : mid, Math.max(1, w - 0.5), h);
  });
  canvas.title = `${values.length} channels; largest |value| ${top.toFixed(3)}`;
  return canvas;
}

const ROW_WINDOW = 40; // rows of the step-inside table laid out on either side of the middle of its view

class InsidePanel {
  // setData(data) shows another text (the live lab): the head select keeps its one listener; a text without
  // data.inside (a model whose rows the panel cannot step through) hides the panel.
  constructor(data, explorer) {
    this.explorer = explorer;
    this.head = 0;
    this.H = -1;
    this.select = document.getElementById("in-head");
    this.select.addEventListener("change", () => { this.head = +this.select.value; this.render(); });
    this.scrollBox = document.querySelector("#inside .in-scroll");
    this.bars = null;
    this.rowH = 0;
    let queued = false;
    this.scrollBox.addEventListener("scroll", () => {
      if (queued) return;
      queued = true;
      requestAnimationFrame(() => { queued = false; this.drawBars(); });
    });
    this.setData(data);
  }

  setData(data) {
    const d = data.inside || null;
    this.d = d;
    this.bars = null;
    document.getElementById("inside").hidden = !d;
    if (!d) return;
    this.tokens = data.tokens;
    this.L = data.L; this.T = data.T;
    this.hs = d.hs;
    this.scale = d.scale;
    [this.q, this.k, this.v] = [d.q, d.k, d.v].map((text) => new LayerFloats(text, this.L, data.H * this.T * this.hs));
    if (data.H !== this.H) {
      this.H = data.H;
      this.select.replaceChildren(...Array.from({ length: this.H }, (_, h) => el("option", { value: h, text: `head ${h}` })));
      this.head = Math.min(this.head, this.H - 1);
      this.select.value = `${this.head}`;
    }
  }

  vec(arr, l, h, j) {
    const o = (h * this.T + j) * this.hs;
    return arr.layer(l).subarray(o, o + this.hs);
  }

  // one row of the computation for every key j: [dots, scaled, bias, logit] (logit -inf where hidden)
  rows(l, h, i) {
    const q = this.vec(this.q, l, h, i), window = this.d.windows[l];
    const slope = this.d.alibi[h] || 0, linear = this.d.kind === "linear";
    const phi = (x) => (x > 0 ? x + 1 : Math.exp(x));
    const out = [];
    for (let j = 0; j <= i; j++) {
      const k = this.vec(this.k, l, h, j);
      let dot = 0;
      for (let c = 0; c < this.hs; c++) dot += linear ? phi(q[c]) * phi(k[c]) : q[c] * k[c];
      const scaled = linear ? dot : dot * this.scale;
      const bias = linear ? 0 : slope * (j - i);
      const hidden = window != null && j <= i - window;
      out.push({ j, dot, scaled, bias, hidden, logit: hidden ? -Infinity : scaled + bias });
    }
    return out;
  }

  weights(rows, l, h) {
    if (this.d.kind === "linear") {
      const total = rows.reduce((s, r) => s + (r.hidden ? 0 : r.dot), 0);
      for (const r of rows) r.weight = r.hidden ? 0 : r.dot / Math.max(total, 1e-6);
      return null;
    }
    const sink = this.d.sinks[l] ? this.d.sinks[l][h] : null;
    let m = sink == null ? -Infinity : sink;
    for (const r of rows) m = Math.max(m, r.logit);
    let z = sink == null ? 0 : Math.exp(sink - m);
    for (const r of rows) { r.e = Math.exp(r.logit - m); z += r.e; }
    for (const r of rows) r.weight = r.e / z;
    return sink == null ? null : { logit: sink, weight: Math.exp(sink - m) / z };
  }

  headOut(rows, l, h) {
    const out = new Float64Array(this.hs);
    const raw = this.d.kind === "linear" && !this.d.denominator;
    for (const r of rows) {
      const v = this.vec(this.v, l, h, r.j), w = raw ? (r.hidden ? 0 : r.dot) : r.weight;
      for (let c = 0; c < this.hs; c++) out[c] += w * v[c];
    }
    if (this.d.kind === "linear" && this.d.out_norm) {
      let ms = 0;
      for (const x of out) ms += x * x;
      const s = 1 / Math.sqrt(ms / this.hs + 1.1920928955078125e-7);
      for (let c = 0; c < this.hs; c++) out[c] *= s;
    }
    return out;
  }

  render() {
    if (!this.d) return;
    const l = this.explorer.layer, i = this.explorer.query, h = this.head;
    const colour = headColour(h, this.H);
    const linear = this.d.kind === "linear";
    const rows = this.rows(l, h, i);
    const sink = this.weights(rows, l, h);
    const out = this.headOut(rows, l, h);
    const window = this.d.windows[l];
    document.getElementById("in-what").textContent =
      `layer ${l} (from the head view), query #${i} "${axisLabel(this.tokens[i], 20)}"` +
      (window != null ? ` \u00b7 this layer sees the last ${window} keys` : "") +
      (linear ? " \u00b7 linear attention: phi(q).phi(k), phi = elu + 1, normalised" : "");
    const qBox = document.getElementById("in-query");
    qBox.replaceChildren(el("span", { class: "in-label", text: `q${i}` }),
                         barStrip(this.vec(this.q, l, h, i), 256, 28, colour),
                         el("span", { class: "in-note", text: `the query (${this.hs} channels, after QK-norm and ` +
                                                                  "RoPE where the model has them)" }));
    const head = el("tr", {}, ...["key", "k_j", linear ? "\u03c6(q)\u00b7\u03c6(k_j)" : "q\u00b7k_j",
                                  linear ? "" : "\u00d7 1/\u221ad_k", linear ? "" : "+ bias", "masked",
                                  linear ? "weight" : "softmax"].map((t) => el("th", { text: t })));
    // one row a key, built as one HTML string (a long context has hundreds of rows: one parse, not thousands of
    // createElement calls); every number's full value is its cell's title
    const td = (cls, text, title) => `<td class="${cls}"${title == null ? "" : ` title="${title}"`}>${text}</td>`;
    const best = rows.reduce((a, r) => (r.weight > a.weight ? r : a), rows[0]);
    const html = rows.map((r) => `<tr data-key="${r.j}" class="${r.hidden ? "hidden-key" : ""} off">` +
      td("key", escapeHtml(`#${r.j} ${axisLabel(this.tokens[r.j], 12)}`)) +
      td("kbar", "") + // drawn when its row is in view (drawBars)
      td("dot", fmt(r.dot), exact(r.dot)) +
      td("scaled", linear ? "" : fmt(r.scaled), linear ? null : exact(r.scaled)) +
      td("bias", linear ? "" : fmt(r.bias), linear ? null : exact(r.bias)) +
      td("masked", r.hidden ? "\u2212\u221e (outside the window)" : fmt(r.logit), exact(r.logit)) +
      td("weight", `<span class="wbar" style="width:${(100 * r.weight).toFixed(1)}px;background:${colour}"></span>` +
                   `<span> ${fmt(r.weight)}</span>`, exact(r.weight)) + "</tr>");
    if (sink) {
      html.push(`<tr data-key="sink" class="sink-row off">${td("key", "sink")}<td></td><td></td><td></td><td></td>` +
                td("masked", fmt(sink.logit), exact(sink.logit)) +
                td("weight", `${fmt(sink.weight)} (attends to nothing)`, exact(sink.weight)) + "</tr>");
    }
    if (i + 1 < this.T) {
      html.push(`<tr data-key="future" class="future-row off">${td("key", `#${i + 1}\u2013#${this.T - 1}`)}` +
                `<td></td><td></td><td></td><td></td>${td("masked", "\u2212\u221e (the future)")}${td("weight", "0")}</tr>`);
    }
    const tbody = el("tbody");
    tbody.innerHTML = html.join("");
    const pad = () => el("tr", { class: "pad" }, el("td", { colspan: 7 }));
    const padTop = pad(), padBottom = pad();
    document.getElementById("in-table").replaceChildren(el("thead", {}, head, padTop), tbody, el("tfoot", {}, padBottom));
    this.bars = { l, h, keys: rows.length, rows: Array.from(tbody.children), on: [], padTop, padBottom, first: 0, last: -1 };
    // long contexts: scroll the table to the key that takes the most weight
    this.placeRows(best.j);
    const box = this.scrollBox, rowH = this.rowHeight();
    box.scrollTop = Math.max(0, head.offsetHeight + best.j * rowH - box.clientHeight / 2);
    this.drawBars();
    const share = this.d.share_norm[l][h][i];
    const outStrip = barStrip(out, 256, 28, colour);
    outStrip.dataset.values = JSON.stringify(Array.from(out)); // the numbers behind the bars, in full
    document.getElementById("in-out").replaceChildren(
      el("span", { class: "in-label", text: "out" }), outStrip,
      el("span", { class: "in-note", id: "in-share",
                   text: `\u03a3_j w_j v_j; through its slice of c_proj it adds a vector of norm ${share.toFixed(3)} ` +
                         "to the residual stream" }));
    this.renderLens(i);
    this.renderCircuits(l, h, i);
  }

  // A long context has hundreds of rows and a dozen show: only those within ROW_WINDOW of the centre are laid out
  // (the others are display: none, still in the page with every number), and two spacer rows keep the table as
  // tall as if all were there, so the scroll bar is the whole table's.
  placeRows(centre) {
    const b = this.bars, n = b.rows.length, rowH = this.rowHeight();
    const first = Math.max(0, Math.min(centre, n - 1) - ROW_WINDOW), last = Math.min(n - 1, centre + ROW_WINDOW);
    for (let j = 0; j < n; j++) {
      const on = j >= first && j <= last;
      if (on !== !!b.on[j]) { b.rows[j].classList.toggle("off", !on); b.on[j] = on; }
    }
    b.first = first; b.last = last;
    b.padTop.style.height = `${first * rowH}px`;
    b.padBottom.style.height = `${(n - 1 - last) * rowH}px`;
  }

  // every row is as tall as the first one laid out (measured once: the style fixes it)
  rowHeight() {
    if (!this.rowH) {
      const b = this.bars, row = b && b.rows[b.first];
      if (!row || b.last < b.first) return 20;
      this.rowH = row.getBoundingClientRect().height || 20;
      if (b.last >= b.first) { // the spacers were set with a guess
        b.padTop.style.height = `${b.first * this.rowH}px`;
        b.padBottom.style.height = `${(b.rows.length - 1 - b.last) * this.rowH}px`;
      }
    }
    return this.rowH;
  }

  // after a scroll: the rows around the middle of the view laid out, each key's k_j drawn as bars where in view
  drawBars() {
    const b = this.bars;
    if (!b) return;
    const box = this.scrollBox, rowH = this.rowHeight(), head = box.querySelector("thead tr").offsetHeight;
    const top = box.scrollTop - head, bottom = top + box.clientHeight;
    const centre = Math.floor((top + bottom) / 2 / rowH);
    if (centre - ROW_WINDOW / 2 < b.first && b.first > 0 || centre + ROW_WINDOW / 2 > b.last && b.last < b.rows.length - 1) {
      this.placeRows(centre);
    }
    const lo = Math.max(b.first, Math.floor(top / rowH) - 1), hi = Math.min(b.last, b.keys - 1, Math.ceil(bottom / rowH) + 1);
    for (let j = lo; j <= hi; j++) {
      const tr = b.rows[j];
      if (tr.dataset.drawn) continue;
      tr.dataset.drawn = "1";
      tr.querySelector("td.kbar").append(barStrip(this.vec(this.k, b.l, b.h, j), 96, 16, "#7f8c8d"));
    }
  }

  renderLens(i) {
    const lens = this.d.lens;
    const table = el("table", { class: "lens" }, el("tr", {}, el("th", { text: "after" }),
      ...[1, 2, 3, 4, 5].map((r) => el("th", { text: `#${r}` }))));
    lens.forEach((layer, n) => table.append(el("tr", { "data-layer": n },
      el("th", { text: n === 0 ? "embeddings" : `block ${n - 1}` }),
      ...layer[i].map(([tok, p]) => el("td", { text: `${axisLabel(tok, 10)} ${p.toFixed(2)}` })))));
    document.getElementById("in-lens").replaceChildren(
      el("h3", { text: `Logit lens: what the model would predict after #${i} at each depth` }), table);
  }

  renderCircuits(l, h, i) {
    const pairs = this.d.qk_pairs[l][h], writes = this.d.ov_writes[l][h][this.tokens[i]] || [];
    document.getElementById("in-circuits").replaceChildren(
      el("h3", { text: `What L${l}H${h} looks for and writes, from its weights alone` }),
      el("p", { id: "in-copying", text: `copying score ${this.d.copying[l][h].toFixed(3)}: the share of tokens whose ` +
        "own logit this head raises most when it attends to them (induction and duplicate heads copy)" }),
      el("p", { text: "query-key: the token pairs that score highest from the embeddings: " +
        pairs.map(([q, k, s]) => `${axisLabel(q, 10)} \u2192 ${axisLabel(k, 10)} (${s.toFixed(2)})`).join(", ") }),
      el("p", { text: `output-value: attending to "${axisLabel(this.tokens[i], 12)}" raises the logits of ` +
        writes.map(([t, v]) => `${axisLabel(t, 10)} (${v.toFixed(2)})`).join(", ") }));
  }
}
