"""Configuration of attention-lab's GPT for transformers (remote code; imports only transformers).

The fields and their meaning are attention-lab's GPTConfig (model/config.py); config.json holds them by name.
"""

from transformers import PretrainedConfig

POSITION_ENCODINGS = ("learned", "sinusoidal", "rope", "alibi", "none")
MLP_ACTIVATIONS = ("gelu", "relu2")
ATTENTION_KINDS = ("softmax", "linear")


class AttentionLabConfig(PretrainedConfig):
    model_type = "attention_lab"
    keys_to_ignore_at_inference = ["past_key_values"]
    # transformers' common names for the sizes (generation and pipelines read some of them)
    attribute_map = {
        "hidden_size": "n_embd",
        "num_hidden_layers": "n_layer",
        "num_attention_heads": "n_head",
        "max_position_embeddings": "block_size",
    }
    # the GPTConfig fields this code implements; the exporter refuses a model with any other. The experiment
    # switches (attn_scale, causal_mask, qk_tied, attend_self) are implemented at their defaults only: GPT-2's
    # attention (and attention softmax or linear, never uniform); qk_init is an initialisation, kept as a record
    FIELDS = (
        "vocab_size", "block_size", "n_layer", "n_head", "n_embd", "dropout", "bias", "pos_encoding",
        "attn_backend", "tie_embeddings", "mlp_ratio", "rope_base", "layer_norm_eps", "qk_norm", "mlp_act",
        "logit_softcap", "zero_init_proj", "value_residual", "n_kv_head", "window", "window_pattern", "attn_sinks",
        "attention", "linear_denominator", "linear_out_norm", "attn_scale", "causal_mask", "qk_tied",
        "attend_self", "qk_init",
    )

    def __init__(
        self,
        vocab_size=4096,
        block_size=256,
        n_layer=4,
        n_head=4,
        n_embd=128,
        dropout=0.0,
        bias=True,
        pos_encoding="learned",
        attn_backend="sdpa",
        tie_embeddings=True,
        mlp_ratio=4,
        rope_base=10000.0,
        layer_norm_eps=1e-5,
        qk_norm=False,
        mlp_act="gelu",
        logit_softcap=0.0,
        zero_init_proj=False,
        value_residual=False,
        n_kv_head=0,
        window=0,
        window_pattern="",
        attn_sinks=False,
        attention="softmax",
        linear_denominator=True,
        linear_out_norm=False,
        attn_scale="sqrt",
        causal_mask="before_softmax",
        qk_tied=False,
        attend_self=True,
        qk_init="normal",
        use_cache=True,
        **kwargs,
    ):
        if pos_encoding not in POSITION_ENCODINGS:
            raise ValueError(f"pos_encoding must be one of {', '.join(POSITION_ENCODINGS)}; got {pos_encoding!r}")
        if mlp_act not in MLP_ACTIVATIONS:
            raise ValueError(f"mlp_act must be one of {', '.join(MLP_ACTIVATIONS)}; got {mlp_act!r}")
        if n_embd % n_head:
            raise ValueError(f"n_embd ({n_embd}) must be divisible by n_head ({n_head})")
        if n_kv_head and n_head % n_kv_head:
            raise ValueError(f"n_kv_head ({n_kv_head}) must divide n_head ({n_head})")
        if attention not in ATTENTION_KINDS:
            raise ValueError(f"attention must be one of {', '.join(ATTENTION_KINDS)}; got {attention!r}")
        if (attn_scale, causal_mask, qk_tied, attend_self) != ("sqrt", "before_softmax", False, True):
            raise ValueError(f"this code computes attn_scale='sqrt', causal_mask='before_softmax', qk_tied=False, "
                             f"attend_self=True only; got {attn_scale!r}, {causal_mask!r}, {qk_tied!r}, "
                             f"{attend_self!r}")
        self.vocab_size = vocab_size
        self.block_size = block_size
        self.n_layer = n_layer
        self.n_head = n_head
        self.n_embd = n_embd
        self.dropout = dropout
        self.bias = bias
        self.pos_encoding = pos_encoding
        self.attn_backend = attn_backend  # attention-lab's choice of kernel; this code always uses sdpa
        self.tie_embeddings = tie_embeddings
        self.mlp_ratio = mlp_ratio
        self.rope_base = rope_base
        self.layer_norm_eps = layer_norm_eps
        self.qk_norm = qk_norm
        self.mlp_act = mlp_act
        self.logit_softcap = logit_softcap
        self.zero_init_proj = zero_init_proj  # initialisation only
        self.value_residual = value_residual
        self.n_kv_head = n_kv_head  # key/value heads (grouped-query); 0 = n_head
        self.window = window  # sliding window W (query i sees keys i-W < j <= i); 0 = none
        self.window_pattern = window_pattern  # per layer, repeated: L windowed, G global; "" = every layer
        self.attn_sinks = attn_sinks  # a learned logit per head in the softmax's denominator
        self.attention = attention  # softmax | linear (elu+1 features)
        self.linear_denominator = linear_denominator
        self.linear_out_norm = linear_out_norm
        self.attn_scale, self.causal_mask, self.qk_tied = attn_scale, causal_mask, qk_tied  # the defaults only
        self.attend_self = attend_self  # the default only
        self.qk_init = qk_init  # initialisation only: the weights loaded are what count
        self.use_cache = use_cache  # generation keeps keys and values (transformers 5 keeps no such field)
        kwargs["tie_word_embeddings"] = tie_embeddings  # transformers ties lm_head to wte by this name
        super().__init__(**kwargs)
        self.tie_word_embeddings = tie_embeddings  # (transformers 5 keeps no such field of its own)
