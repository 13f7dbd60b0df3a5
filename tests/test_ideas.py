"""`python -m attention_lab.ideas`: each idea's numbers checked by hand on tiny models (attention_lab/interp/ideas.py),
the claims' numbers read back (attention_lab/ideas/published.py), and every idea run on a debug run trained in
tmp_path, each writing its figure."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import train as train_mod
from attention_lab.ideas import cli as ideas_cli
from attention_lab.ideas import published
from attention_lab.interp import ideas
from attention_lab.training.config import OptimConfig, compose
from attention_lab.training.optim import lr_at
from model import GPT, GPTConfig
from model.attention import qk_norm, split_qkv
from model.hooks import run_with_cache

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def tiny(**changes) -> GPT:
    """The default model's recipe (RoPE, QK-norm, no biases) at a size that runs in milliseconds, with weights
    large enough that the heads differ."""
    torch.manual_seed(0)
    cfg = dict(vocab_size=40, block_size=24, n_layer=2, n_head=2, n_embd=32, pos_encoding="rope", qk_norm=True,
               bias=False)
    model = GPT(GPTConfig(**{**cfg, **changes}))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    return model.eval()


IDS = torch.tensor([3, 17, 5, 9, 22, 5, 31, 8, 1, 14, 26, 2])


def hand_qk(model: GPT, ids: torch.Tensor, rope: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Block 0's q and k written out from the weights: embedding -> ln_1 -> c_attn -> heads -> QK-norm -> RoPE
    (rope=False: stop before it)."""
    x = model.transformer.wte(ids[None])  # (1, T, C); RoPE adds nothing to the stream
    attn = model.transformer.h[0].attn
    q, k, _ = split_qkv(attn.c_attn(model.transformer.h[0].ln_1(x)), model.config.n_head, model.config.kv_heads,
                        model.config.qk_tied)
    q, k = qk_norm(q), qk_norm(k)
    if not rope:
        return q[0], k[0]
    return model.transformer.wpe.rotate(q, torch.arange(len(ids)))[0], model.transformer.wpe.rotate(
        k, torch.arange(len(ids)))[0]  # (nh, T, hs)


# --- lookup --------------------------------------------------------------------------------------------------------


def test_lookup_equals_the_hand_computation_and_the_models_own_score():
    model = tiny()
    a, b = 2, 9
    with torch.no_grad():
        lk = ideas.lookup(model, IDS, a, b)
        q, k = hand_qk(model, IDS)
    scale = 1 / math.sqrt(model.config.head_size)
    want_ab = (q[:, a] * k[:, b]).sum(-1) * scale  # (nh,)
    want_ba = (q[:, b] * k[:, a]).sum(-1) * scale
    np.testing.assert_allclose(lk.ab[0], want_ab.numpy(), atol=1e-5, err_msg="q_a.k_b is not a's query on b's key")
    np.testing.assert_allclose(lk.ba[0], want_ba.numpy(), atol=1e-5, err_msg="q_b.k_a is not b's query on a's key")
    assert np.abs(lk.ab - lk.ba).max() > 0.05, "an untied model's two directions came out equal: a control that failed"
    _, cache = run_with_cache(model, IDS[None])
    own = cache["scores", 1][0, :, b, a].numpy()  # what the model itself gave query b for key a, block 1
    np.testing.assert_allclose(lk.ba[1], own, atol=1e-5, err_msg="q_b.k_a differs from the model's own score")
    assert np.isneginf(lk.score_ab_masked).all(), "the model's score of query a for the later key b must be -inf"
    np.testing.assert_allclose(lk.asymmetry[..., a, b], lk.ab - lk.ba, atol=1e-5)


def test_tied_queries_and_keys_look_for_what_they_offer():
    model = tiny(qk_tied=True)
    lk = ideas.lookup(model, IDS, 1, 7)
    assert np.abs(lk.ab - lk.ba).max() == 0.0, "with k = q, q_a.k_b and q_b.k_a must be one number"
    assert np.abs(lk.asymmetry_content).max() == 0.0, "before positions S - S^T must be 0 in a tied model"
    assert np.abs(lk.asymmetry).max() < 1e-5, "RoPE turns q and k of a token alike: still symmetric after it"
    assert np.isneginf(lk.score_ab_masked).all(), "the mask is what breaks the symmetry: a cannot see b"


