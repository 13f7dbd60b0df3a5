"""Tokenize a corpus once into a keyed cache directory; later calls with the same settings reuse it.

    <cache_dir>/<name>-<key[:12]>/
        tokenizer.json   the tokenizer (trained on the train split only, for bpe/char)
        train.bin        all train documents' tokens, each document followed by <|endoftext|>
        val.bin          the same for the validation documents
        meta.json        counts, dtype, eot id, the key; written last: a directory without a valid meta.json
                         is not prepared, whatever else it holds, and is cleaned and prepared again

The key hashes everything that changes the result (corpus_fingerprint: file contents or hub id/config/
revision/splits; the validation split; the tokenizer settings; FORMAT_VERSION), never paths of the cache or
the number of processes. Every file is written to a temp name in the same directory and moved into place
with os.replace, so a killed run leaves temp files and no meta.json, never a trusted half-file.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import platform
import shutil
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import numpy as np
import tokenizers
from filelock import FileLock

from data.config import DataConfig
from data.files import atomic_write, fsync_dir
from data.sources import corpus_fingerprint, load_corpus
from data.tokenizer import EOT, Tokenizer

if TYPE_CHECKING:  # read and tokenized in data/sources.py's functions: prepared tokens are reused without it
    import datasets

FORMAT_VERSION = 1  # bump when the layout or content of a prepared directory changes
BATCH = 1000  # documents per tokenizer/map batch


@dataclass
class PreparedData:
    dir: Path
    train_path: Path
    val_path: Path
    tokenizer_path: Path
    meta: dict

    @classmethod
    def open(cls, directory) -> "PreparedData":
        """A prepared directory by path (e.g. the one a checkpoint names); ValueError if it is incomplete."""
        directory = Path(directory)
        meta = _read_valid_meta(directory, key=None)
        if meta is None:
            raise ValueError(f"{directory} is not a prepared data directory (no valid meta.json); run prepare_data")
        return cls(
            dir=directory,
            train_path=directory / "train.bin",
            val_path=directory / "val.bin",
            tokenizer_path=directory / "tokenizer.json",
            meta=meta,
        )

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.meta["dtype"])

    @functools.cached_property
    def tokenizer(self) -> Tokenizer:
        return Tokenizer.from_file(self.tokenizer_path, kind=self.meta["tokenizer"])

    def tokens(self, split: str) -> np.memmap:
        """The token array of "train" or "val", memory-mapped read-only."""
        if split not in ("train", "val"):
            raise ValueError(f"split {split!r} is not one of train, val")
        return load_tokens(self.train_path if split == "train" else self.val_path, self.dtype)


    def held_out(self, part: str) -> "HeldOut":
        """One of the two halves of the validation split that experiments keep apart (attention_lab.claims):
        "choose" (the held-out documents at even positions, 0, 2, ...) is what a choice such as a learning rate
        may read; "test" (positions 1, 3, ...) is scored once and chosen by nothing. Whole documents, so no text
        straddles the two; with a single held-out document, its first and second half."""
        if part not in HELD_OUT_PARTS:
            raise ValueError(f"held-out part {part!r} is not one of {', '.join(HELD_OUT_PARTS)}")
        tokens = np.asarray(self.tokens("val"))
        eot = int(self.meta["eot_id"])
        ends = np.flatnonzero(tokens == eot) + 1  # each document's tokens are followed by the separator
        docs = np.split(tokens, ends[:-1]) if len(ends) else [tokens]
        names = self.meta.get("val_docs") or [f"document {i}" for i in range(len(docs))]
        if len(names) != len(docs):
            names = [f"document {i}" for i in range(len(docs))]
        if len(docs) == 1:
            half = len(tokens) // 2
            docs, names = [tokens[:half], tokens[half:]], [f"{names[0]} (first half)", f"{names[0]} (second half)"]
        which = [i for i in range(len(docs)) if i % 2 == HELD_OUT_PARTS.index(part)]
        part_tokens = np.concatenate([docs[i] for i in which])
        text = self.tokenizer.decode(int(t) for t in part_tokens if t != eot)
        return HeldOut(part, part_tokens, len(text.encode("utf-8")), [names[i] for i in which])


HELD_OUT_PARTS = ("choose", "test")


@dataclass(frozen=True)
class HeldOut:
    """Tokens of one part of the validation split (PreparedData.held_out), with its text's UTF-8 bytes."""

    part: str
    tokens: np.ndarray
    text_bytes: int
    documents: list

    def bits_per_byte(self, total_nats: float, scored: int) -> float:
        """Summed nats over `scored` predicted tokens -> bits per byte of this part's text (each of its tokens,
        separators included, counted as in bits_per_byte below)."""
        return total_nats / scored * len(self.tokens) / self.text_bytes / math.log(2)


