"""Tests that fail on bugs a weaker suite let through (issue: "close the holes that planted bugs slipped through").

Each test names the planted bug it catches. They compare the model with independent references, not with itself.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

import train as train_mod
from attention_lab.training.config import compose
from model import GPT, GPTConfig


def reference_rope(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotate-half RoPE in float64, written from the formula: pair (i, i + hs/2) rotated by pos * base^(-2i/hs)."""
    t, hs = x.shape[-2], x.shape[-1]
    half = hs // 2
    freq = base ** (-torch.arange(half, dtype=torch.float64) * 2 / hs)  # (hs/2,)
    angle = torch.arange(t, dtype=torch.float64)[:, None] * freq[None, :]  # (T, hs/2)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin()], dim=-1)


@pytest.mark.parametrize("qk_norm", [False, True])
def test_layer0_attention_of_a_rope_model_equals_an_independent_reference(qk_norm):
    """Planted bug: the `pe.rotate` line removed from attention (RoPE never applied)."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=32, bias=False, pos_encoding="rope",
                    qk_norm=qk_norm)
    model = GPT(cfg).eval()
    idx = torch.randint(50, (1, 12))
    got = model(idx, return_attention=True).attentions[0][0].double()  # (nh, T, T)

    block = model.transformer.h[0]
    x = block.ln_1(model.transformer.wte(idx)).double()[0]  # (T, C); RoPE adds nothing to the embeddings
    qkv = x @ block.attn.c_attn.weight.double().T  # (T, 3C)
    q, k, _ = qkv.split(cfg.n_embd, dim=-1)
    hs = cfg.head_size
    q = q.view(-1, cfg.n_head, hs).transpose(0, 1)  # (nh, T, hs)
    k = k.view(-1, cfg.n_head, hs).transpose(0, 1)
    if qk_norm:
        q = q / q.pow(2).mean(-1, keepdim=True).add(torch.finfo(torch.float32).eps).sqrt()
        k = k / k.pow(2).mean(-1, keepdim=True).add(torch.finfo(torch.float32).eps).sqrt()
    scores = reference_rope(q) @ reference_rope(k).transpose(-1, -2) / math.sqrt(hs)
    t = idx.size(1)
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    expected = scores.softmax(-1)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4,
                               msg="layer-0 attention differs from softmax(rot(q) rot(k)^T / sqrt(hs)): "
                                   "is RoPE applied to q and k inside attention?")


@pytest.mark.parametrize("pos_encoding, tells_apart", [("rope", True), ("learned", True), ("alibi", True),
                                                         ("sinusoidal", True), ("none", False)])
def test_a_model_with_positions_tells_orders_apart_and_one_without_cannot(pos_encoding, tells_apart):
    """Planted bug: positions computed but never used. Without positions, one layer of causal attention at the
    last token is a function of the *set* of earlier tokens: permuting them cannot change its output. (With two
    layers a causal model can infer order from prefix lengths, so the test uses one.)"""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=1, n_head=2, n_embd=32,
                          pos_encoding=pos_encoding)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(10)  # sharper attention, so that order effects are large
    idx = torch.randint(50, (1, 10))
    shuffled = torch.cat([idx[:, :-1][:, torch.randperm(9)], idx[:, -1:]], dim=1)
    a = model(idx).logits[0, -1]
    b = model(shuffled).logits[0, -1]
    diff = (a - b).abs().max().item()
    if tells_apart:
        assert diff > 1e-3, f"{pos_encoding}: reordering earlier tokens did not change the last logits ({diff})"
    else:
        assert diff < 1e-4, f"none: the last position must not see token order ({diff})"


def test_resume_is_exact_with_dropout_on(tmp_path, data_cache):
    """Planted bug: the torch RNG state not restored on resume (invisible with dropout 0)."""
    common = ["experiment=debug", f"data.cache_dir={data_cache}", "model.dropout=0.2", "optim.decay_steps=20",
              "train.log_interval=1", "train.head_roles=false", "train.sample_tokens=0"]
    train_mod.train(compose(common), tmp_path / "full")
    train_mod.train(compose(common + ["train.max_steps=10"]), tmp_path / "split")
    train_mod.train(compose(common), tmp_path / "split")

    def losses(run):
        return {r["step"]: r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
                if "loss" in r}

    full, split = losses(tmp_path / "full"), losses(tmp_path / "split")
    assert [split[s] for s in range(11, 21)] == [full[s] for s in range(11, 21)], \
        "with dropout on, the resumed run must draw the same dropout masks: is torch's RNG state restored?"



def test_a_resume_trains_with_this_runs_dropout_backend_and_qk_norm(tmp_path, data_cache):
    """Settings that leave the weights' shapes alone may change on resume (docs/training.md; start.py: "this
    run's dropout, backend and attention, the checkpoint's weights"): the resumed model uses them, as config.json
    records. Planted bug: resume_ignores_this_runs_config (the checkpoint's own settings, silently)."""
    from attention_lab.training.start import load_model, resolve_model_config
    from data.prepare import prepare_data

    common = ["experiment=debug", f"data.cache_dir={data_cache}", "train.eval_interval=2", "train.sample_tokens=0",
              "train.head_roles=false"]
    run = tmp_path / "run"
    before = compose(common + ["train.max_steps=2", "model.dropout=0.0", "model.attn_backend=sdpa"])
    train_mod.train(before, run)
    changed = {"dropout": 0.1, "attn_backend": "math", "qk_norm": not before.model.qk_norm}
    cfg = compose(common + ["train.max_steps=4", *(f"model.{k}={str(v).lower()}" for k, v in changed.items())])
    data = prepare_data(cfg.data, log=lambda *a: None)
    model, model_cfg, state, _ = load_model(cfg, resolve_model_config(cfg, data), data, run, say=lambda *a: None)
    assert state is not None and state["step"] == 2, "a control: this must be a resume"
    for name, value in changed.items():
        assert getattr(model_cfg, name) == value, f"config.json would record {name}={getattr(model_cfg, name)!r}"
        assert getattr(model.config, name) == value, \
            f"the resumed model runs the checkpoint's {name}={getattr(model.config, name)!r}, not this run's {value!r}"
    attn = model.transformer.h[0].attn
    assert (attn.dropout_p, attn.backend, attn.qk_norm) == (0.1, "math", changed["qk_norm"])

def test_init_from_really_starts_from_the_source_weights(tmp_path, data_cache):
    """Planted bug: init_from builds a fresh model of the source's shape instead of loading its weights."""
    from attention_lab.interop.hf import export_gpt2
    from attention_lab.store.checkpoint import load_checkpoint
    from data.prepare import prepare_data

    cfg = compose(["experiment=debug", f"data.cache_dir={data_cache}"])
    vocab = prepare_data(cfg.data, log=lambda *a: None).meta["vocab_size"]
    torch.manual_seed(5)
    source = GPT(GPTConfig(vocab_size=vocab, block_size=32, n_layer=1, n_head=2, n_embd=16, pos_encoding="learned"))
    folder = export_gpt2(source, tmp_path / "tiny-gpt2")
    # a learning rate of ~0 and no decay: after two steps the weights are still the source's
    run = tmp_path / "run"
    train_mod.train(compose(["experiment=debug", f"data.cache_dir={data_cache}", f"train.init_from={folder}",
                             "optim.lr=1e-12", "optim.min_lr=0", "optim.weight_decay=0", "train.max_steps=2",
                             "train.eval_interval=2", "train.sample_tokens=0", "train.head_roles=false"]), run)
    trained = load_checkpoint(run, "latest").build_model()
    for name, p in source.state_dict().items():
        torch.testing.assert_close(trained.state_dict()[name], p, atol=1e-6, rtol=0,
                                   msg=f"{name} is not the source's: init_from did not load the weights")


def test_sampling_flags_reach_the_sampler(tmp_path, data_cache, monkeypatch):
    """Planted bug: --temperature / --top-k / --top-p parsed but not passed on."""
    import sample
    from attention_lab import sampling

    run = tmp_path / "run"
    train_mod.train(compose(["experiment=debug", f"data.cache_dir={data_cache}", "train.max_steps=2",
                             "train.eval_interval=2", "train.sample_tokens=0", "train.head_roles=false"]), run)
    seen = {}
    real = sampling.generate_stream

    def spy(model, idx, max_new_tokens, **kw):
        seen.update(kw)
        yield from real(model, idx, max_new_tokens, **kw)

    monkeypatch.setattr(sampling, "generate_stream", spy)
    code = sample.main(["--run", str(run), "--prompt", "To be", "--max-new-tokens", "3", "--temperature", "0.55",
                        "--top-k", "7", "--top-p", "0.85", "--seed", "1", "--no-attention"])
    assert code == 0
    assert (seen["temperature"], seen["top_k"], seen["top_p"]) == (0.55, 7, 0.85), seen


def test_every_planted_bug_still_targets_real_code():
    """tests/mutations.py refuses a stale entry at run time; this keeps the list honest in every test run too."""
    import importlib.util
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("mutations", root / "tests" / "mutations.py")
    mutations = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mutations  # dataclasses look their module up while the class is created
    spec.loader.exec_module(mutations)
    for m in mutations.MUTATIONS:
        count = (root / m.file).read_text().count(m.original)
        assert count == 1, f"mutation {m.name}: its original text occurs {count} times in {m.file}; update it"
        assert all((root / t.split("::")[0]).is_file() for t in m.tests), f"mutation {m.name} names a missing test file"


def test_the_benchmarks_twin_check_fails_when_q_and_k_are_swapped(monkeypatch):
    """Planted bug: q and k swapped in the GPT-2 converter. At GPT-2's init the bench's loss check saw 4.6e-5."""
    import bench.twins as twins
    from attention_lab.interop import convert

    cfg = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32, pos_encoding="learned")
    cpu = torch.device("cpu")
    assert twins.check_same_function(cfg, cpu) < 1e-4
    real = convert.state_dict_to_hf

    def swapped(sd, c):
        out = real(sd, c)
        for key in [k for k in out if k.endswith("attn.c_attn.weight") or k.endswith("attn.c_attn.bias")]:
            q, k, v = out[key].chunk(3, dim=-1)  # GPT-2's Conv1D keeps q|k|v along the last axis
            out[key] = torch.cat([k, q, v], dim=-1)
        return out

    monkeypatch.setattr(twins, "state_dict_to_hf", swapped)
    with pytest.raises(RuntimeError, match="disagree at random weights"):
        twins.check_same_function(cfg, cpu)


@pytest.mark.parametrize("pos_encoding", ["alibi", "rope", "learned"])
def test_the_sdpa_backend_really_runs_the_fused_kernel_and_equals_math(pos_encoding, monkeypatch):
    """Planted bug: a backend test that asks for the weights always runs `math`, so sdpa (with ALiBi's additive
    mask) was never compared. Here the sdpa model is called without weights, and the kernel calls are counted."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    cfg = dict(vocab_size=50, block_size=16, n_layer=2, n_head=4, n_embd=32, pos_encoding=pos_encoding)
    fused = GPT(GPTConfig(attn_backend="sdpa", **cfg)).eval()
    reference = GPT(GPTConfig(attn_backend="math", **cfg)).eval()
    reference.load_state_dict(fused.state_dict())
    calls = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    idx = torch.randint(50, (2, 12))
    a = fused(idx).logits
    assert len(calls) == cfg["n_layer"], f"sdpa backend called the fused kernel {len(calls)} times"
    b = reference(idx).logits
    assert len(calls) == cfg["n_layer"], "the math backend must not call the fused kernel"
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
