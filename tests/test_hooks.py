"""One forward pass, one cache (model/hooks.py, attention_lab/interp/analysis.py, interventions.py).

The cache is checked against the model's own outputs taken another way (return_attention, c_proj's input, the
blocks' pre-hooks); every analysis read from it against the separate-pass functions it replaces (capture,
ablation_effects, logit_lens, head_vectors/head_shares), for each attention variant a user switches on; the
interventions against hand computations; and the cache off against the model untouched (no point is called).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attention_lab.interp.analysis import analyze, text_losses
from attention_lab.interp.capture import capture_attention
from attention_lab.interp.heads import HeadAblation, ablation_effects
from attention_lab.interp.inside import head_shares, head_vectors
from attention_lab.interp.interventions import Intervention, intervention_edits, parse_interventions
from attention_lab.interp.lens import logit_lens
from model import GPT, GPTConfig, generate
from model.hooks import HookPoint, hook_points, hooked, point_name, run_with_cache

VARIANTS = {
    "learned": {},
    "rope+qk_norm": dict(pos_encoding="rope", qk_norm=True),
    "gqa": dict(n_kv_head=2, pos_encoding="rope"),
    "window+alibi": dict(window=5, pos_encoding="alibi"),
    "sinks": dict(attn_sinks=True),
    "linear": dict(attention="linear"),
    "linear_raw": dict(attention="linear", linear_denominator=False, linear_out_norm=True),
    "value_residual+qk_tied": dict(value_residual=True, qk_tied=True),
    "math_backend": dict(attn_backend="math"),
    "softcap+nobias": dict(logit_softcap=15.0, bias=False),
    "dropout": dict(dropout=0.2),
}
T = 20


def build(seed: int = 0, **options) -> GPT:
    """A small model whose weights are pushed off their init, so that heads differ and attention is not flat."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=50, block_size=32, n_layer=2, n_head=4, n_embd=32, **options))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model.eval()


def ids(seed: int = 1, t: int = T) -> list[int]:
    return torch.randint(0, 50, (t,), generator=torch.Generator().manual_seed(seed)).tolist()


def close(actual, expected, what: str, atol: float = 2e-5) -> None:
    actual, expected = (x.detach() if isinstance(x, torch.Tensor) else x for x in (actual, expected))
    actual, expected = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    worst = np.abs(actual - expected).max() if actual.size else 0.0
    assert worst <= atol, f"{what}: differs by {worst:.2e} (> {atol:.0e})"


# ------------------------------------------------------------------------------------------------------------
# the cache off costs nothing


def count_calls(model):
    calls = []
    handles = [p.register_forward_hook(lambda m, a, o, name=n: calls.append(name)) for n, p in hook_points(model).items()]
    return calls, handles


@pytest.mark.parametrize("variant", ["learned", "linear", "window+alibi"])
def test_no_point_is_called_outside_hooked_in_training_evaluation_or_decoding(variant):
    model = build(**VARIANTS[variant])
    x = torch.tensor([ids()])

    def everything_but_analysis() -> list[str]:
        calls, handles = count_calls(model)
        model.train()
        model(x, x).loss.backward()  # a training step's forward and backward
        model.eval()
        model(x, return_attention=True)
        generate(model, x[:, :5], 6, greedy=True)  # KV-cached decoding
        for h in handles:
            h.remove()
        return calls

    fresh = everything_but_analysis()
    assert fresh == [], f"hook points were called outside hooked() in a model never hooked: {fresh[:4]}"
    analyze(model, ids())  # hooked() on and off again, as the lab does with a model it keeps
    after = everything_but_analysis()
    assert after == [], f"hook points were called outside hooked() after an analysis: {after[:4]}"
    assert not any(getattr(m, "hooked", False) or getattr(m, "explicit_path", False) for m in model.modules()), \
        "a module was left switched on"


