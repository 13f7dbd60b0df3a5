"""Wrong versions written by hand as a learner writes them, about the numerics (issue 37): each with the exercise
and the catalogue name the check should give it (None: located without a name is the most it can do). Shared
by tests/test_exercises_numerics.py and the before/after count in docs/exercises.md:

    .venv/bin/python tests/exercise_learners.py        # named / located / missed over this set
"""

from __future__ import annotations

HEADER = "import math\n\nimport torch\nimport torch.nn.functional as F\n\n\n"

_SCORES = "    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))\n"
_FUTURE = "    t = q.size(-2)\n    future = torch.ones(t, t, dtype=torch.bool).triu(1)\n"
_MH = ("def multi_head(x, w_qkv, b_qkv, w_proj, b_proj, n_head):\n"
       "    B, T, C = x.shape\n    hs = C // n_head\n"
       "    q, k, v = (x @ w_qkv.T + b_qkv).split(C, dim=2)\n"
       "    q, k, v = [z.view(B, T, n_head, hs).transpose(1, 2) for z in (q, k, v)]\n")
_MH_END = "    return y.transpose(1, 2).reshape(B, T, C) @ w_proj.T + b_proj\n"
_DECODE = ("def decode(q, k, v, k_cache, v_cache):\n"
           "    k_all, v_all = torch.cat([k_cache, k], dim=2), torch.cat([v_cache, v], dim=2)\n")

# label: (exercise, the learner's code, the mistake the check should name)
LEARNERS: dict[str, tuple[str, str, str | None]] = {
    "attention: softmax by hand, exp / sum": ("attention", "def attention(q, k, v):\n" + _FUTURE + _SCORES
        + "    s = s.masked_fill(future, float('-inf'))\n    e = torch.exp(s)\n"
        "    return (e / e.sum(dim=-1, keepdim=True)) @ v\n", "unstable_softmax"),
    "attention: exp, then the mask multiplied in": ("attention", "def attention(q, k, v):\n" + _FUTURE + _SCORES
        + "    e = s.exp() * (~future)\n    w = e / e.sum(-1, keepdim=True)\n    return w @ v\n",
        "unstable_softmax"),
    "attention: the whole tensor's max subtracted": ("attention", "def attention(q, k, v):\n" + _FUTURE + _SCORES
        + "    s = s.masked_fill(future, float('-inf'))\n    e = torch.exp(s - s.max())\n"
        "    return e / e.sum(-1, keepdim=True) @ v\n", "global_max"),
    "attention: q scaled in place": ("attention", "def attention(q, k, v):\n" + _FUTURE
        + "    q.mul_(1 / math.sqrt(q.size(-1)))  # saves a copy\n    s = q @ k.transpose(-2, -1)\n"
        "    s = s.masked_fill(future, float('-inf'))\n    return torch.softmax(s, -1) @ v\n", "in_place"),
    "attention: scores in float16 to save memory": ("attention", "def attention(q, k, v):\n" + _FUTURE
        + "    s = (q.half() @ k.half().transpose(-2, -1)).float() / math.sqrt(q.size(-1))\n"
        "    s = s.masked_fill(future, float('-inf'))\n    return torch.softmax(s, -1).to(q.dtype) @ v\n",
        "lower_precision"),
    "attention: softmax in bfloat16": ("attention", "def attention(q, k, v):\n" + _FUTURE + _SCORES
        + "    s = s.masked_fill(future, float('-inf'))\n"
        "    w = torch.softmax(s.to(torch.bfloat16), dim=-1).to(q.dtype)\n    return w @ v\n", "lower_precision"),
    "scores: computed in bfloat16": ("scores", "def scores(q, k):\n"
        "    s = q.bfloat16() @ k.bfloat16().transpose(-2, -1)\n    return (s / math.sqrt(q.shape[-1])).to(q.dtype)\n",
        "lower_precision"),
    "scores: q divided in place": ("scores", "def scores(q, k):\n    q /= math.sqrt(q.size(-1))\n"
        "    return q @ k.transpose(-2, -1)\n", "in_place"),
    "mask: masked_fill_ on the scores it was given": ("mask", "def mask(scores):\n    t = scores.size(-1)\n"
        "    scores.masked_fill_(torch.ones(t, t, dtype=torch.bool).triu(1), float('-inf'))\n    return scores\n",
        "in_place"),
    "multi_head: softmax by hand in the heads": ("multi_head", _MH
        + "    s = q @ k.transpose(-2, -1) / math.sqrt(hs)\n"
        "    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float('-inf'))\n"
        "    w = s.exp() / s.exp().sum(-1, keepdim=True)\n    y = w @ v\n" + _MH_END, "unstable_softmax"),
    "multi_head: projections in float16": ("multi_head",
        "def multi_head(x, w_qkv, b_qkv, w_proj, b_proj, n_head):\n    B, T, C = x.shape\n    hs = C // n_head\n"
        "    qkv = (x.half() @ w_qkv.half().T + b_qkv.half()).float()\n    q, k, v = qkv.split(C, dim=2)\n"
        "    q, k, v = [z.view(B, T, n_head, hs).transpose(1, 2) for z in (q, k, v)]\n"
        "    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)\n" + _MH_END, "lower_precision"),
    "decode: softmax by hand": ("decode", _DECODE
        + "    s = q @ k_all.transpose(-2, -1) / math.sqrt(q.size(-1))\n"
        "    w = torch.exp(s) / torch.exp(s).sum(-1, keepdim=True)\n    return w @ v_all, k_all, v_all\n",
        "unstable_softmax"),
    "decode: the whole tensor's max subtracted": ("decode", _DECODE
        + "    s = q @ k_all.transpose(-2, -1) / math.sqrt(q.size(-1))\n    e = (s - s.max()).exp()\n"
        "    return e / e.sum(-1, keepdim=True) @ v_all, k_all, v_all\n", "global_max"),
    "decode: q scaled in place": ("decode", _DECODE + "    q *= q.size(-1) ** -0.5\n"
        "    return torch.softmax(q @ k_all.transpose(-2, -1), -1) @ v_all, k_all, v_all\n", "in_place"),
    "mask: the future set by indexing the scores": ("mask", "def mask(scores):\n    t = scores.shape[-1]\n"
        "    future = torch.triu(torch.ones(t, t), 1).bool()\n    scores[..., future] = float('-inf')\n"
        "    return scores\n",
        "in_place"),
    "attention: softmax with dtype=float16": ("attention", "def attention(q, k, v):\n" + _FUTURE + _SCORES
        + "    s = s.masked_fill(future, float('-inf'))\n"
        "    return F.softmax(s, dim=-1, dtype=torch.float16).to(v.dtype) @ v\n", "lower_precision"),
    "attention: sqrt of the number of heads": ("attention", "def attention(q, k, v):\n" + _FUTURE
        + "    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(1))\n"
        "    s = s.masked_fill(future, float('-inf'))\n    return torch.softmax(s, -1) @ v\n", None),
}

