"""Tokenizers: exact round trips, the char vocabulary and its unknown-character warning, files, labels."""

import json
import os
import warnings
from pathlib import Path

import pytest
import tokenizers
from tokenizers import models, pre_tokenizers

from data.tokenizer import EOT, Tokenizer

TRAIN_TEXT = [
    "First Citizen:\nBefore we proceed any further, hear me speak.\n",
    "All:\nSpeak, speak.\n\tYou are all resolved rather to die than to famish?\n",
] * 20

# Characters the BPE never saw in training: emoji (with ZWJ and skin tone), CJK, combining marks, RTL,
# control characters, NUL, the largest code point, CRLF, and a literal end-of-text string.
ARBITRARY = [
    "👩🏽‍🔬 family: 👨‍👩‍👧‍👦 flags 🇫🇷",
    "日本語のテキスト、中文，한국어",
    "e\u0301 a\u0308\u0323 Z\u0351\u0361\u0489",
    "שלום עולם مرحبا",
    "\x00\x01\x07\x1b[0m\x7f\x85 tab\tcr\r\nend",
    "\U0010ffff\ufeff\u200b",
    "plain ascii <|endoftext|> after",
    "",
]


@pytest.fixture(scope="module")
def bpe():
    return Tokenizer.train_bpe([TRAIN_TEXT], vocab_size=300)


@pytest.fixture(scope="module")
def char():
    return Tokenizer.train_char([TRAIN_TEXT])


@pytest.mark.parametrize("text", ARBITRARY)
def test_bpe_round_trips_arbitrary_unicode(bpe, text):
    ids = bpe.encode(text)
    assert bpe.decode(ids) == text, f"decode(encode(x)) != x for {text!r}: {bpe.decode(ids)!r}"
    assert all(0 <= i < bpe.vocab_size for i in ids), f"ids outside the vocabulary: {ids}"


def test_bpe_vocabulary_holds_every_byte_and_the_eot(bpe):
    assert bpe.kind == "bpe" and bpe.eot_id == 0, bpe
    assert bpe.vocab_size == 300, f"asked for 300 tokens, got {bpe.vocab_size}"
    assert bpe.encode(EOT) == [bpe.eot_id], "the end-of-text string must encode to the special token"
    assert len(bpe.encode("the")) < 3, "training should have merged a frequent word"


def test_encode_batch_equals_encode(bpe):
    assert bpe.encode_batch(ARBITRARY) == [bpe.encode(t) for t in ARBITRARY]


def test_token_strings_are_readable_labels(bpe):
    ids = bpe.encode(" speak\n\t€")
    labels = bpe.token_strings(ids)
    assert len(labels) == len(ids)
    assert "".join(labels).startswith(" speak\\n\\t"), f"Ġ/Ċ should read as space and \\n: {labels}"
    assert "Ġ" not in "".join(labels) and "Ċ" not in "".join(labels), labels
    # € is 3 bytes never merged here: its pieces show as escaped bytes, each label from its token alone
    assert "".join(labels).endswith("\\xe2\\x82\\xac"), labels
    assert bpe.token_strings([bpe.eot_id]) == [EOT]


def test_save_and_reload_give_the_same_tokenizer(bpe, char, tmp_path):
    for tok in (bpe, char):
        path = tmp_path / tok.kind / "tokenizer.json"
        tok.save(path)
        assert [p.name for p in path.parent.iterdir()] == ["tokenizer.json"], "the temp file must be gone"
        for loaded in (Tokenizer.from_file(path), Tokenizer.from_str(tok.to_str())):
            assert loaded.kind == tok.kind, f"kind {loaded.kind} inferred for a {tok.kind} tokenizer"
            assert (loaded.vocab_size, loaded.eot_id) == (tok.vocab_size, tok.eot_id)
            text = TRAIN_TEXT[1]
            assert loaded.encode(text) == tok.encode(text) and loaded.decode(loaded.encode(text)) == text


