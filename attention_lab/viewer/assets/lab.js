// The live lab (attention_lab/lab serves this page; the API is docs/lab.md). The page's own island holds only
// {kind: "lab", limits, text}; every answer of POST /api/analyze is a sample page's island (tokens, L, H, T,
// colormap, roles, frames, scores, inside) plus `live`: {model, checkpoint, step, ids, loss: [T - 1] nats of token
// t + 1 given 0..t, loss_mean, top: [T][10] of [token, p] (the next-token distribution after each position), ms,
// and with interventions before: {loss, loss_mean, top} of the clean model}. It is drawn by the same components
// as the static page (SampleView in main.js), re-rendered in place at every answer. With a second model chosen,
// its own /api/analyze answer for the same text is drawn beside the first one's model view by the same grid code
// (HeadGrid in explorer.js): the same layer rows and head columns, each of its heads with the difference of one
// score (this model minus the first), and the loss difference per token over the text.
//
// Requests: one analysis in flight at a time; what the user changes meanwhile is sent when it returns (the newest
// state only), and an answer for a state older than the one shown is dropped. The maps come first: the analysis is
// asked for without the ablation pass and without the step-inside panel ("ablation": false, its slowest part;
// "inside": false, its logit lens and most of its bytes), drawn, and then POST /api/inside brings the panel's
// numbers, POST /api/qkv its q, k, v as float32 bytes, and POST /api/ablation the model view's Δloss column for the same request (aborted if the page asks for something else
// first, so the server drops them). Every complete render (maps and ablation) ends by raising document.body.dataset.rendered (a
// counter) once the browser has drawn it, with window.lab.drawn the request it answered (window.lab.mapsDrawn as
// soon as the maps are): tests and the latency benchmark (bench/lab_latency.py) wait for them;
// window.labTimings holds each maps render's {tokens, server_ms (live.ms), request_ms (the request sent to its
// answer parsed), draw_ms (to the browser's next paint), total_ms, bytes (the answer's size on the wire)}.
//
// What it is doing is on the page: while an analysis is computing, and after an error, #lab carries data-state
// ("computing" | "error") and the maps drawn are faded (.stale) under a line that says which text and step they are
// for; the checkpoint slider's label names the step of the maps drawn when it differs from the one asked for.

const LAB_DEBOUNCE_MS = 150; // after the last key, before the text is sent
const LAB_AFTER_MS = 350; // after a render, before the slower side requests (continuations, the comparison)

class LabError extends Error {
  constructor(message, status = null) { super(message); this.status = status; } // status: the HTTP status, if any
}

// POST (or GET without body) to the lab's API: the parsed JSON, or a LabError whose message says what went wrong in
// words (the server's {"error": ...} when it sent one). info, when given, gets the answer's size in bytes.
async function labFetch(path, body, signal, info) {
  const response = await labSend(path, body, signal);
  if (!response.ok) throw new LabError(await labErrorText(response), response.status);
  if (info) info.bytes = Number(response.headers.get("content-length")) || null;
  try { return await response.json(); }
  catch (e) { throw new LabError(`the server's answer to ${path} is not JSON (${e.message})`); }
}

// POST for a binary answer (/api/qkv): {values: Float32Array, shape}, or a LabError as labFetch
async function labFetchFloats(path, body, signal) {
  const response = await labSend(path, body, signal);
  if (!response.ok) throw new LabError(await labErrorText(response), response.status);
  const shape = (response.headers.get("x-shape") || "").split(",").map(Number);
  return { values: new Float32Array(await response.arrayBuffer()), shape };
}

// The request sent (POST with a JSON body, GET without one): the response, whatever its status, except that a
// 429 (the lab's queue is full) is waited out, Retry-After seconds each time, up to LAB_RETRIES times, with the
// status line saying so; a network failure becomes a LabError in words. An abort ends the wait too.
const LAB_RETRIES = 3;
async function labSend(path, body, signal) {
  const init = body === undefined ? { signal } : {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body), signal };
  for (let attempt = 0; ; attempt++) {
    let response;
    try { response = await fetch(path, init); }
    catch (e) {
      if (e.name === "AbortError") throw e;
      throw new LabError(`the lab's server does not answer (${e.message}): is it still running?`);
    }
    if (response.status !== 429 || attempt >= LAB_RETRIES) return response;
    const seconds = Math.min(Number(response.headers.get("retry-after")) || 1, 10);
    const status = document.getElementById("lab-status");
    if (status) status.textContent = `the lab is busy with other requests: asking again in ${seconds} s`;
    await labWait(seconds * 1000, signal);
  }
}

function labWait(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal && signal.aborted) { reject(new DOMException("aborted", "AbortError")); return; }
    const timer = setTimeout(resolve, ms);
    if (signal) signal.addEventListener("abort", () => {
      clearTimeout(timer); reject(new DOMException("aborted", "AbortError")); }, { once: true });
  });
}

async function labErrorText(response) {
  let text = "";
  try { text = await response.text(); } catch (e) { /* the body is gone: say the status alone */ }
  try { const j = JSON.parse(text); if (j && j.error) return `${j.error} (HTTP ${response.status})`; } catch (e) { /* not JSON */ }
  return `the server answered HTTP ${response.status}${text ? `: ${text.slice(0, 300)}` : ""}`;
}

function nextPaint() {
  // resolves once the browser has drawn what the DOM holds now (or after 250 ms in a tab that draws nothing)
  return new Promise((resolve) => {
    let done = false;
    const finish = () => { if (!done) { done = true; resolve(); } };
    requestAnimationFrame(() => setTimeout(finish, 0));
    setTimeout(finish, 250);
  });
}

