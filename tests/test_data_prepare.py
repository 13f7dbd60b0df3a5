"""prepare_data on tiny corpora written by the tests: files, meta.json, the cache, crashes, hub files, bad input."""

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import datasets
import numpy as np
import pytest

from data import prepare
from data.config import DataConfig
from data.prepare import PreparedData, load_tokens, prepare_data, token_dtype
from data.tokenizer import EOT, Tokenizer

REPO = Path(__file__).resolve().parent.parent
WORDS = "thou art the king of all this isle and I thy humble servant speak not so loud my lord".split()


def make_text(i: int, n_lines: int = 12) -> str:
    lines = [" ".join(WORDS[(i * 7 + j * k) % len(WORDS)] for k in range(1, 9)) for j in range(n_lines)]
    if i % 4 == 1:
        lines.append("Ünïcödé line: café, 日本, 🙂")
    return f"DOC {i}\n" + "\n".join(lines) + "\n"


@pytest.fixture(autouse=True)
def hf_cache(tmp_path, monkeypatch):
    """Keep the Arrow files `datasets.load_dataset` writes for local parquet/json out of ~/.cache."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))


@pytest.fixture
def corpus(tmp_path) -> Path:
    root = tmp_path / "corpus"
    root.mkdir()
    for i in range(12):
        (root / f"doc{i:02d}.txt").write_text(make_text(i), encoding="utf-8")
    return root


@pytest.fixture
def tokenize_calls(monkeypatch) -> list:
    """Records each batch prepare tokenizes (num_proc=1 runs the map function in this process)."""
    calls = []
    original = prepare._tokenize

    def counting(batch, **kwargs):
        calls.append(len(batch["text"]))
        return original(batch, **kwargs)

    monkeypatch.setattr(prepare, "_tokenize", counting)
    return calls


def text_cfg(tmp_path, corpus, **kwargs) -> DataConfig:
    base = dict(source="text", name="tiny", files=[str(corpus / "*.txt")], cache_dir=str(tmp_path / "cache"),
                vocab_size=300, val_fraction=0.25)
    return DataConfig(**{**base, **kwargs})


def prepared_dirs(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if not p.name.startswith(".")) if cache.exists() else []


def quiet(*args):
    pass


# --- the prepared files -------------------------------------------------------------------------------------------


def test_prepare_writes_tokens_tokenizer_and_meta(tmp_path, corpus):
    data = prepare_data(text_cfg(tmp_path, corpus), log=quiet)
    meta = data.meta
    assert data.dir.name == f"tiny-{meta['key'][:12]}", f"cache dir must be <name>-<key[:12]>, got {data.dir}"
    for key in ("name", "source", "tokenizer", "vocab_size", "eot_id", "dtype", "train", "val", "val_docs", "key",
                "format_version", "counts_note", "config"):
        assert key in meta, f"meta.json lacks {key!r}: {sorted(meta)}"
    assert (meta["source"], meta["tokenizer"], meta["dtype"], meta["vocab_size"]) == ("text", "bpe", "uint16", 300)

    # val: every 4th document (val_fraction=0.25), evenly spread, the rest is train, in file order
    assert meta["val_docs"] == ["doc03", "doc07", "doc11"], meta["val_docs"]
    train_ids = [i for i in range(12) if i not in (3, 7, 11)]
    tok = data.tokenizer
    for split, ids in (("train", train_ids), ("val", [3, 7, 11])):
        texts = [make_text(i) for i in ids]
        tokens = data.tokens(split)
        assert isinstance(tokens, np.memmap) and tokens.dtype == np.uint16, type(tokens)
        assert tok.decode(tokens) == "".join(t + EOT for t in texts), f"{split}.bin must decode to its documents"
        counts = meta[split]
        assert counts["documents"] == len(ids) and counts["tokens"] == len(tokens), counts
        assert int((tokens == meta["eot_id"]).sum()) == len(ids), "one <|endoftext|> after each document"
        assert counts["text_bytes"] == sum(len(t.encode()) for t in texts), "UTF-8 bytes without separators"
        expected_bpt = counts["text_bytes"] / (counts["tokens"] - counts["documents"])
        assert counts["bytes_per_token"] == pytest.approx(expected_bpt, abs=1e-3), counts
    assert np.array_equal(load_tokens(data.train_path, meta["dtype"]), data.tokens("train"))
    assert PreparedData.open(data.dir).meta == meta, "a prepared directory opens by path"


def test_bpe_is_trained_on_the_train_split_only(tmp_path):
    root = tmp_path / "corpus"
    root.mkdir()
    for i in range(4):
        (root / f"t{i}.txt").write_text("abab abab abab\n" * 50)
    (root / "v.txt").write_text("xyzq xyzq xyzq\n" * 500)
    data = prepare_data(DataConfig(source="text", files=[str(root)], val_docs=["v"], vocab_size=400,
                                   cache_dir=str(tmp_path / "cache")), log=quiet)
    learned = Tokenizer.from_file(data.tokenizer_path).token_strings(range(257, data.tokenizer.vocab_size))
    assert not any("xy" in t or "zq" in t for t in learned), f"merges learned from the validation text: {learned}"


def test_summary_is_logged(tmp_path, corpus):
    lines = []
    prepare_data(text_cfg(tmp_path, corpus), log=lines.append)
    summary = "\n".join(lines)
    for word in ("documents", "bytes", "tokens", "bytes/token", "train", "val"):
        assert word in summary, f"the summary should mention {word!r}:\n{summary}"


# --- cache hits and misses ----------------------------------------------------------------------------------------


def test_second_call_reuses_the_cache_without_tokenizing(tmp_path, corpus, tokenize_calls):
    cfg = text_cfg(tmp_path, corpus)
    first = prepare_data(cfg, log=quiet)
    assert tokenize_calls, "the first call must tokenize"
    tokenize_calls.clear()
    lines = []
    second = prepare_data(cfg, log=lines.append)
    assert tokenize_calls == [], "a cache hit must not tokenize"
    assert second.dir == first.dir and second.meta == first.meta
    assert any("reusing" in line for line in lines), lines


def test_key_changes_with_content_and_settings_only(tmp_path, corpus):
    cfg = text_cfg(tmp_path, corpus)
    key = prepare.cache_key(cfg)
    assert prepare.cache_key(text_cfg(tmp_path, corpus, num_proc=2, cache_dir="elsewhere")) == key, \
        "processes and cache location do not change the tokens, so not the key"
    for changed in (dict(vocab_size=301), dict(tokenizer="char"), dict(val_fraction=0.5), dict(val_docs=["doc00"])):
        assert prepare.cache_key(text_cfg(tmp_path, corpus, **changed)) != key, f"{changed} must change the key"

    first = prepare_data(cfg, log=quiet)
    (corpus / "doc05.txt").write_text(make_text(5) + "one more line\n", encoding="utf-8")
    second = prepare_data(cfg, log=quiet)
    assert second.dir != first.dir, "editing a file must prepare into a new directory"
    assert len(prepared_dirs(tmp_path / "cache")) == 2
    assert "one more line" in second.tokenizer.decode(second.tokens("train"))


def test_token_dtype_boundary():
    assert token_dtype(65536) == np.uint16 and token_dtype(65537) == np.uint32


def test_vocabulary_over_65536_is_stored_as_uint32(tmp_path, corpus):
    """A file tokenizer (word-level over characters) padded to 70,000 entries, the characters at the top."""
    import tokenizers
    from tokenizers import Regex, decoders, models, pre_tokenizers

    chars = sorted(set("".join(make_text(i) for i in range(12))))
    vocab = {f"<filler{i}>": i for i in range(70_000 - len(chars) - 1)}
    vocab |= {c: len(vocab) + j for j, c in enumerate(chars)}
    vocab[EOT] = len(vocab)
    raw = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token=EOT))
    raw.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    raw.decoder = decoders.Fuse()
    raw.add_special_tokens([EOT])
    path = tmp_path / "big.json"
    path.write_text(raw.to_str())

    data = prepare_data(text_cfg(tmp_path, corpus, tokenizer="file", tokenizer_file=str(path)), log=quiet)
    assert data.meta["dtype"] == "uint32" and data.tokens("train").dtype == np.uint32, data.meta["dtype"]
    assert data.meta["vocab_size"] == 70_000 and data.meta["eot_id"] == 69_999, data.meta
    assert int(data.tokens("train").max()) == 69_999, "ids above 65535 must survive"
    assert data.tokenizer.decode(data.tokens("val")) == "".join(make_text(i) + EOT for i in (3, 7, 11))


def test_num_proc_2_writes_the_same_tokens(tmp_path, corpus):
    one = prepare_data(text_cfg(tmp_path, corpus), log=quiet)
    two = prepare_data(text_cfg(tmp_path, corpus, num_proc=2, cache_dir=str(tmp_path / "cache2")), log=quiet)
    assert one.meta["key"] == two.meta["key"]
    for name in ("train.bin", "val.bin", "tokenizer.json"):
        assert (one.dir / name).read_bytes() == (two.dir / name).read_bytes(), f"{name} differs with num_proc=2"


# --- interrupted runs ---------------------------------------------------------------------------------------------


def test_error_midway_through_a_file_leaves_nothing_behind(tmp_path, corpus, monkeypatch, tokenize_calls):
    cfg = text_cfg(tmp_path, corpus)
    monkeypatch.setattr(prepare, "BATCH", 2)  # several chunks per .bin file
    calls = {"n": 0}
    import pyarrow.compute as pc  # data/prepare.py imports it where it writes a split

    original = pc.list_flatten

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("simulated crash while writing train.bin")
        return original(*args, **kwargs)

    monkeypatch.setattr(pc, "list_flatten", flaky)
    with pytest.raises(RuntimeError, match="simulated crash"):
        prepare_data(cfg, log=quiet)
    assert prepared_dirs(tmp_path / "cache") == [], "a failed preparation must not leave its directory"

    monkeypatch.setattr(pc, "list_flatten", original)
    tokenize_calls.clear()
    data = prepare_data(cfg, log=quiet)
    assert tokenize_calls, "the rerun must prepare from scratch"
    assert data.tokenizer.decode(data.tokens("val")) == "".join(make_text(i) + EOT for i in (3, 7, 11))


@pytest.mark.parametrize("damage", ["no meta", "truncated meta", "truncated train.bin", "other key"])
def test_a_damaged_directory_is_prepared_again(tmp_path, corpus, tokenize_calls, damage):
    cfg = text_cfg(tmp_path, corpus)
    good = prepare_data(cfg, log=quiet)
    expected = good.tokens("train").tobytes()
    meta_path = good.dir / "meta.json"
    if damage == "no meta":
        meta_path.unlink()
    elif damage == "truncated meta":
        meta_path.write_bytes(meta_path.read_bytes()[:40])
    elif damage == "truncated train.bin":
        good.train_path.write_bytes(good.train_path.read_bytes()[:-3])
    else:
        meta_path.write_text(json.dumps({**good.meta, "key": "0" * 64}))
    tokenize_calls.clear()
    lines = []
    again = prepare_data(cfg, log=lines.append)
    assert tokenize_calls, f"{damage}: the directory must not be trusted"
    assert any("no valid meta.json" in line for line in lines), lines
    assert again.dir == good.dir and again.tokens("train").tobytes() == expected


def test_a_killed_preparation_is_redone_on_the_next_call(tmp_path, corpus):
    """SIGKILL-like: the process dies (os._exit) after train.bin is written, before val.bin and meta.json."""
    cfg = text_cfg(tmp_path, corpus)
    script = textwrap.dedent(f"""
        import os
        from data import prepare
        from data.config import DataConfig
        original = prepare._write_split
        def dying(docs, tok, dtype, path, *args):
            if path.name == "val.bin":
                os._exit(9)
            return original(docs, tok, dtype, path, *args)
        prepare._write_split = dying
        prepare.prepare_data(DataConfig(**{cfg.__dict__!r}), log=print)
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, f"the helper should have died with 9:\n{proc.stdout}\n{proc.stderr}"
    (left,) = [tmp_path / "cache" / d for d in prepared_dirs(tmp_path / "cache")]
    assert (left / "train.bin").exists() and not (left / "meta.json").exists(), sorted(os.listdir(left))

    data = prepare_data(cfg, log=quiet)
    fresh = prepare_data(text_cfg(tmp_path, corpus, cache_dir=str(tmp_path / "fresh")), log=quiet)
    for name in ("train.bin", "val.bin", "tokenizer.json"):
        assert (data.dir / name).read_bytes() == (fresh.dir / name).read_bytes(), f"{name} differs after recovery"
    assert not [p for p in os.listdir(data.dir) if p.startswith(".")], "no temp files in a finished directory"


