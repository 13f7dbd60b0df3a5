"""`python -m attention_lab.viewer <sample folder>` gives back the page sample.py wrote (from page.json beside the
maps), refuses with one error line rather than replace it with a poorer page, and rebuilds it whole with
--checkpoint. The fixture is test_sample.py's tiny run."""

from __future__ import annotations

import json
import re

import pytest

import sample
from attention_lab.viewer import page as viewer
from attention_lab.viewer.report import rebuild_sample
from test_sample import make_run

ISLAND = re.compile(r'<script type="application/json" id="data">(.*?)</script>', re.S)


def island(html: bytes) -> dict:
    return json.loads(ISLAND.search(html.decode("utf-8")).group(1))


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A run and one sample folder as sample.py writes it; (run, folder, the page's bytes)."""
    run = make_run(tmp_path_factory.mktemp("runs") / "tiny")
    folder = run / "samples" / "one"
    rc = sample.main(["--run", str(run), "--prompt", "ROMEO:\nBut", "--max-new-tokens", "12", "--seed", "0",
                      "--out", str(folder)])
    assert rc == 0
    return run, folder, (folder / "attention.html").read_bytes()


def test_the_rebuild_is_the_page_sample_py_wrote(written, capsys):
    run, folder, page = written
    data = island(page)
    assert data.get("inside") and data["scores"], "the fixture's page should show step inside and the scores"
    assert (folder / "page.json").exists(), "sample.py keeps the page's data beside the maps"
    assert viewer.main([str(folder)]) == 0, capsys.readouterr().err
    rebuilt = (folder / "attention.html").read_bytes()
    assert island(rebuilt).keys() == data.keys() and island(rebuilt).get("inside") == data["inside"], (
        "the rebuilt page lost part of sample.py's page")
    assert rebuilt == page, "the rebuilt page differs from the one sample.py wrote"


def test_without_page_json_a_richer_page_is_kept_and_the_error_says_how(written, tmp_path, capsys):
    run, folder, page = written
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in folder.iterdir():
        if f.name != "page.json":
            (copy / f.name).write_bytes(f.read_bytes())
    capsys.readouterr()
    assert viewer.main([str(copy)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, f"one error: line expected:\n{err}"
    checkpoint = json.loads((copy / "tokens.json").read_text())["checkpoint"]
    assert "step inside" in err and f"--checkpoint {checkpoint}" in err, err
    assert (copy / "attention.html").read_bytes() == page, "the richer page was overwritten"

    # the command the error gives rebuilds the whole page
    assert viewer.main([str(copy), "--checkpoint", checkpoint], rebuild_sample) == 0, capsys.readouterr().err
    rebuilt = island((copy / "attention.html").read_bytes())
    assert rebuilt.keys() == island(page).keys() and rebuilt["inside"].keys() == island(page)["inside"].keys()
    assert (copy / "page.json").exists()
    (run / "metrics.jsonl").write_text('{"step": 100, "val_loss": 3.5}\n')
    assert viewer.main([str(run), "--checkpoint", checkpoint], rebuild_sample) == 2
    assert "leave --checkpoint out" in capsys.readouterr().err


def test_a_page_json_of_another_text_is_refused(written, tmp_path, capsys):
    run, folder, page = written
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in folder.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    assert sample.main(["--run", str(run), "--prompt", "JULIET:\nAy", "--max-new-tokens", "5", "--seed", "1",
                        "--out", str(copy), "--no-html"]) == 0  # new maps, the old page.json left beside them
    capsys.readouterr()
    assert viewer.main([str(copy)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "another text" in err and "--checkpoint" in err, err
