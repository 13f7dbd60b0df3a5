"""The live lab's page (attention_lab/viewer/page.py lab_page, assets/lab.js) in a real browser against the real app
(attention_lab.lab.app.create_app under uvicorn on loopback, in a thread), on two tiny runs of three checkpoints.

What a person sees is compared with the offline tools computed here on the same text: the head view's weights with
capture_attention, the step-inside numbers with interp.inside.step_inside, the loss change of a zeroed head with
interp.heads.ablation_effects and its next-token distribution with a forward pass under HeadAblation, a greedy
continuation with sampling.generate_text, the maps at another checkpoint with that checkpoint's model, the two
models' loss difference with a plain cross-entropy, the second model's grid beside the first with its
capture_attention and ablation_effects. The same components serve the static page
(tests/test_viewer.py): here they must re-render with every answer without duplicating anything.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_viewer import (  # noqa: F401
    STEP_INSIDE_TOL,
    _panel_rows,
    _same,
    assert_quiet,
    browser,
    css,
    hover,
    screenshot,
    shots,
    visible,
)

from attention_lab.interp.capture import capture_attention
from attention_lab.interp.heads import HeadAblation, ablation_effects
from attention_lab.interp.inside import step_inside
from attention_lab.sampling import generate_text
from attention_lab.store.checkpoint import load_checkpoint, save_checkpoint
from attention_lab.viewer import page as viewer
from data.tokenizer import Tokenizer
from model import GPT, GPTConfig

CORPUS = "ROMEO:\nBut soft, what light through yonder window breaks? It is the east, and Juliet is the sun.\n"
STEPS = (10, 20, 30)  # the checkpoints of each run; the last is the best, where the lab opens
BLOCK = 64
TEXT = "But soft, what light"
WAIT = 20  # seconds for one answer (the page, the server and the model share two cores with the test)


class Lab:
    def __init__(self, url: str, tokenizer: Tokenizer, runs: dict[str, Path], app=None):
        self.url, self.tok, self.runs, self.app = url, tokenizer, runs, app
        self._models: dict[tuple[str, int], GPT] = {}

    def model(self, run: str = "a", step: int = STEPS[-1]) -> GPT:
        """The checkpoint as the offline tools open it (from disk, as the server does)."""
        if (run, step) not in self._models:
            folder = self.runs[run] / "checkpoints" / f"step_{step:08d}"
            self._models[run, step] = load_checkpoint(folder).build_model("cpu")
        return self._models[run, step]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    from attention_lab.lab.app import create_app, make_server, open_socket, url_of
    from attention_lab.lab.models import Registry

    root = tmp_path_factory.mktemp("lab")
    tok = Tokenizer.train_char([[CORPUS]])
    runs = {}
    for run, seed in (("a", 0), ("b", 1)):
        runs[run] = root / run
        for step in STEPS:
            torch.manual_seed(100 * seed + step)
            model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=BLOCK, n_layer=2, n_head=3, n_embd=24))
            with torch.no_grad():  # large weights: heads that matter to the loss, peaked maps that differ at
                for p in model.parameters():  # every checkpoint
                    p.add_(torch.randn(p.shape) * 0.3)
                for block in model.transformer.h:
                    block.attn.c_attn.weight[: 2 * 24] *= 3
            save_checkpoint(runs[run] / "checkpoints", step, model, tok.to_str(), {"val_loss": 3.0},
                            best=step == STEPS[-1], keep_last=len(STEPS))
    app = create_app(Registry.open([runs["a"], runs["b"]], device="cpu"))
    sock = open_socket("127.0.0.1", 0)
    server = make_server(app)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the lab's server did not start"
        time.sleep(0.05)
    yield Lab(url_of(sock), tok, runs, app)
    server.should_exit = True
    thread.join(10)


# ------------------------------------------------------------------------------------------------------------
# the page as a person uses it


def wait_for(driver, what: str, script: str, *args, timeout: float = WAIT):
    """The first truthy value of `script` (polled), or a failure that says what the page shows instead."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.05).until(lambda d: d.execute_script(script, *args))
    except TimeoutException:
        state = driver.execute_script(
            "return {status: document.getElementById('lab-status').textContent,"
            " error: document.getElementById('lab-error').textContent, drawn: window.lab && window.lab.drawn}")
        pytest.fail(f"waited {timeout} s for {what}; the page shows {state}")


def open_lab(driver, lab: Lab) -> None:
    """Load the page and wait for its first look: the model list and the example's maps (the page opens with
    viewer.LAB_EXAMPLE analysed), so a test's own requests never race the example's."""
    driver.get(lab.url)
    wait_for(driver, "the page's script and the model list",
             "return document.body.dataset.ready === '1' && document.querySelectorAll('#lab-model option').length")
    assert driver.execute_script("return document.getElementById('error-banner').hidden"), "the page hit an error"
    drawn(driver, lab, viewer.LAB_EXAMPLE)


def clear_text(driver) -> None:
    """An empty box, and the page's timings forgotten: what a person does before typing a text of their own."""
    driver.execute_script("const t = document.getElementById('lab-text'); t.value = '';"
                          "t.dispatchEvent(new Event('input')); window.labTimings.length = 0")


def set_text(driver, text: str) -> None:
    """What typing or pasting does to the box, at once: its value, then one input event."""
    driver.execute_script("const t = document.getElementById('lab-text'); t.value = arguments[0];"
                          "t.dispatchEvent(new Event('input'))", text)


def drawn(driver, lab: Lab, text: str, checkpoint: int = STEPS[-1], interventions: list | None = None,
          model: str = "0") -> dict:
    """Wait until the answer for exactly this request is on the screen (drawn, not only received); its request."""
    want = {"text": text, "model": model, "checkpoint": f"step_{checkpoint:08d}", "interventions": interventions or []}
    wait_for(driver, f"the answer for {want}", "return JSON.stringify(window.lab.drawn) === arguments[0]",
             json.dumps(want, separators=(",", ":")))
    return want


def shown_weights(driver, layer: int, query: int) -> dict[int, list[tuple[int, float]]]:
    """The head view's table of the largest weights for one query: head -> [(key, weight)]."""
    from selenium.webdriver.support.ui import Select

    Select(css(driver, "#hv-layer")[0]).select_by_value(str(layer))
    hover(driver, css(driver, "#tokens .tok")[query])
    rows = driver.execute_script("return [...document.querySelectorAll('#weights tr')].map(r => [r.dataset.head,"
                                 " r.textContent])")
    return {int(h): [(int(k), float(w)) for k, w in re.findall(r"#(\d+) (\d\.\d{3})", text)] for h, text in rows}


