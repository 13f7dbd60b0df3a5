"""The exercises test the numerics (issue 37): cases with large scores, where a softmax written as exp(s) / sum
fails and is named; an input changed in place is named with its line; a float32 function that computes in fewer
bits inside is named. The wrong versions are written by hand as a learner writes them (tests/exercise_learners.py,
which also prints the named / located / missed count); correct answers in other styles still pass.

Each test names the planted bug it catches (tests/mutations.py, "the exercises' numerics (issue 37)")."""

from __future__ import annotations

import math

import pytest
import torch
from exercise_learners import CORRECT, HEADER, LEARNERS

from attention_lab.exercises import EXERCISES, check
from attention_lab.exercises.book import EXP_OVERFLOW, HALF_MAX, scores_with


def write(tmp_path, body: str, stem: str = "mine"):
    path = tmp_path / f"{stem}.py"
    path.write_text(HEADER + body)
    return path


@pytest.mark.parametrize("label", list(LEARNERS))
def test_a_numerical_mistake_written_by_hand_is_named(tmp_path, label):
    """Planted bugs: exercise_unstable_softmax_not_catalogued, exercise_inputs_not_compared,
    exercise_precision_not_probed."""
    exercise, body, expected = LEARNERS[label]
    result = check(exercise, write(tmp_path, body), quiet=True)
    assert result.status == "fail" and result.mistake == expected, (
        f"{label}: expected fail / {expected!r}, got {result.status} / {result.mistake!r}:\n{result.message}")


@pytest.mark.parametrize("label", list(CORRECT))
def test_correct_answers_in_other_styles_still_pass(tmp_path, label):
    """einsum, Python loops, -1e9, a stable softmax by hand, sdpa: the large-score cases are built so every
    correct order of operations agrees (a saturated softmax). Planted bug: exercise_tolerance_too_tight."""
    exercise, body = CORRECT[label]
    result = check(exercise, write(tmp_path, body), quiet=True)
    assert result.status == "pass", f"{label}:\n{result.message}"


def test_the_large_cases_reach_the_scores_the_issue_names():
    """Rows whose largest score runs from under exp's limit to about 1e4, in float32 and in bfloat16."""
    for name in ("scores", "attention", "multi_head", "decode"):
        large = [c for c in EXERCISES[name].cases() if c.large]
        assert large, f"{name} has no large-score case"
        tops = [float(x) for c in large for x in c.note.removeprefix("row maxima ").split(" to ")]
        assert min(tops) < EXP_OVERFLOW < max(tops) and max(tops) >= 900, (name, [c.label for c in large])
        if name in ("attention", "decode"):
            assert {c.dtype for c in large} == {torch.float32, torch.bfloat16}, name
    q, k = EXERCISES["scores"].cases()[-1].args
    assert (q @ k.transpose(-2, -1)).abs().max() > HALF_MAX, "the scores case never overflows float16"


def test_the_unstable_softmax_message_says_where_and_why(tmp_path):
    """The sentence quotes exp's limit, the query and its largest score, and points at the scale claim."""
    exercise, body, _ = LEARNERS["attention: softmax by hand, exp / sum"]
    r = check(exercise, write(tmp_path, body), quiet=True)
    assert f"exp without subtracting the row's max: exp overflows float32 above {EXP_OVERFLOW:.1f}" in r.message, \
        r.message
    assert "why it matters: python -m attention_lab.claims scale" in r.message, r.message
    assert "query 5 of head 0 has a largest score of 144" in r.message and "your output there is nan" in r.message, \
        r.message
    ex = EXERCISES[exercise]
    case = next(c for c in ex.cases() if c.large and c.dtype == torch.float32)
    top = scores_with(*case.args[:2]).masked_fill(torch.ones(12, 12, dtype=torch.bool).triu(1), -math.inf).amax(-1)
    assert f"{top[0, 0, 5].item():.3g}" == "144", "the sentence's score is not query 5's largest"


