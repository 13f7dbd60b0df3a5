"""attention-lab's GPT for transformers: AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).

A standalone copy of the math in attention-lab's model/ package (positions.py, attention.py, gpt.py), written
against torch and transformers only, with the same parameter names, so its weights load unchanged. The exporter
ships it for the models no transformers architecture computes exactly; attention-lab's tests hold its logits and
greedy generations equal to the original's for every positional encoding and model option.

Shapes: B batch, T new tokens, S = cached + T keys, C n_embd, nh n_head, hs = C // nh.

Blocks are pre-LayerNorm: x + attn(ln_1(x)), then x + mlp(ln_2(x)). Options (config fields):
    pos_encoding    learned | sinusoidal (added to the token embeddings) | rope (q, k rotated, rotate-half pairs) |
                    alibi (a per-head linear penalty on the scores by distance) | none
    qk_norm         q and k RMS-normalised over the head channels (no parameters), before RoPE
    mlp_act         gelu (tanh approximation) | relu2 (relu(x)^2)
    logit_softcap   c > 0: logits = c * tanh(logits / c), in float32
    value_residual  blocks after the first use lambda * v + (1 - lambda) * v_first (lambda learned per block)
    n_kv_head       grouped-query: n_kv_head key/value heads, query head h reads kv head h // (n_head / n_kv_head)
    window          query i sees keys i-W < j <= i, on the layers window_pattern marks L (every layer if "")
    attn_sinks      a learned logit per head joins the softmax's denominator
    attention       softmax | linear: weights phi(q).phi(k) with phi = elu + 1, normalised by their row sum when
                    linear_denominator; linear_out_norm RMS-normalises each head's output (computed here in the
                    quadratic form, the same function as attention-lab's chunked and recurrent forms)
Positions are token indices from the start of the sequence (as GPT-2's), also with left padding; sequences
longer than block_size are refused, as attention-lab's model refuses them.

Attention weights, as transformers defines them: attn_implementation="sdpa" (the default) runs
torch's fused kernel, "eager" the written-out softmax(q k^T / sqrt(hs) + mask) v. output_attentions=True returns
every layer's weights (B, nh, T, S) in `attentions`, the ones attention-lab's sample.py writes to attention.npy;
under "sdpa" that call computes them the eager way (as transformers 4.x's sdpa models fell back), so the weights are
there whichever implementation is set. The cache is passed as `cache` (transformers >= 5.24) or `past_key_values`
(earlier), whichever the installed transformers uses.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_attention_lab import AttentionLabConfig

try:  # transformers >= 4.36
    from transformers.cache_utils import Cache, DynamicCache
except ImportError:  # pragma: no cover - older transformers: no cache, every step recomputes the context
    Cache, DynamicCache = None, None

# transformers 5.24 renamed past_key_values to cache (in forward's arguments, generation's inputs and the outputs) and
# warns at the old name: use the name the installed version's outputs carry
CACHE = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


# ------------------------------------------------------------------------------------------------------ positions


def sinusoidal_table(n_positions, dim):
    """Vaswani et al. (2017): PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d))."""
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]
    two_i = torch.arange(0, dim, 2, dtype=torch.float64)
    angle = pos / torch.pow(10000.0, two_i / dim)
    table = torch.zeros(n_positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : dim // 2])
    return table.float()


SINUSOID_SCALE = 0.02 * math.sqrt(2.0)  # model/positions.py: the table scaled to the embeddings' initial size


def sinusoidal_embedding(n_positions, dim):
    return SINUSOID_SCALE * sinusoidal_table(n_positions, dim)


def alibi_slopes(n_head):
    """Press et al. (2022): 2^(-8/n) to the powers 1..n; other head counts borrow from the next power of two."""

    def power_of_two(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_head).is_integer():
        slopes = power_of_two(n_head)
    else:
        closest = 2 ** math.floor(math.log2(n_head))
        slopes = power_of_two(closest) + power_of_two(2 * closest)[0::2][: n_head - closest]
    return torch.tensor(slopes, dtype=torch.float32)


def rope_inv_freq(head_size, base):
    return 1.0 / (base ** (torch.arange(0, head_size, 2, dtype=torch.float32) / head_size))


class Positions(nn.Module):
    """Where position enters: embed (learned, sinusoidal), rotate (rope) or score_bias (alibi); "none": nowhere."""

    def __init__(self, config):
        super().__init__()
        self.kind = config.pos_encoding
        self.block_size, self.n_embd, self.n_head = config.block_size, config.n_embd, config.n_head
        self.head_size, self.rope_base = config.n_embd // config.n_head, config.rope_base
        if self.kind == "learned":
            self.weight = nn.Parameter(torch.zeros(config.block_size, config.n_embd))
        elif self.kind == "sinusoidal":
            self.register_buffer("table", sinusoidal_embedding(self.block_size, self.n_embd), persistent=False)
        elif self.kind == "rope":
            self.register_buffer("inv_freq", rope_inv_freq(self.head_size, self.rope_base), persistent=False)
        elif self.kind == "alibi":
            self.register_buffer("slopes", alibi_slopes(self.n_head), persistent=False)

    @torch.no_grad()
    def reset_buffers(self):
        """Recompute the fixed tables (transformers may build the model on the meta device, then materialise it)."""
        if self.kind == "sinusoidal":
            self.table.copy_(sinusoidal_embedding(self.block_size, self.n_embd))
        elif self.kind == "rope":
            self.inv_freq.copy_(rope_inv_freq(self.head_size, self.rope_base))
        elif self.kind == "alibi":
            self.slopes.copy_(alibi_slopes(self.n_head))

    def embed(self, pos):
        if self.kind == "learned":
            return self.weight[pos]  # (T, C)
        if self.kind == "sinusoidal":
            return self.table[pos]
        return None

    def rotate(self, x, pos):
        """x (B, nh, T, hs) rotated by angle pos * base^(-2i/hs) in each (i, i + hs/2) channel pair."""
        if self.kind != "rope":
            return x
        angle = pos.to(torch.float32)[:, None] * self.inv_freq[None, :]  # (T, hs/2)
        cos = torch.cat((angle.cos(), angle.cos()), dim=-1).to(x.dtype)
        sin = torch.cat((angle.sin(), angle.sin()), dim=-1).to(x.dtype)
        half = x.size(-1) // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    def score_bias(self, q_pos, k_pos):
        """(nh, T, S) ALiBi penalty slope * (k - q), or None."""
        if self.kind != "alibi":
            return None
        distance = (k_pos[None, :] - q_pos[:, None]).to(torch.float32)
        return self.slopes[:, None, None] * distance[None]


# ------------------------------------------------------------------------------------------------------ the model


def dropout(p):
    return nn.Dropout(p) if p > 0 else nn.Identity()


def layer_window(config, layer):
    if not config.window:
        return None
    pattern = config.window_pattern or "L"
    return config.window if pattern[layer % len(pattern)] == "L" else None


class CausalSelfAttention(nn.Module):
    def __init__(self, config, layer):
        super().__init__()
        self.n_head = config.n_head
        self.n_kv_head = config.n_kv_head or config.n_head
        self.head_size = config.n_embd // config.n_head
        self.dropout_p = config.dropout
        self.qk_norm = config.qk_norm
        self.layer = layer
        self.window = layer_window(config, layer)
        self.kind = config.attention
        self.linear_denominator, self.linear_out_norm = config.linear_denominator, config.linear_out_norm
        # rows [q: n_head heads | k: n_kv_head heads | v: n_kv_head heads], head_size each
        self.c_attn = nn.Linear(config.n_embd, (self.n_head + 2 * self.n_kv_head) * self.head_size, bias=config.bias)
        self.sink = nn.Parameter(torch.zeros(config.n_head)) if config.attn_sinks else None
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = dropout(config.dropout)
        self.value_lambda = nn.Parameter(torch.tensor(0.5)) if config.value_residual and layer > 0 else None

    def forward(self, x, positions, pos, mask, cache, v_first, eager=False):
        """x (B, T, C); mask (B or 1, nh or 1, T, S) additive; eager: the written-out softmax, its weights returned
        -> y (B, T, C), own values (B, nh, T, hs), weights (B, nh, T, S) or None."""
        b, t, c = x.shape
        nh, nkv, hs = self.n_head, self.n_kv_head, self.head_size
        q, k, v = self.c_attn(x).split([nh * hs, nkv * hs, nkv * hs], dim=-1)
        q, k, v = (y.view(b, t, -1, hs).transpose(1, 2) for y in (q, k, v))
        if self.qk_norm:
            q, k = F.rms_norm(q, (q.size(-1),)), F.rms_norm(k, (k.size(-1),))
        q, k = positions.rotate(q, pos), positions.rotate(k, pos)
        v_own = v
        if self.value_lambda is not None and v_first is not None:
            v = self.value_lambda * v + (1.0 - self.value_lambda) * v_first
        if cache is not None:
            k, v = cache.update(k, v, self.layer)  # (B, nkv, S, hs)
        k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)  # (B, nh, S, hs)
        p = self.dropout_p if self.training else 0.0
        if self.window is not None:  # keys W or more positions back are hidden too
            k_pos = torch.arange(k.size(2), device=x.device)
            far = k_pos[None, :] <= pos[:, None] - self.window  # (T, S)
            mask = mask.masked_fill(far, torch.finfo(torch.float32).min)
        weights = None
        if self.kind == "linear":
            y, weights = self.linear(q, k, v, mask)
        elif self.sink is not None or eager:  # written out; the sink logit joins the denominator, its weight dropped
            scores = (q @ k.transpose(-2, -1)).float() / math.sqrt(hs) + mask  # (B, nh, T, S)
            if self.sink is None:
                weights = F.softmax(scores, dim=-1)
            else:
                sink = self.sink.float().view(1, nh, 1, 1).expand(*scores.shape[:-1], 1)
                weights = F.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
            y = F.dropout(weights, p, training=self.training).to(v.dtype) @ v
        else:
            # the mask is float32; in float16 its minimum would become -inf (NaN rows for padding): clamp it
            mask = mask.to(q.dtype).clamp(min=torch.finfo(q.dtype).min)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_dropout(self.c_proj(y)), v_own, (weights if eager else None)

    def linear(self, q, k, v, mask):
        """Linear attention in its quadratic form: (phi(q) phi(k)^T, hidden keys 0) v, over the row sums; and the
        weights it implies, phi(q_i).phi(k_j) over the row's sum (rows sum to 1, also without the denominator)."""
        phi_q, phi_k = F.elu(q) + 1.0, F.elu(k) + 1.0
        a = (phi_q @ phi_k.transpose(-2, -1)) * (mask == 0)  # the mask holds 0 where a key is visible
        y = a @ v
        row = a.sum(-1, keepdim=True).clamp_min(1e-6)
        if self.linear_denominator:
            y = y / row
        if self.linear_out_norm:
            y = F.rms_norm(y, (y.size(-1),))
        return y, a / row


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, int(round(config.mlp_ratio * config.n_embd)), bias=config.bias)
        self.c_proj = nn.Linear(int(round(config.mlp_ratio * config.n_embd)), config.n_embd, bias=config.bias)
        self.act = config.mlp_act
        self.dropout = dropout(config.dropout)

    def forward(self, x):
        h = self.c_fc(x)
        h = F.gelu(h, approximate="tanh") if self.act == "gelu" else F.relu(h).square()
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    def __init__(self, config, layer):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias)
        self.attn = CausalSelfAttention(config, layer)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, positions, pos, mask, cache, v_first, eager=False):
        a, v, weights = self.attn(self.ln_1(x), positions, pos, mask, cache, v_first, eager)
        x = x + a
        return x + self.mlp(self.ln_2(x)), v, weights


