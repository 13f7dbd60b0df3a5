"""DataConfig: which corpus, how to split it, how to tokenize it, where to cache the result.

A plain dataclass (no unions but Optional) so that it can be registered as a Hydra structured-config schema;
every key of configs/data/*.yaml is a field here.
"""

from dataclasses import dataclass, field
from typing import Optional

SOURCES = ("shakespeare", "hub", "text", "recall")
TOKENIZERS = ("bpe", "char", "file")

# Held out from the 42 Shakespeare works when `val_docs` is empty: one tragedy, one comedy, one history and
# one romance, 459,824 of 5,057,198 bytes (9.1%). Whole plays, so no scene is split between train and val.
SHAKESPEARE_VAL_DOCS = ("julius_caesar", "twelfth_night", "richard_ii", "tempest")

# Byte-level BPE starts from all 256 byte tokens plus <|endoftext|>.
MIN_BPE_VOCAB = 257


@dataclass
class DataConfig:
    # --- where the text comes from --------------------------------------------------------------------------------
    source: str = "shakespeare"  # shakespeare | hub | text | recall
    name: str = "shakespeare"  # label for the cache directory and meta.json

    # source=hub: anything `datasets.load_dataset` takes. `path` is a hub id (roneneldan/TinyStories) or a
    # builder name (parquet, json, csv, text) used with `data_files` for local files.
    path: Optional[str] = None
    config_name: Optional[str] = None
    data_files: list[str] = field(default_factory=list)  # files/globs of the train split (local builders)
    val_data_files: list[str] = field(default_factory=list)  # files/globs of `val_split` (local builders)
    revision: Optional[str] = None  # pin a hub commit; without it the cache cannot see upstream changes
    train_split: str = "train"
    val_split: Optional[str] = None  # None: hold documents out of the train split (val_fraction)
    text_field: str = "text"
    streaming: bool = False  # read only the first max_*_docs documents instead of downloading everything
    max_train_docs: Optional[int] = None
    max_val_docs: Optional[int] = None
    # When set, consecutive rows are joined into one document and a row matching this regex starts the
    # next one (wikitext: one row per paragraph, articles start with " = Title = ").
    doc_start_regex: Optional[str] = None

    # source=text: paths, globs or directories (all *.txt below it); one document per file.
    files: list[str] = field(default_factory=list)

    # source=recall: the delayed-copy task of data/recall.py, generated (a block of random letters, then the same
    # block: the copy needs the token `distance` back), one example a document, always the char tokenizer.
    distance: int = 0  # how far back the copied token is (>= 1 for source=recall)
    recall_task: str = "copy"  # copy: a block of d letters, then the same block; item: one letter recalled d later
    symbols: int = 16  # how many letters the blocks draw from (2-26)
    train_tokens: int = 1_000_000  # about this many training characters, in whole examples of 2 * distance + 1
    val_examples: int = 256  # held-out examples (even ones the "choose" part, odd ones the "test" part)

    # --- validation split (used when val_split is None) -----------------------------------------------------------
    # Document names to hold out: Shakespeare work names (julius_caesar) or, for source=text, file stems.
    # Empty: Shakespeare holds out SHAKESPEARE_VAL_DOCS, other sources use val_fraction.
    val_docs: list[str] = field(default_factory=list)
    # Share of documents held out, spread evenly over the corpus (no randomness). A single document is
    # split instead: its last val_fraction of lines becomes the validation text.
    val_fraction: float = 0.1

    # --- tokenizer ------------------------------------------------------------------------------------------------
    tokenizer: str = "bpe"  # bpe (trained on the train split) | char | file (an existing tokenizer.json)
    vocab_size: int = 4096  # bpe only: target size including the 256 byte tokens and <|endoftext|>
    tokenizer_file: Optional[str] = None  # tokenizer=file: path of a tokenizer.json (e.g. GPT-2's)

    # --- execution ------------------------------------------------------------------------------------------------
    num_proc: int = 1  # processes for tokenizing
    cache_dir: str = "cache/data"  # relative to the current working directory

    def __post_init__(self):
        _one_of("source", self.source, SOURCES)
        _one_of("tokenizer", self.tokenizer, TOKENIZERS)
        if not self.name or any(c in self.name for c in "/\\:") or self.name.startswith("."):
            raise ValueError(
                f"data.name={self.name!r} is used as a directory name: give a non-empty name without '/', '\\', "
                f"':' or a leading '.'"
            )
        if self.source == "hub" and not self.path:
            raise ValueError(
                "data.path is required for source=hub: a hub id such as roneneldan/TinyStories, or a builder "
                "name such as parquet/json/text together with data.data_files"
            )
        if self.source != "hub" and (self.path or self.data_files or self.streaming):
            raise ValueError(
                f"data.path, data.data_files and data.streaming are for source=hub, not source={self.source}"
            )
        if self.val_split is not None and self.source != "hub":
            raise ValueError(f"data.val_split is for source=hub; source={self.source} holds out val_docs/val_fraction")
        if self.val_data_files and (not self.data_files or self.val_split is None):
            raise ValueError("data.val_data_files needs data.data_files and data.val_split (the split it names)")
        if self.streaming and self.max_train_docs is None:
            raise ValueError("data.streaming=true needs data.max_train_docs (how many documents to read)")
        for key in ("max_train_docs", "max_val_docs"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ValueError(f"data.{key}={value} must be None (no cap) or >= 1")
        if self.val_docs and self.source == "hub":
            raise ValueError(
                "data.val_docs names documents of source=shakespeare or source=text; for source=hub use "
                "data.val_split or data.val_fraction"
            )
        if self.val_split is not None and self.val_split == self.train_split:
            raise ValueError(f"data.val_split must differ from data.train_split (both {self.train_split!r})")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"data.val_fraction={self.val_fraction} must be in (0, 1)")
        if not self.text_field:
            raise ValueError("data.text_field must name a column")
        if self.tokenizer == "bpe" and self.vocab_size < MIN_BPE_VOCAB:
            raise ValueError(
                f"data.vocab_size={self.vocab_size} is too small for byte-level BPE: it needs at least "
                f"{MIN_BPE_VOCAB} (256 bytes + <|endoftext|>)"
            )
        if self.tokenizer == "file" and not self.tokenizer_file:
            raise ValueError("data.tokenizer=file needs data.tokenizer_file (the path of a tokenizer.json)")
        if self.num_proc < 1:
            raise ValueError(f"data.num_proc={self.num_proc} must be >= 1")
        self._check_recall()

    def _check_recall(self) -> None:
        if self.source != "recall":
            if self.distance:
                raise ValueError(f"data.distance={self.distance} is for source=recall (the delayed-copy task), not "
                                 f"source={self.source}")
            return
        if isinstance(self.distance, bool) or not isinstance(self.distance, int) or self.distance < 1:
            raise ValueError(f"data.distance={self.distance!r} must be an integer >= 1 for source=recall: how far "
                             "back the copied token is, e.g. data.distance=64 (and model.block_size >= 128 to see it)")
        if not 2 <= self.symbols <= 26:
            raise ValueError(f"data.symbols={self.symbols} must be in 2-26 (the letters a-z)")
        if self.recall_task not in ("copy", "item"):
            raise ValueError(f"data.recall_task={self.recall_task!r} must be copy or item")
        if self.recall_task == "item" and (self.distance < 2 or self.symbols > 24):
            raise ValueError(f"data.recall_task=item needs data.distance >= 2 (the item, then the marker) and "
                             f"data.symbols <= 24 (a filler letter and the marker left), got {self.distance} and "
                             f"{self.symbols}")
        length = self.distance + 2 if self.recall_task == "item" else 2 * self.distance + 1
        if self.train_tokens < length:
            raise ValueError(f"data.train_tokens={self.train_tokens} holds no example of {length} "
                             f"tokens at data.distance={self.distance}")
        if self.val_examples < 2:
            raise ValueError(f"data.val_examples={self.val_examples} must be >= 2 (one for each held-out part)")
        if self.tokenizer != "char":
            raise ValueError(f"source=recall reads one token a letter: data.tokenizer=char, not {self.tokenizer}")
        if self.files or self.val_docs:
            raise ValueError("source=recall generates its examples and holds out its own: leave data.files and "
                             "data.val_docs empty")

    @property
    def resolved_val_docs(self) -> list[str]:
        """The document names held out when no val_split is given (empty: use val_fraction)."""
        if self.val_docs:
            return list(self.val_docs)
        return list(SHAKESPEARE_VAL_DOCS) if self.source == "shakespeare" else []


def _one_of(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"data.{key}={value!r} is not one of {', '.join(allowed)}")