function fmtP(p) { return p >= 0.995 ? "1.00" : p.toFixed(2).replace(/^0/, ""); }
function tokenText(t) { return typeof t === "number" ? `#${t}` : axisLabel(String(t), 16); } // bytes as ⟨E2⟩
const STALE_VIEWS = ["head-view", "model-view", "inside", "lab-tokens", "lab-next"];
function lossColour(v) { return v == null ? "" : `rgba(192, 57, 43, ${Math.min(1, Math.max(0, v) / 6).toFixed(3)})`; }
function diffColour(d) {
  if (d == null) return "";
  const a = Math.min(1, Math.abs(d) / 2).toFixed(3);
  return d < 0 ? `rgba(41, 98, 200, ${a})` : `rgba(192, 57, 43, ${a})`;
}
// [start, end) of each token in `text` when the tokens' labels spell it (tokenizer.token_strings escapes newlines,
// tabs and control characters as \\n, \\t, \\xNN), else null (a character split over byte-level tokens, an unknown
// character, a literal backslash that reads as an escape)
function tokenOffsets(tokens, text) {
  const unescape = (t) => t.replace(/\\(n|t|r|x[0-9a-f]{2})/g, (_, c) =>
    c === "n" ? "\n" : c === "t" ? "\t" : c === "r" ? "\r" : String.fromCharCode(parseInt(c.slice(1), 16)));
  const out = [];
  let at = 0;
  for (const t of tokens) {
    const piece = unescape(String(t));
    if (!piece || !text.startsWith(piece, at)) return null;
    out.push([at, at + piece.length]);
    at += piece.length;
  }
  return at === text.length ? out : null;
}

function ivLabel(iv) {
  if (iv.kind === "hide_key") return `hide key #${iv.key}`;
  return `${iv.kind === "zero" ? "zero" : "uniform"} ${headName(iv.layer, iv.head)}`;
}

class Lab {
  constructor(config) {
    this.limits = config.limits || {};
    this.view = new SampleView();
    this.view.onChange = () => this.pointerAt(this.view.explorer.query);
    hideExplorer();
    this.models = []; this.model = null; this.checkpoint = null; this.compareWith = "";
    this.interventions = []; // [{kind: "zero" | "uniform", layer, head} | {kind: "hide_key", key}]
    this.data = null; // the answer on the page
    this.shownKey = null; // the state that answer is for (the JSON of its request)
    this.busy = false; this.dirty = false; this.timer = null; this.sideTimer = null;
    this.sideSeq = 0; this.renders = 0; this.pointer = null; this.drawn = null;
    this.streamed = 0; // tokens of the last generation appended to the text as they came
    this.generating = null; // the AbortController of a running generation
    this.counts = new Map(); // model + "\0" + text -> how many tokens that text surely has (exact once answered)
    this.offsets = null; // [start, end) of each shown token in the shown text (tokenOffsets), or null
    this.mapsDrawn = null; // the request whose maps are on the screen (the ablation column may still come)
    this.ablating = null; // the AbortController of the /api/ablation request in flight
    window.labTimings = [];
    const $ = (id) => document.getElementById(id);
    this.$ = $;
    $("lab").hidden = false;
    for (const id of STALE_VIEWS) { const n = $(id); if (n) n.classList.add("lab-view"); } // each on its own layer
    this.text = $("lab-text");
    // the page opens with a text in the box (page.py LAB_EXAMPLE unless the server says otherwise), analysed as
    // soon as the models are listed (pickModel), so the first look shows maps; typing replaces it
    this.text.value = config.text || "";
    this.text.addEventListener("input", () => this.changed(LAB_DEBOUNCE_MS));
    // the example, one click away after any edit: it goes back in the box (and the maps follow)
    const example = config.example || "";
    $("lab-example").hidden = !example;
    $("lab-example").title = example;
    $("lab-example").textContent = `try an example: \u201c${example.length > 44 ? `${example.slice(0, 43)}\u2026` : example}\u201d`;
    $("lab-example").addEventListener("click", () => { this.text.value = example; this.changed(0); });
    $("lab-click").addEventListener("change", () => this.captionClick());
    this.captionClick();
    $("lab-model").addEventListener("change", () => this.pickModel($("lab-model").value));
    $("lab-ckpt").addEventListener("input", () => this.pickCheckpoint(+$("lab-ckpt").value));
    $("lab-compare").addEventListener("change", () => {
      this.compareWith = $("lab-compare").value;
      if (!this.compareWith) this.hideOther();
      this.sideRequests(0);
    });
    // the second model's heads beside the first's: #grid and #lab-cmp-side side by side in the model view
    const grid = $("grid"), row = el("div", { class: "lab-grids" });
    const mine = el("div", { class: "lab-grid-col" }, el("h3", { id: "lab-grid-title", hidden: "" }));
    grid.before(row);
    row.before(el("p", { id: "lab-iv-note", hidden: "" })); // a click on a head: its result here, where one looks
    mine.append(grid);
    row.append(mine, $("lab-cmp-side"));
    this.cmpGrid = new HeadGrid($("lab-cmp-grid"), (l, h) => this.openOther(l, h));
    this.cmp = null; // the second model's answer drawn beside: {data, text, frame, scores, source}
    this.cmpCmap = null; this.cmpCmapText = null;
    $("lab-cmp-role").addEventListener("change", () => this.renderDeltas());
    $("lab-generate").addEventListener("click", () => (this.generating ? this.generating.abort() : this.generate()));
    $("lab-iv-clear").addEventListener("click", () => this.setInterventions([]));
    const strip = $("lab-tokens");
    strip.addEventListener("mouseover", (e) => { const t = e.target.closest("[data-i]"); if (t) this.pointerAt(+t.dataset.i); });
    strip.addEventListener("click", (e) => { const t = e.target.closest("[data-i]"); if (t) this.toggleKey(+t.dataset.i); });
    this.applyLimits();
    this.loadModels();
  }

  // --- what the page asks for -------------------------------------------------------------------------------
  request() {
    return { text: this.text.value, model: this.model, checkpoint: this.checkpoint,
             interventions: this.sendable(this.text.value) };
  }

