"""TransformerLens 4 opens every export, and what it measures there is what we measure here.

For each architecture the exporter writes (GPT-2 for learned positions, GPT-NeoX for RoPE with and without biases,
GPTBigCode for multi-query, the shipped model code for QK-norm and ALiBi, through
attention_lab/interop/transformer_lens_bridge.py), a tiny model is trained for a few dozen steps so that its heads
are not uniform, exported, and opened with TransformerBridge. On a probe batch (random tokens repeated twice) the
test checks, against TransformerLens's own cache and machinery:

  * every layer's and head's attention pattern (cache["pattern", layer]) equals ours (model(..., return_attention));
  * role_scores' all-rows scores equal transformer_lens.head_detector's (its detection patterns and
    compute_head_attention_similarity_score on TransformerLens's cached patterns, averaged over the batch as
    detect_head averages over a list of prompts), and its stripe scores equal the same formula, sum(A * D) / sum(A),
    restricted to the query rows that have a target (written out below), with and without the exclusions;
  * the logit lens (attention_lab/interp/lens.py) equals cache.accumulated_resid(apply_ln=True), unembedded and
    log-softmaxed, at every point it reports (the embeddings, the stream entering each later block, ln_f's input).

Tolerances: patterns 1e-5 and scores 1e-5 absolute (measured: patterns within 1.4e-6, scores within 7e-8),
log-probs 1e-4 (measured within 5e-6); GPT-NeoX's patterns equal ours exactly. A wrong head or layer order, a
transposed pattern, a score over the wrong rows, or a lens that skips ln_f moves these by more than 1e-2.

transformer_lens is in the test extras; without it this module is skipped.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("transformer_lens")

import torch  # noqa: E402
from transformer_lens import head_detector  # noqa: E402

from attention_lab.interop.hf import export_pretrained  # noqa: E402
from attention_lab.interop.transformer_lens_bridge import open_bridge  # noqa: E402
from attention_lab.interp.heads import repeated_tokens_probe  # noqa: E402
from attention_lab.interp.lens import logit_lens  # noqa: E402
from attention_lab.interp.roles import DETECTION_ROLES, role_scores  # noqa: E402
from attention_lab.training.config import compose  # noqa: E402
from data.tokenizer import Tokenizer  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

TEXT = "the quick brown fox jumps over the lazy dog, THE QUICK BROWN FOX 0123456789."
HALF = 16  # the probe: HALF random tokens, then the same again (T = 32 = block_size)
PATTERN_TOL = 1e-5
SCORE_TOL = 1e-5
LOGPROB_TOL = 1e-4
TL_HEADS = {"previous_token": "previous_token_head", "duplicate_token": "duplicate_token_head",
            "induction": "induction_head"}  # our role -> TransformerLens's HeadName
OPTIONS = ({}, {"exclude_first": True, "exclude_self": True})  # ours; TransformerLens: exclude_bos / _current_token

# case -> (GPTConfig overrides, the class transformers loads the export as)
CASES = {
    "gpt2-learned": (dict(pos_encoding="learned", bias=True), "GPT2LMHeadModel"),
    "neox-rope-bias": (dict(pos_encoding="rope", bias=True), "GPTNeoXForCausalLM"),
    "neox-rope-no-bias": (dict(pos_encoding="rope", bias=False), "GPTNeoXForCausalLM"),
    "bigcode-multi-query": (dict(pos_encoding="learned", n_kv_head=1, bias=False), "GPTBigCodeForCausalLM"),
    "shipped-rope-qk-norm": (dict(pos_encoding="rope", qk_norm=True, bias=False), "AttentionLabForCausalLM"),
    "shipped-alibi": (dict(pos_encoding="alibi", bias=True), "AttentionLabForCausalLM"),
}


@pytest.fixture(scope="module")
def tokenizer_json() -> str:
    return Tokenizer.train_char([[TEXT]]).to_str()


def trained(cfg: GPTConfig, steps: int = 40, lr: float = 1e-2) -> GPT:
    """`cfg` trained `steps` Adam steps to output the PREVIOUS token of random text: one head looking one key back
    solves it, and heads learn that in a few dozen steps (an induction head would take hundreds), so the patterns
    compared below are sharp, not the near-uniform ones of a fresh model (normalised entropies down to 0.07-0.65
    by case). At lr 2e-2 they get sharper still, and float32 rounding in the scores then moves weights by up to
    6e-6: lr 1e-2 keeps the measured pattern differences at 1.4e-6 or less."""
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for step in range(steps):
        x = repeated_tokens_probe(cfg.vocab_size, HALF, 16, seed=1000 + step)
        y = torch.cat([torch.full_like(x[:, :1], -1), x[:, :-1]], dim=1)  # the token before; -1: none, ignored
        loss = model(x, y).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@dataclasses.dataclass
class Opened:
    case: str
    ours: GPT
    probe: torch.Tensor  # (B, T)
    attentions: torch.Tensor  # (B, L, nh, T, T), ours
    logits: torch.Tensor  # (B, T, V), ours
    bridge: object  # TransformerBridge
    tl_logits: torch.Tensor
    cache: object  # TransformerLens ActivationCache


@pytest.fixture(scope="module", params=list(CASES))
def opened(request, tmp_path_factory, tokenizer_json) -> Opened:
    overrides, architecture = CASES[request.param]
    cfg = GPTConfig(vocab_size=Tokenizer.from_str(tokenizer_json).vocab_size, block_size=2 * HALF, n_layer=2,
                    n_head=4, n_embd=64, **overrides)
    ours = trained(cfg)
    folder = export_pretrained(ours, tmp_path_factory.mktemp(request.param) / "export", tokenizer_json).path
    assert json.loads((folder / "config.json").read_text())["architectures"] == [architecture], \
        f"{request.param}: exported as another architecture than the case is meant to test"
    bridge = open_bridge(folder)
    assert type(bridge.original_model).__name__ == architecture, type(bridge.original_model).__name__
    probe = repeated_tokens_probe(cfg.vocab_size, HALF, 4, seed=0)
    with torch.no_grad():
        out = ours(probe, return_attention=True)
        tl_logits, cache = bridge.run_with_cache(probe)  # a token tensor: nothing is prepended
    return Opened(request.param, ours, probe, torch.stack(out.attentions, dim=1), out.logits, bridge, tl_logits,
                  cache)


def test_transformer_lens_patterns_equal_ours(opened):
    o = opened
    entropy = role_scores(o.attentions.numpy(), o.probe.numpy())["entropy"]
    assert entropy.min() < 0.8, (f"{o.case}: every head is near uniform (normalised entropies {entropy.round(2)}); "
                                 "the training in trained() no longer sharpens them, so equal patterns prove little")
    torch.testing.assert_close(o.tl_logits, o.logits, atol=1e-4, rtol=1e-4,
                               msg=lambda m: f"{o.case}: TransformerBridge's logits differ from ours\n{m}")
    n_layer = o.ours.config.n_layer
    assert f"blocks.{n_layer - 1}.attn.hook_pattern" in o.cache.keys(), sorted(o.cache.keys())[:20]
    for layer in range(n_layer):
        theirs = o.cache["pattern", layer]  # (B, nh, T, T)
        torch.testing.assert_close(theirs, o.attentions[:, layer], atol=PATTERN_TOL, rtol=0, msg=lambda m: (
            f"{o.case}: TransformerLens's attention pattern of layer {layer} differs from ours\n{m}"))


def transformer_lens_scores(patterns: torch.Tensor, tokens: torch.Tensor, role: str, *, exclude_first: bool = False,
                            exclude_self: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(all rows, stripe) per (layer, head) from TransformerLens's cached patterns (B, L, nh, T, T) and its own
    detection patterns. All rows: head_detector.compute_head_attention_similarity_score, the mean over the batch
    (detect_head's mean over a list of prompts). Stripe: the same sum(A * D) / sum(A), over the rows i with D[i].any().
    """
    b, n_layer, n_head, _, _ = patterns.shape
    all_rows, stripe = np.zeros((n_layer, n_head)), np.zeros((n_layer, n_head))
    for seq in range(b):
        d = getattr(head_detector, f"get_{TL_HEADS[role]}_detection_pattern")(tokens[seq : seq + 1].cpu()).double()
        rows = d.sum(-1) > 0
        for layer in range(n_layer):
            for head in range(n_head):
                a = patterns[seq, layer, head]
                all_rows[layer, head] += head_detector.compute_head_attention_similarity_score(
                    a, detection_pattern=d.to(a.dtype), exclude_bos=exclude_first, exclude_current_token=exclude_self,
                    error_measure="mul")
                a = a.double().clone()
                if exclude_first:
                    a[:, 0] = 0.0
                if exclude_self:
                    a.fill_diagonal_(0.0)
                stripe[layer, head] += ((a * d)[rows].sum() / a[rows].sum()).item()
    return all_rows / b, stripe / b


