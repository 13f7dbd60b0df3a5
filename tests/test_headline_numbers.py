"""The numbers a person acts on, pinned against references computed here from first principles:

- bits per byte of a split: nats per token -> bits per UTF-8 byte, with the token and byte counts taken from the
  split's own text (not from meta.json), for the formula, for what prepare writes and for what train.py and
  `python -m attention_lab.evaluate` report;
- which checkpoint is "best": best.json (what sample.py and evaluate load by default) names the evaluation with
  the lowest validation loss, also when the loss goes back up, after pruning and across a resume.

The third hole (the weights a person reads on the page equal attention.npy) is in tests/test_viewer.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import train as train_mod
from attention_lab.store.checkpoint import load_checkpoint
from attention_lab.store.layout import RunLayout
from attention_lab.training.config import compose
from attention_lab.training.evaluate import score_run
from data.prepare import bits_per_byte, prepare_data

# three documents with multi-byte characters (so characters != bytes) and a held-out pair (so separators matter)
DOCS = {
    "alpha": "Thé quick brown fox — jumps over the lazy dog.\n" * 30,
    "beta": "Naïve café owners sell crème brûlée; ☃ snow falls.\n" * 12,
    "gamma": "日本語のテキストも少し。 And some English after it.\n" * 10,
}
VAL = ("beta", "gamma")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    for name, text in DOCS.items():
        (folder / f"{name}.txt").write_text(text, encoding="utf-8")
    return folder


def text_config(corpus: Path, cache: Path, *overrides: str):
    return compose(["experiment=debug", "data=text", f"data.files=[{corpus}]", "data.name=pinned",
                    f"data.val_docs=[{','.join(VAL)}]", "data.tokenizer=bpe", "data.vocab_size=300",
                    f"data.cache_dir={cache}", "model.block_size=16", *overrides])


def independent_counts(tokenizer) -> tuple[int, int]:
    """(tokens, UTF-8 bytes) of the validation split from its documents themselves: each document's own token
    count plus the one separator before it; the bytes of the text, separators not counted."""
    tokens = sum(len(tokenizer.encode(DOCS[name])) + 1 for name in VAL)
    return tokens, sum(len(DOCS[name].encode("utf-8")) for name in VAL)


def test_bits_per_byte_of_a_split_from_its_own_text(corpus, tmp_path):
    data = prepare_data(text_config(corpus, tmp_path).data, log=lambda *_: None)
    tokens, n_bytes = independent_counts(data.tokenizer)
    assert len(data.tokens("val")) == tokens, "val.bin should hold each held-out document's tokens and one separator"
    assert n_bytes != sum(len(DOCS[n]) for n in VAL), "fixture: bytes and characters must differ"
    for nats in (0.5, 2.0, 3.7):
        want = nats * tokens / n_bytes / math.log(2)
        got = bits_per_byte(nats, data.meta, "val")
        assert got == pytest.approx(want, rel=1e-9), (
            f"{nats} nats/token over {tokens} tokens of {n_bytes} UTF-8 bytes is {want:.6f} bits/byte, "
            f"bits_per_byte says {got:.6f}: check meta.json's tokens/text_bytes and the formula in data/prepare.py")


def test_train_and_evaluate_report_bits_per_byte_of_the_held_out_text(corpus, tmp_path):
    run = tmp_path / "run"
    cfg = text_config(corpus, tmp_path / "cache", "train.max_steps=4", "train.eval_interval=4",
                      "train.sample_tokens=0", "train.head_roles=false", "train.film=false")
    train_mod.train(cfg, run)
    data = prepare_data(cfg.data, log=lambda *_: None)
    tokens, n_bytes = independent_counts(data.tokenizer)
    last = [json.loads(line) for line in RunLayout(run).metrics.read_text().splitlines() if "val_loss" in line][-1]
    assert last["val_bpb"] == pytest.approx(last["val_loss"] * tokens / n_bytes / math.log(2), rel=1e-9), (
        f"train.py's val_bpb {last['val_bpb']} is not its val_loss {last['val_loss']} in bits per byte of the "
        f"validation text ({tokens} tokens, {n_bytes} bytes)")

    # the whole split scored once, by hand, as attention_lab.evaluate defines it: full windows of block_size
    # targets at 0, T, 2T, ...; the rest of the targets (if any) from one window that ends at the split's end
    ckpt = load_checkpoint(run, "best")
    model = ckpt.build_model("cpu").float()
    ids = torch.as_tensor(np.asarray(data.tokens("val"), dtype=np.int64))
    n, block = len(ids), ckpt.config.block_size
    plan = [(s, s + 1) for s in range(0, n - block, block)]  # (window start, first target it scores)
    covered = plan[-1][0] + block  # targets 1..covered scored so far
    if covered < n - 1:
        plan.append((n - block - 1, covered + 1))
    total, count = 0.0, 0
    with torch.no_grad():
        for start, first in plan:
            logits = model(ids[start : start + block][None]).logits[0].float()  # position p predicts start+p+1
            targets = torch.arange(first, start + block + 1)
            total += F.cross_entropy(logits[targets - start - 1], ids[targets], reduction="sum").item()
            count += len(targets)
    assert count == tokens - 1, "every token but the first is a target once"
    want = total / count * tokens / n_bytes / math.log(2)
    score = score_run(run, which="best")
    assert score.bits_per_byte == pytest.approx(want, rel=2e-4), (
        f"attention_lab.evaluate says {score.bits_per_byte:.5f} bits/byte, the held-out text scored by hand "
        f"gives {want:.5f}")
    # --split train converts with the training text's own counts (the one training document and its separator)
    train_tokens = len(data.tokenizer.encode(DOCS["alpha"])) + 1
    train_bytes = len(DOCS["alpha"].encode("utf-8"))
    on_train = score_run(run, which="best", split="train")
    assert on_train.tokens == train_tokens - 1 and on_train.bytes == train_bytes, (on_train, train_tokens)
    assert on_train.bits_per_byte == pytest.approx(
        on_train.nats_per_token * train_tokens / train_bytes / math.log(2), rel=1e-9), (
        "evaluate --split train must turn nats into bits per byte with the training split's tokens and bytes")


SCRIPT = [3.0, 2.0, 2.5, 2.7]  # validation losses of four evaluations: the best is the second, then it rises


def scripted_losses(monkeypatch, losses: list[float]):
    seen = iter(losses)
    monkeypatch.setattr(train_mod, "validation_loss", lambda *args, **kw: next(seen))


def test_best_checkpoint_is_the_lowest_validation_loss(tmp_path, data_cache, monkeypatch):
    run = tmp_path / "run"
    base = ["experiment=debug", f"data.cache_dir={data_cache}", "train.eval_interval=2", "train.sample_tokens=0",
            "train.head_roles=false", "train.film=false", "train.keep_checkpoints=1"]
    scripted_losses(monkeypatch, SCRIPT[:2])
    train_mod.train(compose([*base, "train.max_steps=4"]), run)
    scripted_losses(monkeypatch, SCRIPT[2:])  # resumed: the loss goes back up
    train_mod.train(compose([*base, "train.max_steps=8"]), run)
    best = load_checkpoint(run, "best")
    assert (best.step, best.meta["val_loss"]) == (4, 2.0), (
        f"best.json should name step 4 (val loss 2.0, the lowest of {SCRIPT}), names step {best.step} "
        f"with {best.meta.get('val_loss')}")
    pointer = json.loads(RunLayout(run).pointer("best").read_text())
    assert pointer["step"] == 4 and pointer["val_loss"] == 2.0, pointer
    assert load_checkpoint(run, "latest").step == 8
    steps = sorted(p.name for p in RunLayout(run).checkpoints.glob("step_*"))
    assert steps == ["step_00000004", "step_00000008"], f"pruning keeps the latest and the best: {steps}"
    # which checkpoint it opens, not its score: the whole val split of the shared corpus took 20 s to score
    import attention_lab.training.evaluate as evaluate_mod

    monkeypatch.setattr(evaluate_mod, "split_nats", lambda model, tokens, *a, **kw: (1.0, 1))
    assert score_run(run).step == 4, "attention_lab.evaluate scores the best checkpoint by default"