  // --- hidden keys past the end of the text ---------------------------------------------------------------------
  // A hidden key names a token position; when the text shortens below it, sending it would get a 422. The page cannot
  // tokenize, so it sends only the keys below a count the text surely reaches: the exact count of a text it has an
  // answer for, else the shown tokens that end before the last run of whitespace the new text shares with the
  // shown one (no tokenizer here merges across the whitespace before a word: byte-level BPE splits words first, a
  // char tokenizer never merges). The answer tells the exact count; a key that fits after all goes with the next
  // request (analyze sends it at once), one past the end stays listed, struck out, and comes back when the text
  // reaches it again.
  tokensAtLeast(text) {
    const exact = this.counts.get(`${this.model}\0${text}`);
    if (exact != null) return exact;
    if (!this.data || !this.offsets || !this.shownKey) return 0;
    const shown = JSON.parse(this.shownKey);
    if (shown.model !== this.model) return 0;
    let p = 0;
    while (p < text.length && p < shown.text.length && text[p] === shown.text[p]) p++;
    let b = -1; // the start of the last whitespace run inside the shared start
    for (let i = p - 1; i >= 0; i--) {
      if (/\s/.test(text[i])) { b = i; while (b > 0 && /\s/.test(text[b - 1])) b--; break; }
    }
    if (b < 0) return 0;
    let n = 0;
    while (n < this.offsets.length && this.offsets[n][1] <= b) n++;
    return n;
  }

  noteCount(model, text, n) {
    const key = `${model}\0${text}`;
    this.counts.delete(key);
    this.counts.set(key, n);
    if (this.counts.size > 64) this.counts.delete(this.counts.keys().next().value); // the oldest
  }

  fits(iv, text) { return iv.kind !== "hide_key" || iv.key < this.tokensAtLeast(text); }

  sendable(text) { return this.interventions.filter((iv) => this.fits(iv, text)).map((iv) => ({ ...iv })); }

  sampling() {
    const num = (id) => { const v = this.$(id).value.trim(); return v === "" ? null : Number(v); };
    return { max_new_tokens: num("lab-max-new") ?? 30, temperature: num("lab-temperature") ?? 0.8,
             top_k: num("lab-top-k"), top_p: num("lab-top-p"), seed: num("lab-seed") ?? 0 };
  }

  applyLimits() {
    // the inputs' bounds from the server's limits, where it states them as [lo, hi] or a maximum
    const bound = (id, key) => {
      const v = this.limits[key];
      if (Array.isArray(v)) { if (v[0] != null) this.$(id).min = v[0]; if (v[1] != null) this.$(id).max = v[1]; }
      else if (typeof v === "number") this.$(id).max = v;
    };
    bound("lab-max-new", "max_new_tokens"); bound("lab-temperature", "temperature"); bound("lab-seed", "seed");
  }

  showError(message) {
    const line = this.$("lab-error");
    line.hidden = !message;
    line.textContent = message ? `\u26a0 ${message}` : "";
    if (message && this.data) this.markStale("error");
  }

  // the maps on the screen are not the answer to what the page shows now: faded, with a line saying what they are
  // ("computing": an answer is on its way; "error": the last request failed; "": up to date)
  markStale(state) {
    this.$("lab").dataset.state = state;
    for (const id of STALE_VIEWS) { const n = this.$(id); if (n) n.classList.toggle("stale", !!state && !!this.data); }
    const note = this.$("lab-stale");
    const shown = this.shownKey ? JSON.parse(this.shownKey) : null;
    const step = this.data && this.data.live && this.data.live.step != null ? `step ${this.data.live.step}` : "";
    note.hidden = !state || !this.data;
    if (!note.hidden) {
      const what = `${shown ? `${this.data.T} tokens of the previous text` : "another text"}${step ? `, ${step}` : ""}`;
      note.textContent = state === "computing" ? `computing\u2026 the maps below are still those of ${what}` :
        `the maps below are out of date (the last request failed, see above): they show ${what}`;
    }
    this.labelCheckpoint();
  }

  // the model view's caption says what a click on a head does now
  captionClick() {
    const mode = this.$("lab-click").value;
    const small = document.querySelector("#model-view h2 small");
    if (!small) return;
    if (!this.captionBase) this.captionBase = small.textContent.replace(/;?\s*click a head to open it large\s*$/, "");
    const what = { zero: "click a head to zero it (its \u0394loss shows above the grid)",
                   uniform: "click a head to make its weights uniform (the \u0394loss shows above the grid)",
                   open: "click a head to open it large" }[mode];
    small.textContent = `${this.captionBase}; ${what}`;
  }

  // --- models and checkpoints ---------------------------------------------------------------------------------
  async loadModels() {
    let answer;
    try { answer = await labFetch("/api/models"); }
    catch (e) { this.showError(`cannot list the models: ${e.message}`); this.$("lab-status").textContent = ""; return; }
    this.models = answer.models || [];
    if (answer.limits) { this.limits = { ...this.limits, ...answer.limits }; this.applyLimits(); }
    const select = this.$("lab-model");
    select.replaceChildren(...this.models.map((m) => el("option", { value: m.id,
      text: `${m.label}${m.config ? ` (${m.config.n_layer} x ${m.config.n_head}, ${m.config.position})` : ""}` })));
    this.$("lab-compare-box").hidden = this.models.length < 2;
    if (!this.models.length) { this.showError("the server holds no model"); return; }
    this.$("lab-status").textContent = this.text.value ? "" : "type a text";
    this.pickModel(this.models[0].id);
  }

  modelInfo(id = this.model) { return this.models.find((m) => m.id === id) || null; }

  // an answer's model as people read it: its label and the step of the checkpoint that answered
  modelName(live) {
    const label = (this.modelInfo(live.model) || { label: live.model ?? "?" }).label;
    return `${label}${live.step != null ? ` (step ${live.step})` : ""}`;
  }