@pytest.mark.parametrize("options", OPTIONS, ids=["plain", "exclusions"])
def test_role_scores_equal_transformer_lens_head_detector(opened, options):
    o = opened
    ours = role_scores(o.attentions.numpy(), o.probe.numpy(), **options)
    patterns = torch.stack([o.cache["pattern", layer] for layer in range(o.ours.config.n_layer)], dim=1)
    for role in DETECTION_ROLES:
        all_rows, stripe = transformer_lens_scores(patterns, o.probe, role, **options)
        # (with the exclusions row 0 weighs nothing: previous_token's two forms are then one)
        assert options or np.abs(all_rows - stripe).max() > 1e-3, (
            f"{o.case}, {role}: the stripe and all-rows references agree on the probe, so the check below "
            "cannot tell the two forms apart")
        for form, theirs, name in (("all rows", all_rows, f"{role}_all_rows"), ("stripe", stripe, role)):
            diff = np.abs(ours[name] - theirs).max()
            assert diff <= SCORE_TOL, (
                f"{o.case}, {options or 'no exclusions'}: role_scores' {name} ({form}) differs from TransformerLens "
                f"by {diff:.2e}\nours:\n{ours[name].round(4)}\nTransformerLens:\n{theirs.round(4)}")


def test_logit_lens_equals_transformer_lens_accumulated_resid(opened):
    o = opened
    cfg = o.ours.config
    resid, labels = o.cache.accumulated_resid(apply_ln=True, return_labels=True)  # (L + 1, B, T, C)
    assert labels == [f"{layer}_pre" for layer in range(cfg.n_layer)] + ["final_post"], labels
    with torch.no_grad():
        theirs = torch.log_softmax(o.bridge.unembed(resid), dim=-1).double().numpy()  # (L + 1, B, T, V)
    for seq in range(o.probe.shape[0]):
        top = logit_lens(o.ours, o.probe[seq], k=cfg.vocab_size)  # every token: (L + 1, T, V), sorted
        ours = np.full(top.ids.shape, np.nan)
        np.put_along_axis(ours, top.ids, np.log(top.probs.astype(np.float64)), axis=-1)
        diff = np.abs(ours - theirs[:, seq]).max(axis=(1, 2))  # per lens row
        assert diff.max() <= LOGPROB_TOL, (
            f"{o.case}, sequence {seq}: our logit lens differs from TransformerLens's accumulated_resid "
            f"(apply_ln=True) by {diff.round(6).tolist()} in log-probability at rows {labels}")