def test_unrotated_turns_the_cached_queries_back_before_rope():
    model = tiny()
    _, cache = run_with_cache(model, IDS[None])
    q = cache["q", 0][0]
    back = ideas.unrotated(model, q)
    again = model.transformer.wpe.rotate(back, torch.arange(len(IDS)))
    torch.testing.assert_close(again, q, atol=1e-5, rtol=1e-5, msg="rotating back and forth must give q again")
    assert (back - q).abs().max() > 1e-3, "unrotated changed nothing on a RoPE model"
    with torch.no_grad():
        hand, _ = hand_qk(model, IDS, rope=False)
    torch.testing.assert_close(back, hand, atol=1e-4, rtol=1e-4, msg="turned back, q must be q before RoPE")


def test_lookup_table_puts_every_number_under_its_columns_name():
    lk = ideas.lookup(tiny(), IDS, 2, 9)
    header, *rows = ideas_cli.lookup_table(lk)
    ends, at = [], 0
    for name in ideas_cli.LOOKUP_COLUMNS[1:]:  # where each column's name ends in the header (right-aligned)
        at = header.index(name, at) + len(name)
        ends.append(at)
    assert len(rows) == lk.ab.size
    for i, row in enumerate(rows):
        layer, h = divmod(i, lk.ab.shape[1])
        want = [lk.ab[layer, h], lk.ba[layer, h], lk.ab_content[layer, h], lk.ba_content[layer, h]]
        for end, value in zip(ends, want):
            cell = row[:end].split()[-1]  # the number that ends where the header's name ends
            assert row[end:end + 1] in ("", " "), f"a number runs past its column's end:\n{header}\n{row}"
            assert float(cell) == pytest.approx(float(value), abs=6e-4), (
                f"column ending at {end} holds {cell}, want {value:+.3f}:\n{header}\n{row}")


def test_only_a_later_query_ever_meets_an_earlier_key():
    lk = ideas.lookup(tiny(), IDS, 2, 9)
    t = len(IDS)
    assert lk.pairs == t * (t - 1) // 2
    assert lk.later_used == 1.0, "every q_later.k_earlier must be the model's own score, with a weight above 0"
    assert lk.earlier_unused == 1.0, "every q_earlier.k_later must be -inf with weight exactly 0"
    open_ = ideas.lookup(tiny(causal_mask="none"), IDS, 2, 9)  # no mask: the earlier query uses the later key
    assert open_.earlier_unused == 0.0 and open_.later_used == 1.0


def test_lookup_refuses_a_pair_out_of_order():
    with pytest.raises(ValueError, match="0 <= a < b"):
        ideas.lookup(tiny(), IDS, 5, 5)


# --- scale ---------------------------------------------------------------------------------------------------------


def test_scale_stats_compare_the_same_scores_with_and_without_the_scale():
    model = tiny()
    st = ideas.scale_stats(model, IDS)
    d_k = model.config.head_size
    np.testing.assert_allclose(st.std_raw / st.std_scaled, math.sqrt(d_k), rtol=1e-4,
                               err_msg="without the scale the spread must be sqrt(d_k) times larger")
    assert st.pattern_error < 1e-5, "softmax of the scaled scores must be the model's own weights"
    np.testing.assert_allclose(st.q_norm, math.sqrt(d_k), rtol=1e-4, err_msg="QK-norm makes |q| = sqrt(d_k)")
    assert st.bound == pytest.approx(math.sqrt(d_k)) and st.max_abs_scaled <= st.bound + 1e-4
    # the entropy and the largest weight of the model's own rows (row 0 left out), by hand
    _, cache = run_with_cache(model, IDS[None])
    w = cache["pattern", 1][0, :, 1:]
    ent = -(w * torch.log(w.clamp_min(1e-30))).sum(-1).mean()
    assert st.entropy_scaled[1] == pytest.approx(float(ent), abs=1e-5)
    assert st.max_weight_scaled[1] == pytest.approx(float(w.max(-1).values.mean()), abs=1e-6)
    assert (st.max_weight_raw >= st.max_weight_scaled).all(), "8x larger scores must make the softmax peakier"