# --- hub datasets, through local parquet/json files ---------------------------------------------------------------


@pytest.fixture
def parquet_file(tmp_path) -> Path:
    path = tmp_path / "stories.parquet"
    rows = [{"story": make_text(i, n_lines=3), "id": i} for i in range(20)] + [{"story": "", "id": 20}]
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return path


def hub_cfg(tmp_path, **kwargs) -> DataConfig:
    return DataConfig(**{"source": "hub", "name": "hubtest", "cache_dir": str(tmp_path / "cache"), "vocab_size": 300,
                         **kwargs})


def test_every_hub_setting_that_changes_the_documents_changes_the_key(tmp_path):
    """A hub corpus is keyed by what is read from it: each of these settings picks other documents or other text,
    so a change must prepare again, never reuse the other setting's val.bin."""
    base = hub_cfg(tmp_path, path="someone/corpus", max_train_docs=100, max_val_docs=10, val_split="validation")
    key = prepare.cache_key(base)
    assert prepare.cache_key(hub_cfg(tmp_path, path="someone/corpus", max_train_docs=100, max_val_docs=10,
                                     val_split="validation")) == key, "the same settings, the same key"
    for changed in (dict(max_val_docs=11), dict(max_train_docs=101), dict(text_field="story"),
                    dict(doc_start_regex="^ = "), dict(train_split="train[:50%]"), dict(config_name="other"),
                    dict(revision="v2"), dict(val_split="test"), dict(path="someone/other")):
        cfg = hub_cfg(tmp_path, **{"path": "someone/corpus", "max_train_docs": 100, "max_val_docs": 10,
                                   "val_split": "validation", **changed})
        assert prepare.cache_key(cfg) != key, f"{changed} must change the key"


