"""The configurations the rest of the suite skips, each checked against an independent computation:

1. dtype=auto and Muon's Newton-Schulz dtype on every CPU kind (mocked torch.cpu.get_capabilities)
2. generation with keep_first far past block_size, every step against the window a by-hand rule gives
3. the trainer's probe ablation against zeroing a head's c_proj columns by hand, on the repeated half
4. a windowed model's ring-buffer cache across reset() (rebuilds), against a fresh full forward of each window
5. validation with dropout on: eval mode, the training mode restored, best.json from the eval-mode loss
6. role scores of several sequences against the mean of per-sequence scores written out by hand
7. tokens per step, tokens/s and MFU with grad_accum = 2 against the by-hand count

Sections 3, 5 and 7 read one tiny real run (the debug preset with dropout 0.3 and grad_accum 2).
"""

from __future__ import annotations

import copy
import json
import math
import sys
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import train as train_mod
from attention_lab.interp import heads as H
from attention_lab.interp import roles as R
from attention_lab.runtime.device import pick_dtype
from attention_lab.store.checkpoint import load_checkpoint
from attention_lab.training import loop as loop_mod
from attention_lab.training import optim as optim_mod
from attention_lab.training.config import OptimConfig, compose
from attention_lab.training.evaluate import split_nats
from data.batches import eval_batches
from data.prepare import prepare_data
from model import GPT, GPTConfig, generate_stream

