"""Optimizers (AdamW, Muon + AdamW) and schedules (cosine, warmup-stable-decay, time budget)."""

from __future__ import annotations

import math

import pytest
import torch

from attention_lab.training.config import OptimConfig
from attention_lab.training.loop import schedule_position
from attention_lab.training.optim import (
    Muon,
    Optimizers,
    configure_optimizer,
    lr_multiplier,
    ns_dtype_for,
    orthogonalise,
)
from model import GPT, GPTConfig

CPU = torch.device("cpu")


def tiny(**kw) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32, bias=True, **kw))


def test_muon_takes_exactly_the_blocks_matrices_and_adamw_the_rest():
    model = tiny(pos_encoding="learned")
    opt = configure_optimizer(model, OptimConfig(name="muon"), CPU)
    muon, adamw = opt.optimizers
    assert isinstance(muon, Muon) and isinstance(adamw, torch.optim.AdamW)
    name = {id(p): n for n, p in model.named_parameters()}
    muon_names = {name[id(p)] for g in muon.param_groups for p in g["params"]}
    adam_names = {name[id(p)] for g in adamw.param_groups for p in g["params"]}
    expected = {f"transformer.h.{i}.{m}.weight" for i in range(2)
                for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")}
    assert muon_names == expected, f"Muon params: {sorted(muon_names)}"
    assert muon_names.isdisjoint(adam_names)
    assert muon_names | adam_names == set(name.values()), "every parameter is optimised exactly once"
    decayed = {name[id(p)] for g in adamw.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert decayed == {"transformer.wte.weight"}, f"AdamW decays the embedding only (not wpe, gains, biases): {decayed}"
    assert all(g["weight_decay"] == 0.1 for g in muon.param_groups)


def reference_orthogonalise(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Keller Jordan's quintic Newton-Schulz, one float64 matrix at a time, written out independently."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.double()
    if x.shape[0] > x.shape[1]:
        x = x.T
    x = x / x.norm()
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if g.shape[0] > g.shape[1] else x


@pytest.mark.parametrize("shape", [(12, 4), (4, 12), (8, 8)])
def test_orthogonalise_matches_the_float64_iteration_one_matrix_or_a_batch(shape):
    torch.manual_seed(0)
    g = torch.randn(3, *shape)
    ref = torch.stack([reference_orthogonalise(m) for m in g])
    torch.testing.assert_close(orthogonalise(g, dtype=torch.float32).double(), ref, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(orthogonalise(g[1], dtype=torch.float32).double(), ref[1], atol=1e-5, rtol=1e-4)
    s = torch.linalg.svdvals(ref)
    assert 0.5 < s.min() and s.max() < 1.5, f"five steps leave the singular values near 1: {s}"


def test_our_muon_takes_torch_muons_steps_and_state():
    """Same update as torch.optim.Muon (both iterating in bfloat16; ours batches same-shaped matrices), over
    several steps with weight decay and momentum, and its state dict loads into ours."""
    torch.manual_seed(0)
    shapes = [(24, 8), (24, 8), (8, 8), (8, 32)]
    start = [torch.randn(s) for s in shapes]
    grads = [[torch.randn(s) for s in shapes] for _ in range(4)]
    ours_p = [torch.nn.Parameter(w.clone()) for w in start]
    ref_p = [torch.nn.Parameter(w.clone()) for w in start]
    ours = Muon(ours_p, lr=0.02, weight_decay=0.1, ns_dtype=torch.bfloat16)
    ref = torch.optim.Muon(ref_p, lr=0.02, weight_decay=0.1)
    for step_grads in grads:
        for params, opt in ((ours_p, ours), (ref_p, ref)):
            for p, g in zip(params, step_grads):
                p.grad = g.clone()
            opt.step()
    for i, (a, b) in enumerate(zip(ours_p, ref_p)):
        moved = (b - start[i]).abs().max().item()
        assert moved > 0.01, "the reference did not move"
        torch.testing.assert_close(a.detach(), b.detach(), atol=0.02 * moved, rtol=0,
                                   msg=lambda m: f"parameter {i} {shapes[i]}: ours differs from torch.optim.Muon: {m}")
    fresh = Muon([torch.nn.Parameter(w.clone()) for w in start], ns_dtype=torch.float32)
    fresh.load_state_dict(ref.state_dict())
    for p, q in zip(fresh.param_groups[0]["params"], ref_p):
        assert torch.equal(fresh.state[p]["momentum_buffer"], ref.state[q]["momentum_buffer"])


def test_muon_iterates_in_float32_on_a_cpu_without_native_bf16(monkeypatch):
    """torch.optim.Muon always iterates in bfloat16: 70x slower than float32 on a 2-core AMD EPYC (no AVX512-BF16)
    at the default model's shapes, 9 s a step. auto picks float32 there, bfloat16 with AMX/AVX512-BF16 or CUDA."""
    import attention_lab.training.optim as optim_mod

    monkeypatch.setattr(optim_mod, "cpu_has_native_bf16", lambda: False)
    assert ns_dtype_for("auto", CPU) == torch.float32
    assert configure_optimizer(tiny(), OptimConfig(name="muon"), CPU).optimizers[0].ns_dtype == torch.float32
    monkeypatch.setattr(optim_mod, "cpu_has_native_bf16", lambda: True)
    assert ns_dtype_for("auto", CPU) == torch.bfloat16
    assert ns_dtype_for("auto", torch.device("cuda")) == torch.bfloat16
    assert ns_dtype_for("float32", torch.device("cuda")) == torch.float32
    cfg = OptimConfig(name="muon", muon_ns_dtype="float32")
    assert configure_optimizer(tiny(), cfg, CPU).optimizers[0].ns_dtype == torch.float32
    with pytest.raises(ValueError, match="muon_ns_dtype"):
        OptimConfig(name="muon", muon_ns_dtype="fp8")


@pytest.mark.parametrize("steps", [3, 5])
def test_muon_ns_steps_reaches_the_iteration(steps):
    """optim.muon_ns_steps sets how many Newton-Schulz steps an update takes: the first update of a weight is
    -lr * orthogonalise(grad, steps) after decay (momentum from zero only scales the gradient)."""
    cfg = OptimConfig(name="muon", muon_ns_steps=steps, muon_ns_dtype="float32")
    muon = configure_optimizer(tiny(), cfg, CPU).optimizers[0]
    assert all(g["ns_steps"] == steps for g in muon.param_groups)
    torch.manual_seed(1)
    w = torch.nn.Parameter(torch.randn(8, 32))
    g = torch.randn(8, 32)
    opt = Muon([w], lr=0.02, weight_decay=0.1, ns_steps=steps, ns_dtype=torch.float32)
    start = w.detach().clone()
    w.grad = g
    opt.step()
    expected = start * (1 - 0.02 * 0.1) - 0.02 * orthogonalise(g, steps, torch.float32)
    torch.testing.assert_close(w.detach(), expected, atol=1e-6, rtol=1e-5)
    other = start * (1 - 0.02 * 0.1) - 0.02 * orthogonalise(g, 8 - steps, torch.float32)
    assert (w.detach() - other).abs().max() > 1e-4, "3 and 5 steps should give different updates"
    with pytest.raises(ValueError, match="muon_ns_steps"):
        OptimConfig(name="muon", muon_ns_steps=0)


def test_adamw_alone_decays_every_matrix_but_the_position_table():
    model = tiny(pos_encoding="learned")
    opt = configure_optimizer(model, OptimConfig(name="adamw"), CPU)
    assert len(opt.optimizers) == 1
    name = {id(p): n for n, p in model.named_parameters()}
    decayed = {name[id(p)] for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    matrices = {n for n, p in model.named_parameters() if p.dim() == 2 and n != "transformer.wpe.weight"}
    assert decayed == matrices and decayed, f"decayed: {sorted(decayed)}"


def test_lr_multiplier_scales_every_group_from_its_own_base():
    opt = configure_optimizer(tiny(), OptimConfig(name="muon", lr=1e-3, muon_lr=0.02), CPU)
    opt.set_lr_multiplier(0.5)
    muon, adamw = opt.optimizers
    assert all(g["lr"] == pytest.approx(0.01) for g in muon.param_groups)
    assert all(g["lr"] == pytest.approx(5e-4) for g in adamw.param_groups)


def test_cosine_schedule_shape_is_pinned():
    cfg = OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=10)
    m = [lr_multiplier(s, cfg, 110) for s in range(120)]
    assert m[0] == pytest.approx(0.1) and m[9] == pytest.approx(1.0), "linear warmup to the peak"
    assert m[10] == pytest.approx(1.0)
    assert m[60] == pytest.approx(0.55), "half-way through the decay a cosine is at the mean of peak and floor"
    assert m[35] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4))), "a linear decay would give 0.775"
    assert m[110] == pytest.approx(0.1) and m[119] == pytest.approx(0.1)


def test_wsd_schedule_is_flat_then_linear_to_the_floor():
    cfg = OptimConfig(lr=1.0, min_lr=0.0, warmup_steps=10, schedule="wsd", decay_frac=0.5)
    m = [lr_multiplier(s, cfg, 100) for s in range(100)]
    assert m[9] == pytest.approx(1.0) and m[10] == m[49] == 1.0, "stable at the peak until half-way"
    assert m[50] == pytest.approx(1.0) and m[75] == pytest.approx(0.5) and m[99] == pytest.approx(0.02)
    assert all(a >= b for a, b in zip(m[50:], m[51:])), "monotone decay"


def test_time_budget_moves_the_schedule_on_a_slow_machine():
    # 60% of a 10-minute budget spent after 10% of 1000 steps: the schedule is at 60%
    assert schedule_position(100, 6 * 60, 1000, 10) == pytest.approx(600, abs=2)
    assert schedule_position(100, 0.0, 1000, 10) == 100, "a fast machine follows its steps"
    assert schedule_position(100, 6 * 60, 1000, None) == 100, "without a budget the schedule follows the steps"


def test_a_checkpoint_with_another_optimizer_count_is_a_clear_error():
    opt = configure_optimizer(tiny(), OptimConfig(name="muon"), CPU)
    adam_only = configure_optimizer(tiny(), OptimConfig(name="adamw"), CPU)
    with pytest.raises(ValueError, match="same optim.name"):
        opt.load_state_dict(adam_only.state_dict())
    assert isinstance(opt, Optimizers)


@pytest.mark.parametrize("optim", ["muon", "adamw"])
def test_resume_is_exact_with_each_optimizer(whole_and_resumed, data_cache, optim):
    overrides = ["experiment=debug", f"data.cache_dir={data_cache}", f"optim.name={optim}", "optim.schedule=wsd",
                 "optim.decay_steps=20",  # the schedule must not depend on where the first session stops
                 "train.log_interval=1", "train.head_roles=false", "train.sample_tokens=0"]
    a, b = whole_and_resumed(overrides, stop_at=10)
    assert sorted(a) == list(range(1, 21))
    assert [a[s] for s in range(11, 21)] == [b[s] for s in range(11, 21)], \
        f"{optim}: resumed losses differ from the uninterrupted run's: {a} vs {b}"


@pytest.mark.parametrize("frac", [0.2, 0.8])
def test_wsd_decays_over_the_last_decay_frac_of_the_run(frac):
    """decay_frac is the share of the run spent decaying, at its end (the default 0.5 hides which end is meant)."""
    cfg = OptimConfig(lr=1.0, min_lr=0.0, warmup_steps=5, schedule="wsd", decay_frac=frac)
    m = [lr_multiplier(s, cfg, 100) for s in range(100)]
    start = 100 - round(frac * 100)
    assert all(v == 1.0 for v in m[5:start]), f"flat until step {start}: {m[:start + 2]}"
    assert m[start + 1] < 1.0 and m[99] == pytest.approx(1 / (100 - start)), f"decays over the last {frac:.0%}"