def test_an_in_place_edit_is_named_with_its_input_and_line(tmp_path):
    """The input compared before and after the call; the line found by tracing. Planted bug:
    exercise_inputs_not_compared."""
    exercise, body, _ = LEARNERS["mask: masked_fill_ on the scores it was given"]
    path = write(tmp_path, body)
    r = check(exercise, path, quiet=True)
    assert f"your mask changes its input scores in place at line 9 of {path}" in r.message, r.message
    assert "60 of its 150 entries differ after the call" in r.message and "now -inf" in r.message, r.message
    assert "its output agrees with the reference on all" in r.message, r.message

    def attention(q, k, v):  # a notebook's function: wrong output and an in-place edit, both said
        q.mul_(2.0)
        return torch.softmax(q @ k.transpose(-2, -1), -1) @ v

    r = check("attention", attention, quiet=True)
    assert r.mistake != "in_place" and "also: your attention changes its input q in place" in r.message, r.message


def test_lower_precision_inside_is_named_and_higher_precision_passes(tmp_path):
    """float16 or bfloat16 inside a float32 function is named by how its output ignores a change of 1 part in
    2^20; float64 inside passes. Planted bug: exercise_precision_not_probed."""
    exercise, body, _ = LEARNERS["scores: computed in bfloat16"]
    r = check(exercise, write(tmp_path, body), quiet=True)
    assert "computed in a lower precision than the input's: when q changes by 1 part in 2^20" in r.message, r.message
    assert "every entry it returns is a bfloat16" in r.message, r.message
    wider = ("def attention(q, k, v):\n    t = q.size(-2)\n    s = q.double() @ k.double().transpose(-2, -1)\n"
             "    s = s / math.sqrt(q.size(-1))\n    s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), "
             "float('-inf'))\n    return (torch.softmax(s, -1) @ v.double()).to(q.dtype)\n")
    r = check("attention", write(tmp_path, wider, "wider"), quiet=True)
    assert r.status == "pass", r.message


def test_a_near_miss_is_not_taken_for_lower_precision():
    """An answer off by 3x the tolerance at every entry moves with its input like float32: located, not named."""
    from attention_lab.exercises import answers

    def off(q, k, v):
        y = answers.attention(q, k, v)
        return y + 3 * (1e-5 + 1e-4 * y.abs()) if y.dtype == torch.float32 else y

    r = check("attention", off, quiet=True)
    assert r.status == "fail" and r.mistake is None and "first differs at" in r.message, r.message


def _future_heavy_case():
    """A case whose rows 0-10 see only small scores (about 1) while their one future key, key 11, scores 500, and
    row 11 sees that key: the largest visible score of the tensor is 500, of rows 0-10 about 3."""
    from attention_lab.exercises.book import Case, _causal, _maxima_note

    g = torch.Generator().manual_seed(370)
    q, k, v = (torch.randn(1, 2, 12, 16, generator=g) for _ in range(3))
    q[..., 0], k[..., 0] = 2000.0, 0.0
    k[..., 11, 0] = 1.0  # (q.k) / sqrt(16): about 500 for key 11, noise of sd 1 for every other key
    note = _maxima_note(scores_with(q, k), _causal(12))
    return Case({"B": 1, "nh": 2, "T": 12, "hs": 16}, (q, k, v), torch.float32, note)


def test_the_whole_tensors_max_is_named_where_only_the_future_keys_score_high(tmp_path, monkeypatch):
    """The rows the whole tensor's max sinks are found from their visible keys: a row whose future key scores 500
    while it sees only scores of about 1 is sunk by a max of 500 (exp(1 - 500) = 0: its output 0/0), though its
    largest score, the hidden one, is the tensor's largest. Correct answers pass the case. Planted bug:
    exercise_sunk_rows_read_the_future."""
    ex = EXERCISES["attention"]
    case = _future_heavy_case()
    s = scores_with(*case.args[:2])
    assert s[..., :11, 11].min() > 450 and s[..., :11, :11].abs().max() < 10 and s[..., 11, 11].min() > 450, (
        "the case lost its shape: rows 0-10 must see small scores and have a future key above 450")
    cases = ex.cases
    monkeypatch.setattr(ex, "cases", lambda: cases() + [case])
    exercise, body, expected = LEARNERS["attention: the whole tensor's max subtracted"]
    r = check(exercise, write(tmp_path, body), quiet=True)
    assert r.status == "fail" and r.mistake == expected == "global_max", (
        f"the whole tensor's max not named once a case has high future scores: {r.status} / {r.mistake!r}\n"
        f"{r.message}")
    for label in ("attention: a stable softmax by hand", "attention: einsum and -1e9"):
        exercise, body = CORRECT[label]
        assert check(exercise, write(tmp_path, body, "right"), quiet=True).status == "pass", label