GEN = sys.modules["model.generate"]  # the module (model.generate the attribute is the function)
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def one_thread():
    """These models are tiny: a second OpenMP thread only spins, and on a busy 2-core machine the spinning made
    this file 20x slower in CPU time (55 s against 1.3 s for the decoding tests)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ------------------------------------------------------------------------------------------------------------
# 1. dtype=auto and the Newton-Schulz dtype on every CPU kind

_AVX512 = {"avx2": True, "fma3": True, "avx512_f": True, "avx512_cd": True, "avx512_bw": True, "avx512_dq": True,
           "avx512_vl": True}
_NO_BF16 = {"avx512_bf16": False, "amx_bf16": False, "amx_tile": False, "amx_int8": False}
# what torch.cpu.get_capabilities() says on each kind (the keys it uses), and the dtype auto must pick there:
# bf16 only where the CPU computes bf16 matmuls natively (AVX512-BF16 or AMX-BF16), float32 elsewhere
CPU_KINDS = {
    "AMD Zen 3 (AVX2)": ({"avx2": True, "fma3": True, "avx512_f": False} | _NO_BF16, torch.float32),
    "Intel Skylake-SP (AVX-512, no BF16)": (_AVX512 | _NO_BF16 | {"avx512_vnni": False}, torch.float32),
    "Intel Cascade Lake (AVX-512 VNNI, no BF16)": (_AVX512 | _NO_BF16 | {"avx512_vnni": True}, torch.float32),
    "Intel Ice Lake (AVX-512 VBMI, no BF16)": (_AVX512 | _NO_BF16 | {"avx512_vnni": True, "avx512_vbmi": True},
                                               torch.float32),
    "AMX tiles with INT8 only": (_AVX512 | _NO_BF16 | {"amx_tile": True, "amx_int8": True}, torch.float32),
    "Intel Cooper Lake (AVX512-BF16)": (_AVX512 | _NO_BF16 | {"avx512_vnni": True, "avx512_bf16": True},
                                        torch.bfloat16),
    "AMD Zen 4 (AVX512-BF16)": (_AVX512 | _NO_BF16 | {"avx512_vnni": True, "avx512_bf16": True}, torch.bfloat16),
    "Intel Sapphire Rapids (AMX-BF16)": (_AVX512 | {"avx512_vnni": True, "avx512_bf16": True, "avx512_fp16": True,
                                                    "amx_tile": True, "amx_int8": True, "amx_bf16": True},
                                         torch.bfloat16),
    "AMX-BF16 without AVX512-BF16": (_AVX512 | _NO_BF16 | {"amx_tile": True, "amx_bf16": True}, torch.bfloat16),
}


def mock_cpu(monkeypatch, kind: str) -> None:
    caps, _ = CPU_KINDS[kind]
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: dict(caps))


@pytest.mark.parametrize("kind", CPU_KINDS)
def test_auto_dtype_is_bf16_only_on_cpus_with_native_bf16(monkeypatch, kind):
    mock_cpu(monkeypatch, kind)
    want = CPU_KINDS[kind][1]
    assert pick_dtype("auto", CPU) == want, f"{kind}: dtype=auto picked {pick_dtype('auto', CPU)}, should be {want}"
    assert pick_dtype("float32", CPU) == torch.float32 and pick_dtype("bfloat16", CPU) == torch.bfloat16, (
        f"{kind}: an explicit dtype must be kept whatever the CPU")


def test_auto_dtype_is_float32_when_torch_cannot_probe_the_cpu(monkeypatch):
    def no_probe():
        raise RuntimeError("cpuinfo unavailable")

    monkeypatch.setattr(torch.cpu, "get_capabilities", no_probe)
    assert pick_dtype("auto", CPU) == torch.float32
    assert optim_mod.ns_dtype_for("auto", CPU) == torch.float32


def newton_schulz_by_hand(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Keller Jordan's quintic iteration in float64, written out: X / |X|_F, then X <- aX + (bA + cA^2)X, A = XX^T,
    on the wide orientation."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.double()
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = x / x.norm()
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


@pytest.mark.parametrize("kind", CPU_KINDS)
def test_muon_iterates_in_the_cpus_native_dtype(monkeypatch, kind):
    """optim.muon_ns_dtype=auto: the iteration runs in bf16 only where the CPU has native bf16. Checked on what
    the iteration returns (its dtype) and on the update itself: in float32 the first step equals the float64
    iteration written out to 1e-5; in bf16 (8 significant bits) it is 1e-4 to 0.3 away from it."""
    mock_cpu(monkeypatch, kind)
    want = CPU_KINDS[kind][1]
    seen = []
    real = optim_mod.orthogonalise

    def spy(g, steps, dtype, *a, **kw):
        out = real(g, steps, dtype, *a, **kw)
        seen.append(out.dtype)
        return out

    monkeypatch.setattr(optim_mod, "orthogonalise", spy)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=40, block_size=8, n_layer=1, n_head=2, n_embd=16))
    opts = optim_mod.configure_optimizer(model, OptimConfig(name="muon", weight_decay=0.0), CPU)
    muon = opts.optimizers[0]
    assert muon.ns_dtype == want, f"{kind}: Muon set up to iterate in {muon.ns_dtype}, should be {want}"
    x = torch.randint(40, (2, 8), generator=torch.Generator().manual_seed(1))
    model(x[:, :-1], x[:, 1:]).loss.backward()
    hidden = {id(p) for p in muon.param_groups[0]["params"]}
    before = {name: (p.detach().clone(), p.grad.clone()) for name, p in model.named_parameters() if id(p) in hidden}
    opts.step()
    assert seen and set(seen) == {want}, f"{kind}: the Newton-Schulz iteration ran in {set(seen)}, should be {want}"
    lr = muon.param_groups[0]["lr"]
    for name, p in model.named_parameters():
        if name not in before:
            continue
        w, g = before[name]
        scale = math.sqrt(max(1.0, w.shape[0] / w.shape[1]))
        update = (w - p.detach()).double() / (lr * scale)  # the first step's momentum only scales g
        err = (update - newton_schulz_by_hand(g)).abs().max().item()
        if want == torch.float32:
            assert err < 1e-5, f"{kind}: {name}'s update is {err:.2e} from the float32 iteration written out"
        else:
            assert 1e-4 < err < 0.3, f"{kind}: {name}'s update is {err:.2e} from float64: not a bf16 iteration"


@pytest.mark.parametrize("kind, name", [("Intel Skylake-SP (AVX-512, no BF16)", "float32"),
                                        ("Intel Sapphire Rapids (AMX-BF16)", "bfloat16")])
def test_a_dtype_auto_muon_run_computes_in_the_dtype_of_its_cpu(tmp_path, data_cache, monkeypatch, kind, name):
    """train.dtype=auto with Muon on a mocked CPU: the training step's autocast dtype, the matmul peak's dtype
    (provenance.json) and the Newton-Schulz iteration all follow the CPU kind."""
    mock_cpu(monkeypatch, kind)
    want = getattr(torch, name)
    step_dtypes, ns_dtypes = set(), set()
    real_step, real_ns = train_mod.train_step, optim_mod.orthogonalise

    def step(model, opt, sampler, grad_accum, device, dtype, *a, **kw):
        step_dtypes.add(dtype)
        return real_step(model, opt, sampler, grad_accum, device, dtype, *a, **kw)

    def ns(g, steps, dtype, *a, **kw):
        out = real_ns(g, steps, dtype, *a, **kw)
        ns_dtypes.add(out.dtype)
        return out

    monkeypatch.setattr(train_mod, "train_step", step)
    monkeypatch.setattr(optim_mod, "orthogonalise", ns)
    run = tmp_path / "run"
    train_mod.train(compose(["experiment=debug", f"data.cache_dir={data_cache}", "train.device=cpu", "optim=muon",
                             "train.dtype=auto", "train.max_steps=2", "train.eval_interval=2", "train.sample_tokens=0",
                             "train.head_roles=false", "train.film=false"]), run)
    assert step_dtypes == {want}, f"{kind}: the training step ran under {step_dtypes}, should be {want}"
    assert ns_dtypes == {want}, f"{kind}: Muon's iteration ran in {ns_dtypes}, should be {want}"
    prov = json.loads((run / "provenance.json").read_text())
    assert prov["peak_dtype"] == name, f"{kind}: provenance says the run computes in {prov['peak_dtype']}"
    assert f"device cpu, {name}" in (run / "console.log").read_text(), f"{kind}: the console line names another dtype"


# ------------------------------------------------------------------------------------------------------------
# 2. and 4. generation far past block_size: keep_first, and a windowed model's ring buffer across rebuilds

V, BLOCK = 61, 16
DECODERS = {  # each rebuilds past block_size (or, bounded, streams) differently
    "learned positions, full attention": dict(pos_encoding="learned"),
    "rope, full attention": dict(pos_encoding="rope"),
    "rope, window 5 on layers L G (ring + full cache)": dict(pos_encoding="rope", window=5, window_pattern="LG"),
    "learned, window 6 on every layer (ring, rebuilt)": dict(pos_encoding="learned", window=6),
    "rope, window 8 on every layer (bounded ring)": dict(pos_encoding="rope", window=8),
    "alibi, grouped-query, window 5 on L L G": dict(pos_encoding="alibi", n_kv_head=2, window=5,
                                                    window_pattern="LLG", n_layer=3),
}


def sharp_model(seed: int = 0, dtype=torch.float64, backend: str = "sdpa", **kw) -> GPT:
    """A random model whose attention is sharp (weights x6), in float64 so no near-tie flips an argmax."""
    torch.manual_seed(seed)
    cfg = dict(vocab_size=V, block_size=BLOCK, n_layer=2, n_head=4, n_embd=32, attn_backend=backend) | kw
    model = GPT(GPTConfig(**cfg)).to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(6)
    return model


def context_by_hand(seq: list[int], n: int, block: int, keep_first: int) -> list[int]:
    """What the model should see after the first n tokens of seq: all of them while they fit; past the
    context, the first keep_first tokens of the whole sequence and the most recent block - keep_first."""
    if n <= block:
        return seq[:n]
    return seq[:keep_first] + seq[n - (block - keep_first) : n]


def decode_recording_logits(monkeypatch, model, prompt, steps, **kw) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """generate_stream's tokens (B, steps) and the logits (B, V) it chose each of them from."""
    seen = []
    real = GEN.sample_next

    def spy(logits, *a, **k):
        seen.append(logits.clone())
        return real(logits, *a, **k)

    with monkeypatch.context() as m:
        m.setattr(GEN, "sample_next", spy)
        new = torch.cat(list(generate_stream(model, prompt, steps, **kw)), dim=1)
    return new, seen


