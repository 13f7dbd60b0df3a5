"""`python -m attention_lab.viewer <sample folder>` gives back the page sample.py wrote (from page.json beside the
maps), refuses with one error line rather than replace it with a poorer page, and rebuilds it whole with
--checkpoint. The fixture is test_sample.py's tiny run."""

from __future__ import annotations

import json
import re

import pytest
from test_sample import make_run

import sample
from attention_lab.viewer import page as viewer
from attention_lab.viewer.report import rebuild_sample

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


def _checkpoint(run_dir, tokenizer, block_size: int):
    """A run whose best checkpoint has this tokenizer and context (weights random: the rebuild must refuse first)."""
    from attention_lab.store.checkpoint import save_checkpoint
    from model import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, block_size=block_size, n_layer=1, n_head=2, n_embd=16))
    save_checkpoint(run_dir / "checkpoints", 100, model, tokenizer.to_str(), {"val_loss": 3.5}, best=True)
    return run_dir


@pytest.mark.parametrize("which", ["another tokenizer", "a shorter context"])
def test_a_checkpoint_that_cannot_hold_the_samples_tokens_is_refused_and_the_sample_kept(
        written, tmp_path, capsys, which):
    """`python -m attention_lab.viewer FOLDER --checkpoint CKPT` with the wrong checkpoint refuses with one error
    line and leaves the sample as it was: with another tokenizer (its context long enough) the same ids are other
    tokens; with a context shorter than the sample the window would be cropped. Planted bug:
    rebuild_accepts_another_tokenizer (either refusal alone let through, the sample overwritten)."""
    from test_sample import BLOCK, CORPUS

    from data.tokenizer import Tokenizer

    run, folder, page = written
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in folder.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    saved = json.loads((copy / "tokens.json").read_text())
    n = len(saved["token_ids"])
    if which == "another tokenizer":  # digits sort before the letters: every letter's id moves
        ckpt = _checkpoint(tmp_path / "other", Tokenizer.train_char([[CORPUS + "0123456789"]]), BLOCK)
        assert n <= BLOCK, "the other checkpoint's context holds the sample: only its tokenizer differs"
    else:
        ckpt = _checkpoint(tmp_path / "short", Tokenizer.train_char([[CORPUS]]), n - 1)
    before = {name: (copy / name).read_bytes() for name in ("tokens.json", "attention.html", "page.json")}
    capsys.readouterr()
    rc = viewer.main([str(copy), "--checkpoint", str(ckpt)], rebuild_sample)
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1, (
        f"rebuilding the {n}-token sample with a checkpoint of {which} gave rc {rc} and no one error line ({err!r}): "
        "the page now shows " + ("other token strings for the same ids" if which == "another tokenizer" else
                                 f"only the last {n - 1} tokens"))
    assert "give the checkpoint that wrote the sample" in err, err
    for name, data in before.items():
        assert (copy / name).read_bytes() == data, f"the refused rebuild ({which}) still rewrote {name}"
