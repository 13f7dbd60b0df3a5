// "Step inside a head": one head's attention for one query, computed here in the page from the model's own q, k
// and v (attention_lab/viewer/report.py inside_data), the way the tutorials write it out:
//   dots_j = q_i . k_j;  scaled_j = dots_j / sqrt(d_k);  + bias (ALiBi);  masked: -inf for j > i (and outside a
//   window);  weights = softmax (a sink logit joins the denominator only);  head_out = sum_j w_j v_j
// Linear attention: dots_j = phi(q_i) . phi(k_j), phi = elu + 1, weights = dots / sum(dots).
// The layer and the query follow the head view (hover or pin a token there); the head is chosen here.
//
// Every key of the text has a row: the query's past (j <= i) and its future (j > i), whose scores the mask replaces
// by -inf before the softmax, so their weights are 0. Each row shows v_j compactly (its first V_DIMS channels and
// its length) and w_j v_j, the part of the output it contributes; their sum is the head's output.
//
// data.inside: {kind, hs, scale, alibi: [nh], windows: [L] (null: none), sinks: [L][nh] | null per layer,
//   bias (the positions add a score bias: ALiBi), qk_norm, positions (the model's pos_encoding),
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
const V_DIMS = 3; // channels of v_j and w_j v_j written out in a row (the rest: the vector's length)