def test_the_scale_figure_names_qk_norms_bound_in_its_legend():
    from attention_lab.viewer import ideas as draw

    st = ideas.scale_stats(tiny(), IDS)
    left = draw.scale_figure(st, "r").axes[0]
    bounds = [line for line in left.get_lines() if sorted(set(line.get_xdata())) in ([-st.bound], [st.bound])]
    assert len(bounds) == 2, "the bound is drawn at -bound and +bound"
    legend = [t.get_text() for t in left.get_legend().get_texts()]
    assert sum("QK-norm's bound" in t for t in legend) == 1, f"the dashed bound lines need one legend entry: {legend}"


# --- mask, residual --------------------------------------------------------------------------------------------------


def test_the_middle_querys_future_keys_are_minus_infinity_and_weigh_exactly_zero():
    row = ideas.mask_row(tiny(), IDS, 1, 1)
    q = len(IDS) // 2
    assert row.query == q, "the default query is the middle token"
    assert np.isneginf(row.scores[q + 1:]).all() and np.isfinite(row.scores[: q + 1]).all()
    assert (row.weights[q + 1:] == 0.0).all(), "a future key's weight must be exactly 0, not small"
    assert (row.weights[: q + 1] > 0).all() and row.weights.sum() == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(row.weights[: q + 1], F.softmax(torch.from_numpy(row.scores[: q + 1]), -1).numpy(),
                               atol=1e-6)


def test_a_score_of_zero_instead_of_minus_infinity_leaks_weight_to_the_future():
    row = ideas.mask_row(tiny(), IDS, 1, 1)
    q, visible = row.query, np.exp(row.scores[: row.query + 1].astype(np.float64))
    n_future = len(IDS) - q - 1
    total = visible.sum() + n_future  # e^0 = 1 for each future key
    np.testing.assert_allclose(row.weights_zero[q + 1:], 1.0 / total, rtol=1e-5,
                               err_msg="a future key scored 0 must get e^0 / (the row's sum)")
    np.testing.assert_allclose(row.weights_zero[: q + 1], visible / total, rtol=1e-5)
    assert (row.weights[q + 1:] == 0).all() and (row.weights_zero[q + 1:] > 0).all()


def test_weights_zeroed_after_the_softmax_sum_below_one_and_still_move_with_the_future():
    """Tutorial 4's warning: a 0 after the softmax. The softmax ran over every key, so each visible weight is the
    -inf mask's weight times S (the visible keys' share, below 1), and the future keys' scores, q.k from the
    recorded queries and keys, still move S through the denominator: dS/ds_j = -S w_j. Block 0, whose input does
    not depend on the mask, so a model without one computes the same scores and shows the future's."""
    row = ideas.mask_row(tiny(), IDS, 0, 1)
    q = row.query
    _, open_cache = run_with_cache(tiny(causal_mask="none"), IDS[None])  # the same weights, nothing masked
    np.testing.assert_allclose(row.scores_open, open_cache["scores", 0][0, 1, q].numpy(), atol=1e-5,
                               err_msg="the future keys' scores must be the head's own q.k, as with no mask")
    np.testing.assert_allclose(row.scores_open[: q + 1], row.scores[: q + 1], atol=1e-5)
    w_open = F.softmax(torch.from_numpy(row.scores_open).double(), -1).numpy()
    visible_share = w_open[: q + 1].sum()
    assert row.after_sum == pytest.approx(visible_share, rel=1e-5) and row.after_sum < 0.99
    assert (row.weights_after[q + 1:] == 0).all()
    np.testing.assert_allclose(row.weights_after[: q + 1], row.weights[: q + 1] * visible_share, rtol=1e-4,
                               err_msg="each visible weight must be the -inf mask's weight times the visible share")
    np.testing.assert_allclose(row.after_grad[q + 1:], -visible_share * w_open[q + 1:], rtol=1e-4, atol=1e-7)
    assert row.after_grad[q + 1:].sum() == pytest.approx(-visible_share * (1 - visible_share), rel=1e-4)
    from attention_lab.viewer import ideas as draw

    sums = draw.mask_figure(row, [str(i) for i in IDS.tolist()], "r").axes[-2]  # the last panel (then a colorbar)
    heights = [p.get_height() for p in sums.patches]
    np.testing.assert_allclose(heights[:3], [1.0, row.after_sum, row.weights_zero[: q + 1].sum()], rtol=1e-5)