@torch.inference_mode()
def check_every_step(model, prompt, new, seen, keep_first: int, greedy: bool, what: str) -> None:
    """Each step's logits against a fresh forward pass (no cache) of the context written out by hand; the
    contexts of all steps and rows go through the model in batches of equal length."""
    b, t = prompt.shape
    full = torch.cat([prompt, new], dim=1)
    contexts = [(s, row, context_by_hand(full[row].tolist(), t + s, BLOCK, keep_first))
                for s in range(new.size(1)) for row in range(b)]
    by_length: dict[int, list] = {}
    for item in contexts:
        by_length.setdefault(len(item[2]), []).append(item)
    for items in by_length.values():
        want = model(torch.tensor([ctx for _, _, ctx in items])).logits[:, -1]  # (N, V)
        got = torch.stack([seen[s][row] for s, row, _ in items])
        err = (got - want).abs().amax(-1)
        if (err > 1e-8).any():
            s, row, ctx = items[int(err.argmax())]
            raise AssertionError(
                f"{what}: step {s} (after {t + s} tokens, block_size {BLOCK}, keep_first {keep_first}), row {row}: "
                f"the decoder's logits are {err.max():.2e} from a fresh forward pass of the window "
                f"{ctx[:keep_first]} + the last {len(ctx) - keep_first} tokens")
        if greedy:
            tokens = torch.tensor([int(new[row, s]) for s, row, _ in items])
            assert torch.equal(tokens, want.argmax(-1)), f"{what}: a greedy token is not the argmax of its logits"
    assert t + new.size(1) >= 3 * BLOCK, "decode far past block_size"