  pickModel(id) {
    const m = this.modelInfo(id);
    if (!m) return;
    const changed = this.model !== null && this.model !== id;
    this.model = id;
    this.$("lab-model").value = id;
    const ckpts = m.checkpoints || [];
    this.$("lab-ckpt-box").hidden = ckpts.length < 2;
    const slider = this.$("lab-ckpt");
    slider.max = Math.max(0, ckpts.length - 1);
    const at = Math.max(0, ckpts.findIndex((c) => c.name === m.checkpoint));
    slider.value = at;
    this.checkpoint = ckpts.length ? ckpts[at].name : null;
    this.labelCheckpoint();
    const others = this.models.filter((o) => o.id !== id);
    this.$("lab-compare").replaceChildren(el("option", { value: "", text: "no second model" }),
      ...others.map((o) => el("option", { value: o.id, text: o.label })));
    if (!others.some((o) => o.id === this.compareWith)) { this.compareWith = ""; this.hideOther(); }
    this.$("lab-compare").value = this.compareWith;
    this.$("lab-generate").disabled = false;
    if (changed) this.interventions = []; // its heads and keys belong to the other model
    this.renderInterventions();
    this.changed(0);
  }

  pickCheckpoint(i) {
    const ckpts = (this.modelInfo() || {}).checkpoints || [];
    if (!ckpts[i]) return;
    this.checkpoint = ckpts[i].name;
    this.labelCheckpoint();
    this.changed(LAB_DEBOUNCE_MS);
  }

  labelCheckpoint() {
    const ckpts = (this.modelInfo() || {}).checkpoints || [];
    const i = ckpts.findIndex((c) => c.name === this.checkpoint);
    const live = this.data && this.data.live ? this.data.live : null;
    const drawnStep = live && live.model === this.model ? live.step : null;
    let text = i < 0 ? "" : `step ${ckpts[i].step} (${ckpts[i].name}, ${i + 1} of ${ckpts.length})`;
    // the slider moves at once; the maps follow when the answer comes: say which step they are until then
    if (text && drawnStep != null && live.checkpoint !== this.checkpoint) text += ` \u00b7 the maps below: step ${drawnStep}`;
    this.$("lab-ckpt-label").textContent = text;
    this.$("lab-ckpt-label").dataset.drawnStep = drawnStep == null ? "" : `${drawnStep}`;
  }

  // --- the analysis: one in flight, the newest state next ------------------------------------------------------
  changed(delay) {
    clearTimeout(this.timer);
    clearTimeout(this.sideTimer);
    this.sideSeq++; // continuations and comparisons of the old state are no longer wanted
    this.timer = setTimeout(() => this.analyze(), delay);
  }

  async analyze() {
    if (this.model == null) return;
    if (this.busy) { this.dirty = true; return; }
    const body = this.request();
    const key = JSON.stringify(body);
    if (!body.text) { this.$("lab-status").textContent = "type a text"; return; }
    if (key === this.shownKey) { // back to what is drawn (after an error, say): the maps are its answer again
      if (this.$("lab").dataset.state) { this.showError(""); this.markStale(""); this.$("lab-status").textContent = this.statusLine || ""; }
      return;
    }
    if (this.hiddenKeys().length) this.renderInterventions(); // the keys this text does not reach, struck out
    if (this.ablating) { this.ablating.abort(); this.ablating = null; } // its answer is no longer wanted
    this.busy = true; this.dirty = false;
    this.markStale("computing");
    this.$("lab-status").textContent = `computing the maps of ${body.text.length} characters\u2026`;
    const t0 = performance.now();
    let data = null;
    const info = {};
    try { data = await labFetch("/api/analyze", { ...body, ablation: false, inside: false }, undefined, info); this.showError(""); }
    catch (e) {
      // a hidden key thought to fit a text whose count was not known yet: know nothing of it, and ask again
      // without the keys (the answer gives the count); any other error is said in words
      const guessed = body.interventions.some((iv) => iv.kind === "hide_key") &&
                      !this.counts.has(`${body.model}\0${body.text}`);
      if (e.status === 422 && guessed) { this.noteCount(body.model, body.text, 0); this.dirty = true; }
      else this.showError(e.message);
    }
    if (data && data.live) this.noteCount(body.model, body.text, data.T);
    if (this.hiddenKeys().length) this.renderInterventions(); // a count learnt: which keys are sent may change
    this.busy = false;
    const newer = this.dirty || key !== JSON.stringify(this.request());
    if (newer) this.analyze(); // sent before drawing this one: the server works while the page draws
    if (data && !this.stale(data, body)) await this.render(data, key, t0, info.bytes ?? null, newer);
    else if (!data && !newer && this.$("lab").dataset.state === "computing") {
      this.markStale(this.data ? "error" : "");
      this.$("lab-status").textContent = this.statusLine || ""; // what is drawn, if anything; the error says the rest
    }
  }

  // an answer for another model, checkpoint or interventions than the page now asks for is not drawn: the page
  // must never show maps under the wrong name (a text typed further is still the newest answer there is)
  stale(data, body) {
    const now = this.request();
    return body.model !== now.model || body.checkpoint !== now.checkpoint ||
           JSON.stringify(body.interventions) !== JSON.stringify(now.interventions);
  }

