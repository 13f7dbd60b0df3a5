"""The exercises (attention_lab/exercises): each catalogued mistake written by hand as a learner writes it (never
produced by the catalogue's own code) is named; every correct answer passes (RoPE's other convention when asked
for); a near miss within the tolerance passes and one just outside fails; bad code is one `error:` naming the
exercise and the line.

Each test names the planted bug it catches (tests/mutations.py, "the exercises (issue 31)")."""

from __future__ import annotations

import math
import time

import pytest
import torch
from exercise_learners import LEARNERS

from attention_lab.exercises import EXERCISES, answers, check, skeleton, solution, start
from attention_lab.exercises.__main__ import main as cli_main
from attention_lab.exercises.book import TOLERANCE, multi_head_with, table_with
from model.positions import sinusoidal_table

HEADER = "import math\n\nimport torch\nimport torch.nn.functional as F\n\n\n"

# --------------------------------------------------------------------------- the mistakes, by hand, as learners write them

MASK = "    t = scores.size(-1)\n"
ATT = ("    t, d_k = q.size(-2), q.size(-1)\n"
       "    s = q @ k.transpose(-2, -1) / math.sqrt(d_k)\n")
RETURN = "    return torch.softmax(s, dim=-1) @ v\n"
FUTURE = "    future = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)\n"