def test_hub_source_on_local_parquet(tmp_path, parquet_file):
    cfg = hub_cfg(tmp_path, path="parquet", data_files=[str(parquet_file)], text_field="story")
    data = prepare_data(cfg, log=quiet)
    assert data.meta["train"]["documents"] + data.meta["val"]["documents"] == 20, "the empty row is dropped"
    assert data.meta["val"]["documents"] == 2, "val_fraction 0.1 of 21 rows: rows 9 and 19"
    assert data.tokenizer.decode(data.tokens("val")) == make_text(9, 3) + EOT + make_text(19, 3) + EOT
    assert data.meta["val_docs"] is None


def test_hub_source_with_a_validation_split_on_json(tmp_path):
    for split, ids in (("train", range(10)), ("val", range(10, 13))):
        with open(tmp_path / f"{split}.jsonl", "w") as f:
            f.writelines(json.dumps({"text": make_text(i, 3), "n": i}) + "\n" for i in ids)
    cfg = hub_cfg(tmp_path, path="json", data_files=[str(tmp_path / "train.jsonl")],
                  val_data_files=[str(tmp_path / "val.jsonl")], val_split="validation", max_val_docs=2)
    data = prepare_data(cfg, log=quiet)
    assert (data.meta["train"]["documents"], data.meta["val"]["documents"]) == (10, 2), data.meta
    assert data.tokenizer.decode(data.tokens("val")) == make_text(10, 3) + EOT + make_text(11, 3) + EOT


