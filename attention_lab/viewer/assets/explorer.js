"use strict";
// attention-lab's attention pages (attention_lab/viewer/page.py fills the JSON island #data). Everything runs from a
// file on disk: no network, no libraries.
//
// Shapes: L layers, H heads, T tokens. A frame is one forward pass: for every (layer, head) the lower triangle of
// its T x T attention (row q holds keys 0..q), heads in (layer, head) order, as uint8 levels
// q8 = round(255 * sqrt(w)). So a weight is (q8 / 255)^2, and a colour on the sqrt scale of the PNGs is q8 itself.

const LEVELS = Float32Array.from({ length: 256 }, (_, i) => (i / 255) ** 2);
const MASKED = 230; // grey of the masked future (the PNGs' #e6e6e6)

function decodeBase64(text) {
  if (Uint8Array.fromBase64) return Uint8Array.fromBase64(text); // native: a 500-token frame in ~1 ms, not ~10
  const bin = atob(text);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v == null) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k === "style") node.style.cssText = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) if (c != null) node.append(c);
  return node;
}

// One-line glosses of the words the pages show that the tutorials do not define, each the start of its entry in
// docs/glossary.md (tests/test_viewer.py holds every key to a glossary heading). A word drawn by glossed(), or
// an element of the template with data-gloss, carries its gloss as a tooltip (applyGlosses at boot).
const GLOSSES = {
  "nats": "the natural-log unit of a loss (bits/byte uses log 2); guessing uniformly among 4,096 tokens costs " +
    "ln 4096 = 8.3 nats per token (docs/glossary.md#nats)",
  "probe": "random tokens, each sequence repeated once: the first half cannot be predicted, the repeated half can " +
    "by copying (an induction head). A model trained on Shakespeare finds random tokens unlikely, so the first " +
    "half sits above ln(vocab) and may rise as it learns (docs/glossary.md#probe)",
  "c_proj": "the attention's output matrix (W_O): each head's output goes through its own slice of it into the " +
    "residual stream (docs/glossary.md#c_proj)",
  "QK circuit": "the head from its weights alone: how strongly a query holding token a scores a key holding token b " +
    "(docs/glossary.md#qk-circuit-ov-circuit)",
  "OV circuit": "the head from its weights alone: what it adds to the next token's logits when it attends to a key " +
    "holding token a (docs/glossary.md#qk-circuit-ov-circuit)",
  "copying score": "the share of tokens whose own logit the head's OV circuit raises most when it attends to them: " +
    "near 1 for a head that copies (docs/glossary.md#copying-score-copy-copytext)",
  "\u00b7TL": "the score over every query row, as TransformerLens's detect_head computes it, rows without a target " +
    "included: lower than the stripe (docs/glossary.md#tl-all-rows)",
};
function glossed(word, text = word) { return el("abbr", { class: "gloss", "data-gloss": word, title: GLOSSES[word], text }); }
function applyGlosses(root = document) {
  for (const node of root.querySelectorAll("[data-gloss]")) node.title = GLOSSES[node.dataset.gloss] || node.title;
}

// Head colours: evenly spaced hues, the same head the same colour in every view.
function headHue(h, H) { return Math.round((205 + (360 * h) / Math.max(H, 1)) % 360); }
function headColour(h, H, alpha = 1, light = 42) { return `hsla(${headHue(h, H)}, 70%, ${light}%, ${alpha})`; }
function headName(l, h) { return `L${l}H${h}`; }
// the head view's tints, one colour string per head and level (0: none), made once, not per cell and render
const TINTS = new Map();
function headTints(H, scale = 1, light = 42) {
  const key = `${H} ${scale} ${light}`;
  if (!TINTS.has(key)) {
    TINTS.set(key, Array.from({ length: H }, (_, h) => Array.from({ length: 256 }, (_, level) =>
      level > 0 ? headColour(h, H, ((scale * level) / 255).toFixed(3), light) : "")));
  }
  return TINTS.get(key);
}
// a style written only when it changes: at 500 tokens x H heads, rewriting unchanged colours was most of a redraw
function setBackground(node, colour) {
  if (node.tint !== colour) { node.style.backgroundColor = colour; node.tint = colour; }
}

// A token as text in the flowing head view (escaped newlines break the line) and as an axis label.
function isNewline(t) { return t === "\n" || t === "\\n" || t.endsWith("\\n") || t.endsWith("\n"); }
function flowText(t) { return t.replace(/\\n|\n/g, "\u21b5").replace(/\\t|\t/g, "\u21e5") || "\u2205"; }
// a byte of a character split over byte-level tokens (token_strings writes \xe2) as people read it: \u27e8E2\u27e9
function readableBytes(t) { return String(t).replace(/\\x([89a-f][0-9a-f])/g, (_, h) => `\u27e8${h.toUpperCase()}\u27e9`); }
function axisLabel(t, max = 10) {
  let s = flowText(readableBytes(t)).replace(/ /g, "\u2423");
  if (s.length > max) s = s.slice(0, max - 1) + "\u2026";
  return s;
}
function fmtWeight(w) { return w.toFixed(3); }

