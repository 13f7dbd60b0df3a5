"""Map weights and configs between this GPT and Hugging Face's GPT-2 (no file I/O here).

Our names are GPT-2's, so keys match one for one. Two differences:
  * GPT-2 stores its projections as Conv1D, weight (in, out); nn.Linear stores (out, in): transpose.
  * Hub checkpoints of the original GPT-2 lack the "transformer." prefix ("h.0.attn.c_attn.weight").
"""

from __future__ import annotations

from torch import Tensor

from .config import GPTConfig

# the four projections that GPT-2 keeps as Conv1D
TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# GPT-2's non-learned buffers in older transformers versions: the causal mask, nothing to load
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")


def config_from_hf(hf: dict) -> GPTConfig:
    """GPT2Config.to_dict() -> GPTConfig, refusing GPT-2 variants this model does not implement."""
    activation = hf.get("activation_function", "gelu_new")
    if activation not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ValueError(f"GPT-2 activation_function={activation!r} is not supported; only the tanh GELU (gelu_new)")
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
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
        mlp_ratio=n_inner // n_embd,
        layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
    )


def check_exportable(cfg: GPTConfig) -> None:
    wrong = []
    if cfg.pos_encoding != "learned":
        wrong.append(f"pos_encoding={cfg.pos_encoding!r} (GPT-2 has learned positions)")
    if not cfg.bias:
        wrong.append("bias=False (GPT-2 has biases)")
    if wrong:
        raise ValueError("cannot export to GPT-2: " + "; ".join(wrong))


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
        n_inner=cfg.mlp_ratio * cfg.n_embd,
        activation_function="gelu_new",
        resid_pdrop=cfg.dropout,
        embd_pdrop=cfg.dropout,
        attn_pdrop=cfg.dropout,
        layer_norm_epsilon=cfg.layer_norm_eps,
        tie_word_embeddings=cfg.tie_embeddings,
    )


def state_dict_from_hf(hf_sd: dict[str, Tensor], cfg: GPTConfig) -> dict[str, Tensor]:
    """A GPT2LMHeadModel / GPT2Model state dict -> ours (keys and shapes checked by load_state_dict)."""
    out = {}
    for key, value in hf_sd.items():
        if key.endswith(IGNORED_SUFFIXES):
            continue
        if not key.startswith(("transformer.", "lm_head.")):
            key = "transformer." + key
        out[key] = value.t().contiguous() if key.endswith(TRANSPOSED) else value
    if "lm_head.weight" not in out:
        if not cfg.tie_embeddings:
            raise ValueError("GPT-2 state dict has no lm_head.weight and the config does not tie embeddings")
        out["lm_head.weight"] = out["transformer.wte.weight"]
    return out


def state_dict_to_hf(sd: dict[str, Tensor], cfg: GPTConfig) -> dict[str, Tensor]:
    """Our state dict -> a GPT2LMHeadModel state dict (fresh contiguous tensors, no shared storage)."""
    check_exportable(cfg)
    return {
        key: (value.t() if key.endswith(TRANSPOSED) else value).detach().clone().contiguous()
        for key, value in sd.items()
    }

