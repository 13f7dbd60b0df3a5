// Boot: read the data island and build the page for one sample or for a run's training film.
//
// data: {kind: "sample" | "film", subtitle, notes: [str], tokens: [str], L, H, T, colormap (base64 RGB x 256),
//        roles: {role: {short, label, unit, help}}, frames: [{step, attn (base64)}], scores: [{step, roles}],
//        film only: curves: {name: [[step, value], ...]}, phase_changes: [{step, head, metric, message, ...}],
//        frames_total (evaluations recorded; frames may hold fewer to keep the file small)},
//        sample only, optional: inside (the "step inside" panel's numbers: inside.js)
// kind "lab" (the live lab, lab.js): {title, limits}; each answer of its server is a sample's data plus `live`

function showError(message) {
  const banner = document.getElementById("error-banner");
  banner.hidden = false;
  banner.textContent = `This page hit an error and may show less than it should: ${message}`;
}
window.addEventListener("error", (e) => showError(e.message));

function hideExplorer(hidden = true) {
  for (const id of ["controls", "head-view", "model-view"]) document.getElementById(id).hidden = hidden;
}

// One text's page: the explorer (head view, model view, the large view) and the step-inside panel. show(data) again
// with another text's data (the live lab, at every answer) re-renders both in place.
class SampleView {
  constructor() { this.explorer = null; this.panel = null; this.onChange = null; }

  show(data) {
    if (!data.L || !data.frames.length) {
      hideExplorer();
      document.getElementById("inside").hidden = true;
      return;
    }
    hideExplorer(false);
    if (!this.explorer) {
      this.explorer = new Explorer(data);
      this.panel = new InsidePanel(data, this.explorer);
      // the panel follows the head view's layer and query
      this.explorer.onChange = () => { this.panel.render(); if (this.onChange) this.onChange(); };
    } else {
      this.explorer.setData(data);
      this.panel.setData(data);
    }
    // the head view's numbers from the same q and k as step inside, where the page has them (explorer.js weightAt)
    this.explorer.exactRow = data.inside ? (l, h, q) => this.panel.exactWeights(l, h, q) : null;
    const rec = data.scores.length ? data.scores[0] : null;
    this.explorer.setFrame(new Frame(data.frames[0].attn, data.L, data.H, data.T), rec ? rec.roles : null,
                           data.frames[0].label || "this text", rec ? rec.labels : null);
  }
}

