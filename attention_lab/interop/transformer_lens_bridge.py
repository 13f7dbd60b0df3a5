"""Open an exported folder in TransformerLens 4 (`TransformerBridge`): hooks, `run_with_cache`, `cache["pattern",
layer]`, `accumulated_resid`, `head_detector`, on the model a run trained.

    from attention_lab.interop.transformer_lens_bridge import open_bridge
    bridge = open_bridge("exported/")                  # any folder attention_lab.export writes
    logits, cache = bridge.run_with_cache(ids)         # ids (B, T) token tensor: no BOS is prepended

GPT-2, GPT-NeoX and GPTBigCode exports are TransformerLens architectures: `open_bridge` is
`TransformerBridge.boot_transformers(folder, device=..., dtype=torch.float32)`. An export with our own model code
(model_type "attention_lab", e.g. the default RoPE + QK-norm model) has no adapter in TransformerLens, so this
module brings one, registered without editing TransformerLens:

  * `ArchitectureAdapterFactory.register_adapter("AttentionLabForCausalLM", AttentionLabAdapter)`. boot_transformers
    still refuses the folder (its `determine_architecture_from_hf_config` reads the built-in SUPPORTED_ARCHITECTURES
    table, not the registry), so the model is loaded with transformers (trust_remote_code=True) and wrapped with
    `build_bridge_from_module`, which selects the adapter from the registry.
  * TransformerLens does not call a wrapped model's attention: its bridge recomputes attention from the split q, k,
    v projections so that it can hook the scores and the pattern. `AttentionLabAttentionBridge` recomputes ours
    (QK-norm, then RoPE, scores / sqrt(hs) + the block's additive mask, which holds the causal mask and ALiBi), and
    takes the shipped Block's positional call `attn(x, positions, pos, mask, cache, v_first[, eager])`. Everything outside
    attention (embeddings, position tables, blocks, MLP, ln_f, soft cap) is the shipped code itself.

Attention options the recomputation does not implement (value residual, grouped-query, windows, sinks, linear
attention) are refused by name. TransformerLens's weight processing (`enable_compatibility_mode`, fold_ln) is not
mapped for this architecture: the bridge runs the raw weights, as boot_transformers does by default.

transformer_lens is an optional dependency (the test extras): nothing else in attention_lab imports this module.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from transformer_lens.factories.architecture_adapter_factory import ArchitectureAdapterFactory
from transformer_lens.model_bridge import TransformerBridge
from transformer_lens.model_bridge.architecture_adapter import ArchitectureAdapter
from transformer_lens.model_bridge.generalized_components import (
    BlockBridge,
    EmbeddingBridge,
    JointQKVAttentionBridge,
    LinearBridge,
    MLPBridge,
    NormalizationBridge,
    UnembeddingBridge,
)
from transformer_lens.model_bridge.sources import build_bridge_from_module

ARCHITECTURE = "AttentionLabForCausalLM"  # the shipped code's class, config.json "architectures"


class AttentionLabAttentionBridge(JointQKVAttentionBridge):
    """The shipped CausalSelfAttention, recomputed with TransformerLens's hooks (hook_q/k/v, hook_attn_scores,
    hook_pattern, hook_z). Shapes: B batch, nh heads, T new tokens, S keys (cached + new), hs head size."""

    def forward(self, x, positions, pos, mask, cache=None, v_first=None, *eager):
        """The shipped Block's call: x (B, T, C), positions (its Positions module), pos (T,) token indices, mask
        (B or 1, nh or 1, T, S) additive, cache a transformers Cache or None; eager (the Block of an export that
        returns attentions passes it) -> (output (B, T, C), pattern), and then the weights output_attentions asks
        for when eager is passed (the pattern, or None): the Block of either version unpacks what it expects."""
        x = self.hook_in(x)
        q, k, v = self.q(x), self.k(x), self.v(x)  # (B, T, nh * hs) each
        out = self._process_output(self._reconstruct_attention(q, k, v, positions=positions, pos=pos, mask=mask,
                                                                cache=cache))
        if not eager:
            return out
        return out[0], out[1], (out[1] if eager[0] else None)

    def _reconstruct_attention(self, q, k, v, *, positions, pos, mask, cache):
        attn = self.original_component
        nh = self.config.n_heads
        q, k, v, b, t, hs = self._reshape_qkv_to_heads(q, k, v, nh, nh)  # (B, nh, T, hs)
        if attn.qk_norm:  # before RoPE, as the shipped code and model/attention.py
            q, k = F.rms_norm(q, (hs,)), F.rms_norm(k, (hs,))
        q, k = positions.rotate(q, pos), positions.rotate(k, pos)  # identity unless pos_encoding == "rope"
        if cache is not None:
            k, v = cache.update(k, v, attn.layer)  # (B, nh, S, hs)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(hs)  # (B, nh, T, S)
        # a 4-D mask is taken as it is (causal, padding and ALiBi already in it) and added to the scores
        scores = self._apply_reconstruct_attention_mask(attn_scores=scores, attention_mask=mask,
                                                        seq_len=k.size(-2), q_seq_len=t)
        pattern = self._softmax_dropout_pattern(self.hook_attn_scores(scores))  # hook_pattern fires inside
        y = self._reshape_attn_output(pattern @ v, b, t, nh, hs)  # (B, T, C)
        return self._apply_output_projection(y), pattern


def split_c_attn(attn) -> tuple[torch.nn.Linear, torch.nn.Linear, torch.nn.Linear]:
    """The shipped c_attn (nn.Linear, rows [q | k | v], C each) as three nn.Linear: copies, not views."""
    c = attn.n_head * attn.head_size
    weights = attn.c_attn.weight.detach().split(c, dim=0)
    biases = attn.c_attn.bias.detach().split(c, dim=0) if attn.c_attn.bias is not None else (None,) * 3
    out = []
    for w, b in zip(weights, biases):
        linear = torch.nn.Linear(w.shape[1], w.shape[0], bias=b is not None, device=w.device, dtype=w.dtype)
        with torch.no_grad():
            linear.weight.copy_(w)
            if b is not None:
                linear.bias.copy_(b)
        out.append(linear)
    return tuple(out)


def unsupported(cfg) -> list[str]:
    """The options of an attention_lab config the recomputed attention does not implement."""
    reasons = []
    if getattr(cfg, "value_residual", False):
        reasons.append("value_residual=True")
    if getattr(cfg, "n_kv_head", 0) not in (0, cfg.n_head):
        reasons.append(f"n_kv_head={cfg.n_kv_head}")
    if getattr(cfg, "window", 0):
        reasons.append(f"window={cfg.window}")
    if getattr(cfg, "attn_sinks", False):
        reasons.append("attn_sinks=True")
    if getattr(cfg, "attention", "softmax") != "softmax":
        reasons.append(f"attention={cfg.attention!r}")
    return reasons


class AttentionLabAdapter(ArchitectureAdapter):
    """TransformerLens's map of the shipped model: our GPT-2 names, LayerNorms (bias optional), a plain MLP.

    Its config (a TransformerBridgeConfig) keeps only TransformerLens's fields (n_heads, d_head, n_ctx, ...), not
    ours: open_bridge checks our options on the transformers config before it gets here.
    """

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.cfg.normalization_type = "LN"
        self.cfg.final_rms = False
        self.cfg.gated_mlp = False
        self.cfg.attn_only = False
        self.cfg.default_prepend_bos = False  # trained on plain text, no BOS
        self.supports_fold_ln = False
        self.weight_processing_conversions = {}
        attn = AttentionLabAttentionBridge(name="attn", config=self.cfg, split_qkv_matrix=split_c_attn, submodules={
            "qkv": LinearBridge(name="c_attn"), "o": LinearBridge(name="c_proj")})
        mlp = MLPBridge(name="mlp", submodules={"in": LinearBridge(name="c_fc"), "out": LinearBridge(name="c_proj")})
        self.component_mapping = {
            "embed": EmbeddingBridge(name="transformer.wte"),
            "blocks": BlockBridge(name="transformer.h", config=self.cfg, submodules={
                "ln1": NormalizationBridge(name="ln_1", config=self.cfg),
                "attn": attn,
                "ln2": NormalizationBridge(name="ln_2", config=self.cfg),
                "mlp": mlp,
            }),
            "ln_final": NormalizationBridge(name="transformer.ln_f", config=self.cfg),
            "unembed": UnembeddingBridge(name="lm_head"),
        }


def open_bridge(folder: str | os.PathLike, device: str = "cpu") -> TransformerBridge:
    """A folder attention_lab.export wrote (or any GPT-2 / GPT-NeoX / GPTBigCode folder) as a TransformerBridge,
    float32, in eval mode, raw weights. The shipped-code exports run that code (trust_remote_code=True)."""
    folder = Path(folder)
    model_type = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type")
    if model_type != "attention_lab":
        return TransformerBridge.boot_transformers(str(folder), device=device, dtype=torch.float32)
    import transformers  # here: only the shipped-code path needs it directly

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, dtype=torch.float32)
    reasons = unsupported(model.config)
    if reasons:
        raise ValueError(f"{folder}: {', '.join(reasons)} is not implemented in the TransformerLens bridge's "
                         "recomputed attention (attention_lab/interop/transformer_lens_bridge.py)")
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    # TransformerLens loads the tokenizer a second time (with add_bos_token=True) from its init_kwargs; without
    # this transformers would stop there to ask whether to trust the folder's code
    tokenizer.init_kwargs["trust_remote_code"] = True
    position = {"rope": "rotary", "alibi": "alibi"}.get(model.config.pos_encoding, "standard")

    def describe_positions(adapter) -> None:  # TransformerLens's name for where position enters
        adapter.cfg.positional_embedding_type = position

    ArchitectureAdapterFactory.register_adapter(ARCHITECTURE, AttentionLabAdapter)
    return build_bridge_from_module(model.to(device).eval(), ARCHITECTURE, hf_config=model.config,
                                    tokenizer=tokenizer, dtype=torch.float32, device=device, model_name=str(folder),
                                    post_adapter_hook=describe_positions)