SHIPPED = [case for case, (_, architecture) in CASES.items() if architecture == "AttentionLabForCausalLM"]


@pytest.mark.parametrize("opened", SHIPPED, indirect=True)
def test_the_weights_an_export_returns_through_the_bridge_are_its_pattern(opened):
    """The shipped code called through the bridge (its blocks call AttentionLabAttentionBridge) with
    output_attentions=True, which runs eager attention: the weights it returns are TransformerLens's hook_pattern
    and our model's own weights, one (B, nh, T, T) a layer."""
    o = opened
    with torch.no_grad():
        got = o.bridge.original_model(o.probe, output_attentions=True).attentions
    n_layer = o.ours.config.n_layer
    assert got is not None and len(got) == n_layer and all(a is not None for a in got), (
        f"{o.case}: output_attentions=True through the bridge returned "
        f"{None if got is None else [None if a is None else tuple(a.shape) for a in got]}, not one tensor a layer")
    for layer in range(n_layer):
        torch.testing.assert_close(got[layer], o.attentions[:, layer], atol=PATTERN_TOL, rtol=0, msg=lambda m: (
            f"{o.case}, layer {layer}: the weights returned through the bridge are not our model's\n{m}"))
        torch.testing.assert_close(got[layer], o.cache["pattern", layer], atol=0, rtol=0, msg=lambda m: (
            f"{o.case}, layer {layer}: the weights returned are not the bridge's hook_pattern\n{m}"))