HAND_WRITTEN = {
    # exercise, the mistake's catalogue name: the learner's function body
    ("scores", "no_scale"): "def scores(q, k):\n    return q @ k.transpose(-2, -1)\n",
    ("scores", "divided_by_dk"): "def scores(q, k):\n    return q @ k.transpose(-2, -1) / q.size(-1)\n",
    ("scores", "sqrt_of_length"): "def scores(q, k):\n    return (q @ k.transpose(-1, -2)) / math.sqrt(k.shape[2])\n",
    ("scores", "keys_not_transposed"): "def scores(q, k):\n    return q @ k / math.sqrt(q.shape[-1])\n",
    ("scores", "wrong_axes"): "def scores(q, k):\n    return q.transpose(-2, -1) @ k / math.sqrt(q.shape[-1])\n",
    ("scores", "transposed"): "def scores(q, k):\n    return torch.matmul(k, q.transpose(2, 3)) / q.shape[-1] ** 0.5\n",
    ("mask", "zero_not_inf"): "def mask(scores):\n" + MASK
    + "    keep = torch.tril(torch.ones(t, t))\n    return scores * keep\n",
    ("mask", "diagonal_hidden"): "def mask(scores):\n" + MASK
    + "    m = torch.triu(torch.ones(t, t), diagonal=0).bool()\n    return scores.masked_fill(m, float('-inf'))\n",
    ("mask", "future_visible"): "def mask(scores):\n" + MASK
    + "    m = torch.triu(torch.ones(t, t), diagonal=2).bool()\n    return scores.masked_fill(m, float('-inf'))\n",
    ("mask", "mask_transposed"): "def mask(scores):\n" + MASK
    + "    m = torch.tril(torch.ones(t, t), diagonal=-1).bool()\n    return scores.masked_fill(m, -float('inf'))\n",
    ("mask", "softmaxed"): "def mask(scores):\n" + MASK
    + "    m = torch.ones(t, t).tril() == 0\n    return F.softmax(scores.masked_fill(m, float('-inf')), dim=-1)\n",
    ("attention", "no_scale"): "def attention(q, k, v):\n    t = q.size(-2)\n    s = q @ k.transpose(-2, -1)\n"
    + FUTURE + "    s = s.masked_fill(future, float('-inf'))\n" + RETURN,
    ("attention", "divided_by_dk"): "def attention(q, k, v):\n    t = q.size(-2)\n    s = q @ k.mT / k.size(-1)\n"
    + FUTURE + "    s = s.masked_fill(future, float('-inf'))\n" + RETURN,
    ("attention", "mask_after_softmax"): "def attention(q, k, v):\n" + ATT + FUTURE
    + "    w = torch.softmax(s, dim=-1)\n    w = w.masked_fill(future, 0.0)\n    return w @ v\n",
    ("attention", "zero_not_inf"): "def attention(q, k, v):\n" + ATT
    + "    s = s * torch.tril(torch.ones(t, t))  # keep the past, zero the future\n" + RETURN,
    ("attention", "no_mask"): "def attention(q, k, v):\n" + ATT + RETURN,
    ("attention", "diagonal_hidden"): "def attention(q, k, v):\n" + ATT
    + "    s = s.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool)), float('-inf'))\n" + RETURN,
    ("attention", "future_visible"): "def attention(q, k, v):\n" + ATT
    + "    s = s.masked_fill(torch.ones(t, t).triu(2).bool(), float('-inf'))\n" + RETURN,
    ("attention", "mask_transposed"): "def attention(q, k, v):\n" + ATT
    + "    s = s.masked_fill(torch.ones(t, t).tril(-1).bool(), float('-inf'))\n" + RETURN,
    ("attention", "softmax_over_queries"): "def attention(q, k, v):\n" + ATT + FUTURE
    + "    s = s.masked_fill(future, float('-inf'))\n    return torch.softmax(s, dim=-2) @ v\n",
    ("attention", "keys_not_transposed"): "def attention(q, k, v):\n    t = q.size(-2)\n"
    + "    s = q @ k / math.sqrt(q.size(-1))\n" + FUTURE + "    s = s.masked_fill(future, float('-inf'))\n" + RETURN,
    ("attention", "queries_keys_swapped"): "def attention(q, k, v):\n    t = q.size(-2)\n"
    + "    s = k @ q.transpose(-2, -1) / math.sqrt(q.size(-1))\n" + FUTURE
    + "    s = s.masked_fill(future, float('-inf'))\n" + RETURN,
    ("sinusoidal", "concatenated"): "def sinusoidal(n_positions, dim):\n"
    "    p = torch.arange(n_positions).float()[:, None]\n"
    "    freq = 1.0 / 10000 ** (torch.arange(0, dim, 2).float() / dim)\n"
    "    return torch.cat([torch.sin(p * freq), torch.cos(p * freq)[:, : dim // 2]], dim=1)\n",
    ("sinusoidal", "sin_cos_swapped"): "def sinusoidal(n_positions, dim):\n"
    "    pe = torch.zeros(n_positions, dim)\n    p = torch.arange(n_positions).float()[:, None]\n"
    "    freq = torch.exp(torch.arange(0, dim, 2).float() * (-math.log(10000.0) / dim))\n"
    "    pe[:, 0::2] = torch.cos(p * freq)\n    pe[:, 1::2] = torch.sin(p * freq)[:, : dim // 2]\n    return pe\n",
    ("sinusoidal", "pair_index_exponent"): "def sinusoidal(n_positions, dim):\n"
    "    pe = torch.zeros(n_positions, dim)\n    p = torch.arange(n_positions).float()[:, None]\n"
    "    i = torch.arange((dim + 1) // 2).float()\n    angle = p / 10000 ** (i / dim)\n"
    "    pe[:, 0::2] = torch.sin(angle)\n    pe[:, 1::2] = torch.cos(angle)[:, : dim // 2]\n    return pe\n",
    ("sinusoidal", "doubled_exponent"): "def sinusoidal(n_positions, dim):\n"
    "    pe = torch.zeros(n_positions, dim)\n    p = torch.arange(n_positions).float()[:, None]\n"
    "    i = torch.arange(0, dim, 2).float()\n    angle = p / 10000 ** (2 * i / dim)\n"
    "    pe[:, 0::2] = torch.sin(angle)\n    pe[:, 1::2] = torch.cos(angle)[:, : dim // 2]\n    return pe\n",
    ("sinusoidal", "positions_from_one"): "def sinusoidal(n_positions, dim):\n"
    "    pe = torch.zeros(n_positions, dim)\n    p = torch.arange(1, n_positions + 1).float()[:, None]\n"
    "    angle = p / 10000 ** (torch.arange(0, dim, 2).float() / dim)\n"
    "    pe[:, 0::2] = torch.sin(angle)\n    pe[:, 1::2] = torch.cos(angle)[:, : dim // 2]\n    return pe\n",
    ("rope", "adjacent_pairs"): "def rope(x, pos, base=10000.0):\n"
    "    d = x.shape[-1]\n    theta = base ** (-torch.arange(0, d, 2).float() / d)\n"
    "    ang = pos.float()[:, None] * theta\n    c, s = ang.cos().to(x.dtype), ang.sin().to(x.dtype)\n"
    "    even, odd = x[..., ::2], x[..., 1::2]\n    out = torch.empty_like(x)\n"
    "    out[..., ::2] = even * c - odd * s\n    out[..., 1::2] = even * s + odd * c\n    return out\n",
    ("rope", "wrong_direction"): "def rope(x, pos, base=10000.0):\n"
    "    d = x.shape[-1]\n    inv = 1 / base ** (torch.arange(0, d, 2).float() / d)\n"
    "    ang = torch.outer(pos.float(), inv).repeat(1, 2)\n    x1, x2 = x.chunk(2, dim=-1)\n"
    "    return (x * ang.cos() + torch.cat([x2, -x1], -1) * ang.sin()).to(x.dtype)\n",
    ("rope", "pair_index_exponent"): "def rope(x, pos, base=10000.0):\n"
    "    d = x.shape[-1]\n    inv = 1 / base ** (torch.arange(d // 2).float() / d)\n"
    "    ang = torch.outer(pos.float(), inv).repeat(1, 2)\n    x1, x2 = x.chunk(2, dim=-1)\n"
    "    return (x * ang.cos() + torch.cat([-x2, x1], -1) * ang.sin()).to(x.dtype)\n",
    ("rope", "ignores_pos"): "def rope(x, pos, base=10000.0):\n"
    "    t, d = x.shape[-2], x.shape[-1]\n    inv = 1 / base ** (torch.arange(0, d, 2).float() / d)\n"
    "    ang = torch.outer(torch.arange(t).float(), inv).repeat(1, 2)\n    x1, x2 = x.chunk(2, dim=-1)\n"
    "    return (x * ang.cos() + torch.cat([-x2, x1], -1) * ang.sin()).to(x.dtype)\n",
}