def test_residual_contributions_add_up_to_the_stream_and_the_lens_ends_at_the_model():
    model = tiny()
    res = ideas.residual(model, IDS, k=1)
    assert res.final_error < 1e-4, "embedding + every sublayer's addition must be the last stream"
    _, cache = run_with_cache(model, IDS[None])
    attn0 = (cache["resid_mid", 0] - cache["resid_pre", 0])[0].norm(dim=-1).mean()
    assert res.attn_norm[0] == pytest.approx(float(attn0), rel=1e-5)
    with torch.no_grad():
        top = model(IDS[None]).logits[0].argmax(-1).numpy()
    assert (res.lens.ids[-1, :, 0] == top).all(), "the lens's last row must be the model's own prediction"



# --- the figures draw the block and head asked for -------------------------------------------------------------------


def test_the_lookup_figure_draws_the_block_asked_for():
    """`ideas lookup --layer 1`: the maps titled "block 1" are block 1's S - S^T, one per head, not block 0's.
    Planted bug: idea_lookup_figure_draws_block0."""
    from attention_lab.viewer import ideas as draw

    model = tiny()
    with torch.no_grad():
        lk = ideas.lookup(model, IDS, 2, 9)
    assert np.abs(lk.asymmetry_content[1] - lk.asymmetry_content[0]).max() > 0.05, "a control: the blocks differ"
    fig = draw.lookup_figure(lk, [str(i) for i in IDS.tolist()], 1, "r")
    maps = [ax for ax in fig.axes if ax.images and ax.get_title().startswith("L")]
    assert [ax.get_title() for ax in maps] == ["L1H0", "L1H1"]
    for h, ax in enumerate(maps):
        np.testing.assert_array_equal(np.asarray(ax.images[0].get_array()), lk.asymmetry_content[1][h],
                                      err_msg=f"the map titled L1H{h} is not block 1 head {h}'s asymmetry")


def test_the_mask_figure_draws_the_block_and_head_asked_for():
    """`ideas mask --layer 1 --head 1`: the score matrix drawn is that head's, as the model computed it."""
    from attention_lab.viewer import ideas as draw

    model = tiny()
    row = ideas.mask_row(model, IDS, 1, 1)
    _, cache = run_with_cache(model, IDS[None])
    np.testing.assert_array_equal(row.scores_all, cache["scores", 1][0, 1].numpy(),
                                  err_msg="the score matrix is not block 1 head 1's")
    fig = draw.mask_figure(row, [str(i) for i in IDS.tolist()], "r")
    drawn = np.asarray(fig.axes[0].images[0].get_array(), dtype=float)
    assert fig.axes[0].get_title().startswith("block 1, head 1")
    np.testing.assert_array_equal(drawn, np.where(np.isfinite(row.scores_all), row.scores_all, np.nan),
                                  err_msg="the figure does not draw the row's scores (the future blank)")


def test_the_residual_figure_draws_each_blocks_additions_under_its_name():
    """`ideas residual`: the bar named "attn 1" is block 1's attention, "MLP 0" block 0's MLP, and so on."""
    from attention_lab.viewer import ideas as draw

    model = tiny()
    res = ideas.residual(model, IDS, k=1)
    fig = draw.residual_figure(res, [["x"] * len(IDS)] * 3, [str(i) for i in IDS.tolist()], "r")
    ax = fig.axes[0]
    names = [t.get_text() for t in ax.get_xticklabels()]
    heights = [p.get_height() for p in ax.patches]
    want = {"embedding": res.embed_norm, "attn 0": res.attn_norm[0], "MLP 0": res.mlp_norm[0],
            "attn 1": res.attn_norm[1], "MLP 1": res.mlp_norm[1]}
    assert names == list(want), names
    np.testing.assert_allclose(heights, list(want.values()), rtol=1e-6,
                               err_msg="a bar's height is not the addition its name says")

# --- positions ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["rope", "learned"])
def test_without_positions_shuffling_the_earlier_tokens_leaves_the_query_unchanged(encoding):
    model = tiny(pos_encoding=encoding)
    sh = ideas.shuffle_test(model, IDS, shuffles=4)
    assert sh.encoding == encoding and sh.orders.shape == (4, len(IDS) - 1)
    assert all(sorted(o) == list(range(len(IDS) - 1)) and list(o) != sorted(o) for o in sh.orders)
    assert sh.own_error < 1e-5, "with positions on, the test must compute the model's own block 0 attention"
    assert sh.change_off.max() < 1e-5 * sh.size, f"no positions: a set, the output must not move ({sh.change_off})"
    assert sh.change_on.min() > 1e-3 * sh.size, f"with {encoding} the order must move the output ({sh.change_on})"