def assert_weights(driver, want: np.ndarray, what: str) -> None:
    """The head view shows `want`'s largest weights (L, nh, T, T) for a few queries of every layer, to the page's
    8-bit precision."""
    n_layer, n_head, t, _ = want.shape
    for layer in range(n_layer):
        for q in (t - 1, t // 2):
            shown = shown_weights(driver, layer, q)
            assert sorted(shown) == list(range(n_head)), f"{what}: layer {layer} shows heads {sorted(shown)}"
            for h in range(n_head):
                assert len(shown[h]) == min(5, q + 1), f"{what}: L{layer}H{h} query {q} shows {shown[h]}"
                for k, w in shown[h]:
                    tol = 2 * np.sqrt(want[layer, h, q, k]) / 510 + 1 / 255**2 + 6e-4
                    assert abs(w - want[layer, h, q, k]) <= tol, (
                        f"{what}: L{layer}H{h} query {q} key {k}: the page shows {w:.3f}, the model "
                        f"{want[layer, h, q, k]:.4f}")
                best = max(want[layer, h, q, k] for k, _ in shown[h])
                assert best == want[layer, h, q, : q + 1].max(), f"{what}: L{layer}H{h} query {q}: top key missing"


def no_console_errors(driver, what: str, expected: str | None = None) -> None:
    """assert_quiet, letting through the failed loads of the requests a test made fail on purpose."""
    errors = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    errors = [m for m in errors if not (expected and expected in m)]
    assert not errors, f"browser console errors after {what}: {errors}"


def test_the_lab_opens_with_the_example_analysed_and_typing_replaces_it(browser, lab, shots, capsys):
    """The first look shows maps (issue 42's walk found the page empty until one typed or pressed the example):
    without a key pressed, the box holds viewer.LAB_EXAMPLE and the head view, model view and loss strip show its
    tokens with the model's weights; a typed text replaces it, maps and all. Planted bug: lab_opens_empty."""
    browser.get(lab.url)
    wait_for(browser, "the example's maps, with no key pressed", "return !!(window.lab && window.lab.drawn)")
    assert browser.execute_script("return document.getElementById('lab-text').value") == viewer.LAB_EXAMPLE
    drawn(browser, lab, viewer.LAB_EXAMPLE)
    ids = lab.tok.encode(viewer.LAB_EXAMPLE)
    assert len(css(browser, "#tokens .tok")) == len(ids) and len(css(browser, "#lab-tokens [data-i]")) == len(ids)
    assert css(browser, "#head-view")[0].is_displayed() and visible(browser, ".thumb") == 6, "the maps, shown"
    start = viewer.opening_view(lab.tok.token_strings(ids), 2)
    layer = css(browser, "#hv-layer")[0].get_attribute("value")
    queries = [i for i, tok in enumerate(css(browser, "#tokens .tok")) if "query" in tok.get_attribute("class")]
    assert (layer, queries) == (str(start["layer"]), [start["query"]]), (
        f"the first maps open where a sample page would ({start}), not on layer {layer}, query {queries}")
    assert_weights(browser, capture_attention(lab.model(), ids), "the example on the first look")
    browser.execute_script("window.scrollTo(0, 0)")
    screenshot(browser, shots, "lab_first_look.png", capsys)
    set_text(browser, TEXT)
    drawn(browser, lab, TEXT)
    assert len(css(browser, "#tokens .tok")) == len(lab.tok.encode(TEXT)), "the typed text replaces the example"
    no_console_errors(browser, "the first look")


def test_typing_draws_the_texts_maps_and_step_inside_numbers_in_the_same_components(browser, lab):
    """Typed text -> /api/analyze -> the head view, model view and step-inside panel of the sample page, with this
    text's attention and step_inside's numbers; typing on re-renders them in place: the same objects, one of each
    node, one listener (a change of layer renders the panel once)."""
    from selenium.webdriver.support.ui import Select

    open_lab(browser, lab)
    clear_text(browser)
    box = css(browser, "#lab-text")[0]
    box.send_keys(TEXT)  # key by key: the page waits for the pause
    drawn(browser, lab, TEXT)
    ids = lab.tok.encode(TEXT)
    model = lab.model()
    assert browser.execute_script("return window.labTimings.length") <= 3, (
        "typing 20 characters quickly should send one or two requests, not one a key: "
        f"{browser.execute_script('return window.labTimings')}")
    assert len(css(browser, "#tokens .tok")) == len(ids) and len(css(browser, ".thumb")) == 6
    assert_weights(browser, capture_attention(model, ids), "the typed text")
    objects = browser.execute_script("window.__explorer = lab.view.explorer; window.__panel = lab.view.panel;"
                                     "return document.querySelectorAll('#role-filter option').length")

    more = TEXT + " through yonder window"
    box.send_keys(more[len(TEXT):])
    drawn(browser, lab, more)
    ids = lab.tok.encode(more)
    assert browser.execute_script("return lab.view.explorer === window.__explorer && "
                                  "lab.view.panel === window.__panel"), "the components must be re-used, not rebuilt"
    counts = browser.execute_script(
        "return ['#tokens .tok', '.thumb', '#hv-heads .chip', '#hv-layer option', '#in-head option', "
        "'#role-filter option', '.layer-label', '.col-head', '#legend .legend-item'].map(s => "
        "document.querySelectorAll(s).length)")
    n_roles = objects - 1
    assert counts == [len(ids), 6, 3, 2, 3, n_roles + 1, 2, 3, n_roles], f"nodes after a second answer: {counts}"
    for layer, head, query in ((1, 2, len(ids) - 1), (0, 1, 9)):
        Select(css(browser, "#hv-layer")[0]).select_by_value(str(layer))
        Select(css(browser, "#in-head")[0]).select_by_value(str(head))
        hover(browser, css(browser, "#tokens .tok")[query])
        want = step_inside(model, ids, layer, head, query)
        rows = {r["key"]: r for r in _panel_rows(browser)}
        for j in range(query + 1):
            for col, values in (("dot", want.dots), ("scaled", want.scaled), ("masked", want.masked),
                                ("weight", want.weights)):
                got = float(rows[str(j)][col][1])
                assert _same(got, float(values[j])), (
                    f"layer {layer}, head {head}, query {query}, key {j}: {col} is {got!r} on the page, "
                    f"step_inside {float(values[j])!r}")
    renders = browser.execute_script(
        "let n = 0; const p = lab.view.panel, render = p.render.bind(p); p.render = () => { n++; render(); };"
        "const s = document.getElementById('hv-layer'); s.value = '0'; s.dispatchEvent(new Event('change'));"
        "p.render = render; return n")
    assert renders == 1, f"one change of layer rendered the step-inside panel {renders} times: listeners piled up"
    assert_weights(browser, capture_attention(model, ids), "the longer text")
    no_console_errors(browser, "typing")


def test_zeroing_a_head_changes_the_loss_by_its_ablation_effect(browser, lab):
    """The model view's ablation scores are ablation_effects' on this text; clicking a head zeroes it: the page's
    before/after shows the loss change that ablation_effects measures for that head, and the edited model's next-token distribution; a token
    clicked in the loss strip is hidden as a key; the continuations with the same seed arrive."""
    open_lab(browser, lab)
    set_text(browser, TEXT)
    drawn(browser, lab, TEXT)
    assert not css(browser, "#lab-ab")[0].is_displayed(), "no intervention: no before/after"
    model = lab.model()
    idx = torch.tensor([lab.tok.encode(TEXT)])
    effects = ablation_effects(model, idx[:, :-1], idx[:, 1:])  # (L, nh)
    chips = browser.execute_script(  # the model view's Δloss under every head (4 decimals in the chip's title)
        "return [...document.querySelectorAll('.thumb')].map(t => [+t.dataset.layer, +t.dataset.head,"
        " t.querySelector('.sc[data-role=\"ablation\"]').title])")
    for layer, head, title in chips:
        shown = float(re.search(r": (-?\d+\.\d{4})", title).group(1))
        assert abs(shown - effects[layer, head]) <= 1.5e-4, (
            f"the model view's ablation score of L{layer}H{head} is {shown}, ablation_effects "
            f"{effects[layer, head]:.5f}")
    css(browser, '.thumb[data-layer="1"][data-head="2"]')[0].click()
    zero = [{"kind": "zero", "layer": 1, "head": 2}]
    drawn(browser, lab, TEXT, interventions=zero)
    assert css(browser, '.thumb[data-layer="1"][data-head="2"]')[0].get_attribute("data-mark") == "zero"
    want = effects[1, 2]
    got = float(css(browser, "#lab-delta")[0].get_attribute("data-value"))
    assert abs(got - want) <= 1e-5 + 1e-4 * abs(want), (
        f"zeroing L1H2: the page shows a loss change of {got!r}, ablation_effects {want!r}")
    assert abs(want) > 1e-4, f"fixture: zeroing L1H2 should change the loss visibly, changed it by {want}"
    with torch.no_grad(), HeadAblation(model, 1, 2):
        probs = F.softmax(model(idx).logits[0, -1].float(), dim=-1)
    top = probs.topk(10)
    browser.execute_script("window.lab.pointerAt(arguments[0])", len(lab.tok.encode(TEXT)) - 1)  # opens mid-text
    edited = browser.execute_script(
        "return [...document.querySelectorAll('#lab-next .lab-next-cols > div:nth-child(2) td.p')]"
        ".map(td => +td.title)")
    assert np.allclose(edited, top.values.numpy(), atol=2e-5), (
        f"the edited model's next-token probabilities after the last token: page {edited}, "
        f"offline {top.values.numpy().round(5).tolist()}")
    wait_for(browser, "the two continuations",
             "return [...document.querySelectorAll('#lab-ab .lab-cont')].filter(e => e.textContent).length === 2")

    css(browser, '#lab-tokens [data-i="3"]')[0].click()  # hide token 3 as a key, the head stays zeroed
    both = zero + [{"kind": "hide_key", "key": 3}]
    drawn(browser, lab, TEXT, interventions=both)
    assert "hidden-key" in css(browser, '#lab-tokens [data-i="3"]')[0].get_attribute("class")
    assert [c.text for c in css(browser, "#lab-iv .lab-iv")] == ["zero L1H2 \u00d7", "hide key #3 \u00d7"]
    css(browser, "#lab-iv-clear")[0].click()
    drawn(browser, lab, TEXT)
    assert not css(browser, "#lab-ab")[0].is_displayed() and not css(browser, ".thumb[data-mark]")
    no_console_errors(browser, "intervening")


def test_generated_tokens_join_the_text_and_the_maps(browser, lab):
    """Generate streams the continuation into the text box token by token (greedy: it is generate_text's), and the
    maps then show the longer text."""
    open_lab(browser, lab)
    set_text(browser, TEXT)
    drawn(browser, lab, TEXT)
    browser.execute_script("document.getElementById('lab-max-new').value = '8';"
                           "document.getElementById('lab-temperature').value = '0'")
    css(browser, "#lab-generate")[0].click()
    ids = lab.tok.encode(TEXT)
    new = generate_text(lab.model(), lab.tok, ids, 8, greedy=True, use_cache=False)
    longer = TEXT + lab.tok.decode(new)
    drawn(browser, lab, longer)
    assert css(browser, "#lab-text")[0].get_attribute("value") == longer
    assert browser.execute_script("return window.lab.streamed") == 8, "each token should join the text as it comes"
    assert len(css(browser, "#tokens .tok")) == len(ids) + 8, "the maps should show the generated tokens too"
    assert "generated 8 tokens" in css(browser, "#lab-gen-out")[0].text
    no_console_errors(browser, "generating")


def test_the_checkpoint_slider_shows_that_checkpoints_maps(browser, lab):
    """The slider lists the run's three checkpoints; moving it redraws the same text's maps with that checkpoint's
    attention."""
    from selenium.webdriver.common.keys import Keys

    open_lab(browser, lab)
    set_text(browser, TEXT)
    drawn(browser, lab, TEXT)
    assert "step 30 (step_00000030, 3 of 3)" in css(browser, "#lab-ckpt-label")[0].text
    pixels = "return document.querySelector('.thumb[data-layer=\"1\"][data-head=\"0\"] canvas').toDataURL()"
    last = browser.execute_script(pixels)
    css(browser, "#lab-ckpt")[0].send_keys(Keys.HOME)
    drawn(browser, lab, TEXT, checkpoint=STEPS[0])
    assert "step 10 (step_00000010, 1 of 3)" in css(browser, "#lab-ckpt-label")[0].text
    assert "step 10" in css(browser, "#lab-status")[0].text
    assert browser.execute_script(pixels) != last, "another checkpoint's heatmap should look different"
    ids = lab.tok.encode(TEXT)
    assert_weights(browser, capture_attention(lab.model("a", STEPS[0]), ids), "checkpoint step 10")
    no_console_errors(browser, "moving the checkpoint slider")


def test_an_error_is_said_in_words_and_the_page_goes_on_and_compares_two_models(browser, lab):
    """A text past the context gets the server's 422 in words on the page; the next text is drawn again. With two
    models, the second one's loss difference per token colours the text."""
    from selenium.webdriver.support.ui import Select

    open_lab(browser, lab)
    set_text(browser, TEXT)
    drawn(browser, lab, TEXT)
    set_text(browser, "ab " * 30)  # 90 tokens, the context is 64
    message = wait_for(browser, "the error line",
                       "const e = document.getElementById('lab-error'); return !e.hidden && e.textContent")
    assert "HTTP 422" in message and "64" in message, f"the error should say what is wrong: {message!r}"
    set_text(browser, TEXT + ".")
    drawn(browser, lab, TEXT + ".")
    assert not css(browser, "#lab-error")[0].is_displayed(), "a good answer clears the error"

    Select(css(browser, "#lab-compare")[0]).select_by_value("1")
    wait_for(browser, "the comparison", "return !document.getElementById('lab-cmp').hidden && "
             "document.querySelectorAll('#lab-cmp-tokens .lab-tok').length")
    idx = torch.tensor([lab.tok.encode(TEXT + ".")])
    with torch.no_grad():
        loss = [F.cross_entropy(lab.model(run).forward(idx).logits[0, :-1].float(), idx[0, 1:], reduction="none")
                for run in ("a", "b")]
    want = (loss[1] - loss[0]).numpy()
    got = browser.execute_script("return [...document.querySelectorAll('#lab-cmp-tokens .lab-tok')].slice(1)"
                                 ".map(s => +s.dataset.value)")
    assert np.allclose(got, want, atol=1e-4), f"the loss difference per token: page {got}, offline {want.tolist()}"
    no_console_errors(browser, "an error and a comparison", expected="status of 422")


def test_the_lab_page_fetches_nothing_but_its_own_api():
    page = viewer.lab_page({"max_new_tokens": [1, 256]})
    island = json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S).group(1))
    assert island["kind"] == "lab" and island["limits"] == {"max_new_tokens": [1, 256]}
    for name in (*viewer.SCRIPTS, "lab.js"):
        assert viewer._asset(name) in page, f"the lab page should carry {name}"
    assert "fetch(" not in viewer.render_page({"kind": "sample"}, "x"), "the static page must not carry lab.js"
    urls = set(re.findall(r"https?://[^\s\"'<>)]+", page))
    assert urls <= {"http://www.w3.org/2000/svg"}, f"nothing outside the lab may be named: {urls}"
    fetched = set(re.findall(r"""fetch\(\s*([^,)]+)""", page)) | set(re.findall(r'labFetch(?:Floats)?\("([^"]+)"', page))
    assert fetched <= {"path", '"/api/generate"', "/api/models", "/api/analyze", "/api/ablation", "/api/inside",
                       "/api/qkv", "/api/intervene", "/api/compare"}, (
        fetched)
    for tag in ("src=", "@import", "url(", "XMLHttpRequest", "import("):
        assert tag not in page, f"the page must load nothing else, found {tag!r}"