def bits_per_byte(loss_nats: float, meta: dict, split: str = "val") -> float:
    """Convert nats per token into bits per UTF-8 byte of the split's text (meta.json's counts), whatever the
    tokenizer."""
    return loss_nats * meta[split]["tokens"] / meta[split]["text_bytes"] / math.log(2)


def load_tokens(path, dtype) -> np.memmap:
    return np.memmap(path, dtype=np.dtype(dtype), mode="r")


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 holds ids 0..65535; larger vocabularies (e.g. 100k) need uint32."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def cache_key(cfg: DataConfig) -> str:
    spec = {"format_version": FORMAT_VERSION, "corpus": corpus_fingerprint(cfg), "tokenizer": _tokenizer_spec(cfg)}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def prepare_data(cfg: DataConfig, log: Callable[[str], None] = print) -> PreparedData:
    """Return the prepared token files for `cfg`, tokenizing the corpus only if no valid cache exists."""
    key = cache_key(cfg)
    out = Path(cfg.cache_dir) / f"{cfg.name}-{key[:12]}"
    locks = Path(cfg.cache_dir) / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    # Several processes (e.g. DDP ranks) may ask at once: one prepares, the others then find its meta.json.
    with FileLock(locks / f"{out.name}.lock"):
        if _read_valid_meta(out, key) is None:
            if out.exists():
                log(f"data: {out} has no valid meta.json (an interrupted run?); preparing it again")
                shutil.rmtree(out)
            try:
                _prepare(cfg, key, out, log)
            except BaseException:
                shutil.rmtree(out, ignore_errors=True)
                raise
        else:
            log(f"data: reusing {out}")
        return PreparedData.open(out)


def _prepare(cfg: DataConfig, key: str, out: Path, log: Callable[[str], None]) -> None:
    start = time.perf_counter()
    out.mkdir()
    corpus = load_corpus(cfg)
    if len(corpus.train) == 0:
        raise ValueError(f"empty corpus: the train split of source={cfg.source} has no documents")
    if len(corpus.val) == 0:
        raise ValueError(f"the validation split of source={cfg.source} has no documents")

    log(f"data: building the {cfg.tokenizer} tokenizer")
    tok = _build_tokenizer(cfg, corpus.train, log)
    tok.save(out / "tokenizer.json")
    dtype = token_dtype(tok.vocab_size)

    work = out / ".work"  # the tokenized Arrow tables, deleted once the .bin files are written
    splits = {}
    for split, docs in (("train", corpus.train), ("val", corpus.val)):
        splits[split] = _write_split(docs, tok, dtype, out / f"{split}.bin", work / split, cfg.num_proc, key)
    shutil.rmtree(work)
    if splits["train"]["documents"] == 0:
        raise ValueError(f"empty corpus: every train document of source={cfg.source} is empty or whitespace")
    if splits["val"]["documents"] == 0:
        raise ValueError(f"the validation documents of source={cfg.source} are all empty or whitespace")
    if tok.kind == "char":  # characters of val that training never saw
        val_texts = (t for batch in corpus.val.iter(batch_size=BATCH) for t in batch["text"])
        splits["val"]["unknown_chars"] = tok.warn_unknown(val_texts, [load_tokens(out / "val.bin", dtype)], 4)

    meta = {
        "format_version": FORMAT_VERSION,
        "key": key,
        "name": cfg.name,
        "source": cfg.source,
        "tokenizer": tok.kind,
        "vocab_size": tok.vocab_size,
        "eot_id": tok.eot_id,
        "eot_token": EOT,
        "dtype": dtype.name,
        "layout": f"each document's tokens followed by {EOT}",
        "train": splits["train"],
        "val": splits["val"],
        "counts_note": (
            "documents: non-empty documents; tokens: all tokens in the .bin file, separators included; "
            "text_bytes: UTF-8 bytes of the documents' text, separators excluded; "
            "bytes_per_token: text_bytes / (tokens - documents), i.e. per text token"
        ),
        "val_docs": corpus.val_names,
        "config": asdict(cfg),
        "prepare_seconds": round(time.perf_counter() - start, 2),
        "versions": {
            "python": platform.python_version(),
            "datasets": metadata.version("datasets"),
            "tokenizers": tokenizers.__version__,
            "numpy": np.__version__,
        },
    }
    with atomic_write(out / "meta.json", "w") as f:  # last: its presence marks the directory complete
        json.dump(meta, f, indent=2)
    fsync_dir(out.parent)  # the folder's own entry: durable across a power loss once this returns

    log(f"data: prepared {out} in {meta['prepare_seconds']:.1f} s ({tok.kind}, vocab {tok.vocab_size}, {dtype.name})")
    for split in ("train", "val"):
        s = splits[split]
        log(
            f"  {split:5s} {s['documents']:>9,} documents {s['text_bytes']:>14,} bytes {s['tokens']:>13,} tokens "
            f"{s['bytes_per_token']:6.2f} bytes/token"
        )


