"""Head-role scores on hand-built patterns, the probe, ablation, the phase-change detector, and the trainer's logs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from attention_lab.interp import heads as H
from attention_lab.interp import roles as R
from model import GPT, GPTConfig

T = 16


def perfect_previous(t: int) -> np.ndarray:
    a = np.eye(t, k=-1)
    a[0, 0] = 1.0  # row 0 has only itself to look at
    return a


def perfect_induction(ids: np.ndarray) -> np.ndarray:
    """Each query attends to the token after the latest earlier copy of itself; rows without one go to key 0."""
    t = len(ids)
    a = np.zeros((t, t))
    for i in range(t):
        targets = [j for j in range(1, i + 1) if ids[j - 1] == ids[i]]
        a[i, targets[-1] if targets else 0] = 1.0
    return a


def repeated(half: int, seed: int = 0) -> np.ndarray:
    return H.repeated_tokens_probe(1000, half, 1, seed=seed)[0].numpy()


def test_perfect_previous_token_head_scores_one_on_previous_and_near_zero_on_induction():
    ids = repeated(T // 2)
    scores = H.role_scores(perfect_previous(T)[None, None], ids, exclude_first=True)
    assert scores["previous_token"][0, 0] == pytest.approx(1.0)
    assert scores["induction"][0, 0] < 0.1, scores["induction"]
    assert scores["entropy"][0, 0] == pytest.approx(0.0, abs=1e-12)


def test_perfect_induction_head_scores_one_on_induction_and_near_zero_on_previous():
    ids = repeated(T // 2)
    a = perfect_induction(ids)
    scores = H.role_scores(a[None, None], ids, exclude_first=True)
    assert scores["induction"][0, 0] == pytest.approx(1.0)
    assert scores["previous_token"][0, 0] < 0.1, scores["previous_token"]
    # the same over target rows only, without excluding key 0: the first half's rows have no target
    assert H.role_scores(a[None, None], ids)["induction"][0, 0] == pytest.approx(1.0)
    # over all rows and without the exclusion, the first half (parked on key 0) counts against it
    plain = H.role_scores(a[None, None], ids)["induction_all_rows"][0, 0]
    assert plain == pytest.approx((T // 2) / T, abs=1e-9)
    assert R.detection_score(a, np.zeros((T, T)), target_rows_only=True) == 0.0, "no target anywhere: 0"


def test_duplicate_token_head_scores_one_on_duplicates():
    ids = repeated(T // 2)
    a = np.zeros((T, T))
    a[: T // 2, 0] = 1.0
    for i in range(T // 2, T):
        a[i, i - T // 2] = 1.0  # the earlier copy of the same token
    scores = H.role_scores(a[None, None], ids, exclude_first=True)
    assert scores["duplicate_token"][0, 0] == pytest.approx(1.0)
    assert scores["induction"][0, 0] < 0.1


def test_uniform_attention_gets_the_stated_baselines():
    ids = repeated(T // 2)
    u = R.uniform_attention(T)
    scores = H.role_scores(u[None, None], ids)
    rows = np.arange(1, T)
    assert scores["previous_token"][0, 0] == pytest.approx(np.mean(1 / (rows + 1))), "stripe: rows 1..T-1"
    assert scores["previous_token_all_rows"][0, 0] == pytest.approx(np.sum(1 / (rows + 1)) / T), "all T rows"
    assert scores["first_token"][0, 0] == pytest.approx(np.mean(1 / (rows + 1)))
    assert scores["self"][0, 0] == pytest.approx(np.mean(1 / (rows + 1)))
    assert scores["entropy"][0, 0] == pytest.approx(1.0)
    at_128 = H.role_scores(R.uniform_attention(128)[None, None], repeated(64))
    assert at_128["previous_token"][0, 0] == pytest.approx(0.0349, abs=5e-5), "the docstring's T=128 baseline"
    assert at_128["previous_token_all_rows"][0, 0] == pytest.approx(0.0346, abs=5e-5), "the docstring's all-rows one"


def test_first_token_and_self_masses():
    sink = np.zeros((T, T))
    sink[:, 0] = 1.0
    assert R.first_token_mass(sink) == pytest.approx(1.0)
    assert R.self_mass(np.eye(T)) == pytest.approx(1.0)
    assert R.self_mass(sink) == pytest.approx(0.0)


def test_scores_do_not_edit_the_callers_pattern():
    a = R.uniform_attention(T)
    before = a.copy()
    R.detection_score(a, R.previous_token_pattern(T), exclude_first=True, exclude_self=True)
    np.testing.assert_array_equal(a, before)


def test_a_heads_label_is_its_strongest_role_above_the_threshold_else_mixed():
    """roles.role_label on hand-built scores: each labelling role wins when it is the strongest and reaches the
    threshold; below it the head is "mixed"; a tie goes to the role listed first in ROLE_TABLE; roles that may not
    name a head (entropy, the all-rows copies, ablation) never do, however high; NaN and missing scores count as
    unmeasured. Planted bug: head_label_weakest_role."""
    t = R.LABEL_THRESHOLD
    assert R.LABEL_ROLES == ("previous_token", "duplicate_token", "induction", "first_token", "self"), R.LABEL_ROLES
    for role in R.LABEL_ROLES:  # every role wins when it is the strongest, the others just under the threshold
        scores = {r: t - 0.01 for r in R.LABEL_ROLES} | {role: t + 0.3}
        assert R.role_label(scores) == role, f"{role} scores {t + 0.3}, the rest {t - 0.01}: {R.role_label(scores)}"
        # ... and also when every other role is above the threshold too (the strongest, not the first found)
        scores = {r: t + 0.1 for r in R.LABEL_ROLES} | {role: t + 0.3}
        assert R.role_label(scores) == role, f"{role} is strongest among roles all above {t}: {R.role_label(scores)}"
    below = {r: t - 0.01 for r in R.LABEL_ROLES}
    assert R.role_label(below) == "mixed", "every role just under the threshold: no label"
    assert R.role_label(below | {"induction": t}) == "induction", "the threshold itself counts (>=)"
    assert R.role_label(below, threshold=0.3) == "previous_token", "the threshold is a parameter"
    tie = {"previous_token": 0.2, "duplicate_token": 0.7, "induction": 0.7, "first_token": 0.1, "self": 0.0}
    assert R.role_label(tie) == "duplicate_token", "a tie goes to the role listed first in ROLE_TABLE"
    loud = {"entropy": 0.99, "induction_all_rows": 0.9, "ablation": 3.0, "previous_token": 0.5}
    assert R.role_label(loud) == "previous_token", "only LABEL_ROLES may name a head"
    assert R.role_label({"induction": float("nan"), "self": 0.45, "first_token": None}) == "self", "NaN/None unmeasured"
    assert R.role_label({}) == "mixed" and R.role_label({"entropy": 1.0}) == "mixed", "nothing measured: mixed"
    # a grid of heads, as the pages get it: nested lists with None where a head was not measured
    grid = {"previous_token": [[0.9, 0.1], [None, 0.2]], "induction": [[0.1, 0.6], [0.5, 0.2]],
            "first_token": [[0.0, 0.0], [0.0, 0.1]]}
    assert R.role_labels(grid) == [["previous_token", "induction"], ["induction", "mixed"]], R.role_labels(grid)
    assert R.role_labels({"entropy": [[1.0]]}) == [], "no labelling role measured: no labels"
    # the summary table's label (heads.head_label) is the same rule on an (L, nh) array
    arrays = {role: np.asarray(v, dtype=float) for role, v in grid.items() if role != "previous_token"}
    arrays["previous_token"] = np.array([[0.9, 0.1], [np.nan, 0.2]])
    assert [H.head_label(arrays, 0, h) for h in range(2)] == ["previous_token", "induction"]


def test_patterns_are_causal_and_match_their_definitions():
    ids = np.array([5, 7, 5, 7, 9])
    dup = R.duplicate_token_pattern(ids)
    ind = R.induction_pattern(ids)
    assert np.all(np.triu(dup) == 0) and np.all(np.triu(ind, k=1) == 0)
    assert dup[2, 0] == 1 and dup[3, 1] == 1 and dup.sum() == 2
    assert ind[2, 1] == 1 and ind[3, 2] == 1 and ind.sum() == 2  # 5 at 2 -> after the 5 at 0 is key 1


def test_probe_is_deterministic_repeated_and_drawn_from_the_given_ids():
    ids = [3, 11, 42, 99]
    a = H.repeated_tokens_probe(ids, 10, 4, seed=7)
    b = H.repeated_tokens_probe(ids, 10, 4, seed=7)
    c = H.repeated_tokens_probe(ids, 10, 4, seed=8)
    assert a.shape == (4, 20) and a.dtype == torch.long
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(a[:, :10], a[:, 10:])
    assert set(a.unique().tolist()) <= set(ids)


def test_probe_half_losses_split_at_the_repeat():
    losses = torch.cat([torch.full((2, 9), 5.0), torch.full((2, 10), 1.0)], dim=1)  # half = 10: 9 + 10 predictions
    assert H.probe_half_losses(losses, 10) == (5.0, 1.0)


def tiny_model(**kw) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=4, n_embd=32, bias=False, **kw)).eval()


def test_ablation_changes_exactly_that_heads_contribution():
    model = tiny_model()
    x = torch.randint(50, (2, 12))
    seen = {}
    proj = model.transformer.h[1].attn.c_proj
    handle = proj.register_forward_hook(lambda m, args, out: seen.__setitem__("io", (args[0].clone(), out.clone())))
    model(x)
    y_in, out = seen["io"]
    with H.HeadAblation(model, layer=1, head=2):
        model(x)
    y_ablated, out_ablated = seen["io"]
    handle.remove()
    hs = model.config.head_size
    lo, hi = 2 * hs, 3 * hs
    torch.testing.assert_close(y_ablated[..., lo:hi], torch.zeros_like(y_ablated[..., lo:hi]))
    torch.testing.assert_close(torch.cat([y_ablated[..., :lo], y_ablated[..., hi:]], -1),
                               torch.cat([y_in[..., :lo], y_in[..., hi:]], -1))
    contribution = y_in[..., lo:hi] @ proj.weight[:, lo:hi].T  # the head's share of the projection
    torch.testing.assert_close(out - out_ablated, contribution, atol=1e-5, rtol=1e-4)
    assert not proj._forward_pre_hooks, "the ablation hook must be removed when the context exits"


def test_ablation_effects_are_zero_for_a_head_whose_projection_is_zero():
    model = tiny_model()
    hs = model.config.head_size
    with torch.no_grad():
        model.transformer.h[0].attn.c_proj.weight[:, hs:2 * hs] = 0  # head 1 of layer 0 contributes nothing
    x = torch.randint(50, (2, 12))
    effects = H.ablation_effects(model, x[:, :-1], x[:, 1:])
    assert effects.shape == (2, 4)
    assert effects[0, 1] == pytest.approx(0.0, abs=1e-6)
    assert np.abs(effects).max() > 1e-4, "zeroing real heads should move the loss"


def test_measure_heads_returns_every_role_and_curve():
    model = tiny_model()
    probe = H.repeated_tokens_probe(50, 8, 3, seed=0)
    val = torch.randint(50, (3, 17))
    report = H.measure_heads(model, probe, val[:, :-1], val[:, 1:])
    assert set(report.scores) == set(H.ROLES)
    assert all(v.shape == (2, 4) for v in report.scores.values())
    assert report.ablation_probe.shape == (2, 4) and report.position_loss.shape == (16,)
    early, late = H.icl_positions(16)
    expected = report.position_loss[late].mean() - report.position_loss[early].mean()
    assert report.icl_score == pytest.approx(float(expected))


def test_rise_detector_finds_a_jump_not_a_drift():
    steps = list(range(0, 1000, 100))
    jump = [0.02, 0.03, 0.05, 0.04, 0.08, 0.55, 0.62, 0.60, 0.61, 0.63]
    assert H.detect_rise(steps, jump, level=0.3, rise=0.2) == 5
    drift = np.linspace(0.0, 0.45, 10)  # 0.05 per evaluation: never 0.2 within three evaluations
    assert H.detect_rise(steps, drift, level=0.3, rise=0.2) is None
    assert H.detect_rise(steps, [0.5, 0.5, 0.5], level=0.3, rise=0.2) is None, "no 'before' for a flat high series"
    assert H.detect_fall(steps, [0.1, 0.0, -0.1, -1.2, -2.0], drop=0.5) == 3


def test_phase_change_detector_reports_each_change_once_with_its_numbers():
    det = H.PhaseChangeDetector(roles=("induction",))
    series = [0.02, 0.05, 0.08, 0.61, 0.7, 0.72]
    gap = [0.0, -0.02, -0.1, -2.5, -3.0, -3.1]  # repeat minus first-half loss
    found = []
    for i, (v, g) in enumerate(zip(series, gap)):
        scores = {"induction": np.array([[0.01, v]])}
        found += det.update(100 * i, scores, 6.0, 6.0 + g)
    assert [(c.step, c.head, c.metric) for c in found] == [(300, "L0H1", "induction"),
                                                           (300, None, "repeat minus first-half loss")]
    assert found[0].before == pytest.approx(0.02) and found[0].after == pytest.approx(0.61)
    assert found[0].message == "step 300: L0H1 induction score 0.02 -> 0.61 (a role score, 0 to 1)"
    assert "+0.00 -> -2.50 nats/token (the repeated-tokens probe" in found[1].message, "every number with its unit"
    assert (found[1].before, found[1].after) == pytest.approx((0.0, -2.5))


def test_trainer_logs_head_roles_to_tensorboard_and_files(tmp_path, data_cache, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import train as train_mod
    from attention_lab.training.config import compose

    cfg = compose(["experiment=debug", f"data.cache_dir={data_cache}"])
    run_dir = tmp_path / "run"
    train_mod.train(cfg, run_dir)
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0, "images": 0}).Reload()
    scalars = set(acc.Tags()["scalars"])
    n_layer, n_head = cfg.model.n_layer, cfg.model.n_head
    for role in H.ROLES:
        for layer in range(n_layer):
            for head in range(n_head):
                tag = f"heads/{role}/L{layer}H{head}"
                assert tag in scalars, f"{tag} missing from TensorBoard"
                assert [e.step for e in acc.Scalars(tag)] == [10, 20]
    assert {"ablation/probe/L0H0", "ablation/val/L1H1", "model/probe_repeat_loss", "model/icl_score"} <= scalars
    assert {"heads/fingerprint", "model/position_loss_map"} <= set(acc.Tags()["images"])
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    head_rows = [r for r in lines if "heads" in r]
    assert [r["step"] for r in head_rows] == [10, 20]
    assert np.asarray(head_rows[0]["heads"]["scores"]["induction"]).shape == (n_layer, n_head)
    records = [json.loads(line) for line in (run_dir / "attention" / "heads.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [10, 20]
    assert len(records[-1]["position_loss"]) == cfg.model.block_size
    # the read-back script sees the same series in the event files
    from attention_lab.viewer import timeline as tb_report

    events = tb_report.read_events(run_dir)
    assert set(events["roles"]) == set(H.ROLES) and len(events["roles"]["induction"]) == n_layer * n_head
    rows = tb_report.timeline(events)
    assert [r["step"] for r in rows] == [10, 20] and "val_bpb" in rows[-1]
    png = tmp_path / "timeline.png"
    capsys.readouterr()
    assert tb_report.main([str(run_dir), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", "the timeline plot is a PNG"
    said = capsys.readouterr().out  # the table's numbers with their units, under it
    assert "nats/token" in said and "bits/byte" in said and "role score (0 to 1" in said, said


def test_head_roles_switch_off(tmp_path, data_cache):
    import train as train_mod
    from attention_lab.training.config import compose

    cfg = compose(["experiment=debug", f"data.cache_dir={data_cache}", "train.head_roles=false"])
    train_mod.train(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "attention" / "heads.jsonl").exists()
    assert all("heads" not in json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())


def _by_definition(a: np.ndarray, ids: np.ndarray, exclude_first: bool) -> dict[str, np.ndarray]:
    """The roles' scores written out from the module docstring's formulas, one head and one row at a time, in float64:
    the reference the fast role_scores (one row mass for every pattern, float32 read as it is) must equal."""
    t = a.shape[-1]
    pats = {"previous_token": R.previous_token_pattern(t), "duplicate_token": R.duplicate_token_pattern(ids),
            "induction": R.induction_pattern(ids)}
    out = {}
    for name, d in pats.items():
        stripe, all_rows = np.zeros(a.shape[:2]), np.zeros(a.shape[:2])
        for idx in np.ndindex(*a.shape[:2]):
            w = a[idx].astype(np.float64).copy()
            if exclude_first:
                w[:, 0] = 0.0
            hits = float((w * d).sum())
            with_target = [i for i in range(t) if d[i].any()]
            stripe[idx] = hits / w[with_target].sum() if with_target else 0.0
            all_rows[idx] = hits / w.sum()
        out[name], out[f"{name}_all_rows"] = stripe, all_rows
    w = a.astype(np.float64)
    ent = np.zeros(a.shape[:2])
    for idx in np.ndindex(*a.shape[:2]):
        ent[idx] = np.mean([-sum(p * np.log(p) for p in w[idx][i, : i + 1] if p > 0) / np.log(i + 1)
                            for i in range(1, t)])
    out["entropy"] = ent
    out["first_token"] = w[..., 1:, 0].mean(-1)
    out["self"] = np.diagonal(w, axis1=-2, axis2=-1)[..., 1:].mean(-1)
    return out


@pytest.mark.parametrize("exclude_first", [False, True])
def test_role_scores_of_a_models_float32_weights_equal_their_definitions_in_float64(exclude_first):
    """The live lab scores a model's float32 patterns as they are (no float64 copy) and takes each row's mass once
    for the three patterns; every score still equals the docstring's formula in float64 to 1e-6."""
    gen = torch.Generator().manual_seed(0)
    t = 24
    ids = repeated(t // 2)
    logits = torch.randn(2, 3, t, t, generator=gen) * 3
    a = logits.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf")).softmax(-1).numpy()
    assert a.dtype == np.float32
    got = R.role_scores(a, ids, exclude_first=exclude_first)
    want = _by_definition(a, ids, exclude_first)
    for role, value in want.items():
        np.testing.assert_allclose(got[role], value, rtol=1e-6, atol=1e-9, err_msg=role)