  async render(data, key, t0, bytes = null, newer = false) {
    const t1 = performance.now();
    this.data = data; this.shownKey = key;
    // the step-inside panel comes after the maps (POST /api/inside, then its q, k, v: POST /api/qkv): hidden till then
    this.insideLater = (data.pending || []).includes("inside");
    if (!newer) this.markStale("");
    this.offsets = tokenOffsets(data.tokens, JSON.parse(key).text);
    const live = data.live || {};
    // the model's name on its maps (the head view, the large view): two models' heads can be open in turn
    if (data.frames && data.frames[0]) data.frames[0].label = `${this.modelName(live)} \u00b7 this text`;
    this.view.show(data);
    const explorer = this.view.explorer;
    if (explorer) {
      explorer.onHeadClick = (l, h) => this.onHeadClick(l, h);
      explorer.setHeadMarks(this.headMarks());
      // the first maps open where a sample page opens (data.start: a later layer, a whole word), not on layer 0
      // reading itself; after that the layer is the learner's, and a new text's query its middle token
      if (!this.opened && data.start) { this.opened = true; explorer.openAt(data.start.layer, data.start.query); }
    }
    this.renderStrip();
    this.renderAB();
    this.renderIvNote();
    if (this.cmp) { // the second model's heads stay until its answer for this text comes; faded meanwhile
      const stale = this.cmp.text !== JSON.parse(key).text;
      this.$("lab-cmp-side").classList.toggle("stale", stale);
      if (!stale) this.renderDeltas();
    }
    const T = data.T;
    const shownAt = this.pointer != null && this.pointer < T ? this.pointer : T - 1;
    this.pointerAt(shownAt);
    await nextPaint();
    const t2 = performance.now();
    this.renders++;
    const timing = { tokens: T, server_ms: live.ms ?? null, request_ms: +(t1 - t0).toFixed(1),
                     draw_ms: +(t2 - t1).toFixed(1), total_ms: +(t2 - t0).toFixed(1), bytes };
    window.labTimings.push(timing);
    const ckpt = live.step != null ? ` \u00b7 step ${live.step}` : "";
    const loss = live.loss_mean != null ? ` \u00b7 loss ${live.loss_mean.toFixed(3)} nats/token` : "";
    this.statusLine = `${T} tokens${loss}${ckpt} \u00b7 answered in ${timing.request_ms} ms ` +
      `(model ${live.ms != null ? Math.round(live.ms) : "?"} ms), drawn in ${timing.draw_ms} ms`;
    if (!newer) this.$("lab-status").textContent = this.statusLine;
    this.mapsDrawn = JSON.parse(key);
    document.body.dataset.renderMs = `${timing.total_ms}`;
    this.labelCheckpoint();
    this.renderIvNote();
    if (newer) return;
    if (this.insideLater && !(await this.inside(key))) return;
    if ((data.pending || []).includes("ablation")) await this.ablation(key);
    else this.finishRender(key);
  }

  // the step-inside panel for the answer on the screen: its numbers (POST /api/inside: the logit lens, the head
  // shares, the circuits) and its q, k, v (POST /api/qkv, float32 bytes); false if the page has moved on (or a
  // request failed)
  async inside(key) {
    const ctrl = new AbortController();
    this.ablating = ctrl;
    let panel = null, r = null;
    // the first panel of a checkpoint waits for what the text does not change: its heads' copying scores and
    // query-key token pairs, from the weights, once (seconds on the default model): say so, or the wait reads as a hang
    const body = JSON.parse(key), which = `${body.model}@${body.checkpoint}`;
    this.panelsSeen = this.panelsSeen || new Set();
    if (!this.panelsSeen.has(which)) {
      this.$("lab-status").textContent = `${this.statusLine} \u00b7 step inside: the first text of a checkpoint ` +
        "waits while its heads' circuits are computed from the weights, once (seconds); later texts do not\u2026";
    }
    try {
      panel = await labFetch("/api/inside", JSON.parse(key), ctrl.signal);
      this.panelsSeen.add(which);
      if (key === this.shownKey) r = await labFetchFloats("/api/qkv", JSON.parse(key), ctrl.signal);
    } catch (e) { if (e.name !== "AbortError" && key === this.shownKey) this.showError(`step inside: ${e.message}`); }
    if (this.ablating === ctrl) this.ablating = null;
    if (!panel || !r || key !== this.shownKey || !this.data || !this.insideLater) return false;
    const per = r.values.length / 3, d = this.data;
    d.inside = { ...panel.inside, q: r.values.subarray(0, per), k: r.values.subarray(per, 2 * per),
                 v: r.values.subarray(2 * per) };
    this.insideLater = false;
    if (this.$("lab-status").textContent.includes("step inside: the first text")) this.$("lab-status").textContent = this.statusLine;
    d.pending = (d.pending || []).filter((p) => p !== "inside");
    if (this.view.panel) { this.view.panel.setData(d); this.view.panel.render(); }
    return true;
  }

  // the model view's ablation column for the answer on the screen (POST /api/ablation), then the render is complete
  async ablation(key) {
    const ctrl = new AbortController();
    this.ablating = ctrl;
    this.$("lab-status").textContent = `${this.statusLine} \u00b7 computing every head's \u0394loss\u2026`;
    let r = null;
    try { r = await labFetch("/api/ablation", JSON.parse(key), ctrl.signal); }
    catch (e) { if (e.name !== "AbortError" && key === this.shownKey) this.showError(`every head's \u0394loss: ${e.message}`); }
    if (this.ablating === ctrl) this.ablating = null;
    if (!r || key !== this.shownKey || !this.data) return;
    const d = this.data;
    d.pending = (d.pending || []).filter((p) => p !== "ablation");
    if (r.ablation && d.scores && d.scores[0]) d.scores[0].roles.ablation = r.ablation;
    this.view.show(d);
    if (this.view.explorer) this.view.explorer.setHeadMarks(this.headMarks());
    this.renderIvNote();
    await nextPaint();
    if (key !== this.shownKey) return;
    this.$("lab-status").textContent = `${this.statusLine} \u00b7 every head's \u0394loss in ${Math.round(r.ms ?? 0)} ms`;
    this.finishRender(key);
  }

  finishRender(key) {
    this.drawn = JSON.parse(key); // the request whose whole answer is on the screen now
    this.renders++;
    document.body.dataset.rendered = `${this.renders}`;
    this.sideRequests(LAB_AFTER_MS);
  }

