"""The exercises' messages never mislead (issue 37): the values shown are the named entry's own; -inf is written
"-inf"; a wrong mask is located (query, key) whatever it returns; no sentence repeats its own title and every one
quotes a measured number; the claim pointed to fits the mistake; an unnamed mistake is located to its query, head
and channel; every kind of failure is reported from its first case.

Each test names the planted bug it catches (tests/mutations.py, "the exercises' messages (issue 37)")."""

from __future__ import annotations

import math
import re

import pytest
import torch
from exercise_learners import HEADER, LEARNERS
from test_exercises import HAND_WRITTEN

from attention_lab.exercises import EXERCISES, answers, check
from attention_lab.exercises.checking import MEASURED


def test_the_values_shown_are_the_largest_differences_own():
    """One query off by 0.01 at channel 0 and by 0.5 at channel 5: the sentence names channel 5 and its values.
    Planted bug: exercise_values_of_the_first_entry."""
    def attention(q, k, v):
        y = answers.attention(q, k, v).clone()
        if y.size(-2) > 3 and y.dtype == torch.float32:
            y[..., 3, 0] += 0.01
            y[..., 3, 5] += 0.5
        return y

    r = check("attention", attention, quiet=True)
    found = re.search(r"the largest difference there is ([\d.]+) at channel (\d+) \(yours ([-\d.]+), reference "
                      r"([-\d.]+)\)", r.message)
    assert found, r.message
    worst, channel, yours, ref = float(found[1]), int(found[2]), float(found[3]), float(found[4])
    assert channel == 5 and worst == pytest.approx(0.5, abs=1e-3), r.message
    assert yours - ref == pytest.approx(0.5, abs=2e-3), f"the values shown are not channel 5's: {r.message}"


@pytest.mark.parametrize("value,words", [(-math.inf, "-inf appears there"), (math.inf, "an inf appears there"),
                                         (math.nan, "a NaN appears there")])
def test_a_non_finite_output_is_called_by_its_name(value, words):
    """Planted bug: exercise_inf_called_a_inf."""
    def attention(q, k, v):
        y = answers.attention(q, k, v).clone()
        y[..., -1, 0] = value
        return y

    r = check("attention", attention, quiet=True)
    assert r.status == "error" and words in r.message and "a inf" not in r.message, r.message


def test_a_mask_that_returns_inf_is_located_not_an_error(tmp_path):
    """+inf on the future keys: a failing mask at (query, key), exit 1, not an error line without a place."""
    path = tmp_path / "mask.py"
    path.write_text(HEADER + "def mask(scores):\n    t = scores.size(-1)\n"
                    "    return scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float('inf'))\n")
    r = check("mask", path, quiet=True)
    assert r.status == "fail" and r.exit_code == 1, r.message
    assert "it first differs at query 0 of head 0: the largest difference there is inf at key 1 (yours inf, " \
           "reference -inf)" in r.message, r.message


def _messages():
    out = []
    for (exercise, mistake), body in sorted(HAND_WRITTEN.items()):
        out.append((exercise, mistake, body))
    out += [(exercise, mistake, body) for exercise, body, mistake in LEARNERS.values()]
    return out


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z_']+", text.lower())


def test_no_sentence_repeats_its_title_and_each_quotes_a_measured_number(tmp_path):
    """Every hand-written mistake's first line: the title's words once (no 'the mask is applied after the softmax:
    the mask comes after the softmax'), and a number measured from the learner's output or the case's scores,
    besides the case's sizes. Planted bug: exercise_head_sentence_repeats_the_title."""
    titles = {(e.name, m.name): m.title for e in EXERCISES.values() for m in e.mistakes}
    for i, (exercise, mistake, body) in enumerate(_messages()):
        path = tmp_path / f"m{i}.py"
        path.write_text(HEADER + body)
        r = check(exercise, path, quiet=True)
        line = r.message.splitlines()[0]
        labels = [c.label for c in EXERCISES[exercise].cases()]
        bare = line
        for label in labels:
            bare = bare.replace(label, "")
        assert MEASURED.search(bare), f"{exercise}/{mistake}: no measured number in {line!r}"
        title = _words(titles.get((exercise, mistake), ""))
        words = _words(bare)
        grams = [tuple(words[j:j + 3]) for j in range(len(words) - 2)]
        for j in range(len(title) - 2):
            gram = tuple(title[j:j + 3])
            assert grams.count(gram) <= 1, f"{exercise}/{mistake} repeats {' '.join(gram)!r}: {line}"


