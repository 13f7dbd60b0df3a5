"""One small class over `tokenizers.Tokenizer` for the three kinds the project uses.

    bpe   byte-level BPE trained on the train split: every byte is a token, so any text encodes and
          decodes back exactly
    char  one token per character of the train split, plus <|endoftext|> and <|unk|>; characters never
          seen in training map to <|unk|> with a warning
    file  an existing tokenizer.json (e.g. GPT-2's), which must know <|endoftext|> (it is added if not)

All three save as a plain tokenizer.json, so a checkpoint can carry the string (`to_str` / `from_str`).
A literal "<|endoftext|>" in the input text encodes to the special token, as in the `tokenizers` library.
"""

import json
import sys
import warnings
from pathlib import Path
from typing import Iterable, Optional

import numpy as np
import tokenizers
from tokenizers import Regex, decoders, models, pre_tokenizers, trainers

from data.files import atomic_write

EOT = "<|endoftext|>"
UNK = "<|unk|>"
KINDS = ("bpe", "char", "file")


class Tokenizer:
    def __init__(self, tok: tokenizers.Tokenizer, kind: str):
        if kind not in KINDS:
            raise ValueError(f"tokenizer kind {kind!r} is not one of {', '.join(KINDS)}")
        self._tok = tok
        self.kind = kind
        eot_id = tok.token_to_id(EOT)
        if eot_id is None:
            warnings.warn(f"the tokenizer has no {EOT} token; adding it as a special token", stacklevel=2)
            tok.add_special_tokens([EOT])
            eot_id = tok.token_to_id(EOT)
        self.eot_id: int = eot_id
        self.unk_id: Optional[int] = tok.token_to_id(UNK) if kind == "char" else None
        # Ids may have gaps in hand-written files; the embedding table must cover the largest one.
        self.vocab_size: int = max(tok.get_vocab(with_added_tokens=True).values()) + 1
        self._byte_level = "ByteLevel" in json.dumps(json.loads(tok.to_str()).get("decoder"))
        self._specials = {t.content for t in tok.get_added_tokens_decoder().values()}

    # --- building -------------------------------------------------------------------------------------------------

    @classmethod
    def train_bpe(cls, batches: Iterable[list[str]], vocab_size: int, length: Optional[int] = None) -> "Tokenizer":
        """Byte-level BPE over batches of documents; merges never cross documents. `length`: number of batches."""
        tok = tokenizers.Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[EOT],  # id 0
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes, seen or not
            show_progress=sys.stderr.isatty(),  # its bars print only blank lines into log files
        )
        tok.train_from_iterator(batches, trainer, length=length)
        return cls(tok, "bpe")

    @classmethod
    def train_char(cls, batches: Iterable[list[str]]) -> "Tokenizer":
        """<|endoftext|> = 0, <|unk|> = 1, then the characters of the texts in code-point order."""
        chars: set[str] = set()
        for batch in batches:
            for text in batch:
                chars.update(text)
        vocab = {EOT: 0, UNK: 1}
        for c in sorted(chars):
            vocab.setdefault(c, len(vocab))
        tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token=UNK))
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every code point
        tok.decoder = decoders.Fuse()  # concatenate, no spaces between tokens
        tok.add_special_tokens([EOT, UNK])
        return cls(tok, "char")

    @classmethod
    def from_file(cls, path, kind: Optional[str] = None) -> "Tokenizer":
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"tokenizer file {path} does not exist; give the path of a tokenizer.json (data.tokenizer_file), "
                f"e.g. GPT-2's from the Hugging Face hub"
            )
        return cls.from_str(path.read_text(encoding="utf-8"), kind)

    @classmethod
    def from_str(cls, json_str: str, kind: Optional[str] = None) -> "Tokenizer":
        """`kind` None: char for a word-level model, bpe for byte-level BPE, file otherwise."""
        tok = tokenizers.Tokenizer.from_str(json_str)
        if kind is None:
            spec = json.loads(json_str)
            model = spec.get("model", {}).get("type")
            if model == "WordLevel" and tok.token_to_id(UNK) is not None:
                kind = "char"
            elif model == "BPE" and "ByteLevel" in json.dumps(spec.get("pre_tokenizer")):
                kind = "bpe"
            else:
                kind = "file"
        return cls(tok, kind)

    def to_str(self) -> str:
        return self._tok.to_str()

    def save(self, path) -> None:
        """Write tokenizer.json atomically: a temp file in the same directory, then os.replace."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(path) as f:
            f.write(self._tok.to_str())

    # --- using ----------------------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        ids = self._encode([text])
        self.warn_unknown([text], ids, stacklevel=3)
        return ids[0]

    def encode_batch(self, texts: list[str], warn_unknown: bool = True) -> list[list[int]]:
        ids = self._encode(texts)
        if warn_unknown:
            self.warn_unknown(texts, ids, stacklevel=3)
        return ids

    def _encode(self, texts: list[str]) -> list[list[int]]:
        # add_special_tokens=False: no BOS/EOS templates of a loaded file; documents are separated by the caller.
        return [e.ids for e in self._tok.encode_batch_fast(list(texts), add_special_tokens=False)]

    def warn_unknown(self, texts: Iterable[str], ids: Iterable[Iterable[int]], stacklevel: int = 2) -> int:
        """Char-level only: warn when `ids` (the encoding of `texts`) hold <|unk|>, naming the characters
        missing from the vocabulary. Returns how many characters were unknown."""
        if self.unk_id is None:
            return 0
        count = sum(int(np.count_nonzero(np.asarray(row) == self.unk_id)) for row in ids)
        if count:
            vocab = self._tok.get_vocab()
            unknown = sorted({c for text in texts for c in set(text) if c not in vocab})
            shown = "".join(repr(c)[1:-1] for c in unknown[:40]) + (" ..." if len(unknown) > 40 else "")
            warnings.warn(
                f"{count} character(s) not in the char-level vocabulary were mapped to {UNK} "
                f"({len(unknown)} distinct: {shown})",
                stacklevel=stacklevel,
            )
        return count

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def text_stream(self, prefix_ids: Iterable[int] = ()) -> "TextStream":
        """Text for token ids that arrive one at a time, after `prefix_ids` (see TextStream)."""
        return TextStream(self._tok, prefix_ids)

    def token_strings(self, ids: Iterable[int]) -> list[str]:
        """One readable label per token for attention-map axes: the text that token alone decodes to,
        with newlines/tabs/control characters escaped (\\n, \\t, \\x07) and bytes of a character split
        over several byte-level tokens shown as \\xe2."""
        labels = []
        for i in ids:
            i = int(i)
            token = self._tok.id_to_token(i)
            if token is None:
                labels.append(f"<{i}?>")
            elif self._byte_level and token not in self._specials and all(c in _BYTE_OF_CHAR for c in token):
                raw = bytes(_BYTE_OF_CHAR[c] for c in token)
                labels.append(_visible(raw.decode("utf-8", errors="backslashreplace")))
            elif self.kind == "char" or token in self._specials:
                labels.append(_visible(token))
            else:
                labels.append(_visible(self._tok.decode([i], skip_special_tokens=False)))
        return labels

    def __repr__(self) -> str:
        return f"Tokenizer(kind={self.kind!r}, vocab_size={self.vocab_size}, eot_id={self.eot_id})"


class TextStream:
    """Token ids in, printable text out, one token at a time, with constant work per token.

    With byte-level BPE one character can span several tokens: a piece is handed out only once its last byte
    is in. Uses tokenizers' own DecodeStream (prefilled with the prefix, so the first piece decodes as it would
    after the prompt) where the installed version has it; else the same idea by hand: decode only the few
    tokens since the last piece handed out, with the tokens just before them as context.
    """

    def __init__(self, tok: tokenizers.Tokenizer, prefix_ids: Iterable[int] = ()):
        self._tok = tok
        prefix = [int(i) for i in prefix_ids]
        self._pending: list[int] = []  # ids received but not yet printed (a character still incomplete)
        try:
            from tokenizers.decoders import DecodeStream

            self._stream = DecodeStream(ids=prefix, skip_special_tokens=False)  # tokenizers >= 0.22
        except (ImportError, TypeError):
            self._stream = None
            self._context = prefix[-4:]  # enough for a decoder's leading-space rule to see the seam

    def step(self, token_id: int) -> str:
        """The text this token completes ("" while a character is still incomplete)."""
        token_id = int(token_id)
        if self._stream is not None:
            piece = self._stream.step(self._tok, token_id)
            self._pending = [] if piece is not None else self._pending + [token_id]
            return piece or ""
        self._pending.append(token_id)
        before = self._tok.decode(self._context, skip_special_tokens=False)
        text = self._tok.decode(self._context + self._pending, skip_special_tokens=False)
        if text.endswith("\ufffd") or not text.startswith(before):
            return ""
        self._context, self._pending = (self._context + self._pending)[-4:], []
        return text[len(before):]

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character decodes to U+FFFD)."""
        rest, self._pending = self._pending, []
        return self._tok.decode(rest, skip_special_tokens=False) if rest else ""


def _byte_to_char() -> dict[int, str]:
    """The byte-level alphabet: printable Latin-1 bytes stand for themselves, the other 68 bytes (space,
    control characters, ...) for the code points 256, 257, ... in byte order; so space is Ġ and \\n is Ċ."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


_BYTE_OF_CHAR = {c: b for b, c in _byte_to_char().items()}


def _visible(text: str) -> str:
    out = []
    for c in text:
        if c == "\n":
            out.append("\\n")
        elif c == "\t":
            out.append("\\t")
        elif c == "\r":
            out.append("\\r")
        elif ord(c) < 32 or 0x7F <= ord(c) < 0xA0:
            out.append(f"\\x{ord(c):02x}")
        else:
            out.append(c)
    return "".join(out)