DECODE = ("def decode(q, k, v, k_cache, v_cache):\n"
          "    k_all, v_all = torch.cat([k_cache, k], dim=2), torch.cat([v_cache, v], dim=2)\n")
HAND_WRITTEN |= {
    ("decode", "own_key_not_seen"): "def decode(q, k, v, k_cache, v_cache):\n"
    "    w = torch.softmax(q @ k_cache.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)\n    y = w @ v_cache\n"
    "    return y, torch.cat([k_cache, k], dim=2), torch.cat([v_cache, v], dim=2)\n",
    ("decode", "mask_top_left"): DECODE
    + "    s = q @ k_all.transpose(-2, -1) / math.sqrt(q.size(-1))\n"
    "    causal = torch.tril(torch.ones(s.size(-2), s.size(-1), dtype=torch.bool))\n"
    "    s = s.masked_fill(~causal, float('-inf'))\n    return torch.softmax(s, -1) @ v_all, k_all, v_all\n",
    ("decode", "cache_not_appended"): DECODE
    + "    y = F.scaled_dot_product_attention(q, k_all, v_all)\n    return y, k_cache, v_cache\n",
    ("decode", "cache_prepended"): "def decode(q, k, v, k_cache, v_cache):\n"
    "    k_all, v_all = torch.cat([k, k_cache], dim=2), torch.cat([v, v_cache], dim=2)\n"
    "    return F.scaled_dot_product_attention(q, k_all, v_all), k_all, v_all\n",
    ("decode", "no_scale"): DECODE
    + "    return torch.softmax(q @ k_all.transpose(-2, -1), -1) @ v_all, k_all, v_all\n",
    ("decode", "divided_by_dk"): DECODE
    + "    return F.scaled_dot_product_attention(q, k_all, v_all, scale=1 / q.size(-1)), k_all, v_all\n",
}