def test_hooked_with_nothing_recorded_or_edited_leaves_the_logits_bit_for_bit():
    model = build(pos_encoding="rope", qk_norm=True)
    x = torch.tensor([ids()])
    plain = model(x).logits
    with hooked(model):
        same = model(x).logits
    assert torch.equal(plain, same), "hooked() with no edits changed the logits (the fused path should still run)"


def test_points_are_named_for_every_block_and_unknown_names_are_refused():
    model = build()
    names = set(hook_points(model))
    for layer in range(2):
        for kind in ("resid_pre", "resid_mid", "resid_post", "q", "k", "v", "scores", "pattern", "z"):
            assert point_name(kind, layer) in names, f"{point_name(kind, layer)} is not a hook point"
    with pytest.raises(KeyError, match="no activation point"):
        with hooked(model, record=["h.0.attn.hook_nothing"]):
            pass
    with pytest.raises(KeyError, match="no activation point"):
        point_name("queries", 0)
    assert all(isinstance(p, HookPoint) for p in hook_points(model).values())


# ------------------------------------------------------------------------------------------------------------
# what the cache holds


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_cache_equals_the_models_outputs_taken_another_way(variant):
    model = build(**VARIANTS[variant])
    cfg = model.config
    x = torch.tensor([ids()])
    seen = {}
    handles = []
    for i, block in enumerate(model.transformer.h):
        handles.append(block.register_forward_pre_hook(lambda m, a, i=i: seen.__setitem__(("in", i), a[0].clone())))
        handles.append(block.attn.c_proj.register_forward_pre_hook(
            lambda m, a, i=i: seen.__setitem__(("proj_in", i), a[0].clone())))
        handles.append(block.attn.register_forward_hook(
            lambda m, a, out, i=i: seen.__setitem__(("attn_out", i), out[0].clone())))
    with torch.no_grad():
        reference = model(x, return_attention=True)
    for h in handles:
        h.remove()
    out, cache = run_with_cache(model, x)
    close(out.logits, reference.logits, f"{variant}: logits under run_with_cache", atol=2e-5)
    for layer in range(cfg.n_layer):
        close(cache["resid_pre", layer], seen["in", layer], f"{variant}: resid_pre L{layer}")
        close(cache["pattern", layer], reference.attentions[layer], f"{variant}: pattern L{layer}")
        z = cache["z", layer]  # (B, nh, T, hs): c_proj's input is the heads side by side
        close(z.transpose(1, 2).reshape(1, T, cfg.n_embd), seen["proj_in", layer], f"{variant}: z L{layer}")
        close(cache["resid_mid", layer], seen["in", layer] + seen["attn_out", layer], f"{variant}: resid_mid L{layer}")
        if layer + 1 < cfg.n_layer:
            close(cache["resid_post", layer], cache["resid_pre", layer + 1], f"{variant}: resid_post L{layer}")
        if cfg.attention == "softmax":
            scores = cache["scores", layer]
            w = torch.softmax(scores, -1) if not cfg.attn_sinks else None
            if w is not None:
                close(w, cache["pattern", layer], f"{variant}: softmax(scores) L{layer}")
    assert cache.stack("q").shape == (cfg.n_layer, 1, cfg.n_head, T, cfg.head_size)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_analysis_from_one_pass_equals_the_separate_passes_it_replaces(variant):
    model = build(**VARIANTS[variant])
    text = ids()
    found = analyze(model, text)
    idx = torch.tensor([text])
    weights = capture_attention(model, text)
    close(found.weights, weights, f"{variant}: weights")
    close(found.ablation, ablation_effects(model, idx[:, :-1], idx[:, 1:]), f"{variant}: batched ablation")
    lens = logit_lens(model, text, k=5)
    close(found.lens.probs, lens.probs, f"{variant}: logit lens")
    qkv = head_vectors(model, text)
    close(found.qkv, qkv, f"{variant}: q, k, v")
    close(found.shares, head_shares(model, weights, qkv), f"{variant}: head shares", atol=5e-5)
    logits = model(idx).logits[0]
    close(found.loss, F.cross_entropy(logits[:-1], idx[0, 1:], reduction="none").detach(), f"{variant}: loss")
    close(found.top_probs[:, 0], torch.softmax(logits, -1).max(-1).values.detach(), f"{variant}: top-1 probability")
    assert found.top_ids.shape == (T, 10) and found.loss.shape == (T - 1,)