def test_hub_streaming_reads_the_first_documents(tmp_path, parquet_file):
    cfg = hub_cfg(tmp_path, path="parquet", data_files=[str(parquet_file)], text_field="story", streaming=True,
                  max_train_docs=8, val_fraction=0.25)
    data = prepare_data(cfg, log=quiet)
    assert (data.meta["train"]["documents"], data.meta["val"]["documents"]) == (6, 2), data.meta
    non_streamed = prepare_data(hub_cfg(tmp_path, path="parquet", data_files=[str(parquet_file)], text_field="story",
                                        max_train_docs=8, val_fraction=0.25), log=quiet)
    assert non_streamed.dir == data.dir, "streaming reads the same documents, so it shares the cache"


def test_hub_rows_joined_into_articles(tmp_path):
    rows = ["", " = First = \n", "", " Para one . \n", " = = Part = = \n", " Para two . \n", "", " = Second = \n",
            " Para three . \n", ""]
    path = tmp_path / "wiki.jsonl"
    path.write_text("".join(json.dumps({"text": r}) + "\n" for r in rows))
    with pytest.warns(UserWarning, match="not in the char-level vocabulary"):  # the val article's new letters
        data = prepare_data(hub_cfg(tmp_path, path="json", data_files=[str(path)], doc_start_regex="^ = [^=]",
                                    val_fraction=0.5, tokenizer="char"), log=quiet)
    train = data.tokenizer.decode(data.tokens("train"))
    assert train == " = First = \n\n Para one . \n = = Part = = \n Para two . \n" + EOT, repr(train)
    val = data.meta["val"]
    assert val["documents"] == 1 and val["text_bytes"] == len(" = Second = \n Para three . \n"), val


