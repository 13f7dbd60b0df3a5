"""attention_lab.show(run, text): one text's page inline in a notebook (attention_lab/lab/notebook.py).

Checked: the island holds the numbers the one-pass analysis computes for that text (and the edited ones with
interventions), the iframe's srcdoc unescapes to the page itself, bad input raises naming what is wrong, and in
headless Chromium the page inside the iframe runs to its end.
"""

from __future__ import annotations

import html
import json
import re

import numpy as np
import pytest
from test_sample import make_run
from test_viewer import browser  # noqa: F401  (the headless Chromium fixture)

import attention_lab
from attention_lab.interp.analysis import analyze
from attention_lab.interp.interventions import Intervention
from attention_lab.store.checkpoint import load_checkpoint
from attention_lab.viewer.page import dequantise

TEXT = "ROMEO:\nBut soft, what light"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("nb") / "tiny")


def island(page) -> dict:
    found = re.search(r'<script type="application/json" id="data">(.*?)</script>', page.html, re.S)
    assert found, "the page has no data island"
    return json.loads(found.group(1))


def test_the_page_holds_this_texts_analysis(run):
    page = attention_lab.show(run, TEXT)
    data = island(page)
    ckpt = load_checkpoint(run)
    model, tok = ckpt.build_model("cpu"), ckpt.tokenizer()
    ids = tok.encode(TEXT)
    found = analyze(model, ids)
    assert data["T"] == len(ids) and data["tokens"] == tok.token_strings(ids)
    import base64
    levels = np.frombuffer(base64.b64decode(data["frames"][0]["attn"]), dtype=np.uint8).reshape(data["L"], data["H"], -1)
    np.testing.assert_allclose(dequantise(levels, len(ids)), found.weights, atol=2 / 255,
                               err_msg="the page's weights are not this text's")
    np.testing.assert_allclose(np.array(data["scores"][0]["roles"]["ablation"]), found.ablation, atol=1e-4,
                               err_msg="the page's ablation column is not the one-pass ablation of this text")
    assert "inside" in data, "a causal model's page has the step-inside panel"
    assert html.unescape(re.search(r'srcdoc="(.*?)"', page._repr_html_(), re.S).group(1)) == page.html, \
        "the iframe's srcdoc does not unescape to the page"
    sandbox = re.search(r'sandbox="([^"]*)"', page._repr_html_()).group(1).split()
    assert sandbox == ["allow-scripts"], (
        f"the page's scripts (the user's text among its data) run sandboxed in an origin of their own, never the "
        f"notebook's: sandbox={sandbox}")


def test_interventions_change_the_page_and_are_named_in_its_notes(run):
    page = attention_lab.show(run, TEXT, interventions=[{"kind": "uniform", "layer": 0, "head": 1}])
    data = island(page)
    ckpt = load_checkpoint(run)
    model, tok = ckpt.build_model("cpu"), ckpt.tokenizer()
    edited = analyze(model, tok.encode(TEXT), interventions=[Intervention("uniform", 0, 1)])
    np.testing.assert_allclose(np.array(data["scores"][0]["roles"]["ablation"]), edited.ablation, atol=1e-4)
    assert any("uniform L0H1" in n for n in data["notes"]), f"the intervention is not named: {data['notes']}"


def test_bad_input_raises_naming_what_is_wrong(run, tmp_path):
    with pytest.raises(ValueError, match=r"head must be in 0\.\.1"):
        attention_lab.show(run, TEXT, interventions=[{"kind": "zero", "layer": 0, "head": 5}])
    with pytest.raises(Exception, match="no run|checkpoint|not found|No such"):
        attention_lab.show(tmp_path / "nothing", TEXT)


def test_the_page_runs_inside_its_iframe(run, browser, tmp_path):  # noqa: F811
    page = attention_lab.show(run, TEXT, height=500)
    wrapper = tmp_path / "notebook.html"
    wrapper.write_text(f"<!DOCTYPE html><html><body>{page._repr_html_()}</body></html>", encoding="utf-8")
    browser.get(wrapper.as_uri())
    from selenium.webdriver.support.ui import WebDriverWait

    frame = WebDriverWait(browser, 10).until(lambda d: d.find_element("tag name", "iframe"))
    browser.switch_to.frame(frame)
    try:
        WebDriverWait(browser, 10).until(lambda d: d.execute_script("return document.body.dataset.ready") == "1")
        cells = browser.execute_script("return document.querySelectorAll('#grid canvas').length")
        assert cells >= 4, f"the model view inside the iframe drew {cells} heads, expected 2 layers x 2 heads"
        reach = browser.execute_script("try { return 'reached ' + window.parent.document.title } "
                                       "catch (e) { return 'blocked: ' + e.name }")
        assert reach == "blocked: SecurityError", f"the page reached the notebook around it: {reach}"
    finally:
        browser.switch_to.default_content()