  // where the user clicked a head: the result said above the grid (the before and after below it)
  renderIvNote() {
    const note = this.$("lab-iv-note");
    const live = (this.data || {}).live || {};
    const heads = this.interventions.filter((iv) => iv.kind !== "hide_key");
    note.hidden = !heads.length || !live.before;
    if (note.hidden) return;
    const delta = live.loss_mean - live.before.loss_mean;
    note.dataset.value = `${delta}`;
    note.replaceChildren(el("b", { text: `${JSON.parse(this.shownKey).interventions.map(ivLabel).join(", ")}: ` +
      `\u0394loss ${delta >= 0 ? "+" : ""}${delta.toFixed(4)} nats/token` }),
      el("span", { class: "lab-note", text: ` (clean ${live.before.loss_mean.toFixed(4)}, edited ${live.loss_mean.toFixed(4)}) ` }),
      el("a", { href: "#lab-ab", text: "before and after \u2193" }));
  }

  // --- the text as the model scores it: loss per token, hide a key ------------------------------------------------
  renderStrip() {
    const d = this.data, live = d.live || {}, hidden = new Set(this.hiddenKeys());
    this.$("lab-tokens").replaceChildren(...this.tokenSpans(d.tokens, live.loss, lossColour, (i, span) => {
      if (hidden.has(i)) span.classList.add("hidden-key");
      span.title = `#${i} ${d.tokens[i]}: ${i === 0 ? "the first token has no loss" :
        `${live.loss[i - 1].toFixed(4)} nats`}\nclick: ${hidden.has(i) ? "show it again" : "hide it as a key"}`;
    }));
  }

  // one span per token, coloured by values[i - 1] (the loss of token i given the ones before it); a newline token
  // ends its line (a run of them one line, as in the head view)
  tokenSpans(tokens, values, colour, decorate) {
    const out = [];
    tokens.forEach((t, i) => {
      const v = i > 0 && values ? values[i - 1] : null;
      const span = el("span", { class: "lab-tok", "data-i": i, text: flowText(t) });
      if (v != null) { span.style.backgroundColor = colour(v); span.dataset.value = `${v}`; }
      if (decorate) decorate(i, span);
      out.push(span);
      if (isNewline(t) && !(i + 1 < tokens.length && isNewline(tokens[i + 1]))) out.push(el("br"));
    });
    return out;
  }

  // --- the next-token distribution where the pointer is ---------------------------------------------------------
  pointerAt(i) {
    if (!this.data || i == null || i >= this.data.T) return;
    this.pointer = i;
    const d = this.data, live = d.live || {};
    const box = this.$("lab-next");
    const actual = i + 1 < d.T ? d.tokens[i + 1] : null;
    const head = el("h2", { text: `After #${i} "${axisLabel(d.tokens[i], 16)}": the next token` });
    const parts = [head];
    if (live.before) {
      parts.push(el("div", { class: "lab-next-cols" }, this.nextTable(live.before.top, i, actual, "clean"),
                    this.nextTable(live.top, i, actual, "edited")));
    } else parts.push(this.nextTable(live.top, i, actual, null));
    if (actual != null && live.loss) {
      parts.push(el("p", { class: "lab-note", text: `the text goes on with "${axisLabel(actual, 16)}": ` +
        `loss ${live.loss[i].toFixed(3)} nats` + (live.before ? ` (clean ${live.before.loss[i].toFixed(3)})` : "") }));
    }
    box.replaceChildren(...parts);
    for (const n of this.$("lab-tokens").querySelectorAll(".lab-tok")) n.classList.toggle("at", +n.dataset.i === i);
    this.renderABNext(i);
  }

  nextTable(top, i, actual, caption) {
    const rows = ((top || [])[i] || []).map(([t, p]) => el("tr", { class: t === actual ? "actual" : "" },
      el("td", { class: "key", text: tokenText(t) }),
      el("td", {}, el("span", { class: "pbar", style: `width:${(60 * p).toFixed(1)}px` })),
      el("td", { class: "p", text: fmtP(p), title: `${p}` })));
    const table = el("table", { class: "lab-next-table" }, ...rows);
    return caption ? el("div", {}, el("h3", { text: caption }), table) : table;
  }

  // --- interventions ----------------------------------------------------------------------------------------------
  headMarks() {
    const marks = {};
    for (const iv of this.interventions) if (iv.kind !== "hide_key") marks[`${iv.layer},${iv.head}`] = iv.kind;
    return marks;
  }

  hiddenKeys() { return this.interventions.filter((iv) => iv.kind === "hide_key").map((iv) => iv.key); }

  onHeadClick(l, h) {
    const mode = this.$("lab-click").value;
    if (mode === "open") return false;
    const at = this.interventions.findIndex((iv) => iv.kind !== "hide_key" && iv.layer === l && iv.head === h);
    const next = this.interventions.slice();
    if (at >= 0 && next[at].kind === mode) next.splice(at, 1);
    else if (at >= 0) next[at] = { kind: mode, layer: l, head: h };
    else next.push({ kind: mode, layer: l, head: h });
    this.setInterventions(next);
    return true;
  }

  toggleKey(i) {
    const at = this.interventions.findIndex((iv) => iv.kind === "hide_key" && iv.key === i);
    const next = this.interventions.slice();
    if (at >= 0) next.splice(at, 1); else next.push({ kind: "hide_key", key: i });
    this.setInterventions(next);
  }

  setInterventions(list) {
    this.interventions = list;
    this.renderInterventions();
    if (this.view.explorer) this.view.explorer.setHeadMarks(this.headMarks());
    this.changed(0);
  }

  renderInterventions() {
    const text = this.text.value, exact = this.counts.get(`${this.model}\0${text}`);
    const chips = this.interventions.map((iv, n) => {
      const off = !this.fits(iv, text);
      const why = !off ? "" : exact != null ? ` (past the end: the text has ${exact} tokens; not sent until it has ` +
        `${iv.key + 1})` : " (waiting for the text's token count before it is sent)";
      return el("button", { type: "button", class: `lab-iv ${iv.kind}${off ? " off" : ""}`, "data-off": off ? "1" : null,
        title: `remove this intervention${why}`, text: `${ivLabel(iv)} \u00d7`,
        onclick: () => this.setInterventions(this.interventions.filter((_, m) => m !== n)) });
    });
    this.$("lab-iv").replaceChildren(...(chips.length ? chips : [el("span", { class: "lab-note", text: "no intervention" })]));
    this.$("lab-iv-clear").hidden = !this.interventions.length;
  }