class AttentionLabPreTrainedModel(PreTrainedModel):
    config_class = AttentionLabConfig
    base_model_prefix = "transformer"
    _no_split_modules = ["Block"]
    _supports_cache_class = True
    _supports_static_cache = False
    _supports_sdpa = True  # attn_implementation "sdpa" (the default) or "eager"

    @classmethod
    def _can_set_attn_implementation(cls):
        """set_attn_implementation() works: every forward reads config._attn_implementation (transformers 5 guesses
        otherwise from the source, looking for its AttentionInterface)."""
        return True

    def _init_weights(self, module):
        """attention-lab's initialisation (GPT-2's); the fixed position tables are recomputed."""
        std = 0.02
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, Positions):
            if module.kind == "learned":
                nn.init.normal_(module.weight, mean=0.0, std=std)
            module.reset_buffers()
        elif isinstance(module, CausalSelfAttention) and module.value_lambda is not None:
            nn.init.constant_(module.value_lambda, 0.5)


class AttentionLabForCausalLM(AttentionLabPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"}

    def __init__(self, config):
        super().__init__(config)
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=Positions(config),
                drop=dropout(config.dropout),
                h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.transformer.wte

    def set_input_embeddings(self, value):
        self.transformer.wte = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        past_key_values=None,
        labels=None,
        use_cache=None,
        return_dict=None,
        logits_to_keep=0,
        output_attentions=None,
        cache=None,
        **kwargs,
    ):
        """input_ids (B, T): the tokens after the cached ones; attention_mask (B, S): 1 for tokens, 0 for padding;
        labels (B, T): the input ids (shifted inside; -100 ignored) -> loss; output_attentions: every layer's
        weights (B, nh, T, S) in `attentions`; cache (or past_key_values, its earlier name): the keys and values
        seen so far."""
        cfg = self.config
        b, t = input_ids.shape
        use_cache = getattr(cfg, "use_cache", True) if use_cache is None else use_cache
        if output_attentions is None:
            output_attentions = bool(getattr(cfg, "output_attentions", False))
        eager = output_attentions or getattr(cfg, "_attn_implementation", None) == "eager"
        kv = cache if cache is not None else past_key_values
        if use_cache and kv is None and DynamicCache is not None:
            kv = DynamicCache()
        cache = kv if (Cache is not None and isinstance(kv, Cache)) else None
        past = cache.get_seq_length() if cache is not None else 0
        if past + t > cfg.block_size:
            raise ValueError(
                f"sequence of {past + t} tokens is longer than block_size={cfg.block_size}; this model was trained "
                "on at most block_size tokens: crop the input (or ask for fewer new tokens)"
            )
        device = input_ids.device
        pos = torch.arange(past, past + t, device=device)  # (T,)
        k_pos = torch.arange(past + t, device=device)  # (S,)
        positions = self.transformer.wpe

        # additive mask (B or 1, nh or 1, T, S): causal, padding, ALiBi; the minimum, not -inf, keeps rows of
        # padding positions (nothing visible) finite
        allowed = torch.ones(t, past + t, dtype=torch.bool, device=device).tril(diagonal=past)[None, None]
        if attention_mask is not None:
            allowed = allowed & attention_mask[:, None, None, : past + t].bool()
        bias = positions.score_bias(pos, k_pos)
        mask = torch.zeros((), device=device) if bias is None else bias[None]
        mask = mask.masked_fill(~allowed, torch.finfo(torch.float32).min)

        x = self.transformer.wte(input_ids)  # (B, T, C)
        emb = positions.embed(pos)
        if emb is not None:
            x = x + emb
        x = self.transformer.drop(x)
        v_first, attentions = None, []
        for i, block in enumerate(self.transformer.h):
            x, v, weights = block(x, positions, pos, mask, cache, v_first, eager)
            attentions.append(weights)
            if i == 0:
                v_first = v
        x = self.transformer.ln_f(x)
        if logits_to_keep:
            x = x[:, -logits_to_keep:, :]
        logits = self.lm_head(x)
        if cfg.logit_softcap > 0:
            logits = cfg.logit_softcap * torch.tanh(logits.float() / cfg.logit_softcap)

        loss = None
        if labels is not None:
            shifted = logits[:, :-1, :].float()
            loss = F.cross_entropy(shifted.reshape(-1, shifted.size(-1)), labels[:, 1:].reshape(-1), ignore_index=-100)
        out = CausalLMOutputWithPast(loss=loss, logits=logits, attentions=tuple(attentions) if output_attentions else None,
                                     **{CACHE: kv if use_cache else None})
        if return_dict is False:
            return out.to_tuple()
        return out

    def prepare_inputs_for_generation(self, input_ids, past_key_values=None, attention_mask=None, cache=None,
                                      **kwargs):
        """Only the tokens the cache has not seen yet; without a cache, the whole sequence."""
        kv = cache if cache is not None else past_key_values
        seen = kv.get_seq_length() if (Cache is not None and isinstance(kv, Cache)) else 0
        if seen > 0:
            input_ids = input_ids[:, seen:]
        inputs = {
            "input_ids": input_ids,
            CACHE: kv,
            "attention_mask": attention_mask,
            "use_cache": kwargs.get("use_cache", True),
            "logits_to_keep": 1,
        }
        if kwargs.get("output_attentions") is not None:
            inputs["output_attentions"] = kwargs["output_attentions"]
        return inputs