# ------------------------------------------------------------------------------------------------------------
# two models side by side


def _colormap() -> np.ndarray:
    """The page's colormap, (256, 3) uint8: level -> RGB."""
    import base64

    return np.frombuffer(base64.b64decode(viewer._colormap()), dtype=np.uint8).reshape(256, 3)


def assert_pixels(pixels: list[int], width: int, want: np.ndarray, what: str) -> None:
    """A heatmap canvas (RGBA, one pixel per token) shows the (T, T) weights `want`: the colour of level
    round(255 sqrt(w)) (one level either way for rounding) below the diagonal, the masked grey above it."""
    t = want.shape[0]
    assert width == t, f"{what}: the canvas is {width} pixels wide for {t} tokens"
    rgb = np.asarray(pixels, dtype=np.int64).reshape(t, t, 4)[..., :3]
    cmap = _colormap().astype(np.int64)
    levels = np.rint(np.sqrt(want.clip(0, 1)) * 255).astype(np.int64)
    for q in range(t):
        for k in range(t):
            if k > q:
                assert (rgb[q, k] == 230).all(), f"{what}: query {q}, key {k} (the future) is {rgb[q, k]}, not grey"
                continue
            near = [cmap[lv] for lv in range(max(0, levels[q, k] - 1), min(255, levels[q, k] + 1) + 1)]
            assert any((rgb[q, k] == c).all() for c in near), (
                f"{what}: query {q}, key {k} is drawn {rgb[q, k].tolist()}; weight {want[q, k]:.4f} is level "
                f"{levels[q, k]}, colour {cmap[levels[q, k]].tolist()}")