# --- rnn -----------------------------------------------------------------------------------------------------------


def test_an_lstm_far_behind_at_every_position_is_called_undertrained():
    gpt = np.linspace(5.0, 4.0, 16)
    behind, gap = ideas.lstm_behind(gpt, gpt + 0.8)
    assert behind and np.allclose(gap, 0.8)
    close, _ = ideas.lstm_behind(gpt, gpt + np.r_[0.8 * np.ones(8), 0.1 * np.ones(8)])  # last bucket (9-16) close
    assert not close, "a bucket within half a nat: comparable, not undertrained"
    assert not ideas.lstm_behind(gpt, gpt + 0.1)[0]


# --- meaning -------------------------------------------------------------------------------------------------------


def test_word_contexts_keep_whole_windows_inside_one_document():
    toks = np.array([7, 1, 2, 7, 3, 0, 4, 7, 5, 6, 2, 7, 9])  # 0 ends a document; 9 continues the word
    ends = ideas.word_contexts(toks, 7, width=3, n=10, stop=0, continues={9})
    assert ends.tolist() == [3], ("only position 3 has 3 tokens before it in its document and a next token that "
                                  f"does not continue the word; got {ends.tolist()}")
    assert ideas.windows_ending_at(toks, ends, 3).tolist() == [[1, 2, 7]]
    many = ideas.word_contexts(np.tile([1, 7], 50), 7, 2, 5)
    assert many.tolist() == [1, 25, 49, 73, 97], "n contexts spread over the text (the last token has no next one)"


def test_mean_pair_cosine_on_hand_vectors():
    same = np.ones((1, 4, 3))
    axes = np.eye(3)[None]  # three orthogonal vectors
    assert ideas.mean_pair_cosine(same)[0] == pytest.approx(1.0)
    assert ideas.mean_pair_cosine(axes)[0] == pytest.approx(0.0)
    pairs = ideas.nearest_pairs(np.array([[1.0, 0], [0.9, 0.1], [0, 1.0]]), 1)
    assert pairs[0][:2] == (0, 1)


def test_a_words_vector_starts_the_same_in_every_context_and_then_differs():
    model = tiny()
    wins = np.array([[3, 8, 5], [12, 30, 5], [9, 9, 5]])  # the word 5 after three contexts
    v = ideas.last_token_vectors(model, wins)
    c = ideas.mean_pair_cosine(v)
    assert c[0] == pytest.approx(1.0, abs=1e-6), "the embedding has no context (RoPE adds nothing to it)"
    assert c[-1] < 0.999, "after the blocks the contexts must have changed the vector"


def test_the_meaning_figure_draws_a_word_whose_contexts_split_in_sense_by_default():
    """The right panel is the first of --words: by default "bear" (the verb, and the animal), not "will", whose
    contexts are nearly all the one modal verb and cannot show context choosing a sense."""
    args = ideas_cli.parse_args(["meaning"])
    assert args.words.split(",")[0] == "bear"
    from attention_lab.viewer import ideas as draw

    fig = draw.meaning_figure({"bear": np.ones(3), "will": np.ones(3)}, np.zeros(3), np.eye(4), "bear", "r")
    assert "'bear'" in fig.axes[1].get_title()


def test_the_sinusoid_panel_puts_the_sines_left_and_the_cosines_right_as_its_title_says():
    """The table interleaves sin (even columns) and cos (odd); the picture sorts them, and its title must say which
    half is which (a title of PE[p, 2i] alone over a sorted picture misleads)."""
    from attention_lab.viewer import ideas as draw
    from model.positions import sinusoidal_table

    table = sinusoidal_table(16, 8).numpy()
    fig = draw.positions_figure(table, np.zeros((16, 2)), None, "r")
    panel = fig.axes[0]
    drawn = np.asarray(panel.images[0].get_array())
    np.testing.assert_allclose(drawn[:, :4], np.sin(np.arange(16)[:, None] * 10000 ** (-np.arange(0, 8, 2) / 8)),
                               atol=1e-5, err_msg="the left half must be the sines PE[p, 2i]")
    np.testing.assert_allclose(drawn[:, 4:], table[:, 1::2], atol=1e-6)
    title = panel.get_title()
    assert "PE[p, 2i] = sin" in title and "(left)" in title and "PE[p, 2i+1] = cos" in title and "(right)" in title