def test_the_claim_pointed_to_fits_the_mistake():
    """Cache mistakes are not about the causal mask's leak: they do not send the learner to `claims mask`."""
    for m in EXERCISES["decode"].mistakes:
        if m.name in ("own_key_not_seen", "mask_top_left", "cache_not_appended", "cache_prepended"):
            assert "claims" not in m.why, f"decode/{m.name} points to {m.why}"
    heads = {m.name: m.why for m in EXERCISES["multi_head"].mistakes}
    assert heads["mask_after_softmax"].endswith("claims mask") and heads["no_scale"].endswith("claims scale")


def test_an_unnamed_mistake_is_located_to_its_head_and_channel(tmp_path):
    """multi_head: the projection mixes the heads, so the check reruns the layer with an identity projection to
    name the head; sinusoidal: the channel. Planted bug: exercise_head_not_probed."""
    mh = tmp_path / "mh.py"
    mh.write_text(HEADER + "def multi_head(x, w_qkv, b_qkv, w_proj, b_proj, n_head):\n"
                  "    B, T, C = x.shape\n    hs = C // n_head\n    q, k, v = (x @ w_qkv.T + b_qkv).split(C, dim=2)\n"
                  "    q, k, v = [z.view(B, T, n_head, hs).transpose(1, 2) for z in (q, k, v)]\n"
                  "    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)\n"
                  "    y[:, -1] = y[:, -1] * 1.1  # the last head a little louder\n"
                  "    return y.transpose(1, 2).reshape(B, T, C) @ w_proj.T + b_proj\n")
    r = check("multi_head", mh, quiet=True)
    assert r.mistake is None and "head 1 differs first, at position 0, channel 0 of its 4" in r.message, r.message
    sin = tmp_path / "sin.py"
    sin.write_text(HEADER + "def sinusoidal(n_positions, dim):\n    pe = torch.zeros(n_positions, dim)\n"
                   "    p = torch.arange(n_positions).float()[:, None]\n"
                   "    angle = p / 10000 ** (torch.arange(0, dim, 2).float() / dim)\n"
                   "    pe[:, 0::2] = torch.sin(angle)\n    pe[:, 1::2] = torch.cos(angle)[:, : dim // 2]\n"
                   "    pe[:, 3] += 0.01\n    return pe\n")
    r = check("sinusoidal", sin, quiet=True)
    assert "it first differs at position 0: the largest difference there is 0.01 at channel 3" in r.message, r.message


def test_every_kind_of_failure_is_reported_from_its_first_case(tmp_path):
    """A NaN on the first case and an exception on a later one: both said, the earlier case first.
    Planted bug: exercise_last_failure_only."""
    path = tmp_path / "two.py"
    path.write_text(HEADER + "def attention(q, k, v):\n    if q.size(0) == 3:\n        raise KeyError('bf16 only')\n"
                    "    t = q.size(-2)\n    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))\n"
                    "    s = s + torch.ones(t, t).triu(1) * float('-inf')\n    return torch.softmax(s, -1) @ v\n")
    r = check("attention", path, quiet=True)
    lines = r.message.splitlines()
    assert r.status == "error" and "line 12: a NaN appears there" in lines[0] and "B=1 nh=1 T=1" in lines[0], r.message
    assert any("also:" in line and "line 9: KeyError: 'bf16 only'" in line for line in lines[1:]), r.message


@pytest.mark.parametrize("where", ["leading", "trailing"])
@pytest.mark.parametrize("name", ["scores", "mask", "attention", "multi_head", "sinusoidal", "rope"])
def test_an_output_with_an_extra_dimension_is_refused_and_both_shapes_named(name, where):
    """The right values with one more dimension of size 1, (1, B, nh, T, T) for a mask, broadcast against the
    reference: a checker comparing values alone would pass them, and the learner's model would break later.
    Planted bug: checker_ignores_shape."""
    ref = getattr(answers, name)

    def extra(*args, **kwargs):
        y = ref(*args, **kwargs)
        return y[None] if where == "leading" else y[..., None]

    r = check(name, extra, quiet=True)
    assert r.status != "pass", f"{name} returning a {where} extra dimension passed the check"
    got = re.search(r"returned a tensor of shape (\([\d, ]+\)); expected (\([\d, ]+\))", r.message)
    assert got, r.message
    mine, wanted = (tuple(int(d) for d in g.strip("()").split(",")) for g in got.groups())
    assert len(mine) == len(wanted) + 1 and (mine[1:] if where == "leading" else mine[:-1]) == wanted, r.message