CANVAS_PIXELS = ("const c = arguments[0]; return [c.width, Array.from(c.getContext('2d')"
                 ".getImageData(0, 0, c.width, c.height).data)]")


def test_a_second_model_is_drawn_beside_the_first_head_for_head(browser, lab, shots, capsys):
    """Choosing a second model draws its heads beside the first model's, by the same grid code, in the same layer
    rows and head columns: its weights are capture_attention of that model on the text, each head shows its Δloss
    when zeroed minus the first model's (ablation_effects of both), and clicking a head of either grid opens that
    model's head large."""
    from selenium.webdriver.support.ui import Select

    open_lab(browser, lab)
    set_text(browser, TEXT)
    drawn(browser, lab, TEXT)
    assert not css(browser, "#lab-cmp-side")[0].is_displayed(), "one model: no second grid"
    Select(css(browser, "#lab-compare")[0]).select_by_value("1")
    wait_for(browser, "the second model's grid", "return !document.getElementById('lab-cmp-side').hidden && "
             "lab.cmp && lab.cmp.text === arguments[0]", TEXT)
    ids = lab.tok.encode(TEXT)
    idx = torch.tensor([ids])
    a, b = lab.model("a"), lab.model("b")
    want_a, want_b = capture_attention(a, ids), capture_attention(b, ids)
    assert np.abs(want_a - want_b).max() > 0.2, "fixture: the two runs' maps should differ visibly"
    counts = browser.execute_script("return ['.thumb', '.col-head', '.layer-label'].map(s => "
                                    "document.querySelectorAll('#lab-cmp-grid ' + s).length)")
    assert counts == [6, 3, 2], f"the second grid: thumbs, head columns, layer rows {counts}"
    for thumb in css(browser, "#lab-cmp-grid .thumb"):
        layer, head = int(thumb.get_attribute("data-layer")), int(thumb.get_attribute("data-head"))
        width, pixels = browser.execute_script(CANVAS_PIXELS, thumb.find_element("css selector", "canvas"))
        assert_pixels(pixels, width, want_b[layer, head], f"the second grid's L{layer}H{head}")

    # Δ of the score the select names (Δloss by default): the second model's head minus the first's
    assert css(browser, "#lab-cmp-role")[0].get_attribute("value") == "ablation"
    effects_a = ablation_effects(a, idx[:, :-1], idx[:, 1:])
    effects_b = ablation_effects(b, idx[:, :-1], idx[:, 1:])
    deltas = browser.execute_script("return [...document.querySelectorAll('#lab-cmp-grid .thumb')].map(t => "
                                    "[+t.dataset.layer, +t.dataset.head, t.querySelector('.lab-delta').dataset.value])")
    for layer, head, value in deltas:
        want = effects_b[layer, head] - effects_a[layer, head]
        assert abs(float(value) - want) <= 2e-4, (
            f"L{layer}H{head}: the page shows Δ(Δloss) {value}, ablation_effects of the two models {want:.5f}")
    # the same layer rows: layer l of the second grid beside layer l of the first
    tops = browser.execute_script(
        "return [0, 1].map(l => ['#grid', '#lab-cmp-grid'].map(g => document.querySelector("
        "`${g} .thumb[data-layer=\"${l}\"][data-head=\"0\"]`).getBoundingClientRect().top))")
    assert all(abs(x - y) <= 1 for x, y in tops), f"the two grids' layer rows are not side by side: tops {tops}"
    browser.execute_script("document.getElementById('model-view').scrollIntoView()")
    screenshot(browser, shots, "lab_two_models.png", capsys)

    # a click on a head of either grid opens it large, with that model's weights
    labels = browser.execute_script("return lab.models.map(m => m.label)")
    Select(css(browser, "#lab-click")[0]).select_by_value("open")
    for grid, model, want, label in (("#grid", "a", want_a, labels[0]), ("#lab-cmp-grid", "b", want_b, labels[1])):
        css(browser, f'{grid} .thumb[data-layer="1"][data-head="2"]')[0].click()
        title = css(browser, "#big-title")[0].text
        assert css(browser, "#big")[0].is_displayed() and "L1H2" in title and label in title, (
            f"clicking L1H2 of {grid}: the large view says {title!r}, should name {label}")
        width, pixels = browser.execute_script(CANVAS_PIXELS, css(browser, "#big-canvas")[0])
        assert_pixels(pixels, width, want[1, 2], f"model {model}'s L1H2 opened large")
        css(browser, "#big-close")[0].click()
    assert not css(browser, ".thumb[data-mark]"), "with clicks set to open, no head is zeroed"
    no_console_errors(browser, "comparing two models")