class Frame {
  constructor(b64, L, H, T) {
    this.q = decodeBase64(b64);
    this.L = L; this.H = H; this.T = T;
    this.n = (T * (T + 1)) / 2;
    if (this.q.length !== L * H * this.n) {
      throw new Error(`an attention frame holds ${this.q.length} bytes; ${L} layers x ${H} heads x ${T} tokens ` +
                      `need ${L * H * this.n}`);
    }
  }
  base(l, h) { return (l * this.H + h) * this.n; }
  level(l, h, q, k) { return k > q ? -1 : this.q[this.base(l, h) + (q * (q + 1)) / 2 + k]; }
  weight(l, h, q, k) { return k > q ? 0 : LEVELS[this.level(l, h, q, k)]; }
}

// Draw head (l, h) over tokens [start, start + count) into `canvas`: one pixel per token, or the max of each
// p x p block when count > maxPx, so that a one-token diagonal or column never falls between pixels. Returns p.
function drawHeatmap(canvas, frame, l, h, start, count, maxPx, cmap) {
  const p = Math.max(1, Math.ceil(count / maxPx));
  const n = Math.ceil(count / p);
  canvas.width = n; canvas.height = n;
  const ctx = canvas.getContext("2d");
  const img = ctx.createImageData(n, n);
  const px = img.data, qs = frame.q, base = frame.base(l, h), end = start + count;
  for (let r = 0; r < n; r++) {
    const q0 = start + r * p, q1 = Math.min(end, q0 + p);
    for (let c = 0; c < n; c++) {
      const k0 = start + c * p, k1 = Math.min(end, k0 + p);
      let best = -1;
      for (let q = q0; q < q1; q++) {
        const off = base + (q * (q + 1)) / 2, kEnd = Math.min(k1, q + 1);
        for (let k = k0; k < kEnd; k++) if (qs[off + k] > best) best = qs[off + k];
      }
      const o = 4 * (r * n + c);
      if (best < 0) { px[o] = px[o + 1] = px[o + 2] = MASKED; }
      else { px[o] = cmap[3 * best]; px[o + 1] = cmap[3 * best + 1]; px[o + 2] = cmap[3 * best + 2]; }
      px[o + 3] = 255;
    }
  }
  ctx.putImageData(img, 0, 0);
  return p;
}

const tooltip = {
  node: null,
  show(event, html) {
    this.node = this.node || document.getElementById("tooltip");
    this.node.innerHTML = html;
    this.node.hidden = false;
    const pad = 14, box = this.node.getBoundingClientRect();
    let x = event.clientX + pad, y = event.clientY + pad;
    if (x + box.width > window.innerWidth) x = Math.max(0, event.clientX - box.width - pad);
    if (y + box.height > window.innerHeight) y = Math.max(0, event.clientY - box.height - pad);
    this.node.style.left = `${x}px`; this.node.style.top = `${y}px`;
  },
  hide() { if (this.node) this.node.hidden = true; },
};