def test_position_buckets_average_each_doubling():
    ends, means = ideas.position_buckets(np.arange(1.0, 13.0))  # position p has loss p
    assert ends.tolist() == [1, 2, 4, 8, 12] and means.tolist() == [1.0, 2.0, 3.5, 6.5, 10.5]


# --- the claims' numbers ------------------------------------------------------------------------------------------


PAGE = """## `positions`

### Arms

| arm | rate | bpb_windows_1x | bpb_windows_2x | bpb_windows_4x |
|---|---|---|---|---|
| none | 0.003 | 2.7178 | 2.7373 | 2.7505 |
| learned | 0.003 | 2.6755 | - | - |
"""

RECALL = {  # the shape of docs/claims/results_recall.json: every verdict seed's run, the flagged seeds apart
    "results": {
        "transformer, distance=8": [{"seed": s, "recall_bits": v} for s, v in ((1, 0.02), (2, 0.03), (3, 0.52))],
        "transformer, distance=512": [{"seed": s, "recall_bits": v} for s, v in ((1, 4.02), (2, 4.03), (3, 11.48))],
        "lstm, distance=8": [{"seed": s, "recall_bits": v} for s, v in ((2, 4.01), (1, 4.00), (3, 3.59))],
    },
    "outliers": [{"arm": "transformer, distance=512", "seed": 3, "metric": "recall_bits", "value": 11.48},
                 {"arm": "lstm, distance=8", "seed": 3, "metric": "bpb", "value": 3.59}],
}


def test_published_numbers_are_read_from_the_claims_tables():
    assert published.positions_by_length(PAGE) == {"none": {"1x": 2.7178, "2x": 2.7373, "4x": 2.7505},
                                                    "learned": {"1x": 2.6755}}
    assert published.arms_table(PAGE, "rnn") == []
    real = published.read_page()
    if real:  # the repository's own page: every arm of the claim is there
        assert set(published.positions_by_length(real)) >= {"none", "rope", "sinusoidal", "alibi", "learned"}
    results = published.read_results("recall")
    if results:  # the repository's own results: both arms, at each distance
        assert set(published.recall_seeds(results)) == {"transformer", "lstm"}


def test_the_recall_curve_is_the_median_of_the_seeds_and_marks_the_flagged_ones():
    """One far seed (11.48 bits where the others sit at 4) drags a mean to 6.5, above chance; the median stays at
    the arm's 4.03. The flag is the claim's own (outliers, metric recall_bits), not one of another number."""
    got = published.recall_seeds(RECALL)
    assert list(got) == ["transformer", "lstm"] and list(got["transformer"]) == [8, 512]
    far = got["transformer"][512]
    assert far.values == (4.02, 4.03, 11.48) and far.flagged == (False, False, True)
    assert far.median == pytest.approx(4.03)
    assert got["lstm"][8].seeds == (1, 2, 3) and got["lstm"][8].flagged == (False, False, False)
    from attention_lab.viewer import ideas as draw

    fig = draw.rnn_figure({"transformer": np.ones(8), "LSTM": np.ones(8) * 2}, got, {"transformer": 1.0, "LSTM": 1.0},
                          1, "r")
    panel = fig.axes[1]
    medians = [line for line in panel.get_lines() if line.get_label().endswith("median of the seeds")]
    assert [list(line.get_ydata()) for line in medians] == [[pytest.approx(0.03), pytest.approx(4.03)],
                                                            [pytest.approx(4.00)]]
    crosses = [line for line in panel.get_lines() if line.get_marker() == "x" and len(line.get_xdata())]
    assert len(crosses) == 1 and crosses[0].get_ydata()[0] == draw.RECALL_TOP, "the flagged seed, drawn at the top"
    assert any("11.5" in t.get_text() for t in panel.texts), "a seed off the top says its value"


# --- warmup --------------------------------------------------------------------------------------------------------