def test_hub_missing_text_field_lists_the_columns(tmp_path, parquet_file):
    with pytest.raises(ValueError, match=r"no column data.text_field='text'; available columns: story, id"):
        prepare_data(hub_cfg(tmp_path, path="parquet", data_files=[str(parquet_file)]), log=quiet)
    with pytest.raises(ValueError, match=r"column 'id' holds .*not text"):
        prepare_data(hub_cfg(tmp_path, path="parquet", data_files=[str(parquet_file)], text_field="id"), log=quiet)
    assert prepared_dirs(tmp_path / "cache") == [], "nothing may stay cached after an error"


# --- bad input ----------------------------------------------------------------------------------------------------


def test_missing_file_and_empty_glob(tmp_path, corpus):
    with pytest.raises(FileNotFoundError, match=r"data.files: no file matches .*nope\.txt"):
        prepare_data(text_cfg(tmp_path, corpus, files=[str(corpus / "nope.txt")]), log=quiet)
    with pytest.raises(FileNotFoundError, match=r"no file matches .*\*\.md"):
        prepare_data(text_cfg(tmp_path, corpus, files=[str(corpus / "*.txt"), str(corpus / "*.md")]), log=quiet)
    with pytest.raises(ValueError, match=r"data.files is empty"):
        prepare_data(text_cfg(tmp_path, corpus, files=[]), log=quiet)
    with pytest.raises(FileNotFoundError, match=r"data.data_files: no file matches"):
        prepare_data(hub_cfg(tmp_path, path="parquet", data_files=[str(tmp_path / "none*.parquet")]), log=quiet)
    assert prepared_dirs(tmp_path / "cache") == []


def test_empty_corpus(tmp_path):
    (tmp_path / "a.txt").write_text("")
    (tmp_path / "b.txt").write_text("  \n\n")
    with pytest.raises(ValueError, match=r"empty corpus"):
        prepare_data(DataConfig(source="text", files=[str(tmp_path / "*.txt")], cache_dir=str(tmp_path / "c")),
                     log=quiet)
    path = tmp_path / "empty.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["", " ", "\n", ""]))
    with pytest.raises(ValueError, match=r"empty corpus|validation documents .* empty"):
        prepare_data(hub_cfg(tmp_path, path="json", data_files=[str(path)], cache_dir=str(tmp_path / "c")), log=quiet)
    assert prepared_dirs(tmp_path / "c") == [], "nothing may stay cached after an error"


def test_empty_files_among_others_are_skipped_with_a_warning(tmp_path, corpus):
    (corpus / "zz_empty.txt").write_text("\n")
    with pytest.warns(UserWarning, match="skipping 1 empty file.*zz_empty"):
        data = prepare_data(text_cfg(tmp_path, corpus), log=quiet)
    assert data.meta["train"]["documents"] + data.meta["val"]["documents"] == 12