function escapeHtml(s) {
  return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

// Scores: {role: L x H nested list (null where not measured)}; roles: {role: {short, label, unit, help}}.
function fmtScore(v, unit) {
  if (v == null) return "\u2013";
  if (unit === "nats") return (v >= 0 ? "+" : "") + v.toFixed(2);
  const s = v.toFixed(2);
  return s.startsWith("0.") ? s.slice(1) : s;
}

// scores[role][l][h], or null where that role or head was not measured
function roleScore(scores, role, l, h) {
  const s = scores && scores[role];
  const v = s && s[l] ? s[l][h] : null;
  return v == null ? null : v;
}

// TransformerLens's all-rows copies of the stripe scores (prev·TL, ...): behind the legend's toggle
function isTL(role) { return role.endsWith("_all_rows"); }

// A head's label as the legend words it: rule = data.label_rule {threshold, roles, names: {role: text}, none}
function labelText(role, rule) { return (rule && rule.names && rule.names[role]) || String(role).replace(/_/g, " "); }

// The model view's grid: every layer (rows) x head (columns) as a small heatmap with one label under it (its
// strongest role, or "mixed": roles.role_label, computed in Python), its scores on hover, in a container of its own
// (the page's #grid; the live lab draws a second model's heads beside it, aligned row for row). build() makes the
// cells once per shape; draw() paints one forward pass into them.
class HeadGrid {
  constructor(container, onClick) {
    this.container = container; this.onClick = onClick; // onClick(l, h): a head was clicked (or Enter on it)
    this.thumbs = []; this.L = this.H = -1; this.roles = {}; this.roleKeys = null; this.rule = null;
  }

  // (re)builds the cells when the shape or the roles differ from the last build; true when it did
  build(L, H, roles) {
    const roleKeys = JSON.stringify(roles || {});
    if (L === this.L && H === this.H && roleKeys === this.roleKeys) return false;
    this.L = L; this.H = H; this.roles = roles || {}; this.roleKeys = roleKeys;
    this.container.style.gridTemplateColumns = `max-content repeat(${H}, max-content)`;
    this.thumbs = [];
    const nodes = [el("div")];
    for (let h = 0; h < H; h++) {
      nodes.push(el("div", { class: "col-head", style: `color:${headColour(h, H)}`, text: `head ${h}` }));
    }
    for (let l = 0; l < L; l++) {
      nodes.push(el("div", { class: "layer-label", "data-layer": l, text: `layer ${l}` }));
      for (let h = 0; h < H; h++) {
        const canvas = el("canvas", { width: 1, height: 1 });
        const chips = Object.entries(this.roles).map(([role, info]) =>
          el("span", { class: isTL(role) ? "sc tl" : "sc", "data-role": role, title: "" }, `${info.short} `,
             el("b", { text: "\u2013" })));
        const label = el("div", { class: "role-label" });
        const node = el("figure", { class: "thumb", "data-layer": l, "data-head": h, tabindex: 0,
                                    title: `layer ${l}, head ${h}: click to open it large` },
          canvas, el("figcaption", { text: headName(l, h) }), label, el("div", { class: "scores" }, ...chips));
        node.addEventListener("click", () => this.onClick(l, h));
        node.addEventListener("keydown", (e) => { if (e.key === "Enter") this.onClick(l, h); });
        nodes.push(node);
        this.thumbs.push({ l, h, node, canvas, chips, label });
      }
    }
    this.container.replaceChildren(...nodes);
    return true;
  }

  // frame: a Frame of this grid's shape (or null: the cells stay empty); scores: {role: L x H}; cmap: RGB x 256;
  // labels: L x H role names or "mixed" (the scores record's labels; none: no label); rule: data.label_rule
  draw(frame, scores, cmap, labels = null, rule = null) {
    this.rule = rule || this.rule;
    for (const t of this.thumbs) {
      if (frame) drawHeatmap(t.canvas, frame, t.l, t.h, 0, frame.T, 96, cmap);
      t.node.classList.toggle("empty", !frame);
      const role = labels && labels[t.l] ? labels[t.l][t.h] : null;
      t.label.textContent = role == null ? "" : labelText(role, this.rule);
      t.label.dataset.role = role == null ? "" : role;
      t.label.classList.toggle("mixed", role === (this.rule && this.rule.none));
      for (const chip of t.chips) {
        const role = chip.dataset.role, info = this.roles[role], v = roleScore(scores, role, t.l, t.h);
        chip.lastChild.textContent = fmtScore(v, info.unit);
        const strength = v == null ? 0 : info.unit === "nats" ? Math.min(1, Math.abs(v) / 0.5) : Math.min(1, Math.max(0, v));
        chip.style.setProperty("--s", strength.toFixed(3));
        chip.classList.toggle("neg", v != null && v < 0); // zeroing the head lowers the loss
        chip.title = `${info.label}: ${v == null ? "not measured" : v.toFixed(4)}${info.help ? ` \u2014 ${info.help}` : ""}`;
      }
    }
  }

  // marks: {"l,h": word}, shown as the cell's data-mark
  mark(marks) {
    for (const t of this.thumbs) {
      const mark = marks[`${t.l},${t.h}`];
      if (mark) t.node.dataset.mark = mark; else delete t.node.dataset.mark;
    }
  }
}

class Explorer {
  // data: {tokens, L, H, T, roles, colormap}. Call setFrame(frame, scores, label) to show one forward pass, and
  // setData(data) to show another text (the live lab): the page's fixed elements keep the listeners bound here
  // once; what depends on the data (options, chips, tokens, heatmaps) is rebuilt in place, never appended twice.
  constructor(data) {
    this.frame = null; this.scores = null; this.label = ""; this.exactRow = null;
    this.layer = 0; this.query = 0; this.pinned = false;
    this.onChange = null; // called after the head view redraws (the step-inside panel follows it)
    this.onHeadClick = null; // (l, h) -> true when it handled a click on a head (the lab's interventions)
    this.headMarks = {}; // "l,h" -> a word shown on that head's map (data-mark: the lab's interventions)
    this.big = null;
    this.L = this.H = this.T = -1;
    this.tokens = []; this.roleKeys = ""; this.tokNodes = []; this.cells = []; this.thumbs = []; this.headChips = [];
    this.grid = new HeadGrid(document.getElementById("grid"), (l, h) => this.clickHead(l, h));
    this.bindControls();
    this.bindHeadView();
    this.bindBigView();
    this.setData(data);
  }

  setData(data) {
    const shape = data.L !== this.L || data.H !== this.H;
    const roles = data.roles || {}, roleKeys = JSON.stringify(roles);
    const rolesChanged = roleKeys !== this.roleKeys;
    const oldTokens = this.tokens;
    this.tokens = data.tokens; this.L = data.L; this.H = data.H; this.T = data.T;
    this.roles = roles; this.roleKeys = roleKeys; this.rule = data.label_rule || null; this.labels = null;
    if (data.colormap !== this.cmapText) { this.cmap = decodeBase64(data.colormap); this.cmapText = data.colormap; }
    this.cmapWords = data.colormap_words || null;
    this.frame = null; this.scores = null;
    this.layer = Math.min(this.layer, Math.max(0, this.L - 1));
    // a pinned query stays where it is while it exists, and any query while the text is the same (the lab shows
    // one text again when its panel or Δloss arrives); otherwise a middle token, so that the page opens with
    // later keys to mask: the head view greys them, step inside shows them at -inf with weight 0
    const sameText = oldTokens.length === this.T && oldTokens.every((tok, i) => tok === this.tokens[i]);
    if (!(this.pinned && this.query < this.T) && !sameText) { this.query = Math.max(0, Math.floor((this.T - 1) / 2)); this.pinned = false; }
    if (shape) this.shownHeads = new Array(this.H).fill(true);
    if (rolesChanged) this.buildRoleOptions();
    if (shape) this.buildHeadChips();
    this.buildTokens(shape ? [] : oldTokens);
    if (shape || rolesChanged) this.buildModelView();
    this.buildBigWindows();
    if (this.big && (this.big.l >= this.L || this.big.h >= this.H)) this.closeBig();
  }

  // --- role filter -----------------------------------------------------------------------------------------
  bindControls() {
    this.roleSelect = document.getElementById("role-filter");
    this.threshold = document.getElementById("role-threshold");
    this.roleSelect.addEventListener("change", () => {
      const info = this.roles[this.roleSelect.value];
      // a stripe score's filter starts at the label's threshold (roles.LABEL_THRESHOLD, which page.py writes as
      // the input's first value), so "show heads of role X" shows the heads the model view labels X and the
      // near misses the label rule leaves "mixed" are not counted in; a loss change in nats has its own scale
      this.threshold.value = info && info.unit === "nats" ? "0.05" : this.threshold.defaultValue;
      this.applyFilter();
    });
    this.threshold.addEventListener("input", () => this.applyFilter());
  }

  buildRoleOptions() {
    const keep = this.roleSelect.value;
    this.roleSelect.replaceChildren(el("option", { value: "", text: "every head" }));
    for (const [role, info] of Object.entries(this.roles)) {
      this.roleSelect.append(el("option", { value: role, text: `${info.label} (${info.short})` }));
    }
    this.roleSelect.value = keep in this.roles ? keep : "";
  }

  score(role, l, h) { return roleScore(this.scores, role, l, h); }

  passes(l, h) {
    const role = this.roleSelect.value;
    if (!role) return true;
    const v = this.score(role, l, h);
    return v != null && v >= parseFloat(this.threshold.value || "0");
  }

  applyFilter() {
    const role = this.roleSelect.value;
    let shown = 0;
    for (const t of this.thumbs) {
      const ok = this.passes(t.l, t.h);
      shown += ok;
      t.node.classList.toggle("filtered-out", !ok);
      for (const chip of t.chips) chip.classList.toggle("active", chip.dataset.role === role);
    }
    const count = document.getElementById("filter-count");
    if (!role) count.textContent = `${this.L * this.H} heads`;
    else if (!this.scores || !this.scores[role]) count.textContent = `no ${this.roles[role].label} scores at this step`;
    else count.textContent = `${shown} of ${this.L * this.H} heads with ${this.roles[role].label} \u2265 ` +
                              `${parseFloat(this.threshold.value || "0")}`;
    this.headChips.forEach((chip, h) => chip.classList.toggle("filtered-out", !this.passes(this.layer, h)));
  }

  // --- head view: the text, one row of colour per head under each token ------------------------------------
  bindHeadView() {
    this.layerSelect = document.getElementById("hv-layer");
    this.layerSelect.addEventListener("change", () => {
      this.layer = +this.layerSelect.value; this.renderHeadView(); this.applyFilter();
    });
    const box = document.getElementById("tokens");
    this.tokenBox = box;
    box.addEventListener("mouseover", (e) => {
      const tok = e.target.closest(".tok");
      if (!tok) return;
      const i = +tok.dataset.i;
      if (!this.pinned) { this.setQuery(i); tooltip.hide(); }
      else this.pairTooltip(e, i);
    });
    box.addEventListener("mousemove", (e) => {
      const tok = e.target.closest(".tok");
      if (tok && this.pinned) this.pairTooltip(e, +tok.dataset.i);
    });
    box.addEventListener("mouseleave", () => tooltip.hide());
    box.addEventListener("click", (e) => {
      const tok = e.target.closest(".tok");
      if (!tok) return;
      const i = +tok.dataset.i;
      this.pinned = !(this.pinned && i === this.query);
      this.setQuery(i);
      if (this.pinned) this.pairTooltip(e, i);
    });
  }

  buildHeadChips() {
    this.layerSelect.replaceChildren(...Array.from({ length: this.L }, (_, l) => el("option", { value: l, text: `${l}` })));
    this.headChips = [];
    for (let h = 0; h < this.H; h++) {
      const chip = el("button", { type: "button", class: "chip on", "data-head": h,
                                  title: "click: show or hide this head; double-click: this head alone (or all again)",
                                  style: `--c: ${headColour(h, this.H)}`, text: `H${h}` });
      chip.addEventListener("click", () => this.showHeads(this.shownHeads.map((on, i) => (i === h ? !on : on))));
      chip.addEventListener("dblclick", () => {
        const alone = this.shownHeads.every((on, i) => on === (i === h));
        this.showHeads(this.shownHeads.map((_, i) => alone || i === h));
      });
      this.headChips.push(chip);
    }
    document.getElementById("hv-heads").replaceChildren(...this.headChips);
    this.tokenBox.style.setProperty("--strip", `${this.H <= 4 ? 5 : this.H <= 6 ? 4 : this.H <= 8 ? 3 : 2}px`);
  }

  // The text, one token a node. Nodes of the tokens the old text shares at its start are kept (typing appends at
  // the end: only the new tail is built), but the last shared one's line break depends on the token after it.
  buildTokens(old) {
    const box = this.tokenBox, tokens = this.tokens;
    let keep = 0;
    while (keep < old.length && keep < tokens.length && keep < this.tokNodes.length && old[keep] === tokens[keep]) keep++;
    keep = Math.max(0, keep - 1);
    if (keep === 0) box.replaceChildren();
    else { const last = this.tokNodes[keep - 1]; while (last.nextSibling) last.nextSibling.remove(); }
    this.tokNodes.length = keep; this.cells.length = keep;
    const frag = document.createDocumentFragment();
    const lineBreak = (i) => isNewline(tokens[i]) && !(i + 1 < tokens.length && isNewline(tokens[i + 1]));
    if (keep > 0 && lineBreak(keep - 1)) frag.append(el("br"));
    for (let i = keep; i < tokens.length; i++) {
      const cells = Array.from({ length: this.H }, () => el("i"));
      const node = el("span", { class: "tok", "data-i": i }, el("span", { class: "tt", text: flowText(tokens[i]) }),
                      el("span", { class: "strip" }, ...cells));
      this.tokNodes.push(node); this.cells.push(cells);
      frag.append(node);
      // a newline token ends its line; a run of them shares one line, so blank lines take no room
      if (lineBreak(i)) frag.append(el("br"));
    }
    box.append(frag);
  }

  setQuery(i) { this.query = i; this.renderHeadView(); }

  showHeads(shown) {
    this.shownHeads = shown;
    this.headChips.forEach((chip, h) => chip.classList.toggle("on", shown[h]));
    this.renderHeadView();
  }

  pairTooltip(event, k) {
    if (!this.frame) return;
    const q = this.query, l = this.layer;
    let html = `<b>query #${q}</b> ${escapeHtml(axisLabel(this.tokens[q], 16))} &rarr; <b>key #${k}</b> ` +
               `${escapeHtml(axisLabel(this.tokens[k], 16))}<br>layer ${l}`;
    if (k > q) html += "<br><i>masked: a query never sees later tokens</i>";
    else {
      for (let h = 0; h < this.H; h++) {
        html += `<br><span class="swatch" style="background:${headColour(h, this.H)}"></span>H${h} ` +
                `${fmtWeight(this.weightAt(this.frame, l, h, q, k))}`;
      }
    }
    tooltip.show(event, html);
  }

  renderHeadView() {
    const f = this.frame, l = this.layer, q = this.query;
    const alone = this.shownHeads.filter(Boolean).length === 1 ? this.shownHeads.indexOf(true) : -1;
    const tint = headTints(this.H), own = headTints(this.H, 0.85, 60);
    for (let k = 0; k < this.T; k++) {
      const node = this.tokNodes[k];
      node.classList.toggle("future", k > q);
      node.classList.toggle("query", k === q);
      node.classList.toggle("pinned", k === q && this.pinned);
      const cells = this.cells[k];
      for (let h = 0; h < this.H; h++) {
        setBackground(cells[h], tint[h][f && k <= q && this.shownHeads[h] ? f.level(l, h, q, k) : 0]);
      }
      // one head alone: its weights tint the tokens themselves, as a heatmap over the text
      setBackground(node.firstChild, alone >= 0 && f && k <= q ? own[alone][f.level(l, alone, q, k)] : "");
    }
    this.drawLines();
    this.renderWeights();
    this.renderRowSums();
    if (this.onChange) this.onChange();
  }

  // open the head view (and step inside, which follows it) on layer l at query q, either left out: a sample page's
  // data.start or the address's #layer=..&query=.. (main.js bootSample); the query is not pinned, hovering moves it
  openAt(layer, query) {
    if (Number.isInteger(layer)) this.layer = Math.max(0, Math.min(this.L - 1, layer));
    if (Number.isInteger(query)) { this.query = Math.max(0, Math.min(this.T - 1, query)); this.pinned = false; }
    this.layerSelect.value = `${this.layer}`;
    this.renderHeadView();
    this.applyFilter();
    this.revealQuery();
  }

  // the query's token in view inside the text's own scrolled box (the page itself does not move): a page opening
  // on a word three quarters of the way down a long text showed only the text's first lines, the query out of sight
  revealQuery() {
    const box = this.tokenBox, node = box && box.querySelector(`.tok[data-i="${this.query}"]`);
    if (!node || box.scrollHeight <= box.clientHeight) return;
    const top = node.getBoundingClientRect().top - box.getBoundingClientRect().top + box.scrollTop;
    box.scrollTop = Math.max(0, top - box.clientHeight / 3);  // a third down: the lines before it show too
  }

  // bertviz's lines: from the query (the token under the pointer) to every key it attends, one line per shown head
  // in the head's colour, the weight as its opacity; drawn on a canvas under the text, which scrolls with it.
  // this.lines: what was drawn last ({h, k, alpha}), for the tests
  drawLines() {
    const box = this.tokenBox, f = this.frame, l = this.layer, q = this.query;
    if (!this.lineCanvas) this.lineCanvas = el("canvas", { class: "hv-lines", "aria-hidden": "true" });
    const canvas = this.lineCanvas;
    if (canvas.parentNode !== box) box.prepend(canvas); // a rebuilt text (buildTokens) took it out
    this.lines = [];
    const width = box.scrollWidth, height = box.scrollHeight, ratio = window.devicePixelRatio || 1;
    if (canvas.width !== Math.round(width * ratio) || canvas.height !== Math.round(height * ratio)) {
      canvas.width = Math.round(width * ratio); canvas.height = Math.round(height * ratio);
      canvas.style.width = `${width}px`; canvas.style.height = `${height}px`;
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    if (!f || q == null || q >= this.T || !this.tokNodes[q]) return;
    // a token's anchor: the middle of its text's top edge (an arc between two tokens of one line rises into the
    // gap above it, never through the text)
    const centre = (node) => [node.offsetLeft + node.offsetWidth / 2, node.offsetTop + 1];
    const [qx, qy] = centre(this.tokNodes[q]);
    ctx.lineWidth = 2;
    for (let h = 0; h < this.H; h++) {
      if (!this.shownHeads[h]) continue;
      ctx.strokeStyle = headColour(h, this.H);
      for (let k = 0; k <= q; k++) {
        const alpha = LEVELS[f.level(l, h, q, k)];
        if (alpha < 0.01) continue; // invisible: not worth a line (a long text has thousands)
        const [kx, ky] = centre(this.tokNodes[k]);
        ctx.globalAlpha = alpha;
        ctx.beginPath();
        // an arc above the text when both ends sit on one line (at most 6 px high: the gap between lines), so a
        // line never runs along the tokens it joins
        ctx.moveTo(qx, qy);
        ctx.quadraticCurveTo((qx + kx) / 2, Math.min(qy, ky) - (Math.abs(qy - ky) < 4 ? Math.min(12, 4 + Math.abs(qx - kx) / 10) : 0),
                             kx, ky);
        ctx.stroke();
        this.lines.push({ h, k, alpha });
      }
    }
    ctx.globalAlpha = 1;
  }

  renderWeights() {
    const box = document.getElementById("weights");
    box.replaceChildren();
    if (!this.frame) return;
    const f = this.frame, l = this.layer, q = this.query;
    box.append(el("div", { class: "weights-title" },
      el("b", { text: `query #${q} "${axisLabel(this.tokens[q], 24)}"` }),
      ` \u00b7 layer ${l} \u00b7 ${this.label} \u00b7 ${this.pinned ? "pinned (click it again to release)" : "hover to move, click to pin"}`));
    const table = el("table", { class: "weights-table", title: this.exactRow ? "weights computed from the heads' " +
      "q and k, as step inside shows them" : "weights from the page's 8-bit copy of the maps (within 0.004 of the " +
      "model's)" });
    for (let h = 0; h < this.H; h++) {
      if (!this.shownHeads[h]) continue;
      const top = [];
      for (let k = 0; k <= q; k++) top.push([this.weightAt(f, l, h, q, k), k]);
      top.sort((a, b) => b[0] - a[0]);
      const cells = top.slice(0, 5).map(([w, k]) =>
        el("td", { title: `key #${k}` }, el("span", { class: "key", text: axisLabel(this.tokens[k], 12) }),
           el("span", { class: "w", text: ` #${k} ${fmtWeight(w)}` })));
      table.append(el("tr", { "data-head": h },
        el("th", {}, el("span", { class: "swatch", style: `background:${headColour(h, this.H)}` }), `H${h}`),
        ...cells));
    }
    box.append(table);
  }

  // "each row sums to 1", seen without hovering (issue 42's walk found it only in tooltips and step inside): the
  // head view's query's row summed in every head of the model, from the weights the page states in numbers
  // (weightAt: the heads' q and k on a sample page, 4 decimals; else the maps' 8-bit copy, 2 decimals, within 0.01)
  renderRowSums() {
    const box = document.getElementById("row-sums");
    if (!box) return;
    const f = this.frame, q = this.query;
    if (!f || q == null || q >= this.T) { box.replaceChildren(); box.dataset.sums = ""; return; }
    const sums = [];
    for (let l = 0; l < this.L; l++) {
      for (let h = 0; h < this.H; h++) {
        const row = f === this.frame && this.exactRow ? this.exactRow(l, h, q) : null;
        let s = 0;
        for (let k = 0; k <= q; k++) s += row ? row[k] : f.weight(l, h, q, k);
        sums.push(s);
      }
    }
    const exact = !!this.exactRow, digits = exact ? 4 : 2, tol = exact ? 1e-3 : 0.02;
    const lo = Math.min(...sums), hi = Math.max(...sums);
    const fmt = (x) => x.toFixed(digits), span = fmt(lo) === fmt(hi) ? fmt(lo) : `${fmt(lo)} to ${fmt(hi)}`;
    const ones = sums.every((s) => Math.abs(s - 1) <= tol);
    box.dataset.sums = JSON.stringify(sums.map((s) => +s.toFixed(6)));
    box.replaceChildren(el("b", { text: "Each row sums to 1" }),
      " (a softmax over the keys the query may see): the head view's query " +
      `#${q} "${axisLabel(this.tokens[q], 16)}" sums to `, el("b", { class: ones ? "ok" : "off", text: span }),
      ones ? ` in all ${sums.length} heads` + (exact ? "" : " (added up from the maps' 8-bit copy: within 0.01)")
           : ` across the ${sums.length} heads, not 1: part of a row's weight goes elsewhere (an attention sink, ` +
             "or earlier keys cut off: see the notes at the top)");
  }

  // --- model view: every layer x head as a small heatmap, its scores under it ------------------------------
  // the legend: how to read a map's colours, what a head's label means, the scores behind it (hover) and the
  // toggle that shows TransformerLens's all-rows copies (\u00b7TL)
  buildModelView() {
    this.grid.build(this.L, this.H, this.roles);
    this.thumbs = this.grid.thumbs;
    const items = Object.entries(this.roles).map(([role, info]) =>
      el("span", { class: isTL(role) ? "legend-item tl" : "legend-item", title: info.help || "" },
         el("b", { text: info.short }), ` ${info.label}` +
         (info.unit === "nats" ? " (loss change in nats when the head is zeroed)" : "")));
    const stops = [0, 64, 128, 192, 255].map((lv) => `rgb(${this.cmap[3 * lv]},${this.cmap[3 * lv + 1]},${this.cmap[3 * lv + 2]})`);
    const parts = [el("p", { id: "legend-colour" }, el("span", { class: "ramp", style: `background:linear-gradient(90deg,${stops.join(",")})` }),
      // the colours' words come with the colours (page.py COLOUR_SCALE); a page without them says the ramp's ends
      ` colour = \u221a(weight): ${this.cmapWords || "0 at the ramp's left end, 1 at its right"} (the square root ` +
      "lifts small weights, so a stripe of 0.05 still shows); ", el("span", { class: "ramp masked" }), " grey: the masked future (a query never sees later keys)")];
    const rule = this.rule;
    if (rule && Object.keys(this.roles).some((r) => (rule.roles || []).includes(this.roles[r].short))) {
      parts.push(el("p", { id: "legend-label", text: `label: a head's strongest role (${rule.roles.join(", ")}) if ` +
        `its score is \u2265 ${rule.threshold}, else "${rule.none}". Hover a head for its numbers.` }));
    }
    if (Object.keys(this.roles).some(isTL)) {
      const box = el("input", { type: "checkbox", id: "show-tl" });
      box.checked = document.body.classList.contains("show-tl");
      box.addEventListener("change", () => document.body.classList.toggle("show-tl", box.checked));
      parts.push(el("label", { class: "tl-toggle" }, box, " also show TransformerLens's all-rows copies (",
                    glossed("\u00b7TL"), ")"));
    }
    if (items.length) parts.push(el("details", {}, el("summary", { text: "what each score means" }), ...items));
    document.getElementById("legend").replaceChildren(...parts);
  }

  clickHead(l, h) {
    if (this.onHeadClick && this.onHeadClick(l, h)) return;
    this.openBig(l, h);
  }

  // marks: {"l,h": word} (a word per head the lab intervenes on); shown as the thumb's data-mark
  setHeadMarks(marks) {
    this.headMarks = marks || {};
    this.grid.mark(this.headMarks);
  }

  renderModelView() {
    this.grid.draw(this.frame, this.scores, this.cmap, this.labels, this.rule);
    this.setHeadMarks(this.headMarks);
  }

  // --- the large view of one head ----------------------------------------------------------------------------
  bindBigView() {
    this.bigNode = document.getElementById("big");
    this.bigCanvas = document.getElementById("big-canvas");
    this.bigWindow = document.getElementById("big-window");
    this.bigStart = document.getElementById("big-start");
    this.bigWindow.addEventListener("change", () => { this.placeWindow(); this.renderBig(); });
    this.bigStart.addEventListener("input", () => this.renderBig());
    document.getElementById("big-close").addEventListener("click", () => this.closeBig());
    this.bigNode.addEventListener("click", (e) => { if (e.target === this.bigNode) this.closeBig(); });
    document.addEventListener("keydown", (e) => { if (e.key === "Escape" && this.big) this.closeBig(); });
    this.bigCanvas.addEventListener("mousemove", (e) => this.bigTooltip(e));
    this.bigCanvas.addEventListener("mouseleave", () => tooltip.hide());
  }

  buildBigWindows() {
    const keep = +this.bigWindow.value;
    const sizes = [32, 64, 128, 256].filter((w) => w < this.T);
    this.bigWindow.replaceChildren(el("option", { value: this.T, text: `all ${this.T}` }),
                                   ...sizes.map((w) => el("option", { value: w, text: `${w}` })));
    if (sizes.includes(keep)) this.bigWindow.value = `${keep}`;
    else if (this.T > 160) this.bigWindow.value = "128";
    if (this.big) this.placeWindow();
  }

  placeWindow() {
    // the window that holds the head view's query at its bottom row: its whole context up to the window size
    const count = +this.bigWindow.value;
    this.bigStart.max = this.T - count;
    this.bigStart.value = Math.min(this.T - count, Math.max(0, this.query - count + 1));
    document.getElementById("big-start-label").hidden = count >= this.T;
  }

  // source: another forward pass of the same tokens to show instead of this one's ({frame, scores, label}: the
  // lab's second model); its head (l, h) then fills the large view, with its own scores
  openBig(l, h, source = null) {
    this.big = { l, h, source };
    this.bigNode.hidden = false;
    this.placeWindow();
    this.renderBig();
  }

  closeBig() { this.big = null; this.bigNode.hidden = true; tooltip.hide(); }

  renderBig() {
    if (!this.big) return;
    const { l, h } = this.big, count = +this.bigWindow.value, start = +this.bigStart.value;
    const src = this.bigSource();
    document.getElementById("big-title").textContent =
      `layer ${l}, head ${h} (${headName(l, h)}) \u00b7 ${src.label} \u00b7 queries down, keys across`;
    document.getElementById("big-range").textContent = count < this.T ? `tokens ${start}\u2013${start + count - 1} of ${this.T}` : "";
    const scores = document.getElementById("big-scores");
    scores.replaceChildren(...Object.entries(this.roles).map(([role, info]) =>
      el("span", { class: isTL(role) ? "sc tl" : "sc", title: info.help || "" }, `${info.label} `, el("b", { text: fmtScore(roleScore(src.scores, role, l, h), info.unit) }))));
    const maxPx = 560, cell = Math.max(1, Math.min(22, Math.floor(maxPx / count)));
    const size = Math.min(maxPx, cell * count);
    this.bigSize = size;
    if (src.frame) {
      const p = drawHeatmap(this.bigCanvas, src.frame, l, h, start, count, maxPx, this.cmap);
      if (p > 1) document.getElementById("big-range").textContent += ` (max-pooled ${p}x${p})`;
    }
    this.bigCanvas.style.width = `${size}px`; this.bigCanvas.style.height = `${size}px`;
    // token labels on both axes: every one when there is room, else every stride-th
    const per = size / count, stride = Math.max(1, Math.ceil(11 / per));
    const ys = document.getElementById("big-ylabels"), xs = document.getElementById("big-xlabels");
    ys.style.height = `${size}px`; xs.style.width = `${size}px`;
    const yl = [], xl = [];
    for (let i = start; i < start + count; i += stride) {
      const pos = (i - start + 0.5) * per, text = axisLabel(this.tokens[i]), title = `#${i} ${this.tokens[i]}`;
      yl.push(el("span", { class: "big-ylabel", style: `top:${pos}px`, title, text }));
      xl.push(el("span", { class: "big-xlabel", style: `left:${pos}px`, title, text }));
    }
    ys.replaceChildren(...yl); xs.replaceChildren(...xl);
  }

  // what the large view shows: this explorer's pass, or the source it was opened with (its frame only while it
  // holds as many tokens as the text shown: an answer for an older text is not drawn under this one's labels)
  bigSource() {
    const src = (this.big && this.big.source) || this;
    const frame = src.frame && src.frame.T === this.T && src.frame.H > this.big.h && src.frame.L > this.big.l
      ? src.frame : null;
    return { frame, scores: src.scores, label: src.label };
  }

  bigTooltip(e) {
    if (!this.big) return;
    const frame = this.bigSource().frame;
    if (!frame) return;
    const rect = this.bigCanvas.getBoundingClientRect(), count = +this.bigWindow.value, start = +this.bigStart.value;
    const q = start + Math.min(count - 1, Math.floor(((e.clientY - rect.top) / rect.height) * count));
    const k = start + Math.min(count - 1, Math.floor(((e.clientX - rect.left) / rect.width) * count));
    const { l, h } = this.big;
    const what = k > q ? "<i>masked (the future)</i>" : `weight <b>${fmtWeight(this.weightAt(frame, l, h, q, k))}</b>`;
    tooltip.show(e, `query #${q} ${escapeHtml(axisLabel(this.tokens[q], 16))} &rarr; key #${k} ` +
                    `${escapeHtml(axisLabel(this.tokens[k], 16))}<br>${what}`);
  }

  // A weight as the page states it in numbers. The maps are drawn from an 8-bit copy (frame.weight: (level /
  // 255)^2 of round(255 sqrt(w)), off by up to 0.004 near 1), so where the page holds the heads' q and k (a sample
  // page's step inside: exactRow(l, h, q) -> that query's weights computed from them, as step inside shows them)
  // the numbers come from there and the head view and step inside agree to every decimal shown; elsewhere (the
  // film, the live lab's maps) the 8-bit copy's, which the weights table's title says.
  weightAt(frame, l, h, q, k) {
    if (frame === this.frame && this.exactRow) {
      const row = this.exactRow(l, h, q);
      if (row) return row[k];
    }
    return frame.weight(l, h, q, k);
  }

  // --- one forward pass ----------------------------------------------------------------------------------------
  // labels: L x H, each head's role label (the scores record's `labels`), or null
  setFrame(frame, scores, label, labels = null) {
    this.frame = frame; this.scores = scores; this.label = label || ""; this.labels = labels;
    document.getElementById("head-view").classList.toggle("empty", !frame);
    this.renderHeadView();
    this.renderModelView();
    this.applyFilter();
    this.renderBig();
  }
}