def test_a_hidden_key_past_the_end_of_a_shorter_text_is_not_sent_and_comes_back(browser, lab):
    """Hide key 15, then cut the text to 10 tokens: the page sends no key past the end (no 422, no error), shows the
    key struck out, and sends it again once the text reaches it: at once for a text it has seen, and after one
    answer for a new text whose token count it learns from that answer."""
    open_lab(browser, lab)
    set_text(browser, TEXT)
    drawn(browser, lab, TEXT)
    css(browser, '#lab-tokens [data-i="15"]')[0].click()
    hide = [{"kind": "hide_key", "key": 15}]
    drawn(browser, lab, TEXT, interventions=hide)

    short = TEXT[:10]  # 10 characters, 10 tokens
    set_text(browser, short)
    drawn(browser, lab, short, interventions=[])
    chip = css(browser, "#lab-iv .lab-iv")[0]
    assert chip.get_attribute("data-off") == "1" and "past the end" in chip.get_attribute("title"), (
        f"the key past the end should be listed, struck out, saying why: {chip.get_attribute('outerHTML')}")
    assert not css(browser, "#lab-error")[0].is_displayed(), css(browser, "#lab-error")[0].text
    assert not css(browser, "#lab-ab")[0].is_displayed(), "no intervention was applied: no before/after"

    set_text(browser, TEXT)  # a text the page has an answer for: the key goes with the first request
    drawn(browser, lab, TEXT, interventions=hide)
    assert css(browser, "#lab-iv .lab-iv")[0].get_attribute("data-off") is None
    longer = TEXT + " through"  # new: its count is learnt from the answer, and the key sent with the next request
    set_text(browser, longer)
    drawn(browser, lab, longer, interventions=hide)
    assert "hidden-key" in css(browser, '#lab-tokens [data-i="15"]')[0].get_attribute("class")
    sent = browser.execute_script("return window.labTimings.length")
    assert sent <= 6, f"{sent} answers drawn for 5 states: the page should not loop"
    no_console_errors(browser, "a hidden key past the end of the text")  # a 422 would be a console error

    # a count guessed too high (a tokenizer the page's rule misjudges): the server's 422 is not shown; the page asks
    # again without the guessed keys, learns the count and strikes the key out
    browser.execute_script("const known = lab.tokensAtLeast.bind(lab); lab.tokensAtLeast = (t) => "
                           "lab.counts.has(`${lab.model}\\0${t}`) ? known(t) : 1000")
    cut = TEXT[:8]
    set_text(browser, cut)
    drawn(browser, lab, cut, interventions=[])
    assert css(browser, "#lab-iv .lab-iv")[0].get_attribute("data-off") == "1"
    assert not css(browser, "#lab-error")[0].is_displayed(), css(browser, "#lab-error")[0].text
    no_console_errors(browser, "a count guessed too high", expected="status of 422")


def test_an_answer_for_the_checkpoint_left_behind_is_never_drawn(browser, lab):
    """Move the slider while an analysis is on its way: the answer for the old checkpoint must not be drawn under
    the new one's name (the next request's answer is)."""
    open_lab(browser, lab)
    set_text(browser, TEXT)
    drawn(browser, lab, TEXT)
    # log, at each render, the checkpoint the answer is for and the one the slider names
    browser.execute_script("""
        window.renderLog = [];
        const lab = window.lab, render = lab.render.bind(lab);
        lab.render = (data, key, ...rest) => {
          window.renderLog.push([JSON.parse(key).checkpoint, lab.checkpoint]);
          return render(data, key, ...rest);
        };""")
    browser.execute_async_script("""
        const done = arguments[arguments.length - 1];
        const t = document.getElementById('lab-text');
        t.value = arguments[0]; t.dispatchEvent(new Event('input'));
        const wait = setInterval(() => {  // the analysis has left: now the slider moves
          if (!window.lab.busy) return;
          clearInterval(wait);
          const s = document.getElementById('lab-ckpt');
          s.value = 0; s.dispatchEvent(new Event('input'));
          done();
        }, 1);""", TEXT + " x")
    drawn(browser, lab, TEXT + " x", checkpoint=STEPS[0])
    log = browser.execute_script("return window.renderLog")
    assert log and all(a == b for a, b in log), f"an answer was drawn under another checkpoint's name: {log}"


def _next_probs(driver, selector: str) -> list[float]:
    """The probabilities of a next-token table on the page (each cell's full value in its title)."""
    return driver.execute_script(f"return [...document.querySelectorAll({selector!r})].map(td => +td.title)")


def _top10(model, ids: list[int], position: int, layer_head: tuple[int, int] | None = None) -> np.ndarray:
    idx = torch.tensor([ids])
    with torch.no_grad():
        if layer_head is None:
            logits = model(idx).logits[0, position]
        else:
            with HeadAblation(model, *layer_head):
                logits = model(idx).logits[0, position]
    return F.softmax(logits.float(), dim=-1).topk(10).values.numpy()