  // before and after, from the analysis (loss per token, total, next-token distributions); the continuations come
  // from /api/intervene once the page is quiet
  renderAB() {
    const d = this.data, live = d.live || {}, before = live.before;
    this.$("lab-ab").hidden = !before;
    if (!before) return;
    const sides = { before, after: { loss: live.loss, loss_mean: live.loss_mean, top: live.top } };
    for (const [side, s] of Object.entries(sides)) {
      const col = document.querySelector(`#lab-ab [data-side="${side}"]`);
      col.querySelector(".lab-ab-loss").replaceChildren(el("b", { text: `loss ${s.loss_mean.toFixed(4)} nats/token` }));
      col.querySelector(".lab-ab-loss").dataset.value = `${s.loss_mean}`;
      col.querySelector(".lab-ab-tokens").replaceChildren(...this.tokenSpans(d.tokens, s.loss, lossColour));
      col.querySelector(".lab-ab-cont").replaceChildren(el("span", { class: "lab-note", text: "continuation: \u2026" }));
    }
    const delta = live.loss_mean - before.loss_mean;
    const p = this.$("lab-delta");
    p.dataset.value = `${delta}`;
    p.textContent = `\u0394loss ${delta >= 0 ? "+" : ""}${delta.toFixed(4)} nats/token (edited \u2212 clean) with ` +
      JSON.parse(this.shownKey).interventions.map(ivLabel).join(", ");
  }

  renderABNext(i) {
    const live = (this.data || {}).live || {};
    if (!live.before) return;
    const actual = i + 1 < this.data.T ? this.data.tokens[i + 1] : null;
    for (const [side, top] of [["before", live.before.top], ["after", live.top]]) {
      document.querySelector(`#lab-ab [data-side="${side}"] .lab-ab-next`).replaceChildren(
        el("div", { class: "lab-note", text: `next after #${i}:` }), this.nextTable(top, i, actual, null));
    }
  }

  // --- what comes after a render once the user pauses: continuations and the second model ---------------------------
  sideRequests(delay) {
    clearTimeout(this.sideTimer);
    const seq = ++this.sideSeq;
    this.sideTimer = setTimeout(() => this.runSide(seq), delay);
  }

  async runSide(seq) {
    if (!this.data || this.busy) return;
    const key = this.shownKey, body = JSON.parse(key);
    const current = () => seq === this.sideSeq && key === this.shownKey;
    if (this.interventions.length && this.data.live && this.data.live.before) {
      const s = this.sampling();
      try {
        const r = await labFetch("/api/intervene", { ...body, generate: s });
        if (!current()) return;
        for (const side of ["before", "after"]) {
          document.querySelector(`#lab-ab [data-side="${side}"] .lab-ab-cont`).replaceChildren(
            el("span", { class: "lab-note", text: `continuation (seed ${s.seed}): ` }),
            el("span", { class: "lab-cont", text: r[side].continuation || "" }));
        }
        this.$("lab-delta").dataset.intervene = `${r.delta_loss_mean}`;
      } catch (e) { if (current()) this.showError(e.message); return; }
    }
    this.$("lab-cmp").hidden = !this.compareWith;
    if (this.compareWith && current()) {
      const other = this.compareWith;
      try { // the second model's own analysis of the same text, clean, at its default checkpoint
        const r = await labFetch("/api/analyze", { text: body.text, model: other, checkpoint: null, interventions: [] });
        if (current() && other === this.compareWith) this.renderCompare(r, body.text);
      } catch (e) { if (current()) this.showError(`the second model: ${e.message}`); }
    }
  }

  // the second model's answer for the text on the page: the loss difference per token, its heads beside the first's
  renderCompare(b, text) {
    const live = this.data.live || {}, other = b.live || {}, name = (m) => this.modelName(m);
    const summary = this.$("lab-cmp-summary");
    if (JSON.stringify(live.ids) !== JSON.stringify(other.ids)) {
      summary.textContent = `${name(other)} splits this text into other tokens than ${name(live)} (another ` +
        "tokenizer): its tokens and heads do not line up with these; compare models trained on one tokenizer";
      this.$("lab-cmp-tokens").replaceChildren();
      this.hideOther();
      return;
    }
    // the first model's clean numbers (with interventions, live.before): the comparison is of two models as trained
    const clean = live.before || live;
    const diff = other.loss.map((v, i) => v - clean.loss[i]);
    summary.textContent = `${name(live)}: ${clean.loss_mean.toFixed(4)} nats/token \u00b7 ${name(other)}: ` +
      `${other.loss_mean.toFixed(4)} \u00b7 difference ${(other.loss_mean - clean.loss_mean).toFixed(4)}`;
    this.$("lab-cmp-tokens").replaceChildren(...this.tokenSpans(b.tokens, diff, diffColour, (i, span) => {
      span.title = i === 0 ? "the first token has no loss" :
        `#${i}: ${name(live)} ${clean.loss[i - 1].toFixed(3)}, ${name(other)} ${other.loss[i - 1].toFixed(3)} nats`;
    }));

    if (!b.L || !b.frames || !b.frames.length) { this.hideOther(); return; }
    if (b.colormap !== this.cmpCmapText) { this.cmpCmap = decodeBase64(b.colormap); this.cmpCmapText = b.colormap; }
    const frame = new Frame(b.frames[0].attn, b.L, b.H, b.T);
    const scores = b.scores.length ? b.scores[0].roles : null;
    this.cmpGrid.build(b.L, b.H, b.roles || {});
    this.cmpGrid.draw(frame, scores, this.cmpCmap, b.scores.length ? b.scores[0].labels : null, b.label_rule);
    this.cmp = { data: b, text, frame, scores, source: { other: true, frame, scores, label: `${name(other)} \u00b7 this text` } };
    const select = this.$("lab-cmp-role"), keep = select.value;
    if (select.options.length !== Object.keys(b.roles || {}).length) {
      select.replaceChildren(...Object.entries(b.roles || {}).map(([role, info]) => el("option", { value: role, text: info.label })));
      select.value = keep || ("ablation" in (b.roles || {}) ? "ablation" : Object.keys(b.roles || {})[0] || "");
    }
    this.$("lab-grid-title").textContent = name(live);
    this.$("lab-cmp-title").textContent = name(other);
    this.$("lab-grid-title").hidden = false;
    this.$("lab-cmp-side").hidden = false;
    this.$("lab-cmp-side").classList.remove("stale");
    this.renderDeltas();
    this.alignRows();
    const ex = this.view.explorer; // a head of the second model open large: now with this answer's weights
    if (ex && ex.big && ex.big.source && ex.big.source.other) { ex.big.source = this.cmp.source; ex.renderBig(); }
  }