// "#layer=2&query=40" at the end of the page's address: {layer, query}, each a number or null
function addressView(hash) {
  const params = new URLSearchParams(String(hash || "").replace(/^#/, ""));
  const num = (name) => (/^\d+$/.test(params.get(name) || "") ? +params.get(name) : null);
  return { layer: num("layer"), query: num("query") };
}

// A sample page opens where data.start says (page.py opening_view: a later layer, a word late in the text, not
// layer 0 at a newline reading itself), unless the address asks for a layer or query; the line under the head
// view's controls says where and why. The live lab (lab.js) keeps its own query.
function bootSample(data) {
  window.sampleView = new SampleView();
  window.sampleView.show(data);
  const ex = window.sampleView.explorer, note = document.getElementById("hv-start");
  if (!ex || !ex.frame) return;
  const start = data.start || {}, asked = addressView(window.location.hash);
  const layer = asked.layer ?? start.layer ?? null, query = asked.query ?? start.query ?? null;
  if (layer == null && query == null) return;
  ex.openAt(layer, query);
  const at = `layer ${ex.layer}, query #${ex.query} "${axisLabel(ex.tokens[ex.query], 16)}"`;
  note.textContent = asked.layer != null || asked.query != null
    ? `Opened on ${at}, as the page's address asks (#layer=\u2026&query=\u2026).`
    : `Opened on ${at}: ${start.rule}. Layer 0 mostly reads the token itself; hover any token or pick another ` +
      `layer (or add #layer=1&query=20 to the address).`;
  note.hidden = false;
}

class Film {
  constructor(data) {
    this.data = data;
    this.frames = data.frames;
    this.records = data.scores; // sorted by step
    this.cache = new Map();
    this.steps = this.frames.length ? this.frames.map((f) => f.step) : this.records.map((r) => r.step);
    this.roles = Object.keys(data.roles).filter((role) => this.records.some((r) => r.roles[role]));
    this.changes = data.phase_changes || [];
    document.getElementById("film").hidden = false;
    // over training, every head at once is the story: the model view comes first
    document.getElementById("head-view").before(document.getElementById("model-view"));
    this.explorer = data.L > 0 && this.steps.length ? new Explorer(data) : null;
    if (!this.explorer) hideExplorer();
    if (!this.frames.length) document.getElementById("head-view").hidden = true;
    this.buildSlider();
    this.buildCharts();
    this.show(this.steps.length - 1);
  }

  frame(i) {
    if (!this.frames.length) return null;
    if (!this.cache.has(i)) this.cache.set(i, new Frame(this.frames[i].attn, this.data.L, this.data.H, this.data.T));
    return this.cache.get(i);
  }

  recordAt(step) {
    let best = null;
    for (const r of this.records) if (r.step <= step) best = r;
    return best;
  }

  // the slider position (a fraction of its length) of a step between evaluations
  fraction(step) {
    const s = this.steps, n = s.length;
    if (n < 2) return 0;
    if (step <= s[0]) return 0;
    for (let j = 0; j < n - 1; j++) {
      if (step <= s[j + 1]) return (j + (step - s[j]) / (s[j + 1] - s[j])) / (n - 1);
    }
    return 1;
  }

  nearest(step) {
    let best = 0;
    this.steps.forEach((s, i) => { if (Math.abs(s - step) < Math.abs(this.steps[best] - step)) best = i; });
    return best;
  }

  firstAtOrAfter(step) {
    const i = this.steps.findIndex((s) => s >= step);
    return i < 0 ? this.steps.length - 1 : i;
  }

  buildSlider() {
    this.slider = document.getElementById("step-slider");
    const row = document.querySelector("#film .slider-row");
    if (!this.steps.length) { row.hidden = true; return; }
    this.slider.max = this.steps.length - 1;
    this.slider.addEventListener("input", () => this.show(+this.slider.value));
    const track = document.getElementById("phase-track"), list = document.getElementById("phase-list");
    for (const c of this.changes) {
      const jump = () => this.jumpTo(c);
      track.append(el("button", { type: "button", class: "phase-mark", title: c.message, "data-step": c.step,
                                  style: `left: calc(8px + ${this.fraction(c.step)} * (100% - 16px))`, onclick: jump }));
      list.append(el("li", {}, el("button", { type: "button", class: "link", onclick: jump, text: c.message })));
    }
    const play = document.getElementById("play");
    play.addEventListener("click", () => {
      if (this.timer) { clearInterval(this.timer); this.timer = null; play.innerHTML = "&#9654;"; return; }
      if (this.index >= this.steps.length - 1) this.show(0);
      play.innerHTML = "&#10074;&#10074;";
      this.timer = setInterval(() => {
        if (this.index >= this.steps.length - 1) { play.click(); return; }
        this.show(this.index + 1);
      }, 700);
    });
  }

  jumpTo(change) {
    this.show(this.firstAtOrAfter(change.step));
    if (!this.explorer || !change.head) return;
    const m = /^L(\d+)H(\d+)$/.exec(change.head);
    if (!m) return;
    const thumb = document.querySelector(`.thumb[data-layer="${m[1]}"][data-head="${m[2]}"]`);
    if (thumb) {
      thumb.classList.remove("flash"); void thumb.offsetWidth; thumb.classList.add("flash");
      thumb.scrollIntoView({ block: "nearest", behavior: "smooth" });
    }
  }

  buildCharts() {
    const pick = (step) => this.show(this.nearest(step));
    this.lossChart = new LineChart(document.getElementById("loss-chart"), pick);
    this.roleChart = new LineChart(document.getElementById("role-chart"), pick);
    const marks = this.changes.map((c) => ({ step: c.step, label: c.head || c.metric, title: c.message }));
    this.marks = marks;
    // the probe's losses (random tokens: above ln(vocab), and they may rise) sit far above train and validation,
    // so each pair gets the chart's axis to itself: train and validation first, the probe when picked
    const curves = this.data.curves || {};
    const styles = {
      text: [["train_loss", "train", "#9aa3ad", 1, null], ["val_loss", "validation", "#1f5fbf", 2.2, null]],
      probe: [["probe_first_loss", "first half", "#e08a1e", 1.8, "5 3"],
              ["probe_repeat_loss", "repeated half", "#c0392b", 1.8, null]],
    };
    const drawn = (which) => styles[which].filter(([key]) => curves[key] && curves[key].length);
    const which = document.getElementById("loss-which");
    const drawLoss = () => {
      this.lossChart.draw(drawn(which.value).map(([key, name, colour, width, dash]) =>
        ({ name, colour, width, dash, points: curves[key], legend: true })), marks);
      if (this.steps.length) this.lossChart.setCursor(this.steps[this.index]);
    };
    which.value = drawn("text").length || !drawn("probe").length ? "text" : "probe";
    if (!drawn("text").length || !drawn("probe").length) {  // one pair or none: nothing to pick
      which.hidden = true;
      document.getElementById("loss-note").hidden = true;
    }
    which.addEventListener("change", drawLoss);
    drawLoss();
    const select = document.getElementById("chart-role");
    for (const role of this.roles) select.append(el("option", { value: role, text: this.data.roles[role].label }));
    // the role whose curves moved most (page.py moving_role), not one no head took (a flat line near 0)
    const open = this.data.chart_role;
    select.value = open && this.roles.includes(open) ? open : this.roles[0] || "";
    select.addEventListener("change", () => this.drawRoleChart());
    if (!this.roles.length) select.hidden = true;
  }

  drawRoleChart() {
    const role = document.getElementById("chart-role").value, { L, H } = this.data;
    if (!role) { this.roleChart.draw([], this.marks); return; }
    const rec = this.recordAt(this.steps[this.index]);
    const now = (l, h) => (rec && rec.roles[role] && rec.roles[role][l] ? rec.roles[role][l][h] : null);
    const heads = [];
    for (let l = 0; l < L; l++) for (let h = 0; h < H; h++) heads.push([l, h, now(l, h)]);
    const top = new Set(heads.filter((x) => x[2] != null).sort((a, b) => b[2] - a[2]).slice(0, 4).map((x) => headName(x[0], x[1])));
    const series = heads.map(([l, h, v]) => {
      const name = headName(l, h), strong = top.has(name);
      return {
        name, colour: headColour(h, H, strong ? 1 : 0.55, 30 + (35 * l) / Math.max(1, L - 1)), width: strong ? 2.4 : 1,
        legend: strong ? `${name} ${v == null ? "" : fmtScore(v, this.data.roles[role].unit)}` : false,
        points: this.records.map((r) => [r.step, r.roles[role] && r.roles[role][l] ? r.roles[role][l][h] : null]),
      };
    });
    series.sort((a, b) => (a.width > b.width) - (b.width > a.width)); // strong lines drawn last, on top
    const unit = this.data.roles[role].unit;
    this.roleChart.draw(series, this.marks, unit === "nats" ? null : [0, 1]);
    this.roleChart.setCursor(this.steps[this.index]);
  }

  show(i) {
    if (!this.steps.length) { this.drawRoleChart(); return; }
    i = Math.max(0, Math.min(this.steps.length - 1, i));
    this.index = i;
    this.slider.value = i;
    const step = this.steps[i], rec = this.recordAt(step);
    let label = `step ${step}`;
    let text = `${label} \u00b7 frame ${i + 1} of ${this.steps.length}`;
    if (this.frames.length && this.data.frames_total > this.frames.length) text += ` (of ${this.data.frames_total} recorded)`;
    if (rec && rec.step !== step) text += ` \u00b7 head roles from step ${rec.step}`;
    if (this.records.length && !rec) text += " \u00b7 no head roles measured yet";
    document.getElementById("step-label").textContent = text;
    if (this.explorer) this.explorer.setFrame(this.frame(i), rec ? rec.roles : null, label, rec ? rec.labels : null);
    this.lossChart.setCursor(step);
    this.drawRoleChart();
  }
}

function boot() {
  const data = JSON.parse(document.getElementById("data").textContent);
  document.getElementById("subtitle").textContent = data.subtitle || "";
  const notes = document.getElementById("notes");
  for (const n of data.notes || []) notes.append(el("li", { text: n }));
  if (data.kind === "film") window.film = new Film(data);
  else if (data.kind === "lab") window.lab = new Lab(data); // lab.js, in the live lab's page only
  else bootSample(data);
  applyGlosses();
  document.body.dataset.ready = "1";
}

boot();