# (use_cache, keep_first, prompt length, greedy): both paths, sinks kept from a short and from a cropped long
# prompt, no sinks; greedy where its argmax is checked too, seeded sampling where the tokens must vary
DECODING_CASES = {
    "cache, keep 3, sampled": (True, 3, 5, False),
    "cache, keep 3, long prompt, greedy": (True, 3, BLOCK + 7, True),
    "cache, keep 0, greedy": (True, 0, 5, True),
    "no cache, keep 3, sampled": (False, 3, 5, False),
    "no cache, keep 3, long prompt, greedy": (False, 3, BLOCK + 7, True),
}


@pytest.mark.parametrize("case", DECODING_CASES)
@pytest.mark.parametrize("decoder", DECODERS)
def test_generation_far_past_the_context_sees_the_window_the_rule_gives(monkeypatch, decoder, case):
    """56 tokens with block_size 16: at every step, for each row of a batch of 2, the logits the decoder samples
    from equal a fresh forward pass of the window written out by hand (the first keep_first tokens of the
    sequence, then the most recent ones). A bounded (all-windowed) model with keep_first rebuilds like any other
    model: it must keep the first tokens too, with the cache as without."""
    use_cache, keep_first, prompt_len, greedy = DECODING_CASES[case]
    model = sharp_model(**DECODERS[decoder])
    prompt = torch.randint(V, (2, prompt_len), generator=torch.Generator().manual_seed(1))
    new, seen = decode_recording_logits(monkeypatch, model, prompt, 56 - prompt_len, greedy=greedy,
                                        use_cache=use_cache, keep_first=keep_first,
                                        generator=torch.Generator().manual_seed(5))
    check_every_step(model, prompt, new, seen, keep_first, greedy, f"{decoder}, {case}")


@pytest.mark.parametrize("backend", ["sdpa", "math"])
@pytest.mark.parametrize("decoder", [d for d in DECODERS if "window" in d])
@torch.no_grad()
def test_ring_buffer_cache_after_each_reset_equals_a_fresh_forward(decoder, backend):
    """KVCache across reset(), as decoding past block_size rebuilds it: four windows of a batch of 3, each
    prefilled into the reset cache then extended one token at a time; every logit equals a fresh forward pass of
    the same tokens (which for t > window runs local_attention, not the ring). The rebuilt windows overlap, so a
    ring that keeps entries from before the reset has keys at the same positions to confuse with the new ones."""
    model = sharp_model(backend=backend, **DECODERS[decoder])
    seq = torch.randint(V, (3, 4 * BLOCK), generator=torch.Generator().manual_seed(2))
    cache = model.new_kv_cache()
    for r, (start, prefill) in enumerate([(0, 9), (5, BLOCK - 3), (17, BLOCK - 1), (30, BLOCK - 4)]):
        if r:
            cache.reset()
        window = seq[:, start : start + BLOCK]
        fresh = model(window).logits  # (3, BLOCK, V)
        got = [model(window[:, :prefill], kv_cache=cache).logits]
        got += [model(window[:, i : i + 1], kv_cache=cache).logits for i in range(prefill, BLOCK)]
        got = torch.cat(got, dim=1)
        err = (got - fresh).abs().max().item()
        assert err < 1e-8, (f"{decoder}, {backend}: after reset number {r} the cache's logits are {err:.2e} from a "
                            f"fresh forward pass of the same window (rows {(got - fresh).abs().amax((1, 2)).tolist()})")
        assert cache.length == BLOCK


# ------------------------------------------------------------------------------------------------------------
# 3. the probe ablation, by hand


def half_loss(model, probe: torch.Tensor, half: int, which: str) -> float:
    """Mean next-token loss of the probe's first half (targets 1..half-1) or its repeat (targets half..2half-1)."""
    x, y = probe[:, :-1], probe[:, 1:]
    losses = F.cross_entropy(model(x).logits.float().flatten(0, 1), y.flatten(), reduction="none").view_as(y)
    return (losses[:, half - 1 :] if which == "repeat" else losses[:, : half - 1]).mean().item()


def head_zeroed(model, layer: int, head: int):
    """A copy of the model whose c_proj of `layer` ignores head `head`: its hs input columns set to zero."""
    other = copy.deepcopy(model)
    hs = model.config.head_size
    with torch.no_grad():
        other.transformer.h[layer].attn.c_proj.weight[:, head * hs : (head + 1) * hs] = 0
    return other


