"""The LSTM baseline (model/lstm.py, model.arch=lstm): sized like the GPT, causal, it learns, and it goes through
train.py (exact resume), sample.py, evaluate and checkpoints like a GPT run; export and the attention-only tools
step aside with one line each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import sample
import train as train_mod
from attention_lab.interop import export as export_cli
from attention_lab.store.checkpoint import load_checkpoint, save_checkpoint
from attention_lab.training import evaluate
from attention_lab.training.config import compose
from attention_lab.training.start import TrainingError, check_resumable
from attention_lab.viewer import page, timeline
from data.tokenizer import Tokenizer
from model import (
    GPT,
    LSTMLM,
    GPTConfig,
    LSTMConfig,
    build_model,
    config_from_dict,
    flops_per_token,
    generate,
    lstm_matching,
    num_params,
)
from model.lstm import lstm_params

SKIP_LINE = "model.arch=lstm has no attention"


def gpt_count(cfg: GPTConfig) -> int:
    """The GPT's parameters as the trainer reports them, counted by hand: every tensor once, no position table."""
    model = GPT(cfg)
    n = sum(p.numel() for p in model.parameters())
    wpe = getattr(model.transformer.wpe, "weight", None)
    return n - (wpe.numel() if wpe is not None else 0)


def lstm_count(cfg: LSTMConfig) -> int:
    return sum(p.numel() for p in LSTMLM(cfg).parameters())


# ------------------------------------------------------------------------------------------------ the model


@pytest.mark.parametrize("which", ["default", "debug", "untied", "learned positions, biases", "deep and narrow"])
def test_matched_lstm_has_the_gpts_parameter_count_within_2_percent(which):
    base = compose([]).model.gpt(vocab_size=4096)  # the default model on the default 4096-token BPE
    cfg = {"default": base,
           "debug": compose(["experiment=debug"]).model.gpt(vocab_size=86),
           "untied": GPTConfig(vocab_size=4096, block_size=64, n_layer=2, n_head=4, n_embd=64, tie_embeddings=False),
           "learned positions, biases": GPTConfig(vocab_size=500, block_size=128, n_layer=3, n_head=2, n_embd=96),
           "deep and narrow": GPTConfig(vocab_size=1000, block_size=32, n_layer=8, n_head=2, n_embd=48)}[which]
    lstm = lstm_matching(cfg)
    want, got = gpt_count(cfg), lstm_count(lstm)
    assert abs(got - want) <= 0.02 * want, (
        f"{which}: the matched LSTM ({lstm.n_layer} x {lstm.n_embd}) has {got:,} parameters, the GPT {want:,} "
        f"({got / want - 1:+.2%}); lstm_matching must size it within 2%")
    for other in (lstm.n_embd - 1, lstm.n_embd + 1):  # the closest width, not just a close one
        n = lstm_count(LSTMConfig(cfg.vocab_size, cfg.block_size, cfg.n_layer, other, 0.0, cfg.tie_embeddings))
        assert abs(n - want) >= abs(got - want), f"{which}: width {other} ({n:,}) is closer to {want:,} than {got:,}"
    assert (lstm.vocab_size, lstm.block_size, lstm.n_layer, lstm.tie_embeddings, lstm.dropout) == (
        cfg.vocab_size, cfg.block_size, cfg.n_layer, cfg.tie_embeddings, cfg.dropout), "not the GPT's other settings"
    assert got == lstm_params(lstm.vocab_size, lstm.n_layer, lstm.n_embd, lstm.tie_embeddings), (
        "lstm_params' formula disagrees with the model's own parameters")
    assert num_params(LSTMLM(lstm)) == got and num_params(GPT(cfg)) == want, "model.num_params counts another way"


def test_default_sizes():
    """The numbers the report quotes: the default GPT (4 x 256, 4096 tokens) and its matched LSTM (4 x 303)."""
    cfg = compose([]).model.gpt(vocab_size=4096)
    lstm = lstm_matching(cfg)
    assert (gpt_count(cfg), lstm.n_embd, lstm_count(lstm)) == (4_196_608, 303, 4_188_672)