def _tokenizer_spec(cfg: DataConfig) -> dict:
    if cfg.tokenizer == "bpe":
        return {"kind": "bpe", "vocab_size": cfg.vocab_size}
    if cfg.tokenizer == "char":
        return {"kind": "char"}
    path = Path(cfg.tokenizer_file)
    if not path.is_file():
        raise FileNotFoundError(f"data.tokenizer_file={cfg.tokenizer_file!r} does not exist; give a tokenizer.json")
    return {"kind": "file", "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def _build_tokenizer(cfg: DataConfig, train: datasets.Dataset, log: Callable[[str], None]) -> Tokenizer:
    batches = (batch["text"] for batch in train.iter(batch_size=BATCH))
    if cfg.tokenizer == "bpe":
        tok = Tokenizer.train_bpe(batches, cfg.vocab_size, length=-(-len(train) // BATCH))
        if tok.vocab_size < cfg.vocab_size:
            log(f"data: the corpus allows only {tok.vocab_size} of {cfg.vocab_size} BPE tokens")
        return tok
    if cfg.tokenizer == "char":
        return Tokenizer.train_char(batches)
    return Tokenizer.from_file(cfg.tokenizer_file, kind="file")


def _tokenize(batch: dict, tokenizer: Tokenizer, dtype: str) -> dict:
    """A batch of documents -> their token arrays with <|endoftext|> appended; empty documents dropped."""
    texts = [t for t in batch["text"] if t and not t.isspace()]
    ids = tokenizer.encode_batch(texts, warn_unknown=False)  # unknown chars are counted once, after writing
    return {
        "ids": [np.array([*row, tokenizer.eot_id], dtype=dtype) for row in ids],
        "text_bytes": [len(t.encode("utf-8")) for t in texts],
    }


def _write_split(
    docs: datasets.Dataset, tok: Tokenizer, dtype: np.dtype, path: Path, work: Path, num_proc: int, key: str
) -> dict:
    import pyarrow.compute as pc

    if num_proc > 1:
        # The tokenizer already used its thread pool (training); forked workers would warn and go serial anyway.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    work.mkdir(parents=True)
    tokenized = docs.map(
        _tokenize,
        batched=True,
        batch_size=BATCH,
        num_proc=num_proc if num_proc > 1 else None,
        remove_columns=docs.column_names,
        fn_kwargs={"tokenizer": tok, "dtype": dtype.name},
        load_from_cache_file=False,  # this cache is ours (the key); always tokenize afresh
        cache_file_name=str(work / "tokens.arrow"),
        new_fingerprint=f"{key[:16]}-{path.stem}",
        desc=f"tokenizing {path.stem}",
    )
    tokens = text_bytes = 0
    with atomic_write(path, "wb") as f:
        for table in tokenized.with_format("arrow").iter(batch_size=BATCH):
            flat = pc.list_flatten(table["ids"]).to_numpy()
            f.write(flat.astype(dtype, copy=False).tobytes())
            tokens += len(flat)
            text_bytes += pc.sum(table["text_bytes"]).as_py() or 0
    documents = len(tokenized)
    text_tokens = tokens - documents
    return {
        "documents": documents,
        "tokens": tokens,
        "text_bytes": text_bytes,
        "bytes_per_token": round(text_bytes / text_tokens, 4) if text_tokens else None,
    }


def _read_valid_meta(directory: Path, key: Optional[str]) -> Optional[dict]:
    """meta.json if it is complete and matches the files beside it (and `key`, when given), else None."""
    try:
        meta = json.loads((directory / "meta.json").read_text(encoding="utf-8"))
        if meta["format_version"] != FORMAT_VERSION or (key is not None and meta["key"] != key):
            return None
        itemsize = np.dtype(meta["dtype"]).itemsize
        for split in ("train", "val"):
            if (directory / f"{split}.bin").stat().st_size != meta[split]["tokens"] * itemsize:
                return None
        if not (directory / "tokenizer.json").is_file():
            return None
    except (OSError, ValueError, KeyError, TypeError):  # missing, truncated or foreign files
        return None
    return meta