MH = ("def multi_head(x, w_qkv, b_qkv, w_proj, b_proj, n_head):\n"
      "    B, T, C = x.shape\n    hs = C // n_head\n"
      "    q, k, v = (x @ w_qkv.T + b_qkv).split(C, dim=2)\n")
SPLIT = "    q, k, v = [z.view(B, T, n_head, hs).transpose(1, 2) for z in (q, k, v)]\n"
SDPA = "    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)\n"
HAND_WRITTEN |= {
    ("multi_head", "split_no_transpose"): MH + "    q, k, v = [z.reshape(B, n_head, T, hs) for z in (q, k, v)]\n"
    + SDPA + "    y = y.transpose(1, 2).reshape(B, T, C)\n    return y @ w_proj.T + b_proj\n",
    ("multi_head", "concat_no_transpose"): MH + SPLIT + SDPA
    + "    y = y.reshape(B, T, C)\n    return y @ w_proj.T + b_proj\n",
    ("multi_head", "heads_interleaved"): MH + SPLIT + SDPA
    + "    y = torch.stack([y[:, h] for h in range(n_head)], dim=-1).reshape(B, T, C)\n"
    "    return y @ w_proj.T + b_proj\n",
    ("multi_head", "heads_reversed"): MH + SPLIT + SDPA
    + "    y = torch.cat([y[:, h] for h in range(n_head - 1, -1, -1)], dim=-1)\n    return y @ w_proj.T + b_proj\n",
    ("multi_head", "no_output_projection"): MH + SPLIT + SDPA + "    return y.transpose(1, 2).reshape(B, T, C)\n",
    ("multi_head", "no_scale"): MH + SPLIT + SDPA.replace("is_causal=True", "is_causal=True, scale=1.0")
    + "    return y.transpose(1, 2).reshape(B, T, C) @ w_proj.T + b_proj\n",
    ("multi_head", "no_mask"): MH + SPLIT + SDPA.replace("is_causal=True", "is_causal=False")
    + "    return y.transpose(1, 2).reshape(B, T, C) @ w_proj.T + b_proj\n",
}


def write(tmp_path, name: str, body: str, stem: str | None = None):
    path = tmp_path / f"{stem or name}.py"
    path.write_text(HEADER + body)
    return path


@pytest.mark.parametrize("exercise,mistake", sorted(HAND_WRITTEN), ids=lambda x: x)
def test_a_mistake_written_by_hand_is_named(tmp_path, exercise, mistake):
    """Planted bugs: exercise_diagnosis_picks_the_first, exercise_diagnosis_ignores_a_case, exercise_check_runs_the_reference."""
    path = write(tmp_path, exercise, HAND_WRITTEN[exercise, mistake])
    result = check(exercise, path, quiet=True)
    assert result.status == "fail" and result.mistake == mistake, (
        f"{exercise}: the hand-written {mistake!r} was {result.status} / {result.mistake!r}:\n{result.message}")
    m = next(m for m in EXERCISES[exercise].mistakes if m.name == mistake)
    assert m.title in result.message and f"why it matters: {m.why}" in result.message, (
        f"the message must name the mistake in words and why it matters (an experiment where one fits):\n"
        f"{result.message}")