def test_char_vocabulary_is_the_training_characters(char):
    chars = sorted(set("".join(TRAIN_TEXT)))
    assert char.kind == "char" and char.eot_id == 0 and char.unk_id == 1, char
    assert char.vocab_size == len(chars) + 2, "characters + <|endoftext|> + <|unk|>"
    text = "".join(TRAIN_TEXT[:2])
    ids = char.encode(text)
    assert len(ids) == len(text), "one token per character"
    assert char.decode(ids) == text, "decode must not insert spaces between characters"
    assert char.decode([*ids[:3], char.eot_id]) == text[:3] + EOT
    assert char.token_strings(char.encode("a\n")) == ["a", "\\n"]


def test_char_ids_follow_code_point_order_in_every_process():
    """The ids are the characters in code-point order after the two specials, whatever order Python's set gives
    them: a tokenizer rebuilt in another process (another hash seed) must give the corpus the same ids, or a cached
    train.bin and a checkpoint would meet a vocabulary of other ids."""
    import subprocess
    import sys

    chars = sorted(set("".join(TRAIN_TEXT)))
    code = ("import json, sys; from data.tokenizer import Tokenizer; "
            "t = Tokenizer.train_char([json.loads(sys.argv[1])]); "
            "print(json.dumps([t.encode(c)[0] for c in json.loads(sys.argv[2])]))")
    seen = set()
    for seed in ("1", "2", "3"):
        proc = subprocess.run([sys.executable, "-c", code, json.dumps(TRAIN_TEXT), json.dumps(chars)],
                              capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parent.parent,
                              env={**os.environ, "PYTHONHASHSEED": seed})
        assert proc.returncode == 0, proc.stderr[-2000:]
        ids = json.loads(proc.stdout)
        assert ids == list(range(2, 2 + len(chars))), f"PYTHONHASHSEED={seed}: ids {ids[:8]}... not in code-point order"
        seen.add(tuple(ids))
    assert len(seen) == 1


def test_char_unknown_characters_warn_and_map_to_unk(char):
    with pytest.warns(UserWarning, match=r"2 character\(s\) not in the char-level vocabulary.*1 distinct: Z"):
        ids = char.encode("Zeal Z")
    assert ids[0] == ids[5] == char.unk_id, ids
    with pytest.warns(UserWarning, match=r"3 character\(s\).*2 distinct: 9Q"):
        char.encode_batch(["Q9", "9"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        char.encode("speak")  # known characters: no warning
        char.encode_batch(["Q"], warn_unknown=False)


def test_file_tokenizer_missing_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Tokenizer.from_file(tmp_path / "nope.json", kind="file")


def test_file_tokenizer_without_eot_gets_one(tmp_path):
    raw = tokenizers.Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    path.write_text(raw.to_str())
    with pytest.warns(UserWarning, match="no <|endoftext|> token; adding it"):
        tok = Tokenizer.from_file(path, kind="file")
    assert tok.eot_id == 3 and tok.vocab_size == 4, tok
    assert tok.encode("a b") == [0, 1]


def test_gpt2_style_file_keeps_its_eot(bpe, tmp_path):
    """A byte-level BPE file whose <|endoftext|> is not id 0 (GPT-2's is 50256) keeps that id."""
    spec = json.loads(bpe.to_str())
    spec["added_tokens"][0]["id"] = 299
    vocab = spec["model"]["vocab"]
    top = next(t for t, i in vocab.items() if i == 299)
    vocab[top], vocab[EOT] = 0, 299
    path = tmp_path / "gpt2ish.json"
    path.write_text(json.dumps(spec))
    tok = Tokenizer.from_file(path, kind="file")
    assert tok.eot_id == 299 and tok.kind == "file", tok
    assert tok.decode(tok.encode(ARBITRARY[0])) == ARBITRARY[0]
    assert tok.token_strings(tok.encode(" speak")) == [" speak"], "byte-level labels for file tokenizers too"