@torch.no_grad()
def ablation_by_hand(model, probe: torch.Tensor, val_x, val_y):
    half = probe.size(1) // 2
    cfg = model.config
    base = half_loss(model, probe, half, "repeat")
    n = max(1, probe.size(0) // 2)

    def val_loss(m):
        return F.cross_entropy(m(val_x[:n]).logits.float().flatten(0, 1), val_y[:n].flatten()).item()

    base_val = val_loss(model)
    probe_effect, val_effect = np.zeros((cfg.n_layer, cfg.n_head)), np.zeros((cfg.n_layer, cfg.n_head))
    for layer in range(cfg.n_layer):
        for head in range(cfg.n_head):
            other = head_zeroed(model, layer, head)
            probe_effect[layer, head] = half_loss(other, probe, half, "repeat") - base
            val_effect[layer, head] = val_loss(other) - base_val
    return probe_effect, val_effect, half_loss(model, probe, half, "first"), base


@pytest.mark.parametrize("variant", [{}, {"n_kv_head": 2, "window": 6, "pos_encoding": "rope"}])
def test_probe_ablation_is_the_repeated_halfs_loss_change_when_that_head_is_zeroed(variant):
    """measure_heads' ablation_probe[l, h]: the loss on the probe's repeated half with head h of layer l zeroed
    (its columns of c_proj set to 0, by hand) minus the unablated model's loss on the same positions; the half
    losses are the two halves' mean losses; ablation_val the same on the validation windows' every position."""
    model = sharp_model(dtype=torch.float32, vocab_size=50, block_size=32, dropout=0.2, **variant)  # eval mode
    probe = H.repeated_tokens_probe(50, 12, 3, seed=0)
    val = torch.randint(50, (3, 33), generator=torch.Generator().manual_seed(3))
    report = H.measure_heads(model, probe, val[:, :-1], val[:, 1:])
    probe_effect, val_effect, first, repeat = ablation_by_hand(model, probe, val[:, :-1], val[:, 1:])
    assert report.probe_first_loss == pytest.approx(first, abs=1e-5), "the first half's loss"
    assert report.probe_repeat_loss == pytest.approx(repeat, abs=1e-5), "the repeated half's loss"
    np.testing.assert_allclose(report.ablation_probe, probe_effect, atol=2e-5, err_msg=(
        "ablation_probe is not the repeated half's loss change when the named head's c_proj columns are zeroed"))
    np.testing.assert_allclose(report.ablation_val, val_effect, atol=2e-5, err_msg=(
        "ablation_val is not the validation loss change when the named head's c_proj columns are zeroed"))
    assert np.ptp(probe_effect) > 1e-2, f"the heads should matter differently, or a swap goes unseen: {probe_effect}"
    assert abs(first - repeat) > 1e-2, "the halves should differ, or scoring the wrong one would go unseen"


# ------------------------------------------------------------------------------------------------------------
# 3., 5. and 7. on one tiny real run: dropout 0.3, grad_accum 2, head roles with ablation, a fake clock

# on the CPU, where the by-hand numbers are computed; lr 0.1 makes step 4 the best of the evaluations at 2, 4, 6
RUN_OVERRIDES = ["train.device=cpu", "model.dropout=0.3", "train.grad_accum=2", "train.max_steps=6",
                 "train.eval_interval=2", "train.log_interval=1", "train.sample_tokens=0", "train.film=false",
                 "train.probe_batch=4", "train.keep_checkpoints=10", "optim.lr=0.1", "optim.warmup_steps=1"]


@pytest.fixture(scope="module")
def dropout_run(tmp_path_factory, data_cache):
    """The debug preset with dropout and gradient accumulation. The loop's clock advances exactly 1 s per
    optimizer step (and stands still otherwise), so tokens/s and MFU are exact numbers; every training step
    records whether the model was in training mode."""
    run_dir = tmp_path_factory.mktemp("dropout_run")
    cfg = compose(["experiment=debug", f"data.cache_dir={data_cache}", *RUN_OVERRIDES])
    clock = [1000.0]
    training_flags = []
    real_step = train_mod.train_step

    def step(model, *a, **kw):
        training_flags.append(model.training)
        out = real_step(model, *a, **kw)
        clock[0] += 1.0
        return out

    with pytest.MonkeyPatch.context() as m:
        m.setattr(train_mod, "train_step", step)
        m.setattr(loop_mod, "time", types.SimpleNamespace(time=lambda: clock[0]))
        final = train_mod.train(cfg, run_dir)
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return types.SimpleNamespace(dir=run_dir, cfg=cfg, final=final, lines=lines, training_flags=training_flags,
                                 data=prepare_data(cfg.data))


def checkpoint_at(run_dir, step: int):
    return load_checkpoint(run_dir / "checkpoints" / f"step_{step:08d}")


def eval_mode_val_loss(model, batches) -> float:
    """The trainer's validation loss by hand: a no-dropout twin of the model (same weights), mean of the batch
    means."""
    twin = GPT(GPTConfig.from_dict(model.config.to_dict() | {"dropout": 0.0}))
    twin.load_state_dict(model.state_dict())
    twin.train()  # dropout 0: training mode computes the eval-mode function
    with torch.no_grad():
        return float(np.mean([F.cross_entropy(twin(x).logits.flatten(0, 1), y.flatten()).item() for x, y in batches]))


def test_validation_of_a_dropout_run_is_the_eval_mode_loss_and_picks_best_by_it(dropout_run):
    """Every evaluation's val_loss equals the eval-mode loss of that step's weights on the trainer's validation
    batches (by hand, with a no-dropout twin); best.json names the step with the lowest of those; the model
    trained in training mode at every step, evaluations between them notwithstanding."""
    run, tc = dropout_run, dropout_run.cfg.train
    batches = eval_batches(run.data.tokens("val"), run.cfg.model.block_size, tc.batch_size, tc.eval_batches)
    recorded = {r["step"]: r["val_loss"] for r in run.lines if "val_loss" in r}
    assert sorted(recorded) == [2, 4, 6], recorded
    by_hand = {}
    for step in recorded:
        model = checkpoint_at(run.dir, step).build_model()
        model.train()  # as the trainer holds it: evaluation must switch dropout off itself
        by_hand[step] = eval_mode_val_loss(model, batches)
        assert recorded[step] == pytest.approx(by_hand[step], abs=1e-5), (
            f"step {step}: val_loss {recorded[step]:.6f} but the eval-mode loss of its weights is "
            f"{by_hand[step]:.6f}: validation ran with dropout on?")
    best = load_checkpoint(run.dir, "best")
    assert best.step == min(by_hand, key=by_hand.get), f"best.json names step {best.step}; eval-mode losses {by_hand}"
    assert run.training_flags == [True] * tc.max_steps, (
        f"the model's training flag at each step: {run.training_flags}; evaluation must give training mode back")


def test_validation_loss_and_whole_split_scoring_run_in_eval_mode_and_restore_the_mode():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=40, block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.5))
    tokens = np.random.default_rng(0).integers(0, 40, 200).astype(np.uint16)
    batches = eval_batches(tokens, 16, 4, 3)
    for mode in (True, False):
        model.train(mode)
        a = loop_mod.validation_loss(model, batches, CPU, torch.float32)
        b = loop_mod.validation_loss(model, batches, CPU, torch.float32)
        assert model.training == mode, f"validation_loss left the model in training={model.training}, was {mode}"
        assert a == b, f"two validations of the same weights differ ({a} vs {b}): dropout was on"
        assert a == pytest.approx(eval_mode_val_loss(model, batches), abs=1e-6), "not the eval-mode loss"
        total, count = split_nats(model, tokens)
        assert model.training == mode, "split_nats must give the model its mode back"
        twin = GPT(GPTConfig.from_dict(model.config.to_dict() | {"dropout": 0.0}))
        twin.load_state_dict(model.state_dict())
        assert (total, count) == pytest.approx(split_nats(twin, tokens), abs=1e-4), "whole-split scoring used dropout"