def test_every_catalogued_mistake_has_a_hand_written_twin():
    listed = {(e.name, m.name) for e in EXERCISES.values() for m in e.mistakes
              if not (e.name == "multi_head" and m.name in EXERCISES["attention"].mistakes[0].name)}
    inside = {("multi_head", m.name) for m in EXERCISES["attention"].mistakes}  # covered by `attention`'s twins
    numerics = {(exercise, name) for exercise, _, name in LEARNERS.values()}  # tests/exercise_learners.py
    missing = sorted(listed - set(HAND_WRITTEN) - inside - numerics)
    assert not missing, f"catalogued mistakes without a hand-written learner's version in this file: {missing}"


def test_the_messages_quote_the_number_that_shows_the_mistake(tmp_path):
    r = check("scores", write(tmp_path, "scores", HAND_WRITTEN["scores", "no_scale"]), quiet=True)
    assert "your scores are 2.83 times the reference's at d_k = 8" in r.message, r.message
    r = check("attention", write(tmp_path, "attention", HAND_WRITTEN["attention", "mask_after_softmax"]), quiet=True)
    assert "query 0's weights sum to 0.688 and query 2's to 0.441, not 1" in r.message, r.message
    r = check("mask", write(tmp_path, "mask", HAND_WRITTEN["mask", "zero_not_inf"]), quiet=True)
    assert "query 0 of head 0 has score 0 for key 1" in r.message, r.message


# --------------------------------------------------------------------------------------------- correct answers


@pytest.mark.parametrize("name", list(EXERCISES))
def test_the_projects_answer_passes(name):
    """Planted bug: exercise_tolerance_too_tight (a correct answer written another way fails)."""
    result = check(name, getattr(answers, name), quiet=True)
    assert result.status == "pass", result.message


def test_other_correct_answers_pass(tmp_path):
    """Written differently from answers.py: sdpa, -1e9 instead of -inf, einsum, float64 and back."""
    others = {
        "attention": "def attention(q, k, v):\n    return F.scaled_dot_product_attention(q, k, v, is_causal=True)\n",
        "scores": "def scores(q, k):\n    return torch.einsum('bhid,bhjd->bhij', q, k) / math.sqrt(q.shape[-1])\n",
        "decode": "def decode(q, k, v, k_cache, v_cache):\n    k2, v2 = torch.cat((k_cache, k), 2), torch.cat((v_cache, v), 2)\n"
                  "    return F.scaled_dot_product_attention(q, k2, v2), k2, v2\n",
    }
    for name, body in others.items():
        result = check(name, write(tmp_path, name, body), quiet=True)
        assert result.status == "pass", f"{name}: {result.message}"
    big = "def mask(scores):\n    t = scores.size(-1)\n    return scores.masked_fill(torch.ones(t, t).triu(1).bool(), -1e9)\n"
    result = check("mask", write(tmp_path, "mask", big), quiet=True)
    assert result.status == "pass" and "large negative number" in result.message, result.message


def test_rope_the_other_convention_passes_when_asked_for_and_is_named_when_not(tmp_path):
    path = write(tmp_path, "rope", HAND_WRITTEN["rope", "adjacent_pairs"])
    assert check("rope", path, rope="adjacent", quiet=True).status == "pass"
    assert check("rope", answers.rope_adjacent, rope="adjacent", quiet=True).status == "pass"
    asked_wrongly = check("rope", answers.rope, rope="adjacent", quiet=True)
    assert asked_wrongly.mistake == "halves_pairs", asked_wrongly.message
    named = check("rope", path, quiet=True)
    assert "rotates (i, i + hs/2)" in named.message and "--rope adjacent" in named.message, named.message


def test_the_catalogue_agrees_with_the_model():
    """The mistakes are the reference with one thing changed: their unchanged parts are the model's own."""
    assert torch.equal(table_with(33, 7), sinusoidal_table(33, 7))
    ex = EXERCISES["multi_head"]
    for case in ex.cases():
        ref = ex.reference(*case.float_args())
        torch.testing.assert_close(multi_head_with(*case.float_args()), ref, rtol=0, atol=1e-6,
                                   msg=f"multi_head_with (the catalogue's layer) drifts from CausalSelfAttention "
                                       f"({case.label})")