def test_the_next_token_tables_are_the_models_at_the_pointer_before_and_after(browser, lab):
    """The pointer on token i shows the top 10 after token i: in the pointer's pane (clean, then clean and edited
    with an intervention) and in the before/after panel, each equal to a forward pass of that model."""
    open_lab(browser, lab)
    set_text(browser, TEXT)
    drawn(browser, lab, TEXT)
    model, ids = lab.model(), lab.tok.encode(TEXT)
    for i in (0, 6, len(ids) - 1):
        browser.execute_script("window.lab.pointerAt(arguments[0])", i)
        got = _next_probs(browser, "#lab-next td.p")
        assert np.allclose(got, _top10(model, ids, i), atol=2e-5), (
            f"the pointer on token {i}: the page's next-token probabilities {got} are not the model's after token {i}")
    css(browser, '.thumb[data-layer="0"][data-head="1"]')[0].click()
    drawn(browser, lab, TEXT, interventions=[{"kind": "zero", "layer": 0, "head": 1}])
    browser.execute_script("window.lab.pointerAt(6)")
    clean, edited = _top10(model, ids, 6), _top10(model, ids, 6, (0, 1))
    assert not np.allclose(clean, edited, atol=1e-4), "fixture: zeroing L0H1 should move the distribution at 6"
    for where, want in (("#lab-ab [data-side='before'] .lab-ab-next td.p", clean),
                        ("#lab-ab [data-side='after'] .lab-ab-next td.p", edited),
                        ("#lab-next .lab-next-cols > div:nth-child(1) td.p", clean),
                        ("#lab-next .lab-next-cols > div:nth-child(2) td.p", edited)):
        got = _next_probs(browser, where)
        assert np.allclose(got, want, atol=2e-5), f"{where}: the page shows {got}, the model {want.round(5).tolist()}"
    no_console_errors(browser, "the next-token tables")


def test_a_hidden_key_exactly_one_past_the_end_is_not_sent(browser, lab):
    """The boundary: hide key 15, then cut the text to exactly 15 tokens (keys 0..14): key 15 is past the end."""
    open_lab(browser, lab)
    set_text(browser, TEXT)
    drawn(browser, lab, TEXT)
    css(browser, '#lab-tokens [data-i="15"]')[0].click()
    drawn(browser, lab, TEXT, interventions=[{"kind": "hide_key", "key": 15}])
    cut = TEXT[:15]  # a character a token: 15 tokens
    assert len(lab.tok.encode(cut)) == 15, "fixture: one token a character"
    set_text(browser, cut)
    drawn(browser, lab, cut, interventions=[])
    assert css(browser, "#lab-iv .lab-iv")[0].get_attribute("data-off") == "1", "key 15 should be struck out"
    assert not css(browser, "#lab-error")[0].is_displayed(), css(browser, "#lab-error")[0].text
    no_console_errors(browser, "a key one past the end")


def test_step_inside_follows_the_checkpoint_slider_at_the_same_length(browser, lab):
    """The same text at another checkpoint has as many tokens: the step-inside panel must compute with that
    checkpoint's q, k, v, not keep the ones it decoded before. A typed text's panel opens on its middle token, the
    later keys at -inf with weight 0 (planted bug: inside_opens_on_the_last_query)."""
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    open_lab(browser, lab)
    set_text(browser, TEXT)
    drawn(browser, lab, TEXT)
    ids = lab.tok.encode(TEXT)
    mid = (len(ids) - 1) // 2
    what = css(browser, "#in-what")[0].text
    assert f"query #{mid} " in what, f"the lab's step inside should open on the middle query #{mid}: {what!r}"
    opened = {r["key"]: r for r in _panel_rows(browser)}
    for j in range(mid + 1, len(ids)):
        assert opened[str(j)]["masked"][1] == "-Infinity" and float(opened[str(j)]["weight"][1]) == 0.0, (
            f"the future key {j} of query #{mid} should be -inf with weight 0: {opened[str(j)]}")
    layer, head, query = 1, 2, len(ids) - 1

    def check(step: int) -> None:
        Select(css(browser, "#hv-layer")[0]).select_by_value(str(layer))
        Select(css(browser, "#in-head")[0]).select_by_value(str(head))
        hover(browser, css(browser, "#tokens .tok")[query])
        want = step_inside(lab.model("a", step), ids, layer, head, query)
        rows = {r["key"]: r for r in _panel_rows(browser)}
        for j in range(query + 1):
            got = float(rows[str(j)]["weight"][1])
            assert _same(got, float(want.weights[j])), (
                f"checkpoint step {step}, key {j}: the panel's weight {got!r}, step_inside {float(want.weights[j])!r}")

    check(STEPS[-1])
    css(browser, "#lab-ckpt")[0].send_keys(Keys.HOME)
    drawn(browser, lab, TEXT, checkpoint=STEPS[0])
    check(STEPS[0])


def test_a_text_replaced_from_its_first_token_is_drawn_once(browser, lab):
    """Paste a text over another (no token in common at the start): the head view shows the new tokens, once."""
    open_lab(browser, lab)
    set_text(browser, TEXT)
    drawn(browser, lab, TEXT)
    other = "It is the east, and Juliet"
    set_text(browser, other)
    drawn(browser, lab, other)
    shown = browser.execute_script("return [...document.querySelectorAll('#tokens .tok')].map(t => t.textContent)")
    assert len(shown) == len(lab.tok.encode(other)), (
        f"the head view shows {len(shown)} tokens for a text of {len(lab.tok.encode(other))}: {''.join(shown)!r}")
    assert_weights(browser, capture_attention(lab.model(), lab.tok.encode(other)), "the replaced text")


# ------------------------------------------------------------------------------------------------------------
# the page says what it is doing (issue 30)