// the first V_DIMS channels of a vector and its length, as a row's cell shows them: "+0.12 −0.40 +0.33 … |1.23|"
function vecBrief(values) {
  let sq = 0;
  for (const x of values) sq += x * x;
  const first = Array.from(values.slice(0, V_DIMS));
  const sign = (x) => (x < 0 ? "\u2212" : "+") + Math.abs(x).toFixed(2);
  return { first, norm: Math.sqrt(sq),
           text: first.map(sign).join(" ") + (values.length > V_DIMS ? " \u2026" : "") + ` |${Math.sqrt(sq).toFixed(2)}|` };
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

  // the weights of query i over every key for head h of layer l, computed as the table computes them (the head
  // view's numbers read these: explorer.js weightAt), or null without the data; the last few are kept
  exactWeights(l, h, i) {
    if (!this.d || i < 0 || i >= this.T) return null;
    const key = `${l},${h},${i}`;
    if (!this.exactCache || this.exactCache.d !== this.d) this.exactCache = { d: this.d, rows: new Map() };
    const cache = this.exactCache.rows;
    if (!cache.has(key)) {
      const rows = this.rows(l, h, i);
      this.weights(rows, l, h);
      if (cache.size >= 64) cache.delete(cache.keys().next().value);
      cache.set(key, Float64Array.from(rows, (r) => r.weight));
    }
    return cache.get(key);
  }

  vec(arr, l, h, j) {
    const o = (h * this.T + j) * this.hs;
    return arr.layer(l).subarray(o, o + this.hs);
  }

  // one row of the computation for every key j of the text: [dots, scaled, bias, logit]; the logit is -inf where
  // the query may not look: the future (j > i) and keys outside a window
  rows(l, h, i) {
    const q = this.vec(this.q, l, h, i), window = this.d.windows[l];
    const slope = this.d.alibi[h] || 0, linear = this.d.kind === "linear";
    const phi = (x) => (x > 0 ? x + 1 : Math.exp(x));
    const out = [];
    for (let j = 0; j < this.T; j++) {
      const k = this.vec(this.k, l, h, j);
      let dot = 0;
      for (let c = 0; c < this.hs; c++) dot += linear ? phi(q[c]) * phi(k[c]) : q[c] * k[c];
      const scaled = linear ? dot : dot * this.scale;
      const bias = linear ? 0 : slope * (j - i);
      const future = j > i, hidden = !future && window != null && j <= i - window;
      out.push({ j, dot, scaled, bias, hidden, future, logit: hidden || future ? -Infinity : scaled + bias });
    }
    return out;
  }

  // whether the positions add a bias to the scores (ALiBi): only then has the table a "+ bias" column
  hasBias() {
    if (this.d.kind === "linear") return false;
    return this.d.bias != null ? !!this.d.bias : this.d.alibi.some((m) => m !== 0);
  }

  weights(rows, l, h) {
    if (this.d.kind === "linear") {
      const total = rows.reduce((s, r) => s + (r.hidden || r.future ? 0 : r.dot), 0);
      for (const r of rows) r.weight = r.hidden || r.future ? 0 : r.dot / Math.max(total, 1e-6);
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

  // the head's output sum_j w_j v_j; each row keeps its part, r.wv = w_j v_j (linear attention without its
  // denominator weighs the values by the raw phi(q).phi(k_j))
  headOut(rows, l, h) {
    const out = new Float64Array(this.hs);
    const raw = this.d.kind === "linear" && !this.d.denominator;
    for (const r of rows) {
      const v = this.vec(this.v, l, h, r.j), w = raw ? (r.hidden || r.future ? 0 : r.dot) : r.weight;
      r.wv = new Float64Array(this.hs);
      for (let c = 0; c < this.hs; c++) { r.wv[c] = w * v[c]; out[c] += r.wv[c]; }
    }
    if (this.d.kind === "linear" && this.d.out_norm) {
      let ms = 0;
      for (const x of out) ms += x * x;
      const s = 1 / Math.sqrt(ms / this.hs + 1.1920928955078125e-7);
      for (let c = 0; c < this.hs; c++) out[c] *= s;
    }
    return out;
  }

  // One sentence each, in place: why the later keys are -inf; what QK-norm does to the scores in this model; where
  // the positions went when no "+ bias" column shows them. [[lead, sentence], ...]
  explain(i) {
    const d = this.d, hs = this.hs, parts = [];
    if (i + 1 < this.T) {
      parts.push(["The mask", `keys #${i + 1}\u2013#${this.T - 1} are the future of query #${i}: the mask puts \u2212\u221e in ` +
        "place of their scores before the softmax, so their weights are exactly 0; that is why training can " +
        "predict every position of a text in one pass (each position sees only its past)."]);
    }
    if (d.qk_norm && d.kind !== "linear") {
      const sqrt = Math.abs(d.scale * Math.sqrt(hs) - 1) < 1e-9;
      const scale = sqrt ? `1/\u221a${hs} = ${d.scale.toFixed(4)}` : d.scale.toPrecision(4);
      parts.push(["QK-norm", `this model divides each q and k by its root-mean-square over the head's ${hs} ` +
        `channels (no parameters), so each has length \u221a${hs} and |q\u00b7k| \u2264 ${hs}; scaled by ${scale}, ` +
        `every score stays within \u00b1${(hs * d.scale).toFixed(2)}, however large the weights grow.`]);
    }
    if (d.kind !== "linear" && !this.hasBias()) {
      const where = { rope: "RoPE rotates q and k by their positions (the bars above are after the rotation)",
                      learned: "learned position vectors were added to the token embeddings before layer 0",
                      sinusoidal: "sinusoid position vectors were added to the token embeddings before layer 0" };
      if (where[d.positions]) parts.push(["Positions", `no "+ bias" column: ${where[d.positions]}; nothing is added to the scores.`]);
    }
    return parts;
  }

  render() {
    if (!this.d) return;
    const l = this.explorer.layer, i = this.explorer.query, h = this.head;
    const colour = headColour(h, this.H);
    const linear = this.d.kind === "linear", bias = this.hasBias();
    const rows = this.rows(l, h, i);
    const sink = this.weights(rows, l, h);
    const out = this.headOut(rows, l, h);
    const window = this.d.windows[l];
    const best = rows.reduce((a, r) => (r.weight > a.weight ? r : a), rows[0]);
    document.getElementById("in-what").textContent =
      `layer ${l} (from the head view), query #${i} "${axisLabel(this.tokens[i], 20)}"` +
      ` \u00b7 most weight: key #${best.j} (${best.weight.toFixed(3)})` +
      (window != null ? ` \u00b7 this layer sees the last ${window} keys` : "") +
      (linear ? " \u00b7 linear attention: phi(q).phi(k), phi = elu + 1, normalised" : "");
    document.getElementById("in-explain").replaceChildren(...this.explain(i).map(([lead, text]) =>
      el("span", { class: "in-line" }, el("b", { text: `${lead}: ` }), text)));
    const after = [this.d.qk_norm && !linear ? "QK-norm" : "", this.d.positions === "rope" ? "RoPE" : ""].filter(Boolean);
    const qBox = document.getElementById("in-query");
    qBox.replaceChildren(el("span", { class: "in-label", text: `q${i}` }),
                         barStrip(this.vec(this.q, l, h, i), 256, 28, colour),
                         el("span", { class: "in-note", text: `the query (${this.hs} channels` +
                                                                  (after.length ? `, after ${after.join(" and ")})` : ")") }));
    const vHead = `v_j: channels 0\u2013${Math.min(V_DIMS, this.hs) - 1} of ${this.hs} \u2026 |length|`;
    const head = el("tr", {}, ...[["key", "key"], ["kbar", "k_j"], ["dot", linear ? "\u03c6(q)\u00b7\u03c6(k_j)" : "q\u00b7k_j"],
                                  ["scaled", linear ? "" : "\u00d7 1/\u221ad_k"], ...(bias ? [["bias", "+ bias"]] : []),
                                  ["masked", "masked"], ["weight", linear ? "weight w_j" : "softmax w_j"],
                                  ["v", vHead], ["wv", "w_j\u00b7v_j: the same"]]
      .map(([cls, t]) => el("th", { class: cls, text: t })));
    // one row a key, built as one HTML string (a long context has hundreds of rows: one parse, not thousands of
    // createElement calls); every number's full value is its cell's title
    const td = (cls, text, title, extra = "") => `<td class="${cls}"${title == null ? "" : ` title="${title}"`}${extra}>${text}</td>`;
    const vec = (cls, values, zero = false) => {
      const b = vecBrief(values);
      return td(cls, zero ? "0 (weight 0)" : b.text, `first ${b.first.length}: ${b.first.map(exact).join(", ")}; length ${exact(b.norm)}`,
                ` data-first="${b.first.join(",")}" data-norm="${b.norm}"`);
    };
    const html = rows.map((r) => `<tr data-key="${r.j}" class="${r.hidden ? "hidden-key" : r.future ? "future-key" : ""} off">` +
      td("key", escapeHtml(`#${r.j} ${axisLabel(this.tokens[r.j], 12)}`)) +
      td("kbar", "") + // drawn when its row is in view (drawBars)
      td("dot", fmt(r.dot), exact(r.dot)) +
      td("scaled", linear ? "" : fmt(r.scaled), linear ? null : exact(r.scaled)) +
      (bias ? td("bias", fmt(r.bias), exact(r.bias)) : "") +
      td("masked", r.hidden ? "\u2212\u221e (outside the window)" : r.future ? "\u2212\u221e (the future)" : fmt(r.logit),
         exact(r.logit)) +
      td("weight", `<span class="wbar" style="width:${(60 * r.weight).toFixed(1)}px;background:${colour}"></span>` +
                   `<span> ${r.future || r.hidden ? "0" : fmt(r.weight)}</span>`, exact(r.weight)) +
      vec("v", this.vec(this.v, l, h, r.j)) + vec("wv", r.wv, r.future || r.hidden) + "</tr>");
    if (sink) {
      html.push(`<tr data-key="sink" class="sink-row off">${td("key", "sink")}<td></td><td></td><td></td>` +
                (bias ? "<td></td>" : "") + td("masked", fmt(sink.logit), exact(sink.logit)) +
                td("weight", `${fmt(sink.weight)} (attends to nothing)`, exact(sink.weight)) + "<td></td><td></td></tr>");
    }
    const tbody = el("tbody");
    tbody.innerHTML = html.join("");
    const table = document.getElementById("in-table");
    table.classList.toggle("with-bias", bias);
    const pad = () => el("tr", { class: "pad" }, el("td", { colspan: head.children.length }));
    const padTop = pad(), padBottom = pad();
    table.replaceChildren(el("thead", {}, head, padTop), tbody, el("tfoot", {}, padBottom));
    this.bars = { l, h, keys: this.T, rows: Array.from(tbody.children), on: [], padTop, padBottom, first: 0, last: -1 };
    // the rows in view: the query's own row low in the box, so the keys just before it and the first masked keys
    // after it show together (where the mask begins); the key with most weight is named above the table
    const centre = i + 1 < this.T ? i : best.j;
    this.placeRows(centre);
    const box = this.scrollBox, rowH = this.rowHeight();
    box.scrollTop = Math.max(0, head.offsetHeight + centre * rowH - box.clientHeight * 0.6);
    this.drawBars();
    const share = this.d.share_norm[l][h][i];
    const outStrip = barStrip(out, 256, 28, colour);
    outStrip.dataset.values = JSON.stringify(Array.from(out)); // the numbers behind the bars, in full
    const brief = vecBrief(out);
    document.getElementById("in-out").replaceChildren(
      el("span", { class: "in-label", text: "out" }), outStrip,
      el("span", { class: "in-note", id: "in-share" },
         `\u03a3_j w_j\u00b7v_j, the last column summed (${brief.text}); through its slice of `, glossed("c_proj"),
         ` it adds a vector of norm ${share.toFixed(3)} to the residual stream`));
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
      el("p", { id: "in-copying" }, glossed("copying score"), ` ${this.d.copying[l][h].toFixed(3)}: the share of ` +
        "tokens whose own logit this head raises most when it attends to them (induction and duplicate heads copy)"),
      el("p", {}, glossed("QK circuit", "query-key"), ": the token pairs that score highest from the embeddings: " +
        pairs.map(([q, k, s]) => `${axisLabel(q, 10)} \u2192 ${axisLabel(k, 10)} (${s.toFixed(2)})`).join(", ")),
      el("p", {}, glossed("OV circuit", "output-value"), `: attending to "${axisLabel(this.tokens[i], 12)}" raises ` +
        "the logits of " + writes.map(([t, v]) => `${axisLabel(t, 10)} (${v.toFixed(2)})`).join(", ")));
  }
}