  // each head of the second grid: its score minus the first model's head at the same layer and index
  renderDeltas() {
    if (!this.cmp || !this.data) return;
    const role = this.$("lab-cmp-role").value, info = (this.cmp.data.roles || {})[role] || {};
    const mine = this.data.scores && this.data.scores.length ? this.data.scores[0].roles : null;
    for (const t of this.cmpGrid.thumbs) {
      const a = roleScore(mine, role, t.l, t.h), b = roleScore(this.cmp.scores, role, t.l, t.h);
      const d = a == null || b == null ? null : b - a;
      let span = t.node.querySelector(".lab-delta");
      if (!span) { span = el("span", { class: "lab-delta" }); t.node.querySelector("figcaption").append(span); }
      span.textContent = d == null ? "\u0394 \u2013" : `\u0394 ${d >= 0 ? "+" : "\u2212"}${Math.abs(d).toFixed(2)}`;
      if (d == null) delete span.dataset.value; else span.dataset.value = `${d}`;
      span.style.backgroundColor = d == null ? "" : diffColour(info.unit === "nats" ? 4 * d : 2 * d);
      span.title = d == null ? `${info.label || role}: not measured in one of the two models` :
        `${info.label || role}: ${b.toFixed(4)} here, ${a.toFixed(4)} in the first model's ${headName(t.l, t.h)}`;
    }
  }

  // the two grids' layer rows at the same heights, so that layer l of one sits beside layer l of the other
  alignRows() {
    const grids = [this.view.explorer ? this.view.explorer.grid : null, this.cmpGrid].filter(Boolean);
    for (const g of grids) g.container.style.gridTemplateRows = "";
    if (this.$("lab-cmp-side").hidden || grids.length < 2) return;
    const rows = Math.max(...grids.map((g) => g.L));
    const heights = new Array(rows).fill(0);
    for (const g of grids) for (const t of g.thumbs) heights[t.l] = Math.max(heights[t.l], t.node.offsetHeight);
    const template = `auto ${heights.map((h) => `minmax(${h}px, auto)`).join(" ")}`;
    for (const g of grids) g.container.style.gridTemplateRows = template;
  }

  openOther(l, h) {
    if (this.cmp && this.view.explorer) this.view.explorer.openBig(l, h, this.cmp.source);
  }

  hideOther() {
    this.cmp = null;
    this.$("lab-cmp-side").hidden = true;
    this.$("lab-grid-title").hidden = true;
    this.alignRows();
    const ex = this.view.explorer;
    if (ex && ex.big && ex.big.source && ex.big.source.other) ex.closeBig();
  }

  // --- generation: streamed tokens join the text --------------------------------------------------------------------
  async generate() {
    if (this.model == null || !this.text.value) { this.showError("type a text for the model to continue"); return; }
    const base = this.text.value;
    const body = { text: base, model: this.model, checkpoint: this.checkpoint, ...this.sampling(),
                   interventions: this.sendable(base) };
    const ctrl = new AbortController();
    this.generating = ctrl;
    const button = this.$("lab-generate"), out = this.$("lab-gen-out");
    button.textContent = "stop"; this.text.readOnly = true;
    out.textContent = "generating\u2026";
    let added = "", done = null;
    this.streamed = 0;
    try {
      const response = await fetch("/api/generate", { method: "POST", headers: { "Content-Type": "application/json" },
                                                       body: JSON.stringify(body), signal: ctrl.signal });
      if (!response.ok) throw new LabError(await labErrorText(response));
      const reader = response.body.getReader(), decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done: end } = await reader.read();
        if (value) buffer += decoder.decode(value, { stream: true });
        let n;
        while ((n = buffer.indexOf("\n")) >= 0) {
          const line = buffer.slice(0, n).trim();
          buffer = buffer.slice(n + 1);
          if (!line) continue;
          const msg = JSON.parse(line);
          if (msg.error) throw new LabError(msg.error);
          if (msg.done) { done = msg; continue; }
          added += msg.text;
          this.text.value = base + added; // the tokens appear as they come
          this.streamed++;
          out.textContent = `${added.length} characters so far`;
        }
        if (end) break;
      }
      if (done) this.text.value = base + done.text;
      out.textContent = done ? `generated ${done.ids ? done.ids.length : "?"} tokens (seed ${body.seed})` : "the stream ended early";
      this.showError("");
    } catch (e) {
      if (e.name === "AbortError") out.textContent = `stopped after ${added.length} characters`;
      else { this.showError(e.message); out.textContent = ""; }
    } finally {
      this.generating = null;
      button.textContent = "generate"; this.text.readOnly = false;
      this.changed(0); // what was generated is part of the text now: the maps follow
    }
  }
}