def test_every_mistake_differs_from_the_reference_and_from_the_others():
    """Otherwise a mistake could never be named, or two would claim one learner."""
    for ex in EXERCISES.values():
        ordinary = [c for c in ex.cases() if not c.large]  # where checking.diagnose compares outputs
        for conv, (_, mistakes) in [(None, (None, ex.mistakes)), *ex.conventions.items()]:
            outputs = {}
            for m in mistakes:
                if m.compute is None:  # known by a pattern (tests/test_exercises_numerics.py), not an output
                    continue
                outs = []
                for case in ordinary:
                    try:
                        out = m.output(case)
                        outs.append(out if isinstance(out, tuple) else (out,))
                    except RuntimeError:
                        outs.append(None)
                outputs[m.name] = outs
            refs = [ex.conventions[conv][0](*c.float_args()) if conv else ex.reference(*c.float_args())
                    for c in ordinary]
            refs = [r if isinstance(r, tuple) else (r,) for r in refs]

            def same(a, b):
                return all((x is None) == (y is None) and (x is None or all(
                    p.shape == q.shape and torch.allclose(p.float(), q.float(), atol=1e-4, equal_nan=True)
                    for p, q in zip(x, y))) for x, y in zip(a, b))

            for name, outs in outputs.items():
                assert not same(outs, refs), f"{ex.name}: the mistake {name} equals the reference on every case"
            names = list(outputs)
            for i, a in enumerate(names):
                for b in names[i + 1:]:
                    assert not same(outputs[a], outputs[b]), f"{ex.name}: mistakes {a} and {b} are the same outputs"


# --------------------------------------------------------------------------------------------- the tolerance


# the tolerance docs/exercises.md states: (positions?, dtype) -> (atol, rtol)
STATED = {(False, torch.float32): (1e-5, 1e-4), (True, torch.float32): (1e-4, 1e-4),
          (False, torch.bfloat16): (2e-2, 2e-2), (True, torch.bfloat16): (2e-2, 2e-2)}


@pytest.mark.parametrize("name,dtype", [("scores", torch.float32), ("attention", torch.float32),
                                        ("rope", torch.float32), ("sinusoidal", torch.float32),
                                        ("attention", torch.bfloat16)])
def test_a_near_miss_within_tolerance_passes_and_just_outside_fails(name, dtype):
    """Planted bug: exercise_tolerance_loose (a loose tolerance lets a wrong answer pass). The answer's outputs of
    one dtype are nudged by 0.5x and 3x the stated tolerance at every entry, the others left alone."""
    ref = getattr(answers, name)

    def nudged(by):
        def fn(*args):
            out = ref(*args)
            if out.dtype != dtype:
                return out
            atol, rtol = STATED[name in ("rope", "sinusoidal"), out.dtype]  # the docs' numbers, not the code's
            step = (atol + rtol * out.float().abs()) * by
            return torch.where(torch.isfinite(out), out.float() + step, out.float()).to(out.dtype)
        return fn

    inside, outside = check(name, nudged(0.5), quiet=True), check(name, nudged(3.0), quiet=True)
    assert inside.status == "pass", f"0.5x the tolerance must pass: {inside.message}"
    assert outside.status == "fail", f"3x the tolerance must fail: {outside.message}"
    assert "first differs at" in outside.message and "matches none of" in outside.message, outside.message