def test_later_tokens_never_change_earlier_logits():
    torch.manual_seed(0)
    model = LSTMLM(LSTMConfig(vocab_size=50, block_size=16, n_layer=2, n_embd=24)).eval()
    x = torch.randint(0, 50, (3, 16))
    for t in (0, 7, 15):
        changed = x.clone()
        changed[:, t] = (changed[:, t] + 1) % 50
        a, b = model(x).logits, model(changed).logits
        assert torch.equal(a[:, :t], b[:, :t]), f"changing token {t} changed the logits before it"
        assert not torch.allclose(a[:, t], b[:, t]), f"changing token {t} did not change its own logits"


def test_state_carried_token_by_token_equals_the_whole_window():
    """What generate()'s cache computes (the state carried from call to call) is the full forward pass."""
    torch.manual_seed(0)
    model = LSTMLM(LSTMConfig(vocab_size=30, block_size=12, n_layer=3, n_embd=16)).eval()
    x = torch.randint(0, 30, (2, 12))
    full = model(x).logits
    state = model.new_kv_cache()
    steps = [model(x[:, :5], kv_cache=state).logits] + [model(x[:, [t]], kv_cache=state).logits for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-6,
                               msg="decoding with the carried state differs from the whole window")
    assert state.length == 12
    with pytest.raises(ValueError, match="block_size"):
        model(x[:, :1], kv_cache=state)
    out = [generate(model, x[:, :4], 30, greedy=True, use_cache=c) for c in (True, False)]  # slides past 12
    assert torch.equal(out[0], out[1]), "cached and uncached greedy decoding differ (past block_size too)"


