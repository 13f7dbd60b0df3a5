"""Map this GPT to and from Hugging Face transformers architectures: configs and state dicts (no file I/O here).

    learned | sinusoidal | none positions  ->  GPT2LMHeadModel     (model_type "gpt2")
    rope positions                         ->  GPTNeoXForCausalLM  (model_type "gpt_neox")
    anything neither expresses exactly     ->  our own code shipped in the export (model_type "attention_lab",
                                               loaded with trust_remote_code=True; attention_lab/interop/remote_code/)

`plan_export(cfg)` picks the target and says why; every GPTConfig field must be listed in FIELD_ROLES, so a new
model option makes the exporter refuse until someone decides how it maps, instead of being silently dropped.

GPT-2: our names are GPT-2's, so keys match one for one, with two differences:
  * GPT-2 keeps its projections as Conv1D, weight (in, out); nn.Linear stores (out, in): transpose.
  * GPT-2 always has a position table and biases: a sinusoidal table or zeros as `wpe`, zeros for absent biases.
Hub checkpoints of the original GPT-2 also lack the "transformer." prefix ("h.0.attn.c_attn.weight").

GPT-NeoX (pre-LayerNorm with use_parallel_residual=False is our block; rotate-half RoPE is ours):
  * its fused query_key_value rows are grouped per head, [q_h0 k_h0 v_h0 | q_h1 k_h1 v_h1 | ...], ours are
    [q | k | v] (each C rows, heads inside): regroup.
  * rotary over the whole head (partial_rotary_factor 1.0; NeoX's default is 0.25), rope_theta = rope_base.
  * LayerNorms and the MLP always have biases there: zeros when bias=False. The attention's too
    (attention_bias=True, zero query_key_value and dense biases): transformers computes the same function
    without them, but TransformerLens's GPT-NeoX adapter refuses a checkpoint whose attention has no bias.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from model.config import GPTConfig
from model.positions import sinusoidal_embedding

HINT_KEY = "attention_lab"  # every exported config.json carries the GPTConfig it came from under this key

# How each GPTConfig field reaches the exported model. plan_export refuses a config with a field not listed here.
FIELD_ROLES = {
    "vocab_size": "size",
    "block_size": "size (GPT-2 n_positions, GPT-NeoX max_position_embeddings)",
    "n_layer": "size",
    "n_head": "size",
    "n_embd": "size",
    "mlp_ratio": "size (n_inner / intermediate_size)",
    "layer_norm_eps": "mapped",
    "tie_embeddings": "mapped (tie_word_embeddings)",
    "dropout": "mapped (every dropout probability; training only)",
    "bias": "mapped (zeros where the architecture always has biases)",
    "mlp_act": "mapped (gelu -> gelu_pytorch_tanh, relu2 -> relu2)",
    "pos_encoding": "chooses the architecture",
    "rope_base": "mapped (GPT-NeoX rope_theta)",
    "attn_backend": "not exported: both backends compute the same function",
    "zero_init_proj": "not exported: initialisation only",
    "qk_norm": "remote code when true",
    "logit_softcap": "remote code when > 0",
    "value_residual": "remote code when true",
    "n_kv_head": "GPTBigCode when 1 with learned, sinusoidal or no positions; else remote code when below n_head",
    "window": "remote code when > 0",
    "window_pattern": "remote code (with window)",
    "attn_sinks": "remote code when true",
    "attention": "remote code when linear; not exportable when uniform (an experiment switch: q zeroed)",
    "linear_denominator": "remote code (with attention=linear)",
    "linear_out_norm": "remote code (with attention=linear)",
    "attn_scale": "not exportable unless sqrt (an experiment switch; nothing exported computes another scale)",
    "causal_mask": "not exportable unless before_softmax (an experiment switch; nothing exported computes another)",
    "qk_tied": "not exportable when true (an experiment switch; nothing exported ties the key projection)",
    "attend_self": "not exportable when false (an experiment switch; nothing exported hides a query's own key)",
    "qk_init": "not exported: initialisation only (the trained weights compute GPT-2's attention either way)",
}
# the experiment switches (model/config.py) and the value every exported architecture, and the remote code, computes
SWITCH_DEFAULTS = {"attn_scale": "sqrt", "causal_mask": "before_softmax", "qk_tied": False, "attend_self": True}
# values of a model field that are experiment switches too: no exported architecture computes them
SWITCH_VALUES = {"attention": ("uniform",)}
NATIVE_ACTIVATIONS = {"gelu": "gelu_pytorch_tanh", "relu2": "relu2"}  # transformers' ACT2FN names, same kernels
# transformers activations that compute our tanh GELU (gelu_new and gelu_fast: the same formula written out)
TANH_GELUS = ("gelu_pytorch_tanh", "gelu_new", "gelu_fast", "gelu_python_tanh")
GPT2_POSITIONS = ("learned", "sinusoidal", "none")


@dataclass
class ExportPlan:
    target: str  # "gpt2", "gpt_neox" or "remote"
    reasons: list[str]  # why not native (remote only)

    @property
    def architecture(self) -> str:
        return {"gpt2": "GPT2LMHeadModel", "gpt_neox": "GPTNeoXForCausalLM", "gpt_bigcode": "GPTBigCodeForCausalLM",
                "remote": "AttentionLabForCausalLM"}[self.target]


def unmapped_fields(cfg: GPTConfig) -> list[str]:
    return [f.name for f in dataclasses.fields(cfg) if f.name not in FIELD_ROLES]


def native_blockers(cfg: GPTConfig) -> list[str]:
    """Why no transformers architecture computes this model exactly (empty: GPT-2 or GPT-NeoX does)."""
    reasons = []
    if cfg.pos_encoding == "alibi":
        reasons.append(
            "pos_encoding='alibi': transformers' ALiBi models do not fit (MptForCausalLM has the same slopes, but "
            "its MLP uses the exact erf GELU where ours uses the tanh approximation, it has no biases and a fixed "
            "MLP ratio of 4; BLOOM adds a LayerNorm on the embeddings)"
        )
    if cfg.qk_norm:
        reasons.append("qk_norm=True: GPT-2 and GPT-NeoX do not normalise queries and keys")
    if cfg.logit_softcap > 0:
        reasons.append(f"logit_softcap={cfg.logit_softcap}: GPT-2 and GPT-NeoX do not soft-cap their logits")
    if cfg.value_residual:
        reasons.append("value_residual=True: GPT-2 and GPT-NeoX do not mix the first block's values into later ones")
    if cfg.kv_heads != cfg.n_head and not bigcode_fits(cfg):
        reasons.append(f"n_kv_head={cfg.n_kv_head} with {cfg.pos_encoding} positions: GPT-2 and GPT-NeoX give every "
                       "query head its own keys and values; GPTBigCode (multi-query) has learned positions only; "
                       "StarCoder2 (RoPE + grouped-query) was not checked")
    if cfg.window:
        reasons.append(f"window={cfg.window}: GPT-2 and GPT-NeoX attend over the whole context")
    if cfg.attn_sinks:
        reasons.append("attn_sinks=True: GPT-2 and GPT-NeoX have no sink logits")
    if cfg.attention != "softmax":
        reasons.append(f"attention={cfg.attention!r}: GPT-2 and GPT-NeoX use softmax attention")
    if cfg.mlp_act not in NATIVE_ACTIVATIONS:
        reasons.append(f"mlp_act={cfg.mlp_act!r} has no transformers activation known to compute it exactly")
    return reasons


def bigcode_fits(cfg: GPTConfig) -> bool:
    """Multi-query attention with additive (or no) positions: GPTBigCode's multi_query layout is ours exactly
    (c_attn rows [q | k | v] of one kv head, nn.Linear, GPT-2's names)."""
    return cfg.kv_heads == 1 < cfg.n_head and cfg.pos_encoding in GPT2_POSITIONS


def plan_export(cfg: GPTConfig, remote_code: bool = False) -> ExportPlan:
    """The architecture `cfg` exports to; ValueError for a config field the exporter does not know yet."""
    unknown = unmapped_fields(cfg)
    if unknown:
        raise ValueError(
            f"cannot export: GPTConfig field(s) {', '.join(unknown)} are unknown to the exporter, so it cannot tell "
            "whether the exported model would compute the same function. Add each to FIELD_ROLES in "
            "attention_lab/interop/convert.py (and to the remote code in attention_lab/interop/remote_code/ if it changes the math)."
        )
    switched = [f"{name}={getattr(cfg, name)!r}" for name, default in SWITCH_DEFAULTS.items()
                if getattr(cfg, name) != default]
    switched += [f"{name}={getattr(cfg, name)!r}" for name, values in SWITCH_VALUES.items()
                 if getattr(cfg, name) in values]
    if switched:
        raise ValueError(
            f"cannot export: the experiment switch(es) {', '.join(switched)} are computed by no transformers "
            "architecture and not by the shipped remote code; only "
            f"{', '.join(f'{k}={v!r}' for k, v in SWITCH_DEFAULTS.items())}"
            f"{''.join(f', {k} other than {v!r}' for k, vs in SWITCH_VALUES.items() for v in vs)} export"
        )
    reasons = native_blockers(cfg)
    if remote_code and not reasons:
        reasons = ["remote code was asked for"]
    if reasons:
        return ExportPlan("remote", reasons)
    if bigcode_fits(cfg):
        return ExportPlan("gpt_bigcode", [])
    return ExportPlan("gpt2" if cfg.pos_encoding in GPT2_POSITIONS else "gpt_neox", [])


def _check_target(cfg: GPTConfig, target: str) -> None:
    plan = plan_export(cfg)
    if plan.target != target:
        why = "; ".join(plan.reasons) if plan.reasons else f"pos_encoding={cfg.pos_encoding!r} maps to {plan.target}"
        raise ValueError(f"cannot export to {target}: {why}")


# --------------------------------------------------------------------------------------------------------- GPT-2

# the four projections that GPT-2 keeps as Conv1D
TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# GPT-2's non-learned buffers in older transformers versions: the causal mask, nothing to load
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")
BIASED = ("ln_1", "ln_2", "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")  # per block, each has .bias


def _activation_from_hf(name: str, where: str) -> str:
    if name in TANH_GELUS:
        return "gelu"
    if name == "relu2":
        return "relu2"
    raise ValueError(
        f"{where}={name!r} is not supported; this model has the tanh GELU ({', '.join(TANH_GELUS)}) or relu2"
    )


def config_from_hf(hf: dict) -> GPTConfig:
    """GPT2Config.to_dict() -> GPTConfig (learned positions, biases), refusing GPT-2 variants we do not implement."""
    activation = _activation_from_hf(hf.get("activation_function", "gelu_new"), "GPT-2 activation_function")
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention"):
        if hf.get(flag):
            raise ValueError(f"GPT-2 config sets {flag}=True, which this model does not implement")
    if hf.get("scale_attn_weights", True) is False:
        raise ValueError("GPT-2 config sets scale_attn_weights=False; this model always scales by 1/sqrt(d_k)")
    n_embd = hf["n_embd"]
    n_inner = hf.get("n_inner") or 4 * n_embd
    if n_inner % n_embd:
        raise ValueError(f"GPT-2 n_inner={n_inner} is not a multiple of n_embd={n_embd}")
    return GPTConfig(
        vocab_size=hf["vocab_size"],
        block_size=hf["n_positions"],
        n_layer=hf["n_layer"],
        n_head=hf["n_head"],
        n_embd=n_embd,
        dropout=0.0,
        bias=True,
        pos_encoding="learned",
        tie_embeddings=hf.get("tie_word_embeddings", True),
        mlp_ratio=_ratio(n_inner, n_embd),
        layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        mlp_act=activation,
    )


def check_exportable(cfg: GPTConfig) -> None:
    """ValueError unless GPT2LMHeadModel computes this model exactly."""
    _check_target(cfg, "gpt2")


def hf_config_from(cfg: GPTConfig) -> dict:
    """GPTConfig -> keyword arguments of transformers.GPT2Config (and the config.json it writes)."""
    check_exportable(cfg)
    return dict(
        model_type="gpt2",
        architectures=["GPT2LMHeadModel"],
        vocab_size=cfg.vocab_size,
        n_positions=cfg.block_size,
        n_embd=cfg.n_embd,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        n_inner=cfg.mlp_hidden,
        activation_function=NATIVE_ACTIVATIONS[cfg.mlp_act],
        resid_pdrop=cfg.dropout,
        embd_pdrop=cfg.dropout,
        attn_pdrop=cfg.dropout,
        layer_norm_epsilon=cfg.layer_norm_eps,
        tie_word_embeddings=cfg.tie_embeddings,
    )


def state_dict_to_hf(sd: dict[str, Tensor], cfg: GPTConfig) -> dict[str, Tensor]:
    """Our state dict -> a GPT2LMHeadModel state dict (fresh contiguous tensors, no shared storage)."""
    check_exportable(cfg)
    out = {
        key: (value.t() if key.endswith(TRANSPOSED) else value).detach().clone().contiguous()
        for key, value in sd.items()
    }
    return _with_gpt2_fixtures(out, cfg, c_attn_width=3 * cfg.n_embd)


def _with_gpt2_fixtures(out: dict[str, Tensor], cfg: GPTConfig, c_attn_width: int) -> dict[str, Tensor]:
    """What GPT-2-style architectures (GPT2LMHeadModel, GPTBigCode) always have and ours may not: a `wpe` table
    (the sinusoidal one, or zeros for no positions) and biases (zeros when cfg.bias is false)."""
    like = out["transformer.wte.weight"]
    if cfg.pos_encoding == "sinusoidal":  # a fixed table: GPT-2's wpe holds it, frozen by nothing but intent
        out["transformer.wpe.weight"] = sinusoidal_embedding(cfg.block_size, cfg.n_embd).to(like.dtype)
    elif cfg.pos_encoding == "none":
        out["transformer.wpe.weight"] = like.new_zeros(cfg.block_size, cfg.n_embd)
    if not cfg.bias:
        widths = {"attn.c_attn": c_attn_width, "mlp.c_fc": cfg.mlp_hidden}
        for i in range(cfg.n_layer):
            for name in BIASED:
                out[f"transformer.h.{i}.{name}.bias"] = like.new_zeros(widths.get(name, cfg.n_embd))
        out["transformer.ln_f.bias"] = like.new_zeros(cfg.n_embd)
    return out


def _ratio(inner: int, hidden: int) -> float:
    """The MLP's width as mlp_ratio: a whole number where it divides (4), else the exact fraction (4.5)."""
    return inner // hidden if inner % hidden == 0 else inner / hidden


def gpt2_key(key: str) -> str:
    return key if key.startswith(("transformer.", "lm_head.")) else "transformer." + key


def state_dict_from_hf(hf_sd: dict[str, Tensor], cfg: GPTConfig) -> dict[str, Tensor]:
    """A GPT2LMHeadModel / GPT2Model state dict -> ours (keys and shapes checked by load_state_dict).

    For cfg.pos_encoding other than "learned" the position table is dropped and for bias=False the biases:
    `gpt2_variant` decides those only where the table and the biases are exactly what the export wrote.
    """
    out = {}
    for key, value in hf_sd.items():
        if key.endswith(IGNORED_SUFFIXES):
            continue
        key = gpt2_key(key)
        out[key] = value.t().contiguous() if key.endswith(TRANSPOSED) else value
    if cfg.pos_encoding != "learned":
        out.pop("transformer.wpe.weight", None)
    if not cfg.bias:
        for key in [k for k in out if k.endswith(".bias")]:
            del out[key]
    return _with_head(out, cfg, "GPT-2")


def gpt2_variant(hf_sd: dict[str, Tensor], base: GPTConfig, hint: dict | None) -> GPTConfig:
    """The GPTConfig of an exported GPT-2 folder: `base` (from config.json) with the hint's positions and biases
    where the weights agree exactly (a sinusoidal or zero table, zero biases), and its training-only fields."""
    hint = _checked_hint(hint)
    if not hint:
        return base
    sd = {gpt2_key(k): v for k, v in hf_sd.items()}
    changes = _training_fields(hint)
    wpe = sd.get("transformer.wpe.weight")
    if wpe is not None and hint.get("pos_encoding") == "sinusoidal":
        if torch.equal(wpe.float(), sinusoidal_embedding(base.block_size, base.n_embd).to(wpe.dtype).float()):
            changes["pos_encoding"] = "sinusoidal"
    elif wpe is not None and hint.get("pos_encoding") == "none" and not wpe.any():
        changes["pos_encoding"] = "none"
    if hint.get("bias") is False and _all_zero(v for k, v in sd.items() if k.endswith(".bias")
                                              and not k.endswith(IGNORED_SUFFIXES)):
        changes["bias"] = False
    return dataclasses.replace(base, **changes)


# --------------------------------------------------------------------------------------------- GPTBigCode (MQA)


def bigcode_config_from(cfg: GPTConfig) -> dict:
    """GPTConfig (multi-query, additive positions) -> transformers.GPTBigCodeConfig's fields."""
    _check_target(cfg, "gpt_bigcode")
    return dict(hf_config_from(dataclasses.replace(cfg, n_kv_head=0)), model_type="gpt_bigcode",
                architectures=["GPTBigCodeForCausalLM"], multi_query=True, num_key_value_heads=1,
                scale_attn_weights=True, attention_softmax_in_fp32=True, scale_attention_softmax_in_fp32=False)


def config_from_bigcode(hf: dict) -> GPTConfig:
    if not hf.get("multi_query", True):
        raise ValueError("GPTBigCode with multi_query=False groups its c_attn rows per head; only multi-query "
                         "checkpoints load")
    return dataclasses.replace(config_from_hf(hf), n_kv_head=1)


def state_dict_to_bigcode(sd: dict[str, Tensor], cfg: GPTConfig) -> dict[str, Tensor]:
    """Our state dict -> GPTBigCodeForCausalLM's: the same names and layout (nn.Linear, no transposes); fixed
    position tables and zero biases where ours has none, as for GPT-2."""
    _check_target(cfg, "gpt_bigcode")
    out = {k: v.detach().clone().contiguous() for k, v in sd.items()}
    return _with_gpt2_fixtures(out, cfg, c_attn_width=cfg.n_embd + 2 * cfg.head_size)


# ------------------------------------------------------------------------------------------------------ GPT-NeoX

# ours (inside transformer.h.{i}.) -> theirs (inside gpt_neox.layers.{i}.)
NEOX_BLOCK = {
    "ln_1": "input_layernorm",
    "ln_2": "post_attention_layernorm",
    "attn.c_attn": "attention.query_key_value",
    "attn.c_proj": "attention.dense",
    "mlp.c_fc": "mlp.dense_h_to_4h",
    "mlp.c_proj": "mlp.dense_4h_to_h",
}
NEOX_TOP = {"transformer.wte": "gpt_neox.embed_in", "transformer.ln_f": "gpt_neox.final_layer_norm"}
# the head: "embed_out" is what transformers 4.x names it and 5.x still reads (renamed to lm_head on load)
NEOX_HEAD = "embed_out.weight"


def qkv_to_per_head(t: Tensor, n_head: int) -> Tensor:
    """Our c_attn rows [q | k | v] (3C, ...) -> GPT-NeoX's [q_h0 k_h0 v_h0 | q_h1 k_h1 v_h1 | ...]."""
    rest = t.shape[1:]
    hs = t.shape[0] // (3 * n_head)
    return t.reshape(3, n_head, hs, *rest).transpose(0, 1).reshape(3 * n_head * hs, *rest)


def qkv_from_per_head(t: Tensor, n_head: int) -> Tensor:
    """GPT-NeoX's per-head [q_h k_h v_h] rows -> our [q | k | v]."""
    rest = t.shape[1:]
    hs = t.shape[0] // (3 * n_head)
    return t.reshape(n_head, 3, hs, *rest).transpose(0, 1).reshape(3 * n_head * hs, *rest)


def neox_config_from(cfg: GPTConfig) -> dict:
    """GPTConfig -> transformers.GPTNeoXConfig keyword arguments / config.json (transformers 4.x and 5.x names)."""
    _check_target(cfg, "gpt_neox")
    rope = {"rope_type": "default", "rope_theta": cfg.rope_base, "partial_rotary_factor": 1.0}
    return dict(
        model_type="gpt_neox",
        architectures=["GPTNeoXForCausalLM"],
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.n_embd,
        num_hidden_layers=cfg.n_layer,
        num_attention_heads=cfg.n_head,
        intermediate_size=cfg.mlp_hidden,
        hidden_act=NATIVE_ACTIVATIONS[cfg.mlp_act],
        max_position_embeddings=cfg.block_size,
        layer_norm_eps=cfg.layer_norm_eps,
        use_parallel_residual=False,  # ours is x + attn(ln_1(x)), then + mlp(ln_2(.)): sequential
        attention_bias=True,  # zeros when bias=False: TransformerLens's GPT-NeoX adapter needs the tensors
        tie_word_embeddings=cfg.tie_embeddings,
        hidden_dropout=cfg.dropout,
        attention_dropout=cfg.dropout,
        rope_parameters=rope,  # transformers 5.x
        rotary_pct=1.0,  # transformers 4.x names of the same two numbers
        rotary_emb_base=cfg.rope_base,
    )


def config_from_neox(hf: dict) -> GPTConfig:
    """GPTNeoXConfig.to_dict() -> GPTConfig, refusing GPT-NeoX variants this model does not implement."""
    if hf.get("use_parallel_residual", True):
        raise ValueError(
            "GPT-NeoX config has use_parallel_residual=True (attention and MLP read the same input, as in Pythia); "
            "this model applies them one after the other (use_parallel_residual=False)"
        )
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    fraction = rope.get("partial_rotary_factor", hf.get("rotary_pct", 0.25))
    if fraction != 1.0:
        raise ValueError(f"GPT-NeoX rotary fraction {fraction}: this model rotates the whole head (1.0)")
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"GPT-NeoX rope_type={rope.get('rope_type', rope.get('type'))!r}: only plain RoPE is implemented")
    theta = rope.get("rope_theta", hf.get("rotary_emb_base", hf.get("rope_theta", 10000.0)))
    hidden, heads = hf["hidden_size"], hf["num_attention_heads"]
    if hf.get("head_dim") not in (None, hidden // heads):
        raise ValueError(f"GPT-NeoX head_dim={hf['head_dim']} differs from hidden_size / num_attention_heads")
    inner = hf["intermediate_size"]
    if inner % hidden:
        raise ValueError(f"GPT-NeoX intermediate_size={inner} is not a multiple of hidden_size={hidden}")
    return GPTConfig(
        vocab_size=hf["vocab_size"],
        block_size=hf["max_position_embeddings"],
        n_layer=hf["num_hidden_layers"],
        n_head=heads,
        n_embd=hidden,
        dropout=0.0,
        bias=True,
        pos_encoding="rope",
        tie_embeddings=hf.get("tie_word_embeddings", False),
        mlp_ratio=_ratio(inner, hidden),
        rope_base=float(theta),
        layer_norm_eps=hf.get("layer_norm_eps", 1e-5),
        mlp_act=_activation_from_hf(hf.get("hidden_act", "gelu"), "GPT-NeoX hidden_act"),
    )


def state_dict_to_neox(sd: dict[str, Tensor], cfg: GPTConfig) -> dict[str, Tensor]:
    """Our state dict -> a GPTNeoXForCausalLM state dict (the head under NEOX_HEAD; drop it when tied)."""
    _check_target(cfg, "gpt_neox")
    out: dict[str, Tensor] = {}
    like = sd["transformer.wte.weight"]
    for key, value in sd.items():
        value = value.detach().clone().contiguous()
        if key == "lm_head.weight":
            out[NEOX_HEAD] = value
            continue
        prefix, _, param = key.rpartition(".")
        if prefix in NEOX_TOP:
            out[f"{NEOX_TOP[prefix]}.{param}"] = value
            continue
        _, _, i, inner = prefix.split(".", 3)  # transformer.h.{i}.{inner}
        if inner == "attn.c_attn":
            value = qkv_to_per_head(value, cfg.n_head)
        out[f"gpt_neox.layers.{i}.{NEOX_BLOCK[inner]}.{param}"] = value
    if not cfg.bias:  # every bias GPT-NeoX has (attention_bias=True, see neox_config_from) as zeros
        hidden = like.new_zeros(cfg.n_embd)
        for i in range(cfg.n_layer):
            for inner in ("input_layernorm", "post_attention_layernorm", "attention.dense", "mlp.dense_4h_to_h"):
                out[f"gpt_neox.layers.{i}.{inner}.bias"] = hidden.clone()
            out[f"gpt_neox.layers.{i}.attention.query_key_value.bias"] = like.new_zeros(3 * cfg.n_embd)
            out[f"gpt_neox.layers.{i}.mlp.dense_h_to_4h.bias"] = like.new_zeros(cfg.mlp_hidden)
        out["gpt_neox.final_layer_norm.bias"] = hidden.clone()
    return out


def state_dict_from_neox(hf_sd: dict[str, Tensor], cfg: GPTConfig) -> dict[str, Tensor]:
    """A GPTNeoXForCausalLM state dict -> ours. Absent attention biases (attention_bias=False) become zeros when
    cfg.bias; with bias=False every bias is dropped (`neox_variant` says when they are all zero)."""
    block = {v: k for k, v in NEOX_BLOCK.items()}
    top = {v: k for k, v in NEOX_TOP.items()}
    out: dict[str, Tensor] = {}
    for key, value in hf_sd.items():
        if key in (NEOX_HEAD, "lm_head.weight"):
            out["lm_head.weight"] = value
            continue
        if key.endswith((".attention.bias", ".attention.masked_bias", ".rotary_emb.inv_freq")):
            continue  # buffers of older transformers versions
        prefix, _, param = key.rpartition(".")
        if prefix in top:
            out[f"{top[prefix]}.{param}"] = value
            continue
        parts = prefix.split(".", 3)  # gpt_neox.layers.{i}.{inner}
        if len(parts) != 4 or parts[:2] != ["gpt_neox", "layers"] or parts[3] not in block:
            raise ValueError(f"GPT-NeoX weight {key!r} has no place in this model")
        inner = block[parts[3]]
        if inner == "attn.c_attn":
            value = qkv_from_per_head(value, cfg.n_head)
        out[f"transformer.h.{parts[2]}.{inner}.{param}"] = value
    if cfg.bias:
        like = out["transformer.wte.weight"]
        for i in range(cfg.n_layer):
            for inner, width in (("attn.c_attn", 3 * cfg.n_embd), ("attn.c_proj", cfg.n_embd)):
                out.setdefault(f"transformer.h.{i}.{inner}.bias", like.new_zeros(width))
    else:
        for key in [k for k in out if k.endswith(".bias")]:
            del out[key]
    return _with_head(out, cfg, "GPT-NeoX")


def neox_variant(hf_sd: dict[str, Tensor], base: GPTConfig, hint: dict | None) -> GPTConfig:
    """The GPTConfig of an exported GPT-NeoX folder: bias=False where the hint says so and every bias is zero."""
    hint = _checked_hint(hint)
    if not hint:
        return base
    changes = _training_fields(hint)
    buffers = (".attention.bias", ".attention.masked_bias")  # causal masks of older transformers versions
    if hint.get("bias") is False and _all_zero(v for k, v in hf_sd.items()
                                              if k.endswith(".bias") and not k.endswith(buffers)):
        changes["bias"] = False
    return dataclasses.replace(base, **changes)


# ------------------------------------------------------------------------------------------------------- helpers


def _with_head(out: dict[str, Tensor], cfg: GPTConfig, what: str) -> dict[str, Tensor]:
    if "lm_head.weight" not in out:
        if not cfg.tie_embeddings:
            raise ValueError(f"{what} state dict has no output head and the config does not tie embeddings")
        out["lm_head.weight"] = out["transformer.wte.weight"]
    return out


def _all_zero(tensors) -> bool:
    return all(not t.any() for t in tensors)


def _checked_hint(hint: dict | None) -> dict | None:
    if hint is None:
        return None
    if not isinstance(hint, dict):
        raise ValueError(f"config.json's {HINT_KEY!r} entry should be a GPTConfig dict, got {type(hint).__name__}")
    GPTConfig.from_dict(hint)  # unknown fields (an export by a newer attention-lab) are refused here, by name
    return hint


def _training_fields(hint: dict) -> dict:
    """Fields that do not change the function at inference (backend, initialisation, dropout): from the hint."""
    return {k: hint[k] for k in ("attn_backend", "zero_init_proj", "dropout") if k in hint}