def test_divided_by_dk_is_caught_at_a_small_head_size():
    """At a small d_k, dividing by d_k instead of sqrt(d_k) changes the output less than the scores; the check must
    still see it on the smallest head size alone (scores: hs = 4, attention: hs = 7). Planted bug:
    exercise_tolerance_loose."""
    for name in ("scores", "attention"):
        ex = EXERCISES[name]
        case = min((c for c in ex.cases() if c.sizes["T"] > 1), key=lambda c: c.sizes["hs"])
        wrong = next(m for m in ex.mistakes if m.name == "divided_by_dk").output(case)
        ok = torch.isclose(wrong, ex.reference(*case.float_args()), atol=TOLERANCE[case.dtype].atol,
                           rtol=TOLERANCE[case.dtype].rtol)
        assert not ok.all(), f"{name}: divided by d_k passes the tolerance at {case.label}"
    result = check("attention", _divided_by_dk, quiet=True)
    assert result.mistake == "divided_by_dk", result.message


def _divided_by_dk(q, k, v):
    t = q.size(-2)
    s = (q @ k.transpose(-2, -1)) / q.size(-1)
    s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


def test_the_answers_are_far_inside_the_tolerance():
    """The tolerance is stated from a measurement: an answer written another way differs from the reference by
    a few float32 roundings (so 1e-5 + 1e-4|ref| is wide for a right answer and narrow for a wrong idea)."""
    ex = EXERCISES["attention"]
    worst = 0.0
    for case in ex.cases():
        if case.dtype != torch.float32:
            continue
        worst = max(worst, (answers.attention(*case.args) - ex.reference(*case.args)).abs().max().item())
    assert worst < 1e-6, f"the answer differs from math_attention by {worst:g}"


# --------------------------------------------------------------------------------------------- bad code, clear words


def test_bad_code_is_one_error_naming_the_exercise_and_the_line(tmp_path):
    cases = {
        "syntax": ("attention", "def attention(q, k, v)\n    return q\n", "line 7: it does not import: SyntaxError"),
        "import": ("attention", "import not_a_module_anywhere\n", "line 7: it does not import: ModuleNotFoundError"),
        "missing": ("attention", "def attend(q, k, v):\n    return q\n", "defines no function `attention` (it defines attend)"),
        "raises": ("attention", "def attention(q, k, v):\n    t = q.size(-2)\n    s = q @ k.transpose(-2, -1)\n"
                   "    s = s.view(t, t)\n    return s @ v\n", "line 10: RuntimeError"),
        "shape": ("attention", "def attention(q, k, v):\n    s = q @ k.transpose(-2, -1)\n    return torch.softmax(s, -1)\n",
                  "line 9: your attention returned a tensor of shape (1, 1, 1, 1)"),
        "dtype": ("attention", "def attention(q, k, v):\n    t = q.size(-2)\n    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))\n"
                  "    s = s + torch.full((t, t), float('-inf')).triu(1)\n    return torch.softmax(s, -1) @ v.float()\n",
                  "line 11: your attention returned a tensor of dtype float32; expected bfloat16"),
        "device": ("scores", "def scores(q, k):\n    return (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).to('meta')\n",
                   "line 8: your scores returned a tensor on device meta"),
        "nan": ("attention", "def attention(q, k, v):\n    t = q.size(-2)\n    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))\n"
                "    future = torch.ones(t, t, dtype=q.dtype).triu(1)\n    additive = future * float('-inf')\n"
                "    s = s + additive\n"
                "    return torch.softmax(s, -1) @ v\n", "line 11: a NaN appears there"),
    }
    for label, (exercise, body, expected) in cases.items():
        path = write(tmp_path, label, body)
        result = check(exercise, path, quiet=True)
        assert result.status == "error" and result.message.startswith(f"error: {exercise}: "), (label, result.message)
        assert expected in result.message and str(path) in result.message, f"{label}: {result.message}"


def test_a_function_that_runs_for_minutes_is_stopped_at_its_line(tmp_path):
    path = write(tmp_path, "slow", "def scores(q, k):\n    total = 0\n    while True:\n        total += 1\n")
    t0 = time.monotonic()
    result = check("scores", path, quiet=True, timeout=1.0)
    assert time.monotonic() - t0 < 10, "the timeout did not stop the learner's loop"
    assert result.status == "error" and "stopped after 1 s" in result.message, result.message
    assert "at line 9" in result.message or "at line 10" in result.message, result.message


