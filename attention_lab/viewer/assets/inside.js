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

function decodeFloat32(text) {
  const bytes = decodeBase64(text);
  return new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
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

class InsidePanel {
  // setData(data) shows another text (the live lab): the head select keeps its one listener; a text without
  // data.inside (a model whose rows the panel cannot step through) hides the panel.
  constructor(data, explorer) {
    this.explorer = explorer;
    this.head = 0;
    this.H = -1;
    this.select = document.getElementById("in-head");
    this.select.addEventListener("change", () => { this.head = +this.select.value; this.render(); });
    this.setData(data);
  }

  setData(data) {
    const d = data.inside || null;
    this.d = d;
    document.getElementById("inside").hidden = !d;
    if (!d) return;
    this.tokens = data.tokens;
    this.L = data.L; this.T = data.T;
    this.hs = d.hs;
    this.scale = d.scale;
    [this.q, this.k, this.v] = [d.q, d.k, d.v].map(decodeFloat32);
    if (data.H !== this.H) {
      this.H = data.H;
      this.select.replaceChildren(...Array.from({ length: this.H }, (_, h) => el("option", { value: h, text: `head ${h}` })));
      this.head = Math.min(this.head, this.H - 1);
      this.select.value = `${this.head}`;
    }
  }

  vec(arr, l, h, j) {
    const o = ((l * this.H + h) * this.T + j) * this.hs;
    return arr.subarray(o, o + this.hs);
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
    const body = rows.map((r) => el("tr", { "data-key": r.j, class: r.hidden ? "hidden-key" : "" },
      el("td", { class: "key", text: `#${r.j} ${axisLabel(this.tokens[r.j], 12)}` }),
      el("td", {}, barStrip(this.vec(this.k, l, h, r.j), 96, 16, "#7f8c8d")),
      el("td", { class: "dot", text: fmt(r.dot), title: exact(r.dot) }),
      el("td", { class: "scaled", text: linear ? "" : fmt(r.scaled), title: linear ? null : exact(r.scaled) }),
      el("td", { class: "bias", text: linear ? "" : fmt(r.bias), title: linear ? null : exact(r.bias) }),
      el("td", { class: "masked", text: r.hidden ? "\u2212\u221e (outside the window)" : fmt(r.logit),
                 title: exact(r.logit) }),
      el("td", { class: "weight", title: exact(r.weight) },
         el("span", { class: "wbar", style: `width:${(100 * r.weight).toFixed(1)}px;background:${colour}` }),
         el("span", { text: ` ${fmt(r.weight)}` }))));
    if (sink) {
      body.push(el("tr", { "data-key": "sink", class: "sink-row" },
        el("td", { class: "key", text: "sink" }), el("td"), el("td"), el("td"), el("td"),
        el("td", { class: "masked", text: fmt(sink.logit), title: exact(sink.logit) }),
        el("td", { class: "weight", text: `${fmt(sink.weight)} (attends to nothing)`, title: exact(sink.weight) })));
    }
    if (i + 1 < this.T) {
      body.push(el("tr", { "data-key": "future", class: "future-row" },
        el("td", { class: "key", text: `#${i + 1}\u2013#${this.T - 1}` }), el("td"), el("td"), el("td"), el("td"),
        el("td", { class: "masked", text: "\u2212\u221e (the future)" }), el("td", { class: "weight", text: "0" })));
    }
    document.getElementById("in-table").replaceChildren(el("thead", {}, head), el("tbody", {}, ...body));
    // long contexts: scroll the table to the key that takes the most weight
    const best = rows.reduce((a, r) => (r.weight > a.weight ? r : a), rows[0]);
    const box = document.querySelector("#inside .in-scroll"), target = body[best.j];
    box.scrollTop = Math.max(0, target.offsetTop - box.clientHeight / 2);
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