def test_lstm_learns_a_pattern_that_needs_memory():
    """3 1 4 1 5 9 2 6, repeated: after a 1 comes 4 or 5, which only the token before the 1 tells. A model that
    reads one token back cannot go below (2 ln 2) / 8 = 0.17 nats; the LSTM gets there in 50 steps."""
    torch.manual_seed(0)
    model = LSTMLM(LSTMConfig(vocab_size=16, block_size=24, n_layer=1, n_embd=32))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2)
    gen = torch.Generator().manual_seed(0)
    pattern = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    losses = []
    for _ in range(50):
        seq = pattern[(torch.randint(0, 8, (16,), generator=gen)[:, None] + torch.arange(25)) % 8]
        loss = model(seq[:, :-1], seq[:, 1:]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    last = sum(losses[-5:]) / 5
    assert losses[0] > 2.0 and last < 0.1, (
        f"the LSTM did not learn the pattern: loss {losses[0]:.2f} -> {last:.3f} (want < 0.1, below what one "
        "token of context allows)")


def test_config_errors_name_the_field():
    for kwargs, field in (({"n_embd": 0}, "n_embd"), ({"n_layer": 1.5}, "n_layer"), ({"dropout": 1.0}, "dropout"),
                          ({"tie_embeddings": "yes"}, "tie_embeddings"), ({"vocab_size": True}, "vocab_size")):
        with pytest.raises(ValueError, match=f"LSTMConfig.{field}"):
            LSTMConfig(**kwargs)
    with pytest.raises(ValueError, match="model.arch"):
        compose(["model.arch=rnn"])
    with pytest.raises(ValueError, match="model.lstm_hidden"):
        compose(["model.lstm_hidden=-1"])
    with pytest.raises(ValueError, match="model.arch=lstm"):
        compose(["model.lstm_hidden=64"])  # the width of an LSTM the run does not train
    with pytest.raises(ValueError, match="no attention"):
        LSTMLM(LSTMConfig(vocab_size=10, block_size=4, n_layer=1, n_embd=4))(torch.zeros(1, 2, dtype=torch.long),
                                                                           return_attention=True)


def test_the_model_section_picks_the_network():
    section = compose(["experiment=debug", "model.arch=lstm"]).model
    assert section.network(86) == lstm_matching(section.gpt(vocab_size=86))
    wide = compose(["experiment=debug", "model.arch=lstm", "model.lstm_hidden=64"]).model.network(86)
    assert (wide.n_embd, wide.n_layer, wide.block_size, wide.vocab_size) == (64, 2, 32, 86)
    gpt = compose(["experiment=debug"]).model.network(86)
    assert type(gpt) is GPTConfig and gpt == section.gpt(vocab_size=86), "arch=gpt must hand down a plain GPTConfig"


def test_checkpoint_saves_and_reloads_the_lstm(tmp_path):
    torch.manual_seed(0)
    tok = Tokenizer.train_char([["to be or not to be"]])
    for tie in (True, False):
        model = LSTMLM(LSTMConfig(vocab_size=tok.vocab_size, block_size=8, n_layer=2, n_embd=12, tie_embeddings=tie))
        save_checkpoint(tmp_path / f"tie{tie}" / "checkpoints", 3, model, tok.to_str(), {"val_loss": 1.0})
        ckpt = load_checkpoint(tmp_path / f"tie{tie}")
        assert ckpt.config == model.config, f"the checkpoint's config came back as {ckpt.config!r}"
        again = ckpt.build_model()
        assert type(again) is LSTMLM, f"an LSTM checkpoint reloaded as {type(again).__name__}"
        x = torch.randint(0, tok.vocab_size, (2, 8))
        assert torch.equal(again(x).logits, model.eval()(x).logits), f"tie_embeddings={tie}: other logits"
    saved = json.loads((ckpt.path / "model_config.json").read_text())
    assert saved["arch"] == "lstm", saved
    gpt = GPTConfig(vocab_size=9, block_size=8, n_layer=1, n_head=1, n_embd=8)
    assert "arch" not in gpt.to_dict() and config_from_dict(gpt.to_dict()) == gpt, "GPT configs are unchanged"
    assert type(build_model(gpt)) is GPT
    with pytest.raises(ValueError, match="unknown model arch"):
        config_from_dict({"arch": "rnn"})


def test_resume_refuses_the_other_network_or_width():
    gpt = GPTConfig(vocab_size=86, block_size=32, n_layer=2, n_head=2, n_embd=32)
    lstm = lstm_matching(gpt)
    with pytest.raises(TrainingError, match="model.arch: checkpoint 'gpt', config 'lstm'"):
        check_resumable(gpt, lstm, Path("ckpt"))
    with pytest.raises(TrainingError, match="n_embd: checkpoint"):
        check_resumable(lstm, LSTMConfig(86, 32, 2, lstm.n_embd + 1), Path("ckpt"))
    check_resumable(lstm, LSTMConfig(86, 32, 2, lstm.n_embd, dropout=0.1), Path("ckpt"))  # dropout: no shape


def test_flops_per_token_is_six_n_without_an_attention_term():
    cfg = LSTMConfig(vocab_size=100, block_size=64, n_layer=2, n_embd=32)
    n = num_params(LSTMLM(cfg))
    assert flops_per_token(cfg, n) == 6 * n and flops_per_token(cfg, n, training=False) == 2 * n
    gpt = GPTConfig(vocab_size=100, block_size=64, n_layer=2, n_head=2, n_embd=32)
    assert flops_per_token(gpt, 1000) == 6 * 1000 + 12 * 2 * 32 * 64, "the GPT's count must not change"


# ------------------------------------------------------------------------------- a debug run, end to end

COMMON = ("model.arch=lstm", "train.log_interval=1", "optim.decay_steps=20")


def lstm_config(cache: Path, *overrides: str):
    return compose(["experiment=debug", f"data.cache_dir={cache}", *COMMON, *overrides])


def train_losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


@pytest.fixture(scope="module")
def lstm_run(tmp_path_factory, data_cache):
    run_dir = tmp_path_factory.mktemp("lstm_run")
    final = train_mod.train(lstm_config(data_cache), run_dir)
    return run_dir, final


def test_debug_run_trains_an_lstm_and_skips_the_attention_tools(lstm_run):
    run_dir, final = lstm_run
    assert final["step"] == 20, final
    losses = train_losses(run_dir)
    assert losses[20] < losses[1], f"the LSTM's loss did not fall: {losses[1]:.3f} -> {losses[20]:.3f}"
    ckpt = load_checkpoint(run_dir, "latest")
    assert type(ckpt.config) is LSTMConfig and type(ckpt.build_model()) is LSTMLM, "the run did not train an LSTM"
    assert ckpt.config == lstm_matching(compose(["experiment=debug"]).model.gpt(vocab_size=ckpt.config.vocab_size))
    console = (run_dir / "console.log").read_text()
    assert console.count(SKIP_LINE) == 1, f"one line should say what the LSTM skips:\n{console}"
    assert "an LSTM: 2 layers x" in console, console
    assert not (run_dir / "attention").exists() and not (run_dir / "attention.html").exists(), (
        "an LSTM run wrote attention files")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert not any("heads" in r or "probe_first_loss" in r for r in rows), "head roles were measured"
    assert json.loads((run_dir / "config.json").read_text())["model"]["arch"] == "lstm"


def test_mfu_counts_six_n_flops_per_token(lstm_run):
    run_dir, _ = lstm_run
    n = sum(p.numel() for p in load_checkpoint(run_dir, "latest").build_model().parameters())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    peak = compose(["experiment=debug"]).train.peak_flops
    for r in (r for r in rows if "mfu" in r):
        assert r["mfu"] == pytest.approx(r["tokens_per_s"] * 6 * n / peak, rel=1e-9), (
            f"step {r['step']}: MFU {r['mfu']} is not tokens/s x 6N / peak")


def test_resume_reproduces_the_uninterrupted_lstm_run(lstm_run, tmp_path, data_cache):
    full_dir, _ = lstm_run
    split_dir = tmp_path / "split"
    train_mod.train(lstm_config(data_cache, "train.max_steps=10"), split_dir)
    train_mod.train(lstm_config(data_cache), split_dir)  # the same folder: resumes from its step-10 checkpoint
    full, split = train_losses(full_dir), train_losses(split_dir)
    for step in range(11, 21):
        assert split[step] == full[step], (
            f"step {step}: resumed LSTM loss {split[step]!r} != uninterrupted {full[step]!r}; something the run "
            "depends on is not saved or restored")


def test_sample_generates_from_the_lstm_run_and_writes_no_maps(lstm_run, capsys):
    run_dir, _ = lstm_run
    texts = []
    for cache in ([], ["--no-cache"]):
        rc = sample.main(["--run", str(run_dir), "--prompt", "ROMEO:", "--max-new-tokens", "60", "--greedy", *cache])
        out, err = capsys.readouterr()
        assert rc == 0, err
        assert out.startswith("ROMEO:") and len(out) > len("ROMEO:\n"), out
        assert "LSTM, 2 layers" in err and err.count("no attention maps") == 1, err
        texts.append(out)
    assert texts[0] == texts[1], "cached and uncached greedy text differ (60 tokens: past the 32-token context)"
    assert not (run_dir / "samples").exists(), "sample.py wrote attention files for an LSTM"


def test_evaluate_scores_the_lstm_with_the_same_bits_per_byte(lstm_run, tmp_path, capsys):
    run_dir, final = lstm_run
    out = tmp_path / "score.json"
    assert evaluate.main([str(run_dir), "--json", str(out), "--batch-size", "256"]) == 0
    score = json.loads(out.read_text())
    assert f"{score['bits_per_byte']:.4f} bits/byte" in capsys.readouterr().out
    assert score["bits_per_byte"] == pytest.approx(final["val_bpb"], rel=0.1), (score, final)
    # split_nats on whole windows equals the model's own mean loss over them, computed here
    model = load_checkpoint(run_dir).build_model()
    tokens = torch.arange(3 * 32 + 1) % 50
    total, count = evaluate.split_nats(model, tokens.numpy(), batch_size=2)
    windows = tokens[:-1].view(3, 32), tokens[1:].view(3, 32)
    with torch.no_grad():
        by_hand = F.cross_entropy(model(windows[0]).logits.flatten(0, 1), windows[1].flatten(), reduction="sum")
    assert count == 96 and total == pytest.approx(by_hand.item(), rel=1e-6), (total, by_hand.item())


def test_export_refuses_the_lstm_run(lstm_run, tmp_path, capsys):
    run_dir, _ = lstm_run
    assert export_cli.main([str(run_dir), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: LSTM runs cannot be exported to transformers") and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists(), "a refused export wrote a folder"


def test_the_film_and_the_role_timeline_refuse_the_lstm_run_in_one_line(lstm_run, capsys):
    run_dir, _ = lstm_run
    for main in (page.main, timeline.main):
        assert main([str(run_dir)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error:") and "LSTM" in err and err.count("\n") == 1, err