def test_ablation_beyond_one_batch_of_copies_is_still_every_head():
    """64 heads (4 layers x 16) need two batches of ABLATION_ROWS copies; the second must line up too."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, block_size=32, n_layer=4, n_head=16, n_embd=64)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    text = ids()
    idx = torch.tensor([text])
    close(analyze(model, text).ablation, ablation_effects(model, idx[:, :-1], idx[:, 1:]), "64-head ablation")


def test_analysis_restores_training_mode_and_handles_one_token():
    model = build(dropout=0.3).train()
    found = analyze(model, [3])
    assert model.training, "analyze left the model in eval mode"
    assert found.ablation is None and found.loss.shape == (0,) and np.isnan(found.loss_mean)
    assert found.weights.shape == (2, 4, 1, 1)


# ------------------------------------------------------------------------------------------------------------
# interventions


def test_zero_equals_the_c_proj_ablation_and_touches_only_that_head():
    model = build(pos_encoding="rope")
    text = ids()
    idx = torch.tensor([text])
    with HeadAblation(model, 1, 2):
        expected = model(idx).logits
    edits = intervention_edits(model.config, [Intervention("zero", 1, 2)])
    _, cache = run_with_cache(model, idx, edits=edits)
    with hooked(model, edits):
        got = model(idx).logits
    close(got, expected, "zeroing z of L1H2 vs zeroing its c_proj input channels")
    z = cache["z", 1][0]
    assert z[2].abs().max() == 0 and z[1].abs().max() > 0, "zero must clear head 2 and only head 2"


def test_uniform_spreads_the_weight_over_the_visible_keys_only():
    model = build(window=5, pos_encoding="alibi")
    found = analyze(model, ids(), interventions=[Intervention("uniform", 0, 1)], ablation=False)
    w = found.weights[0, 1]
    for i in range(T):
        visible = np.arange(T)[(np.arange(T) <= i) & (np.arange(T) > i - 5)]
        close(w[i, visible], np.full(len(visible), 1 / len(visible)), f"uniform row {i}")
        assert w[i].sum() == pytest.approx(1.0, abs=1e-6)
    clean = analyze(model, ids(), ablation=False)
    close(found.weights[0, 0], clean.weights[0, 0], "the other heads of the layer are untouched")


def test_hide_key_hides_one_key_from_later_queries_and_renormalises():
    model = build()
    found = analyze(model, ids(), interventions=[Intervention("hide_key", key=4)], ablation=False)
    assert found.weights[:, :, 5:, 4].max() == 0, "a later query still sees the hidden key"
    close(found.weights.sum(-1), np.ones(found.weights.shape[:-1]), "rows still sum to 1")
    assert found.weights[:, :, 4, 4].min() > 0, "query 4 keeps its own key (its row would be empty)"
    only = analyze(model, ids(), interventions=[Intervention("hide_key", 1, 3, 4)], ablation=False)
    assert only.weights[1, 3, 5:, 4].max() == 0 and only.weights[0, 3, 5:, 4].min() > 0, \
        "hide_key with layer and head hides it in that head only"


def test_hiding_the_last_key_changes_nothing_and_the_ablation_pass_reads_past_it():
    """The last key has no query after it; the ablation pass reads the text without its last token, so that
    key is past the end there (it used to raise IndexError in sample.py --ablate and the notebook)."""
    from attention_lab.interp.analysis import batched_ablation

    model = build()
    text = torch.tensor([ids()])
    last = [Intervention("hide_key", key=T - 1)]
    close(batched_ablation(model, text, last), batched_ablation(model, text), "hiding the last key changes nothing")
    found = analyze(model, ids(), interventions=last, ablation=True)
    close(found.weights, analyze(model, ids(), ablation=False).weights, "the maps are the clean ones")


def test_text_losses_equal_the_full_analysis_with_the_same_edits():
    model = build(attn_sinks=True)
    items = [Intervention("zero", 0, 0), Intervention("uniform", 1, 3), Intervention("hide_key", key=2)]
    loss, mean, top_ids, top_probs = text_losses(model, ids(), interventions=items)
    found = analyze(model, ids(), interventions=items, ablation=False)
    close(loss, found.loss, "per-token loss")
    assert mean == pytest.approx(found.loss_mean) and (top_ids == found.top_ids).all()


@pytest.mark.parametrize("bad, message", [
    ([{"kind": "explode", "layer": 0, "head": 0}], "kind must be one of"),
    ([{"kind": "zero", "layer": 2, "head": 0}], r"layer must be in 0\.\.1"),
    ([{"kind": "zero", "layer": 0, "head": -1}], r"head must be in 0\.\.3"),
    ([{"kind": "zero", "layer": 0}], "head must be an integer"),
    ([{"kind": "zero", "layer": True, "head": 0}], "layer must be an integer"),
    ([{"kind": "hide_key", "key": 20}], r"key must be in 0\.\.19"),
    ([{"kind": "zero", "layer": 0, "head": 0, "key": 3}], "takes no key"),
    ([{"kind": "zero", "layer": 0, "head": 0, "path": "/etc"}], "unknown fields"),
    ([1], "must be an object"),
    ({"kind": "zero"}, "must be a list"),
    ([{"kind": "zero", "layer": 0, "head": 0}] * 65, "at most 64"),
])
def test_bad_interventions_are_refused_with_the_field_named(bad, message):
    with pytest.raises(ValueError, match=message):
        parse_interventions(bad, build().config, T)


def test_linear_attention_takes_only_zero():
    cfg = build(attention="linear").config
    with pytest.raises(ValueError, match="linear attention"):
        parse_interventions([{"kind": "uniform", "layer": 0, "head": 0}], cfg, T)
    assert parse_interventions([{"kind": "zero", "layer": 0, "head": 0}], cfg, T) == [Intervention("zero", 0, 0)]


def test_an_edit_of_the_pattern_is_what_averages_the_values():
    """Put all of head 1's weight on key 0: its output must then be v_0 at every position."""
    model = build()
    x = torch.tensor([ids()])

    def first_key(w):
        w = w.clone()
        w[:, 1] = 0.0
        w[:, 1, :, 0] = 1.0
        return w

    _, cache = run_with_cache(model, x, edits={point_name("pattern", 0): first_key})
    z, v = cache["z", 0][0, 1], cache["v", 0][0, 1]  # (T, hs)
    close(z, v[0].expand_as(z), "z of a head whose weights all sit on key 0")
    assert cache["pattern", 0][0, 1, :, 0].min() == 1.0, "the recorded pattern is the edited one"


def test_ablation_under_interventions_is_measured_on_the_edited_model():
    """With interventions, each head's Δloss is the edited model with that head zeroed minus the edited model:
    ablation_effects run under the same edits."""
    model = build(pos_encoding="rope")
    text = ids()
    idx = torch.tensor([text])
    items = [Intervention("uniform", 0, 1), Intervention("hide_key", key=3)]
    found = analyze(model, text, interventions=items)
    with hooked(model, intervention_edits(model.config, items)):
        expected = ablation_effects(model, idx[:, :-1], idx[:, 1:])
    close(found.ablation, expected, "ablation Δloss under interventions")
    clean = analyze(model, text).ablation
    assert np.abs(found.ablation - clean).max() > 1e-3, "the edits should change some head's Δloss"