def test_the_plotted_schedule_is_lr_at():
    for oc in (OptimConfig(lr=2e-3, min_lr=1e-4, warmup_steps=10, schedule="wsd"),
               OptimConfig(lr=1e-3, warmup_steps=5, schedule="cosine")):
        steps, lr = ideas_cli.schedule(oc, 60)
        assert steps.tolist() == list(range(60))
        assert lr.tolist() == [lr_at(s, oc, 60) for s in range(60)], "the curve must be lr_at at every step"
        assert np.allclose(np.diff(lr[: oc.warmup_steps]), oc.lr / oc.warmup_steps), "warmup rises linearly"


def test_the_followed_schedule_is_read_off_the_logged_rates():
    steps = np.arange(10, 110, 10)
    lr = np.array([0.2, 0.6, 1.0, 1.0, 1.0, 1.0, 0.7, 0.4, 0.2, 0.1]) * 2e-3
    assert ideas_cli.followed_phases(steps, lr, 2e-3) == (30, 70), "warmup ends at the first peak, decay at the drop"
    assert ideas_cli.followed_phases(steps[:2], lr[:2], 2e-3) is None, "a run stopped inside its warmup"
    from attention_lab.viewer import ideas as draw

    plan_steps, plan = ideas_cli.schedule(OptimConfig(lr=2e-3, warmup_steps=20), 300)
    fig = draw.warmup_figure(plan_steps, plan, None, (steps, lr), 20, "r", (30, 70))
    main, planned = fig.axes[0].lines[:2]
    assert list(main.get_xdata()) == list(steps) and list(main.get_ydata()) == list(lr), \
        "the main curve must be the rates the run logged"
    assert (planned.get_alpha() or 1.0) < 0.5 and "not followed" in planned.get_label(), "the plan is drawn faint"


def test_evaluations_are_marked_where_a_clock_schedule_drops_and_muons_line_shows(tmp_path):
    rows = [{"step": s, "lr": 2e-3 - 1e-5 * s} for s in range(10, 110, 10)]
    rows.insert(5, {"step": 50, "val_loss": 4.0, "seconds_val": 2.0, "seconds_HeadRoles": 4.5, "seconds_Film": 0.5})
    rows.append({"step": 100, "val_loss": 3.9, "seconds_val": 2.0})
    rows.insert(3, {"step": 33, "seconds_snapshot": 0.02})  # a snapshot is no evaluation
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pauses = ideas_cli.evaluation_pauses(metrics)
    assert pauses == [(50, pytest.approx(7.0)), (100, pytest.approx(2.0))], \
        f"an evaluation's seconds are all of its row's seconds_* (the loss and every callback): {pauses}"
    assert ideas_cli.evaluation_pauses(tmp_path / "none.jsonl") == []
    from attention_lab.viewer import ideas as draw

    logged = ideas_cli.logged_rates(metrics)
    plan_steps, plan = ideas_cli.schedule(OptimConfig(lr=2e-3, warmup_steps=20), 300)
    fig = draw.warmup_figure(plan_steps, plan, plan * 10, logged, 20, "r", None, 10.0, pauses)
    marks = [line for line in fig.axes[0].lines if line.get_marker() == "v"]
    assert len(marks) == 1 and list(marks[0].get_xdata()) == [50], \
        "the evaluation inside the logged steps is marked, the last (nothing follows it) is not"
    assert any("evaluation (about 7 s" in t.get_text() for t in fig.legends[0].get_texts())
    adamw, muon = fig.axes[0].lines[0], fig.axes[1].lines[0]
    assert np.allclose(muon.get_ydata(), adamw.get_ydata() * 10), "Muon's rate is AdamW's times muon_lr / lr"
    assert np.allclose(np.array(fig.axes[1].get_ylim()), np.array(fig.axes[0].get_ylim()) * 10)
    assert muon.get_linestyle() == "--" and muon.get_linewidth() < adamw.get_linewidth() / 2 \
        and muon.get_color() != adamw.get_color(), \
        "Muon's line lies on AdamW's: it must be thin, dashed and of another colour on a wide one, or it is hidden"


# --- the command on a debug run -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def debug_run(tmp_path_factory, data_cache):
    run_dir = tmp_path_factory.mktemp("ideas") / "runs" / "debug" / "r"
    cfg = compose(["experiment=debug", f"data.cache_dir={data_cache}", "train.max_steps=6", "train.eval_interval=6",
                   "train.head_roles=false", "train.film=false", "train.tensorboard=false",
                   "train.head_ablation=false"])
    train_mod.train(cfg, run_dir)
    return run_dir


