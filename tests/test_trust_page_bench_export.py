"""Numbers the rest of the suite took on trust, each against an independent computation, across the
configurations the other tests skip:

  * inside.head_shares (what the attention page's "step inside" panel and the in-context copying score say each
    head adds to the residual stream) against what the model's own c_proj receives from that head, for every
    attention kind: linear attention without its denominator or with its output norm included (the browser
    half, the panel's own arithmetic, is tests/test_viewer.py::test_step_inside_shows_the_computation_...).
  * bench/attention.py's decoding-cache table (bytes a cache holds per token of context) against the bytes a
    real model's KVCache holds after decoding (the tensors' nbytes over the tokens) and against the formula
    written out by hand: 2 (k and v) x n_layer x n_kv_head x head_size x 4 bytes (float32) per token, a windowed
    layer capped at its W tokens, linear attention a constant n_layer x n_head x (hs^2 + hs) x 4.
  * the config.json the exporter writes, read as the transformers versions we support read it: 4.40 to 4.57
    (names taken from their configuration_gpt2/_gpt_neox/_gpt_bigcode.py: each reads its own names with its own
    defaults, e.g. GPT-NeoX's rotary_pct defaults to 0.25) and the installed 5.x (its own config classes).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from attention_lab.interop.convert import TANH_GELUS, config_from_neox
from attention_lab.interop.hf import export_pretrained, load_pretrained
from attention_lab.interp.capture import capture_attention
from attention_lab.interp.inside import head_shares, head_vectors
from bench.attention import QUICK, VARIANTS, decode, decode_model, predicted_bytes
from bench.common import Context, describe_machine
from model import GPT, GPTConfig
from model.attention import FAR

FLOAT32 = 4  # bytes per element: the bench and these tests decode in float32


# ------------------------------------------------------------------------------------------------------------
# inside.head_shares: what each head hands c_proj


SHARE_VARIANTS = {
    "softmax": {},
    "sinks": dict(attn_sinks=True),
    "window": dict(window=3, window_pattern="LG"),
    "grouped-query": dict(n_kv_head=2),
    "alibi": dict(pos_encoding="alibi"),
    "linear": dict(attention="linear", pos_encoding="learned"),
    "linear, no denominator": dict(attention="linear", pos_encoding="learned", linear_denominator=False),
    "linear, out_norm": dict(attention="linear", pos_encoding="learned", linear_out_norm=True),
    "linear, no denominator, out_norm, value_residual": dict(
        attention="linear", pos_encoding="learned", linear_denominator=False, linear_out_norm=True,
        value_residual=True),
}


@pytest.mark.parametrize("variant", list(SHARE_VARIANTS))
def test_head_shares_are_what_each_head_hands_c_proj(variant):
    """head_shares[l, h, i] = (head h's output at i) W_O^T, where the head's output is read from the model's
    own forward pass: c_proj's input, whose columns h*hs..(h+1)*hs are head h's (CausalSelfAttention and
    LinearAttention both concatenate the heads before c_proj)."""
    torch.manual_seed(0)
    cfg = GPTConfig(**(dict(vocab_size=50, block_size=16, n_layer=2, n_head=4, n_embd=32, pos_encoding="rope")
                       | SHARE_VARIANTS[variant]))
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape) * 0.3)
    ids = torch.randint(0, 50, (12,), generator=torch.Generator().manual_seed(1))
    seen = {}
    hooks = [block.attn.c_proj.register_forward_pre_hook(
        lambda m, args, layer=layer: seen.__setitem__(layer, args[0][0].detach().double()))
        for layer, block in enumerate(model.transformer.h)]
    try:
        with torch.no_grad():
            model(ids[None])
    finally:
        for h in hooks:
            h.remove()
    got = head_shares(model, capture_attention(model, ids), head_vectors(model, ids))  # (L, nh, T, C)
    hs = cfg.head_size
    for layer, head in np.ndindex(cfg.n_layer, cfg.n_head):
        cols = slice(head * hs, (head + 1) * hs)
        w_o = model.transformer.h[layer].attn.c_proj.weight.detach().double()[:, cols]  # (C, hs)
        want = (seen[layer][:, cols] @ w_o.T).numpy()  # (T, C)
        np.testing.assert_allclose(got[layer, head], want, atol=1e-5, rtol=1e-4, err_msg=(
            f"{variant}: head_shares of layer {layer}, head {head} is not what that head hands c_proj in the "
            "model's forward pass (the page's 'adds a vector of norm ...' and the in-context copying score read it)"))


# ------------------------------------------------------------------------------------------------------------
# bench/attention.py: the decoding cache's bytes per token


def by_hand_bytes(cfg: GPTConfig, length: int) -> int:
    """What a cache must hold after `length` tokens, float32, written out: per layer keys and values of
    min(length, W) tokens (all `length` without a window) for each of the n_kv_head heads; linear attention its
    state, per query head an hs x hs sum and an hs normaliser, whatever the length."""
    hs = cfg.n_embd // cfg.n_head
    total = 0
    for layer in range(cfg.n_layer):
        if cfg.attention == "linear":
            total += cfg.n_head * (hs * hs + hs) * FLOAT32
            continue
        local = cfg.window and (cfg.window_pattern or "L")[layer % len(cfg.window_pattern or "L")] == "L"
        kept = min(length, cfg.window) if local else length
        total += 2 * kept * (cfg.n_kv_head or cfg.n_head) * hs * FLOAT32
    return total


def decoded_cache(cfg: GPTConfig, length: int):
    """A real model with block_size = length (so a full layer's buffer holds exactly the tokens decoded): a prefill
    of all but 3 tokens, then 3 decoded one at a time. Returns the cache."""
    cfg = GPTConfig(**(cfg.to_dict() | {"block_size": length}))
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, length), generator=torch.Generator().manual_seed(1))
    cache = model.new_kv_cache()
    with torch.inference_mode():
        model(ids[:, : length - 3], kv_cache=cache, last_only=True)
        for t in range(length - 3, length):
            model(ids[:, [t]], kv_cache=cache, last_only=True)
    assert cache.length == length, f"the cache says it holds {cache.length} tokens, {length} were fed"
    return cache


def nbytes_held(cache) -> int:
    """The nbytes of what the cache keeps for the tokens: linear attention's state tensors; a full layer's key
    and value buffers (checked to be exactly full); a windowed layer's ring buffers, in the share of their slots
    that hold a position (all W once W tokens went by; the slot positions themselves not counted)."""
    total = 0
    for layer, (k, v, state) in enumerate(zip(cache.k, cache.v, cache.state)):
        if state is not None:
            total += sum(x.nbytes for x in state)
            continue
        slots = k.shape[2]
        if cache.pos[layer] is not None:  # a ring of W slots
            used = int((cache.pos[layer] != FAR).sum())
            assert used == min(cache.length, slots), f"layer {layer}: {used} of {slots} ring slots used"
        else:
            used = cache.length
            assert slots == used, f"layer {layer}: a buffer of {slots} positions for {used} tokens"
        total += (k.nbytes + v.nbytes) * used // slots
    return total


CACHE_CONFIGS = {  # four query heads, so grouped-query (2 kv heads) differs from multi-head and multi-query
    "multi-head": {},
    "grouped-query": dict(n_kv_head=2),
    "multi-query": dict(n_kv_head=1),
    "window, every layer": dict(window=8),
    "window, local then global": dict(window=8, window_pattern="LG"),
    "window, grouped-query": dict(window=8, n_kv_head=2),
    "linear": dict(attention="linear", pos_encoding="none"),
    "linear, grouped-query": dict(attention="linear", pos_encoding="none", n_kv_head=2),
}


@pytest.mark.parametrize("variant", list(CACHE_CONFIGS))
@pytest.mark.parametrize("length", [8, 20])
def test_predicted_cache_bytes_are_what_a_real_cache_holds(variant, length):
    """bench/attention.py predicted_bytes (the table's "bytes held (computed)") equals the by-hand formula and the
    nbytes of a real KVCache after decoding `length` tokens, per token of context; a windowed layer stops growing
    at W = 8 tokens (20 > W), a linear layer does not grow at all."""
    cfg = GPTConfig(**(dict(vocab_size=64, block_size=32, n_layer=3, n_head=4, n_embd=32, pos_encoding="rope")
                       | CACHE_CONFIGS[variant]))
    computed, hand = predicted_bytes(cfg, length), by_hand_bytes(cfg, length)
    held = nbytes_held(decoded_cache(cfg, length))
    assert computed == hand == held, (
        f"{variant}, {length} tokens: the bench computes {computed / length:g} bytes per token, the formula gives "
        f"{hand / length:g}, a real cache holds {held / length:g}")


def test_kv_cache_table_rows_match_a_real_cache_and_the_formula(capsys):
    """The kv_cache table as bench/attention.py writes it (tiny shapes, W = 16, lengths on both sides of W): each
    row's bytes per token equals the formula and a real cache of that variant decoded to that length; each row's
    "measured" bytes equal what the cache allocates: block_size positions per full layer, W per windowed one,
    the state per linear one."""
    device = torch.device("cpu")
    ctx = Context(device=device, quick=True, machine=describe_machine(device), peak_flops=1e9)
    s = dict(QUICK, cached=(8, 16, 24), decode_steps=1)
    cache_table, _ = decode(ctx, s)
    block = max(s["cached"]) + s["decode_steps"] + 8  # as decode() sizes the models' contexts
    rows = {(r["variant"], r["length"]): r for r in cache_table.rows}
    assert set(rows) == {(v, n) for v in VARIANTS for n in s["cached"]}, f"table rows {sorted(rows)}"
    for (name, length), row in rows.items():
        cfg = decode_model(VARIANTS[name], block, True).config
        at = f"kv_cache table, {name}, {length} tokens"
        hand = by_hand_bytes(cfg, length)
        held = nbytes_held(decoded_cache(cfg, length))
        assert row["computed"] == hand == held, (
            f"{at}: the table says {row['computed']} bytes held, the formula {hand}, a real cache {held}")
        assert row["per_token"] == pytest.approx(hand / length, rel=1e-12), (
            f"{at}: the table's bytes per token {row['per_token']} is not held / length = {hand / length}")
        hs = cfg.head_size
        if cfg.attention == "linear":
            allocated = cfg.n_layer * cfg.n_head * (hs * hs + hs) * FLOAT32
        else:
            allocated = sum(2 * (cfg.layer_window(i) or block) * cfg.kv_heads * hs * FLOAT32
                            for i in range(cfg.n_layer))
        assert row["measured"] == allocated, f"{at}: the table measured {row['measured']} bytes, allocated {allocated}"
    per_token = {name: [rows[(name, n)]["per_token"] for n in s["cached"]] for name in VARIANTS}
    assert per_token["multi-query"][0] * 2 == per_token["multi-head"][0], per_token  # 1 of 2 kv heads
    assert per_token["window (W = 256)"][-1] < per_token["window (W = 256)"][0], per_token  # capped at W = 16
    capsys.readouterr()


# ------------------------------------------------------------------------------------------------------------
# exported config.json, as each supported transformers version reads it


# Every number transformers 4.40 ... 4.57 reads from config.json for these models: name -> (the default its
# __init__ falls back on when the name is absent, what the value must be for our GPTConfig). Taken from the
# configuration_*.py of 4.40.0 and 4.57.6 (the same names in both; 4.57 also copies rotary_pct into
# partial_rotary_factor and rotary_emb_base into rope_theta, overriding any of those given in the file).
GPT2_4X = {
    "vocab_size": (50257, lambda c: c.vocab_size),
    "n_positions": (1024, lambda c: c.block_size),
    "n_embd": (768, lambda c: c.n_embd),
    "n_layer": (12, lambda c: c.n_layer),
    "n_head": (12, lambda c: c.n_head),
    "n_inner": (None, lambda c: c.mlp_ratio * c.n_embd),  # None means 4 * n_embd
    "layer_norm_epsilon": (1e-5, lambda c: c.layer_norm_eps),
    "tie_word_embeddings": (True, lambda c: c.tie_embeddings),  # PretrainedConfig's
    "scale_attn_weights": (True, lambda c: True),
    "scale_attn_by_inverse_layer_idx": (False, lambda c: False),
    "reorder_and_upcast_attn": (False, lambda c: False),
}
BIGCODE_4X = GPT2_4X | {"multi_query": (True, lambda c: c.kv_heads == 1)}
for _name in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
    del BIGCODE_4X[_name]  # GPT-2's only
NEOX_4X = {
    "vocab_size": (50432, lambda c: c.vocab_size),
    "hidden_size": (6144, lambda c: c.n_embd),
    "num_hidden_layers": (44, lambda c: c.n_layer),
    "num_attention_heads": (64, lambda c: c.n_head),
    "intermediate_size": (24576, lambda c: c.mlp_ratio * c.n_embd),
    "rotary_pct": (0.25, lambda c: 1.0),  # the rotary fraction: ours rotates the whole head
    "rotary_emb_base": (10000, lambda c: c.rope_base),
    "max_position_embeddings": (2048, lambda c: c.block_size),
    "layer_norm_eps": (1e-5, lambda c: c.layer_norm_eps),
    "tie_word_embeddings": (False, lambda c: c.tie_embeddings),
    "use_parallel_residual": (True, lambda c: False),
    "rope_scaling": (None, lambda c: None),
}
READERS_4X = {"gpt2": GPT2_4X, "gpt_bigcode": BIGCODE_4X, "gpt_neox": NEOX_4X}
ACTIVATION_4X = {"gpt2": ("activation_function", "gelu_new"), "gpt_neox": ("hidden_act", "gelu"),
                 "gpt_bigcode": ("activation_function", "gelu_pytorch_tanh")}  # name, default


def read_5x(target: str, h, c: GPTConfig) -> dict[str, tuple]:
    """The same numbers as the installed 5.x config object `h` holds them: name -> (its value, the model's)."""
    if target == "gpt_neox":
        rope = h.rope_parameters
        return {
            "rope_parameters.partial_rotary_factor": (rope["partial_rotary_factor"], 1.0),
            "rope_parameters.rope_theta": (rope["rope_theta"], c.rope_base),
            "rope_parameters.rope_type": (rope["rope_type"], "default"),
            "max_position_embeddings": (h.max_position_embeddings, c.block_size),
            "layer_norm_eps": (h.layer_norm_eps, c.layer_norm_eps),
            "tie_word_embeddings": (h.tie_word_embeddings, c.tie_embeddings),
            "use_parallel_residual": (h.use_parallel_residual, False),
            "intermediate_size": (h.intermediate_size, c.mlp_ratio * c.n_embd),
        }
    out = {  # GPT-2 and GPTBigCode
        "n_positions": (h.n_positions, c.block_size),
        "max_position_embeddings": (h.max_position_embeddings, c.block_size),
        "layer_norm_epsilon": (h.layer_norm_epsilon, c.layer_norm_eps),
        "tie_word_embeddings": (h.tie_word_embeddings, c.tie_embeddings),
        "n_inner": (h.n_inner, c.mlp_ratio * c.n_embd),
        "num_attention_heads": (h.num_attention_heads, c.n_head),
        "hidden_size": (h.hidden_size, c.n_embd),
    }
    if target == "gpt_bigcode":
        out |= {"multi_query": (h.multi_query, c.kv_heads == 1),
                "num_key_value_heads": (h.num_key_value_heads, c.kv_heads)}
    return out


V5_ONLY = {"rope_parameters", "dtype", "num_key_value_heads"}  # names 4.x does not read
V4_ONLY = {"rotary_pct", "rotary_emb_base", "torch_dtype"}  # names 5.x reads only when its own are absent

# every number away from every version's default, so that a name the export leaves out cannot read right
EXPORTS = {
    "gpt2": dict(pos_encoding="learned", tie_embeddings=False),
    "gpt_neox": dict(pos_encoding="rope", rope_base=500.0, tie_embeddings=True),
    "gpt_bigcode": dict(pos_encoding="learned", n_kv_head=1, tie_embeddings=False),
}


def _export(tmp_path, target: str) -> tuple[GPT, dict, object]:
    cfg = GPTConfig(vocab_size=40, block_size=24, n_layer=2, n_head=2, n_embd=16, mlp_ratio=3,
                    layer_norm_eps=1e-6, **EXPORTS[target])
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    result = export_pretrained(model, tmp_path / target)
    assert result.plan.target == target, f"fixture: {EXPORTS[target]} exported as {result.plan.target}"
    return model, json.loads((result.path / "config.json").read_text()), result.path


@pytest.mark.parametrize("target", list(EXPORTS))
def test_exported_config_reads_the_same_in_transformers_4_and_5(tmp_path, target):
    """Each number the 4.x config class reads (its name, or its default when absent) and each the installed 5.x
    config class holds after loading config.json equals the model's own GPTConfig; an n_ctx, if written, too."""
    transformers = pytest.importorskip("transformers")
    model, hf, path = _export(tmp_path, target)
    cfg = model.config
    wrong = [f"4.x {name}: {hf.get(name, default)!r} (default {default!r}), the model has {want(cfg)!r}"
             for name, (default, want) in READERS_4X[target].items() if hf.get(name, default) != want(cfg)]
    name, default = ACTIVATION_4X[target]
    if hf.get(name, default) not in TANH_GELUS:
        wrong.append(f"4.x {name}: {hf.get(name, default)!r} is not the tanh GELU the model computes")
    if "n_ctx" in hf and hf["n_ctx"] != cfg.block_size:  # GPT-2's name before 4.12; nothing we support reads it
        wrong.append(f"n_ctx {hf['n_ctx']} but block_size {cfg.block_size}")
    five = transformers.AutoConfig.from_pretrained(path)
    wrong += [f"5.x {name}: {got!r}, the model has {want!r}"
              for name, (got, want) in read_5x(target, five, cfg).items() if got != want]
    assert not wrong, f"{target} config.json misleads a transformers version we support:\n" + "\n".join(wrong)


@pytest.mark.parametrize("keep", ["4.x names only", "5.x names only"])
def test_neox_rotary_fraction_and_theta_read_back_from_either_versions_names(tmp_path, keep):
    """A GPT-NeoX config.json holding only one version's names (as transformers 4.x or 5.x would save it) gives
    the same rotary fraction and theta through our reader (convert.config_from_neox, load_pretrained) and
    through the installed transformers; the hint with our GPTConfig is removed so it cannot answer instead."""
    transformers = pytest.importorskip("transformers")
    model, hf, path = _export(tmp_path, "gpt_neox")
    drop = V5_ONLY if keep == "4.x names only" else V4_ONLY
    hf = {k: v for k, v in hf.items() if k not in drop and k != "attention_lab"}
    (path / "config.json").write_text(json.dumps(hf))
    ours = config_from_neox(hf)  # refuses a rotary fraction other than 1.0
    assert ours.rope_base == model.config.rope_base, f"{keep}: our reader gives rope_base {ours.rope_base}"
    back = load_pretrained(path)
    for field in ("rope_base", "block_size", "layer_norm_eps", "tie_embeddings", "mlp_ratio"):
        assert getattr(back.config, field) == getattr(model.config, field), (
            f"{keep}: load_pretrained gives {field}={getattr(back.config, field)!r}, the export had "
            f"{getattr(model.config, field)!r}")
    idx = torch.randint(0, 40, (1, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(back(idx).logits, model(idx).logits), f"{keep}: the model read back computes otherwise"
    five = transformers.AutoConfig.from_pretrained(path).rope_parameters
    assert (five["partial_rotary_factor"], five["rope_theta"]) == (1.0, model.config.rope_base), (
        f"{keep}: transformers {transformers.__version__} reads rope_parameters {five}")