def test_a_notebook_function_gets_the_same_messages():
    def attention(q, k, v):
        t = q.size(-2)
        s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        w = torch.softmax(s, dim=-1).masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), 0.0)
        return w @ v

    result = check("attention", attention, quiet=True)
    assert result.mistake == "mask_after_softmax" and not result, result.message

    def broken(q, k, v):
        raise KeyError("oops")

    result = check("attention", broken, quiet=True)
    line = broken.__code__.co_firstlineno + 1
    assert result.status == "error" and f"line {line}: KeyError" in result.message, result.message


# --------------------------------------------------------------------------------------------- the command line


def test_start_writes_a_skeleton_into_the_users_folder_never_the_package(tmp_path, capsys):
    path = start("mask", tmp_path / "mine")
    text = path.read_text()
    assert "def mask(scores):" in text and "(B, nh, T, T)" in text and "check mask" in text
    result = check("mask", path, quiet=True)
    assert result.status == "error" and "NotImplementedError: write mask" in result.message
    with pytest.raises(ValueError, match="exists already"):
        start("mask", tmp_path / "mine")
    import attention_lab

    with pytest.raises(ValueError, match="inside the attention_lab package"):
        start("mask", attention_lab.__path__[0])
    for name in EXERCISES:
        compile(skeleton(name), name, "exec")


def test_the_command_line_codes_and_the_solution_after_a_pass(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli_main(["list"]) == 0 and "1. scores" in capsys.readouterr().out
    assert cli_main(["start", "attention"]) == 0
    shown, text = solution("attention")
    assert not shown and "does not pass yet" in text
    assert cli_main(["check", "attention"]) == 2
    (tmp_path / "my_attention" / "attention.py").write_text(HEADER + HAND_WRITTEN["attention", "mask_after_softmax"])
    assert cli_main(["check", "attention"]) == 1
    assert "the mask is applied after the softmax" in capsys.readouterr().out
    import inspect

    (tmp_path / "my_attention" / "attention.py").write_text(HEADER + inspect.getsource(answers.attention))
    assert cli_main(["check", "attention"]) == 0
    out = capsys.readouterr().out
    assert "pass: attention" in out, out
    command = next(line for line in out.splitlines() if "train a model with it:" in line).split(": ", 1)[1]
    from attention_lab.exercises.checking import REPO

    assert command == (f"python {REPO / 'train.py'} experiment=debug "
                       f"model.attn_impl={tmp_path / 'my_attention' / 'attention.py'}:attention"), command
    assert cli_main(["solution", "attention"]) == 0 and "def attention(q, k, v):" in capsys.readouterr().out
    assert cli_main(["solution", "rope", "--anyway", "--rope", "adjacent"]) == 0
    assert "x[..., 0::2]" in capsys.readouterr().out


def test_a_notebook_stub_says_it_is_not_written_and_stop_raises_until_it_passes():
    """A "your turn" stub (raise NotImplementedError) is reported as not written, in the stub's words, with the
    command that shows the answer; stop=True raises that message; the answers the SOLVED switch uses pass."""
    from attention_lab.exercises import NotPassedYet, answer

    def scores(q, k):
        raise NotImplementedError("write scores = q k^T / sqrt(d_k), then rerun this cell")

    result = check("scores", scores, quiet=True)
    assert result.status == "error" and "not written yet" in result.message, result.message
    assert "write scores = q k^T / sqrt(d_k), then rerun this cell" in result.message, result.message
    assert "solution scores --anyway" in result.message, result.message
    with pytest.raises(NotPassedYet, match="not written yet"):
        check("scores", scores, stop=True)
    for name in EXERCISES:
        assert check(name, answer(name), quiet=True, stop=True), f"answer({name!r}) does not pass its own check"