def test_the_runs_probe_ablation_and_half_losses_are_the_by_hand_ones(dropout_run):
    """The numbers the trainer recorded (attention/heads.jsonl, metrics.jsonl) at each evaluation, recomputed
    from that step's checkpoint by hand: the probe's half losses and each head's ablation effect on the repeated
    half and on the validation windows, all in eval mode (dropout is 0.3 in this run)."""
    run, tc = dropout_run, dropout_run.cfg.train
    block = run.cfg.model.block_size
    probe = H.repeated_tokens_probe(np.unique(run.data.tokens("train")), min(block // 2, 64), tc.probe_batch,
                                    seed=tc.seed)
    val_x, val_y = next(iter(eval_batches(run.data.tokens("val"), block, 4 * tc.probe_batch, 1)))
    records = {r["step"]: r for r in map(json.loads, (run.dir / "attention" / "heads.jsonl").read_text().splitlines())}
    metrics = {r["step"]: r for r in run.lines if "probe_repeat_loss" in r}
    assert sorted(records) == sorted(metrics) == [2, 4, 6], (sorted(records), sorted(metrics))
    for step, record in records.items():
        model = checkpoint_at(run.dir, step).build_model()  # eval mode
        probe_effect, val_effect, first, repeat = ablation_by_hand(model, probe, val_x, val_y)
        assert metrics[step]["probe_repeat_loss"] == pytest.approx(repeat, abs=1e-5), f"step {step}: repeat loss"
        assert metrics[step]["probe_first_loss"] == pytest.approx(first, abs=1e-5), f"step {step}: first-half loss"
        np.testing.assert_allclose(record["ablation"]["probe"], probe_effect, atol=1.5e-4,
                                   err_msg=f"step {step}: the recorded probe ablation is not the by-hand one")
        np.testing.assert_allclose(record["ablation"]["val"], val_effect, atol=1.5e-4,
                                   err_msg=f"step {step}: the recorded validation ablation is not the by-hand one")


def test_tokens_per_step_tokens_per_second_and_mfu_count_every_micro_batch(dropout_run):
    """grad_accum = 2: a step is batch_size x block_size x grad_accum tokens (x world_size); the console line,
    the tokens seen, tokens/s (1 s per step on the loop's clock) and MFU (6N + 12 L C T FLOPs per token, over
    the preset's peak) all count them."""
    run, tc, mc = dropout_run, dropout_run.cfg.train, dropout_run.cfg.model
    tokens = tc.batch_size * mc.block_size * tc.grad_accum
    assert tokens == 4 * 32 * 2
    assert f"{tokens:,} tokens per step" in (run.dir / "console.log").read_text(), "the console's tokens per step"
    model = checkpoint_at(run.dir, 6).build_model()
    n = sum(p.numel() for p in model.parameters())  # RoPE: no position table; the tied head counted once
    flops_per_token = 6 * n + 12 * mc.n_layer * mc.n_embd * mc.block_size
    train_lines = [r for r in run.lines if "tokens_per_s" in r]
    assert [r["step"] for r in train_lines] == list(range(1, tc.max_steps + 1))
    for r in train_lines:
        assert r["tokens_per_s"] == pytest.approx(tokens), f"step {r['step']}: {r['tokens_per_s']} tokens/s"
        assert r["mfu"] == pytest.approx(tokens * flops_per_token / tc.peak_flops, rel=1e-9), f"step {r['step']} MFU"
    state = load_checkpoint(run.dir, "latest").train_state()
    assert state["tokens_seen"] == tc.max_steps * tokens, f"tokens seen {state['tokens_seen']}"
    # world_size multiplies it too (the DDP run itself: tests/test_train.py)
    fake = types.SimpleNamespace(cfg=run.cfg, info=types.SimpleNamespace(world_size=3), model_cfg=mc, n_params=n)
    fake.tokens_per_step = train_mod.Run.tokens_per_step.fget(fake)
    assert fake.tokens_per_step == 3 * tokens, f"3 processes: {fake.tokens_per_step} tokens per step"
    assert train_mod.Run.flops_per_step.fget(fake) == pytest.approx(3 * tokens * flops_per_token)


# ------------------------------------------------------------------------------------------------------------
# 6. role scores of several sequences


# the headline scores and the all-rows (detect_head) forms of the three detection roles
SCORED_ROLES = ("previous_token", "duplicate_token", "induction", "first_token", "self", "entropy",
                "previous_token_all_rows", "duplicate_token_all_rows", "induction_all_rows")


def scores_by_hand(a: np.ndarray, ids: list[int], exclude_first: bool = False) -> dict[str, float]:
    """One head's scores on one sequence, written out: a (T, T) whose rows sum to 1, ids (T,). exclude_first
    drops key 0 from the detection scores (the three summaries always read the whole pattern)."""
    t = len(ids)
    d = a.copy()
    if exclude_first:
        d[:, 0] = 0.0
    targets = {
        "previous_token": lambda i, j: j == i - 1,
        "duplicate_token": lambda i, j: j < i and ids[j] == ids[i],
        "induction": lambda i, j: 1 <= j <= i and ids[j - 1] == ids[i],
    }
    out = {}
    for role, is_target in targets.items():  # the stripe: over the query rows that have a target
        rows = [i for i in range(t) if any(is_target(i, j) for j in range(t))]
        on = sum(d[i, j] for i in rows for j in range(t) if is_target(i, j))
        total = sum(d[i, j] for i in rows for j in range(t))
        out[role] = on / total if total > 0 else 0.0
        # all rows (TransformerLens's detect_head): every query row in the denominator
        on_all = sum(d[i, j] for i in range(t) for j in range(t) if is_target(i, j))
        out[f"{role}_all_rows"] = on_all / d.sum() if d.sum() > 0 else 0.0
    rows = range(1, t)  # row 0 has one key
    out["first_token"] = sum(a[i, 0] for i in rows) / (t - 1)
    out["self"] = sum(a[i, i] for i in rows) / (t - 1)
    out["entropy"] = sum(-sum(p * math.log(p) for p in a[i, : i + 1] if p > 0) / math.log(i + 1)
                         for i in rows) / (t - 1)
    return out


def batch_of_patterns(ids: np.ndarray, n_layer: int, n_head: int, seed: int = 0) -> np.ndarray:
    """(B, L, nh, T, T) causal patterns, different for every sequence, layer and head: random rows, with some
    heads pulled towards the sequence's own induction or duplicate targets (so ids matter to the scores)."""
    rng = np.random.default_rng(seed)
    b, t = ids.shape
    a = rng.random((b, n_layer, n_head, t, t)) ** 3 * np.tril(np.ones((t, t)))
    for s in range(b):
        a[s, 0, 1] += 4 * R.induction_pattern(ids[s])
        a[s, 1, 0] += 3 * R.duplicate_token_pattern(ids[s])
        a[s, 1, 2] += 2 * np.eye(t, k=-1)
    return a / a.sum(-1, keepdims=True)


@pytest.mark.parametrize("exclude_first", [False, True])
def test_role_scores_of_a_batch_are_the_mean_of_each_sequences_by_hand_scores(exclude_first):
    """Three sequences with different tokens (a repeated probe, a periodic one, random with a few repeats) and
    different patterns: each headline score is the mean over the sequences of that sequence's score written out
    by hand, per layer and head (2 x 3, so averaging over a wrong axis cannot give the right shape and values)."""
    rng = np.random.default_rng(1)
    t = 14
    first = rng.integers(0, 50, t // 2)
    ids = np.stack([np.concatenate([first, first]), np.arange(t) % 4 + 60, rng.integers(0, 9, t)])
    a = batch_of_patterns(ids, 2, 3)
    got = R.role_scores(a, ids, exclude_first=exclude_first)
    for role in SCORED_ROLES:
        per_seq = np.array([[[scores_by_hand(a[s, layer, head], ids[s].tolist(), exclude_first)[role]
                              for head in range(3)] for layer in range(2)] for s in range(3)])
        np.testing.assert_allclose(got[role], per_seq.mean(0), atol=1e-12, err_msg=(
            f"{role}: the batch's score is not the mean of the three sequences' by-hand scores"))
        assert np.ptp(per_seq, axis=0).max() > 1e-3 or role.startswith("previous_token"), (
            f"{role}: the sequences should score differently, or using one sequence's ids for all goes unseen")
    # the same with the patterns the trainer gets: each sequence alone through the library matches too
    for s in range(3):
        alone = R.role_scores(a[s], ids[s], exclude_first=exclude_first)
        for role in ("duplicate_token", "induction"):
            want = [[scores_by_hand(a[s, layer, head], ids[s].tolist(), exclude_first)[role] for head in range(3)]
                    for layer in range(2)]
            np.testing.assert_allclose(alone[role], want, atol=1e-12, err_msg=f"{role} of sequence {s} alone")


@torch.no_grad()
def test_the_trainers_role_scores_on_a_batch_are_the_mean_of_each_sequence_run_alone():
    """measure_heads scores a probe of 4 sequences (and 2 validation windows) in one batch: equal to the mean of
    the by-hand scores of each sequence's own attention, from the model run on that sequence alone."""
    model = sharp_model(dtype=torch.float32, vocab_size=50, block_size=32)
    probe = H.repeated_tokens_probe(50, 10, 4, seed=3)
    val = torch.randint(50, (4, 33), generator=torch.Generator().manual_seed(4))
    report = H.measure_heads(model, probe, val[:, :-1], val[:, 1:], ablate=False)
    cfg = model.config
    for name, x, got in (("probe", probe[:, :-1], report.scores), ("validation", val[:2, :-1], report.text_scores)):
        per_seq = []
        for s in range(x.size(0)):
            out = model(x[s : s + 1], return_attention=True)
            a = torch.stack(out.attentions, dim=1)[0].double().numpy()  # (L, nh, T, T)
            per_seq.append([[scores_by_hand(a[layer, head], x[s].tolist()) for head in range(cfg.n_head)]
                            for layer in range(cfg.n_layer)])
        for role in SCORED_ROLES:
            want = np.array([[[seq[layer][head][role] for head in range(cfg.n_head)] for layer in range(cfg.n_layer)]
                             for seq in per_seq]).mean(0)
            np.testing.assert_allclose(got[role], want, atol=1e-5, err_msg=(
                f"{name} {role}: the trainer's batch score is not the mean of each sequence's own"))