def test_the_page_marks_its_maps_stale_while_computing_and_after_an_error(browser, lab):
    """While an answer is on its way the maps drawn are faded under a line naming what they show, and the slider
    names the step of the maps drawn; after an error they stay marked; a good answer clears the mark."""
    from selenium.webdriver.common.by import By

    open_lab(browser, lab)
    set_text(browser, TEXT)
    drawn(browser, lab, TEXT)
    assert browser.execute_script("return document.getElementById('lab').dataset.state") == "", "up to date"
    assert not css(browser, "#model-view.stale"), "maps up to date must not be marked stale"
    # hold the next answer: the page's fetch of /api/analyze waits until the test lets it go
    browser.execute_script("""
      window.__release = null;
      const real = window.__realFetch = window.fetch;
      window.fetch = (url, opts) => url === '/api/analyze' ?
        new Promise((ok) => { window.__release = () => ok(real(url, opts)); }) : real(url, opts);""")
    slider = browser.find_element(By.ID, "lab-ckpt")
    browser.execute_script("arguments[0].value = 0; arguments[0].dispatchEvent(new Event('input'))", slider)
    wait_for(browser, "the computing state", "return document.getElementById('lab').dataset.state === 'computing'")
    note = browser.execute_script("return document.getElementById('lab-stale').textContent")
    label = browser.execute_script("return document.getElementById('lab-ckpt-label').textContent")
    assert css(browser, "#model-view.stale") and css(browser, "#head-view.stale"), "computing: maps not marked"
    # faded at once, on the views' own layers: a fading transition or a filter re-rasterised thousands of nodes in
    # software, on the cores the server computes the answer on (100 ms of a 500-token answer, docs/benchmarks.md)
    for view in ("head-view", "model-view", "inside", "lab-tokens"):
        style = browser.execute_script("const s = getComputedStyle(document.getElementById(arguments[0])); "
                                       "return [s.opacity, s.transitionDuration, s.filter, s.willChange];", view)
        assert style == ["0.45", "0s", "none", "opacity"], (view, style)
    assert "computing" in note and f"step {STEPS[-1]}" in note, note
    assert label.startswith(f"step {STEPS[0]}") and f"the maps below: step {STEPS[-1]}" in label, label
    browser.execute_script("window.fetch = window.__realFetch; window.__release()")
    drawn(browser, lab, TEXT, checkpoint=STEPS[0])
    label = browser.execute_script("return document.getElementById('lab-ckpt-label').textContent")
    assert "the maps below" not in label and not css(browser, "#model-view.stale"), label
    # an error: the old maps stay, marked out of date
    browser.execute_script("document.getElementById('lab-text').value = 'x'.repeat(80);"
                           "document.getElementById('lab-text').dispatchEvent(new Event('input'))")
    wait_for(browser, "the error state", "return document.getElementById('lab').dataset.state === 'error'")
    assert css(browser, "#model-view.stale"), "after an error the old maps must be marked"
    assert "out of date" in browser.execute_script("return document.getElementById('lab-stale').textContent")
    set_text(browser, TEXT)  # back to the text drawn: its maps are up to date again
    wait_for(browser, "the mark cleared", "return !document.querySelector('#model-view.stale') && "
             "document.getElementById('lab-stale').hidden && document.getElementById('lab').dataset.state === ''")
    drawn(browser, lab, TEXT, checkpoint=STEPS[0])
    no_console_errors(browser, "the stale states", expected="422")


def test_a_click_on_a_head_says_its_result_above_the_grid_and_the_caption_follows_the_mode(browser, lab):
    from selenium.webdriver.support.ui import Select

    open_lab(browser, lab)
    caption = browser.execute_script("return document.querySelector('#model-view h2 small').textContent")
    assert "click a head to zero it" in caption, caption
    Select(css(browser, "#lab-click")[0]).select_by_value("open")
    assert "click a head to open it large" in browser.execute_script(
        "return document.querySelector('#model-view h2 small').textContent")
    Select(css(browser, "#lab-click")[0]).select_by_value("zero")
    set_text(browser, TEXT)
    drawn(browser, lab, TEXT)
    browser.execute_script("lab.onHeadClick(1, 2)")
    drawn(browser, lab, TEXT, interventions=[{"kind": "zero", "layer": 1, "head": 2}])
    note = css(browser, "#lab-iv-note")[0]
    assert note.is_displayed() and "zero L1H2" in note.text and "\u0394loss" in note.text, note.text
    ids = lab.tok.encode(TEXT)
    idx = torch.tensor([ids])
    want = ablation_effects(lab.model(), idx[:, :-1], idx[:, 1:])[1, 2]
    assert abs(float(note.get_attribute("data-value")) - want) < 1e-4, (note.get_attribute("data-value"), want)
    grid_top, note_bottom = browser.execute_script(
        "return [document.getElementById('grid').getBoundingClientRect().top,"
        " document.getElementById('lab-iv-note').getBoundingClientRect().bottom]")
    assert 0 <= grid_top - note_bottom < 120, f"the result should sit right above the grid: {note_bottom}, {grid_top}"


def test_the_first_screen_has_an_example_and_byte_tokens_read_as_bytes(browser, lab):
    open_lab(browser, lab)
    set_text(browser, TEXT)
    drawn(browser, lab, TEXT)
    button = css(browser, "#lab-example")[0]
    assert button.is_displayed() and "ROMEO" in button.text, button.text
    button.click()
    text = browser.execute_script("return document.getElementById('lab-text').value")
    assert text == viewer.LAB_EXAMPLE, f"the example button puts the example back in the box: {text!r}"
    drawn(browser, lab, text)
    assert browser.execute_script("return tokenText('\\\\xe2')") == "\u27e8E2\u27e9"
    assert browser.execute_script("return tokenText('a\\\\nb')") != "\u27e80A\u27e9", "a newline is no byte token"



def test_a_busy_lab_is_asked_again_after_its_retry_after_and_the_page_says_so(browser, lab):
    """429 (the lab's queue is full) is not the request's fault: the page waits Retry-After and asks again, up
    to three times, saying so in its status line; a fourth 429 is said as an error."""
    open_lab(browser, lab)
    result = browser.execute_async_script("""
        const done = arguments[arguments.length - 1];
        const real = window.fetch, seen = [];
        let busy = 2;
        window.fetch = (path, init) => {
          seen.push(path);
          if (busy-- > 0) return Promise.resolve(new Response('{"error": "busy"}',
              { status: 429, headers: { "Retry-After": "1", "Content-Type": "application/json" } }));
          return real(path, init);
        };
        const said = [];
        const watch = new MutationObserver(() => said.push(document.getElementById("lab-status").textContent));
        watch.observe(document.getElementById("lab-status"), { childList: true, characterData: true, subtree: true });
        labFetch("/api/models").then(r => { busy = 9; return labFetch("/api/models").then(
            () => "no error", e => e.message).then(last => ({ models: r.models.length, seen, said, last })); })
          .catch(e => ({ error: String(e) })).then(r => { window.fetch = real; watch.disconnect(); done(r); });
    """)
    assert "error" not in result, result
    assert result["models"] >= 1 and result["seen"][:3] == ["/api/models"] * 3, result
    assert any("busy with other requests: asking again in 1 s" in t for t in result["said"]), result["said"]
    assert len(result["seen"]) == 3 + 4, "after two 429s the third try answers; then 1 + 3 retries, all 429"
    assert "HTTP 429" in result["last"], result["last"]

# ------------------------------------------------------------------------------------------------------------
# only its own page talks to it: a foreign page in a real browser cannot make the lab compute (issue 30)