# correct answers written in other styles: they must pass (einsum, Python loops, -1e9, a stable softmax by hand)
CORRECT: dict[str, tuple[str, str]] = {
    "attention: einsum and -1e9": ("attention", "def attention(q, k, v):\n" + _FUTURE
        + "    s = torch.einsum('bhid,bhjd->bhij', q, k) / math.sqrt(q.shape[-1])\n"
        "    s = s.masked_fill(future, -1e9)\n    return torch.einsum('bhij,bhjd->bhid', s.softmax(-1), v)\n"),
    "attention: a loop over heads and queries": ("attention", "def attention(q, k, v):\n"
        "    out = torch.empty_like(q)\n    B, H, T, d = q.shape\n"
        "    for b in range(B):\n        for h in range(H):\n            for i in range(T):\n"
        "                s = k[b, h, : i + 1] @ q[b, h, i] / math.sqrt(d)\n"
        "                out[b, h, i] = torch.softmax(s, 0) @ v[b, h, : i + 1]\n    return out\n"),
    "attention: a stable softmax by hand": ("attention", "def attention(q, k, v):\n" + _FUTURE + _SCORES
        + "    s = s.masked_fill(future, float('-inf'))\n    e = torch.exp(s - s.amax(-1, keepdim=True))\n"
        "    return e / e.sum(-1, keepdim=True) @ v\n"),
    "attention: scaled q, then torch.softmax": ("attention", "def attention(q, k, v):\n" + _FUTURE
        + "    q = q * q.size(-1) ** -0.5\n    s = (q @ k.mT).masked_fill(future, float('-inf'))\n"
        "    return torch.softmax(s, dim=-1) @ v\n"),
    "scores: einsum": ("scores", "def scores(q, k):\n"
        "    return torch.einsum('bhtd,bhsd->bhts', q, k) / math.sqrt(q.shape[-1])\n"),
    "mask: a clone, then masked_fill_": ("mask", "def mask(scores):\n    t = scores.size(-1)\n"
        "    out = scores.clone()\n"
        "    out.masked_fill_(torch.ones(t, t, dtype=torch.bool).triu(1), float('-inf'))\n    return out\n"),
    "multi_head: sdpa": ("multi_head", _MH + "    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)\n"
        + _MH_END),
    "multi_head: a stable softmax by hand, -1e9": ("multi_head", _MH
        + "    s = q @ k.transpose(-2, -1) / math.sqrt(hs)\n"
        "    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -1e9)\n"
        "    y = (s - s.max(-1, keepdim=True).values).softmax(-1) @ v\n" + _MH_END),
    "decode: a stable softmax by hand": ("decode", _DECODE
        + "    s = q @ k_all.transpose(-2, -1) / math.sqrt(q.size(-1))\n    e = (s - s.amax(-1, keepdim=True)).exp()\n"
        "    return e / e.sum(-1, keepdim=True) @ v_all, k_all, v_all\n"),
}


def outcome(result) -> str:
    """named (the catalogue's name), located (a fail or error without a name), or missed (a pass)."""
    if result.status == "pass":
        return "missed"
    return "named" if result.mistake else "located"


def main() -> None:
    import tempfile
    from collections import Counter
    from pathlib import Path

    from attention_lab.exercises import check

    counts = Counter()
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, (exercise, body, expected)) in enumerate(LEARNERS.items()):
            path = Path(tmp) / f"l{i}.py"
            path.write_text(HEADER + body)
            r = check(exercise, path, quiet=True)
            got = outcome(r)
            counts[got] += 1
            print(f"{got:8} {r.mistake or '-':18} {label}\n         {r.message.splitlines()[0][:200]}")
        for i, (label, (exercise, body)) in enumerate(CORRECT.items()):
            path = Path(tmp) / f"c{i}.py"
            path.write_text(HEADER + body)
            r = check(exercise, path, quiet=True)
            print(f"{'ok' if r else 'WRONG':8} correct: {label}" + ("" if r else f"\n         {r.message[:300]}"))
    print(f"{len(LEARNERS)} wrong versions: {counts['named']} named, {counts['located']} located, "
          f"{counts['missed']} missed")


if __name__ == "__main__":
    main()