def test_non_utf8_file_names_the_file_and_offset(tmp_path, corpus):
    bad = corpus / "latin1.txt"
    bad.write_bytes("naïve".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.txt is not UTF-8: byte 0xef at byte offset 2 .*iconv"):
        prepare_data(text_cfg(tmp_path, corpus), log=quiet)
    assert prepared_dirs(tmp_path / "cache") == [], "nothing may stay cached after an error"


def test_unknown_val_docs_list_the_available_names(tmp_path, corpus):
    with pytest.raises(ValueError, match=r"no document named hamlet; available: doc00, doc01"):
        prepare_data(text_cfg(tmp_path, corpus, val_docs=["doc01", "hamlet"]), log=quiet)


def test_missing_tokenizer_file(tmp_path, corpus):
    with pytest.raises(FileNotFoundError, match=r"data.tokenizer_file=.*gpt2.json.* does not exist"):
        prepare_data(text_cfg(tmp_path, corpus, tokenizer="file", tokenizer_file=str(tmp_path / "gpt2.json")),
                     log=quiet)


# --- char level and a single file ---------------------------------------------------------------------------------


def test_char_level_warns_about_validation_characters_unseen_in_training(tmp_path, corpus):
    (corpus / "doc03.txt").write_text("Zebra Zoo § 𝔘\n")  # a val document (every 4th) with new characters
    # also unseen: the 7 of "DOC 7" (train has DOC 0-10 without 7)
    with pytest.warns(UserWarning, match=r"5 character\(s\) not in the char-level vocabulary.*4 distinct: 7Z§𝔘\)"):
        data = prepare_data(text_cfg(tmp_path, corpus, tokenizer="char"), log=quiet)
    assert data.meta["val"]["unknown_chars"] == 5 and data.meta["train"].get("unknown_chars") is None, data.meta
    text = data.tokenizer.decode(data.tokens("train"))
    assert text == "".join(make_text(i) + EOT for i in range(12) if i not in (3, 7, 11)), "char round trip"


def test_a_single_file_is_split_by_lines(tmp_path):
    path = tmp_path / "book.txt"
    lines = [f"line {i} of the only book\n" for i in range(100)]
    path.write_text("".join(lines))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        data = prepare_data(DataConfig(source="text", files=[str(path)], tokenizer="char", val_fraction=0.1,
                                       cache_dir=str(tmp_path / "c")), log=quiet)
    val = data.tokenizer.decode(data.tokens("val"))
    assert val == "".join(lines[90:]) + EOT, f"the last 10% of lines is the validation text: {val[:60]!r}"
    assert data.meta["val_docs"] == [f"book[{len(''.join(lines[:90]))}:]"], data.meta["val_docs"]
    assert data.tokenizer.decode(data.tokens("train")) == "".join(lines[:90]) + EOT, "the train text stops at the cut"


def test_a_single_file_cut_between_lines_trains_on_none_of_the_validation_text(tmp_path):
    """The cut goes back to the start of the line the target falls in: the train text is everything before it and
    the validation text everything after, not one character of it in both."""
    path = tmp_path / "book.txt"
    lines = [f"line {i}{'.' * (i % 7)} of the only book\n" for i in range(50)]  # lines of unequal length
    text = "".join(lines)
    path.write_text(text)
    data = prepare_data(DataConfig(source="text", files=[str(path)], tokenizer="char", val_fraction=0.13,
                                   cache_dir=str(tmp_path / "c")), log=quiet)
    train = data.tokenizer.decode(data.tokens("train")).removesuffix(EOT)
    val = data.tokenizer.decode(data.tokens("val")).removesuffix(EOT)
    target = int(len(text) * 0.87)
    assert text[target - 1] != "\n", "the test needs a target inside a line"
    assert train + val == text, "train and validation are the text cut once, in order"
    assert train.endswith("\n") and len(train) < target, f"cut at a line start before the target: {train[-30:]!r}"