def test_the_default_model_opens_in_transformer_lens(tmp_path, tokenizer_json):
    """The default config (RoPE + QK-norm: the shipped code) at its full size, untrained. QK-norm makes the scale
    of q and k irrelevant, so for sharp patterns each query projection is made its key projection: every query then
    meets itself at the largest score QK-norm allows, sqrt(d_head) (normalised entropies 0.09-0.11, not ~0.9)."""
    cfg = compose([]).model.gpt(vocab_size=Tokenizer.from_str(tokenizer_json).vocab_size)
    assert cfg.qk_norm and cfg.pos_encoding == "rope", "the default model changed: check which export this tests"
    torch.manual_seed(3)
    ours = GPT(cfg).eval()
    with torch.no_grad():
        for block in ours.transformer.h:  # c_attn rows [q | k | v]
            block.attn.c_attn.weight[: cfg.n_embd] = block.attn.c_attn.weight[cfg.n_embd : 2 * cfg.n_embd]
    folder = export_pretrained(ours, tmp_path / "export", tokenizer_json).path
    bridge = open_bridge(folder)
    probe = repeated_tokens_probe(cfg.vocab_size, 24, 2, seed=1)
    with torch.no_grad():
        out = ours(probe, return_attention=True)
        logits, cache = bridge.run_with_cache(probe)
    entropy = role_scores(torch.stack(out.attentions, dim=1).numpy(), probe.numpy())["entropy"]
    assert entropy.max() < 0.5, f"the default model's patterns are not sharp: normalised entropies {entropy.round(2)}"
    torch.testing.assert_close(logits, out.logits, atol=1e-4, rtol=1e-4,
                               msg=lambda m: f"default model: TransformerBridge's logits differ from ours\n{m}")
    for layer in range(cfg.n_layer):
        torch.testing.assert_close(cache["pattern", layer], out.attentions[layer], atol=PATTERN_TOL, rtol=0,
                                   msg=lambda m: f"default model, layer {layer}: patterns differ\n{m}")


@pytest.mark.parametrize("option, overrides", [
    ("value_residual", dict(value_residual=True)),
    ("n_kv_head", dict(n_kv_head=2)),
    ("window", dict(window=4)),
])
def test_shipped_code_options_the_bridge_does_not_recompute_are_refused(tmp_path, tokenizer_json, option,
                                                                         overrides):
    cfg = GPTConfig(vocab_size=Tokenizer.from_str(tokenizer_json).vocab_size, block_size=16, n_layer=2, n_head=4,
                    n_embd=32, pos_encoding="rope", qk_norm=True, **overrides)
    folder = export_pretrained(GPT(cfg), tmp_path / "export", tokenizer_json).path
    with pytest.raises(ValueError, match=option):
        open_bridge(folder)