@pytest.fixture
def foreign_browser():
    """Headless Chromium that resolves evil.example.com to 127.0.0.1 (what DNS rebinding achieves)."""
    from test_viewer import _find_browser

    chrome, driver_path, missing = _find_browser()
    if missing:
        if __import__("os").environ.get("REQUIRE_BROWSER_TESTS") == "1":
            pytest.fail(f"browser tests need {missing}")
        pytest.skip(f"browser tests need {missing}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chrome
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--host-resolver-rules=MAP evil.example.com 127.0.0.1", "--disable-extensions", "--no-first-run"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_script_timeout(60)
    yield driver
    driver.quit()


ATTACK = """
const done = arguments[arguments.length - 1], lab = arguments[0], out = [];
const body = JSON.stringify({text: "ROMEO: But soft, what light", interventions: [{kind: "zero", layer: 0, head: 0}],
                             generate: {max_new_tokens: 256}});
const tries = [
  [lab + "api/intervene", {method: "POST", mode: "no-cors", body, headers: {"Content-Type": "text/plain"}}],
  [lab + "api/intervene", {method: "POST", mode: "no-cors", body}],
  [lab + "api/analyze", {method: "POST", mode: "no-cors", body: "text=ROMEO",
                         headers: {"Content-Type": "application/x-www-form-urlencoded"}}],
  [lab + "api/generate", {method: "POST", mode: "cors", body: JSON.stringify({text: "ROMEO"}),
                          headers: {"Content-Type": "application/json"}}],
  [lab + "api/models", {}],
];
Promise.all(tries.map(([u, o]) => fetch(u, o).then(async (r) => out.push([u, r.type, r.status, await r.text()]),
                                                  (e) => out.push([u, "error", 0, String(e)]))))
  .then(() => done(out));
"""


def _cpu_of(thread_names: set[str]) -> float:
    """CPU seconds (user + system) the named threads of this process have used (Linux /proc)."""
    import os
    import threading as th

    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for t in th.enumerate():
        if any(t.name.startswith(n) for n in thread_names) and t.native_id:
            try:
                fields = Path(f"/proc/self/task/{t.native_id}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def test_a_page_of_another_origin_or_a_rebound_name_cannot_make_the_lab_compute(foreign_browser, lab, tmp_path):
    """A page served from another origin (another loopback port) fires no-cors and cors requests at the lab, and
    a page reached as evil.example.com (resolving to 127.0.0.1, as after DNS rebinding) reads and posts as if it
    were the lab's own: no model job starts, and the model thread spends no CPU (measured, not only the statuses);
    the lab's own page still works after."""
    import http.server
    import threading as th

    worker = lab_worker(lab)
    folder = tmp_path / "site"
    folder.mkdir()
    (folder / "index.html").write_text("<!doctype html><title>another site</title><p>hello</p>")
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(folder), **k)  # noqa: E731
    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    th.Thread(target=site.serve_forever, daemon=True).start()
    port = lab.url.rsplit(":", 1)[1].strip("/")
    try:
        started, cpu = worker.started, _cpu_of({"lab-model"})
        # another origin: the page of another port on this machine
        foreign_browser.get(f"http://127.0.0.1:{site.server_address[1]}/")
        other = foreign_browser.execute_async_script(ATTACK, lab.url)
        # DNS rebinding: the lab's own port reached under a foreign name; the page then is "same-origin" with it
        foreign_browser.get(f"http://evil.example.com:{port}/")
        shown = foreign_browser.execute_script("return document.body.innerText")
        rebound = foreign_browser.execute_async_script(ATTACK, f"http://evil.example.com:{port}/")
        time.sleep(1.0)  # anything queued would have started by now
        assert worker.started == started, (
            f"foreign pages started {worker.started - started} model jobs: {other} {rebound}")
        spent = _cpu_of({"lab-model"}) - cpu
        assert spent <= 0.05, f"the model thread spent {spent:.2f} CPU-s for foreign pages"
        assert "not this lab's" in shown and "attention" not in shown.lower()[:200], shown[:300]
        for url, kind, status, text in rebound:
            assert status in (0, 421), f"rebinding: {url} answered {status} ({kind}): {text[:200]}"
            assert "ROMEO" not in text and '"models"' not in text, f"rebinding read the lab's answer: {text[:200]}"
        for url, kind, status, text in other:
            assert status in (0, 403, 415) and '"models"' not in text, f"another origin: {url} {kind} {status}"
    finally:
        site.shutdown()
    # the lab's own page is unaffected
    r = __import__("httpx").post(lab.url + "api/analyze", json={"text": TEXT, "ablation": False}, timeout=60)
    assert r.status_code == 200 and worker.started == started + 1, r.status_code


def lab_worker(lab):
    return lab.app.state.worker


def test_byte_tokens_read_as_bytes_in_the_circuits_and_the_axes(browser, lab):
    """The probe: byte tokens read as `\\xff -> \\xff` in the step-inside panel's query-key pairs. A byte of a split
    character is written ⟨FF⟩ wherever a token is labelled short (the axes, the circuits, the next-token tables)."""
    open_lab(browser, lab)
    got = browser.execute_script("return [axisLabel('\\\\xff'), axisLabel('\\\\xe2\\\\x80'), axisLabel('a\\\\x07'),"
                                 " axisLabel('\\\\n')]")
    assert got[:2] == ["\u27e8FF\u27e9", "\u27e8E2\u27e9\u27e880\u27e9"], got
    assert got[2] == "a\\x07" and got[3] == "\u21b5", f"control characters and newlines keep their marks: {got}"


def test_the_first_text_of_a_checkpoint_says_why_its_step_inside_panel_waits(browser, lab):
    """The first step-inside panel of a checkpoint waits for the heads' circuits (computed from the weights, once):
    the status line says so while it waits, and not for the next text of that checkpoint (issue 36)."""
    from selenium.webdriver.common.keys import Keys

    open_lab(browser, lab)
    set_text(browser, TEXT)
    drawn(browser, lab, TEXT)
    browser.execute_script("""
        window.saidStatus = [];
        new MutationObserver(() => window.saidStatus.push(document.getElementById("lab-status").textContent))
          .observe(document.getElementById("lab-status"), { childList: true, characterData: true, subtree: true });""")
    css(browser, "#lab-ckpt")[0].send_keys(Keys.HOME)  # a checkpoint this page has not opened yet
    for text, first in ((TEXT, True), (TEXT[:12], False)):
        set_text(browser, text)
        drawn(browser, lab, text, checkpoint=STEPS[0])
        said = browser.execute_script("const s = window.saidStatus; window.saidStatus = []; return s")
        why = [s for s in said if "heads' circuits are computed from the weights, once" in s]
        if first:
            assert why, f"the first text's wait for its step-inside panel is not explained: {said}"
            assert "heads' circuits" not in css(browser, "#lab-status")[0].text, "the reason stays after the panel"
        else:
            assert not why, f"a later text of the same checkpoint does not wait for the circuits: {said}"