ARGS = {
    "lookup": ["--pair", "2", "9"],
    "scale": [],
    "meaning": ["--words", "e,t", "--contexts", "4", "--width", "8"],
    "positions": [],
    "rnn": ["--minutes", "0.01", "--windows", "2", "--repeats", "1"],
    "mask": ["--layer", "1", "--head", "1"],
    "residual": [],
    "warmup": [],
}


@pytest.mark.parametrize("name", list(ARGS))
def test_each_idea_prints_its_numbers_and_writes_its_figure(name, debug_run, tmp_path, capsys):
    where = [] if name == "mask" else ["--out", str(tmp_path)]  # mask: the default folder, the run's ideas/
    root = ["--runs-root", str(tmp_path / "no_runs")]  # rnn: no LSTM run there, so one is trained for --minutes
    rc = ideas_cli.main([name, str(debug_run), *where, *root, "--text", "ROMEO:\nBut soft, what light", *ARGS[name]])
    out, err = capsys.readouterr()
    assert rc == 0, f"{name} failed: {err}"
    figure = (debug_run / "ideas" if name == "mask" else tmp_path) / f"{name}.png"
    assert f"figure: {figure}" in out, out
    assert figure.read_bytes()[:8] == PNG_MAGIC and figure.stat().st_size > 5000, f"{name}: no real PNG"
    needles = {"lookup": "only what a later token looks for", "scale": "QK-norm", "meaning": "mean cosine",
               "positions": "sees a set", "rnn": "parallel", "mask": "instead of -inf", "residual": "logit lens",
               "warmup": "the schedule the run followed"}
    assert needles[name] in out, out
    if name == "rnn":  # said before it trains, and a verdict on whether the LSTM can be compared
        assert out.index("training an LSTM of the transformer's size here for 0.01 minute") < out.index("LSTM step")
        assert "model.arch=lstm name=lstm" in out
        assert ("too undertrained to compare" in out) != ("the LSTM's loss minus the transformer's" in out), out


@pytest.fixture(scope="module")
def lstm_run(debug_run, data_cache):
    run_dir = debug_run.parent.parent / "lstm" / "r"  # beside the debug run, under the same runs root
    cfg = compose(["experiment=debug", f"data.cache_dir={data_cache}", "model.arch=lstm", "train.max_steps=2",
                   "train.eval_interval=2", "train.head_roles=false", "train.film=false", "train.tensorboard=false",
                   "train.head_ablation=false"])
    train_mod.train(cfg, run_dir)
    return run_dir


def test_rnn_uses_the_newest_lstm_run_instead_of_training_one(debug_run, lstm_run, tmp_path, capsys):
    rc = ideas_cli.main(["rnn", str(debug_run), "--runs-root", str(debug_run.parent.parent), "--out", str(tmp_path),
                         "--windows", "2", "--repeats", "1", "--text", "ROMEO:"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "the LSTM: lstm/r" in out and "newest LSTM run" in out, out
    assert "training an LSTM" not in out and "LSTM step" not in out, "an LSTM run was there: nothing to train"


def test_warmup_prints_the_runs_own_schedule(debug_run, tmp_path, capsys):
    assert ideas_cli.main(["warmup", str(debug_run), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    oc = OptimConfig(**json.loads((debug_run / "config.json").read_text())["optim"])
    assert f"warmup {oc.warmup_steps} steps" in out and f"step 0: {lr_at(0, oc, 6):.2e}" in out, out


def test_errors_are_one_line(tmp_path, debug_run, capsys):
    assert ideas_cli.main(["mask", "--runs-root", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "make train" in err and "Traceback" not in err, err
    assert ideas_cli.main(["nonsense"]) == 2
    assert "unknown idea" in capsys.readouterr().err
    assert ideas_cli.main(["lookup", str(debug_run), "--tied", str(debug_run), "--out", str(tmp_path)]) == 2
    assert "not a qk_tied model" in capsys.readouterr().err
    assert ideas_cli.main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in ARGS), listed
    rnn = listed[listed.index("\nrnn "):listed.index("\nmask ")]
    assert "TRAINS an LSTM for --minutes (default 1)" in rnn, "--list must say that rnn trains, and how long"
    assert listed.count("trains nothing") == len(ARGS) - 1, listed
