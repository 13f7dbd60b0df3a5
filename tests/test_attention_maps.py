"""attention_lab.interp.figures: capture, figures, TensorBoard logging; the measured head table on hand-made heads."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.tensorboard import SummaryWriter

from attention_lab.interp.capture import capture_attention
from attention_lab.interp.figures import (
    AttentionFrames,
    FingerprintFrames,
    attention_figure,
    figure_to_array,
    log_attention_to_tensorboard,
    pool_max,
    role_fingerprint_figure,
)
from attention_lab.interp.heads import format_head_table, head_rows, role_scores
from attention_lab.interp.roles import TRACKED_ROLES
from model import GPT, GPTConfig

T = 20


def tiny_model(dropout: float = 0.0, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=40, block_size=32, n_layer=2, n_head=2, n_embd=32, dropout=dropout))
    with torch.no_grad():  # larger weights than GPT-2's init, so that attention is far from uniform
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    return model


def one_hot_rows(targets: list[int], t: int) -> np.ndarray:
    """(T, T) attention with all of row i's weight on key targets[i]."""
    w = np.zeros((t, t))
    w[np.arange(t), targets] = 1.0
    return w


def synthetic_heads(ids: list[int]) -> tuple[np.ndarray, list[str]]:
    """(1, 7, T, T) hand-made heads and the pattern head_summary should find in each."""
    t = len(ids)
    uniform = np.tril(np.ones((t, t))) / np.arange(1, t + 1)[:, None]
    local = np.zeros((t, t))
    for q in range(t):
        keys = list(range(max(0, q - 2), q + 1))  # the last three tokens, equally
        local[q, keys] = 1.0 / len(keys)

    def earlier_match(q: int, offset: int) -> int | None:
        """Latest key j in [1, q-2] with ids[j - offset] == ids[q]."""
        for j in range(q - 2, 0, -1):
            if ids[j - offset] == ids[q]:
                return j
        return None

    copy, induction = [], []
    for q in range(t):
        c, i = earlier_match(q, 0), earlier_match(q, 1)
        copy.append(c if c is not None else 0)  # rows without an earlier copy look at the first token
        induction.append(i if i is not None else 0)
    heads = [
        (one_hot_rows([max(q - 1, 0) for q in range(t)], t), "previous"),
        (one_hot_rows([0] * t, t), "first"),
        (one_hot_rows(list(range(t)), t), "self"),
        (uniform, "broad"),
        (local, "local"),
        (one_hot_rows(copy, t), "copy"),
        (one_hot_rows(induction, t), "induction"),
    ]
    return np.stack([h for h, _ in heads])[None], [name for _, name in heads]


# ----------------------------------------------------------------------------------------------------------
# capture


def test_capture_attention_shapes_rows_mask_and_equals_the_model():
    model = tiny_model()
    idx = torch.randint(0, 40, (1, T), generator=torch.Generator().manual_seed(1))
    w = capture_attention(model, idx)
    assert w.shape == (2, 2, T, T) and w.dtype == np.float32, f"got {w.shape} {w.dtype}, want (2, 2, {T}, {T}) float32"
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5, err_msg="every query row must sum to 1")
    upper = w[..., np.triu_indices(T, k=1)[0], np.triu_indices(T, k=1)[1]]
    assert (upper == 0.0).all(), "future keys (upper triangle) must get exactly 0 weight"
    with torch.no_grad():
        direct = model(idx, return_attention=True).attentions
    for layer in range(2):
        torch.testing.assert_close(
            torch.from_numpy(w[layer]), direct[layer][0], atol=1e-6, rtol=0,
            msg=f"layer {layer}: captured weights differ from the model's own",
        )
    assert not np.allclose(w[0, 0], w[0, 0][:, :1]), "fixture attention should not be uniform"


def test_capture_attention_crops_to_block_size_and_accepts_lists():
    model = tiny_model()
    ids = torch.randint(0, 40, (50,), generator=torch.Generator().manual_seed(2)).tolist()
    w = capture_attention(model, ids)
    assert w.shape == (2, 2, 32, 32), f"50 tokens with block_size 32 should give 32x32 maps, got {w.shape}"
    np.testing.assert_array_equal(w, capture_attention(model, torch.tensor([ids[-32:]])),
                                  err_msg="a long input must be cropped to its last block_size tokens")


def test_capture_attention_runs_in_eval_fp32_and_restores_training_mode():
    model = tiny_model(dropout=0.5)
    model.train()
    idx = torch.randint(0, 40, (1, T), generator=torch.Generator().manual_seed(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        w1 = capture_attention(model, idx)
    w2 = capture_attention(model, idx)
    assert model.training, "capture_attention must give the model back in training mode"
    assert w1.dtype == np.float32
    np.testing.assert_array_equal(w1, w2, err_msg="dropout or autocast leaked into capture (weights differ)")
    model.eval()
    with torch.no_grad():
        ref = model(idx, return_attention=True).attentions[1][0].numpy()
    np.testing.assert_allclose(w1[1], ref, atol=1e-6, err_msg="capture should equal a float32 eval-mode forward")


# ----------------------------------------------------------------------------------------------------------
# summary


def test_measured_roles_label_hand_made_heads():
    base = [5, 9, 2, 7, 3, 8, 1, 6, 4, 11]
    ids = base + base  # a repeated sequence: copy and induction targets exist in its second half
    weights, expected = synthetic_heads(ids)
    rows = head_rows(role_scores(weights, np.array(ids)))
    assert len(rows) == len(expected), f"one row per head expected, got {len(rows)}"
    names = {"previous": "previous_token", "first": "first_token", "self": "self", "broad": "mixed",
             "local": "mixed", "copy": "duplicate_token", "induction": "induction"}
    got = [r["role"] for r in rows]
    assert got == [names[e] for e in expected], f"head roles: got {got}, want {expected}"
    by_name = dict(zip(expected, rows))
    # row 0 has no previous token (it looks at itself): every row that has one puts all its mass there (the
    # stripe), (T-1)/T of all rows' mass is on t-1 (detect_head's all-rows form)
    assert by_name["previous"]["previous_token"] == pytest.approx(1.0) and \
        by_name["previous"]["previous_token_all_rows"] == pytest.approx((len(ids) - 1) / len(ids), abs=1e-4) and \
        by_name["previous"]["entropy"] == pytest.approx(0.0), f"a one-hot previous-token head: {by_name['previous']}"
    assert by_name["broad"]["entropy"] == pytest.approx(1.0), "uniform attention has normalised entropy 1"
    assert by_name["induction"]["induction"] == pytest.approx(1.0), f"induction head: {by_name['induction']}"
    table = format_head_table(rows)
    lines = table.splitlines()
    assert lines[1 + len(rows)].startswith("what the columns say"), f"header + one line per head + legend:\n{table}"


# ----------------------------------------------------------------------------------------------------------
# figures and TensorBoard


def test_attention_figure_renders_to_an_rgb_array():
    model = tiny_model()
    w = capture_attention(model, list(range(T)))
    fig = attention_figure(w[0], [f"t{i}" for i in range(T)], "layer 0")
    pixels = figure_to_array(fig)
    assert pixels.dtype == np.uint8 and pixels.ndim == 3 and pixels.shape[2] == 3, f"want (H, W, 3): {pixels.shape}"
    assert pixels.shape[0] >= 200 and pixels.shape[1] >= 300, f"figure too small to read: {pixels.shape}"
    assert pixels.std() > 10, "the figure looks blank"
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == [f"t{i}" for i in range(T)], f"with {T} tokens every token should be labelled, got {labels}"
    with pytest.raises(ValueError, match="labels"):
        attention_figure(w[0], ["x"] * (T - 1))


@pytest.mark.parametrize("nh", [4, 5, 6, 8])
def test_the_key_labels_sit_under_each_columns_lowest_head_and_the_query_labels_left_of_each_row(nh):
    """Heads fill rows of four: the lowest head of every column names the keys (5 heads: head 0 has head 4 below
    it, so heads 1-4 do), and the first head of every row names the queries."""
    labels = [f"t{i}" for i in range(6)]
    fig = attention_figure(causal_rows(np.random.default_rng(0), nh, 6), labels, "layer 0")
    heads = fig.axes[:nh]  # then the colour bar
    with_keys = [h for h, ax in enumerate(heads) if ax.get_xlabel() == "key"]
    assert with_keys == [h for h in range(nh) if h + 4 >= nh], f"{nh} heads: key labels under heads {with_keys}"
    assert all([t.get_text() for t in heads[h].get_xticklabels()] == labels for h in with_keys)
    with_queries = [h for h, ax in enumerate(heads) if ax.get_ylabel() == "query"]
    assert with_queries == list(range(0, nh, 4)), f"{nh} heads: query labels beside heads {with_queries}"


def test_every_head_is_drawn_on_one_colour_scale_with_the_future_greyed_out():
    """Heads compare by colour only if they share one scale over [0, 1] (the colorbar is drawn once), whatever each
    head's own largest weight (a window cropped from a longer text has no row of weight 1); the masked future is
    the light-grey 'bad' colour, never a weight of 0 painted dark."""
    t, nh = 6, 3
    rows = np.tril(np.ones((t, t), dtype=np.float32))
    w = np.stack([rows * (h + 1) / (4 * (np.arange(t)[:, None] + 1)) for h in range(nh)])  # largest 0.25, 0.5, 0.75
    fig = attention_figure(w, [f"t{i}" for i in range(t)], "one scale")
    images = [ax.images[0] for ax in fig.axes if ax.images]
    assert len(images) == nh, f"one image per head: {len(images)}"
    for h, im in enumerate(images):
        assert (im.norm.vmin, im.norm.vmax) == (0.0, 1.0), f"head {h} is scaled to {im.norm.vmin}..{im.norm.vmax}"
        future = np.ma.getmaskarray(im.get_array())
        np.testing.assert_array_equal(future, np.triu(np.ones((t, t), dtype=bool), k=1),
                                      err_msg=f"head {h}: the future (above the diagonal) must be masked, and only it")
        grey = im.cmap(np.ma.masked_invalid([np.nan]))[0]
        assert np.allclose(grey[:3], [0xE6 / 255] * 3), f"the masked future is light grey, not {grey}"


def test_attention_figure_thins_labels_and_pools_long_texts():
    t = 300
    w = np.tril(np.ones((2, t, t), dtype=np.float32)) / np.arange(1, t + 1, dtype=np.float32)[:, None]
    fig = attention_figure(w, [str(i) for i in range(t)], "long")
    n_labels = len(fig.axes[0].get_yticklabels())
    assert 0 < n_labels <= 48, f"at most 48 labels per axis, got {n_labels}"
    title = fig.get_suptitle()
    assert "one label per 7" in title and "max-pooled 2x2" in title, f"the title should say what was thinned: {title!r}"
    pooled = pool_max(np.arange(16, dtype=float).reshape(1, 4, 4), 2)
    np.testing.assert_array_equal(pooled, [[[5, 7], [13, 15]]], err_msg="pool_max takes each block's max")


def causal_rows(rng: np.random.Generator, nh: int, t: int) -> np.ndarray:
    w = np.tril(rng.random((nh, t, t), dtype=np.float32))
    return w / w.sum(-1, keepdims=True)


def assert_same_pixels(got: np.ndarray, want: np.ndarray, at: str) -> None:
    """A redrawn frame is, pixel for pixel, the fresh figure it stands for."""
    assert got.shape == want.shape, f"{at}: {got.shape} != {want.shape}"
    differ = np.abs(got.astype(int) - want.astype(int)).max(-1) > 0
    assert not differ.any(), (f"{at}: {differ.sum()} pixels differ from a fresh figure, "
                              f"rows {np.unique(np.nonzero(differ)[0])[:10]}")


@pytest.mark.parametrize("nh, t", [(2, 12), (5, 50), (1, 300)], ids=["short", "two rows of heads, thinned", "pooled"])
def test_attention_frames_draw_the_pixels_of_a_fresh_figure_at_every_frame(nh, t):
    """The trainer's heatmaps (AttentionFrames: the still parts drawn once, the heatmaps and title redrawn over
    them) are pixel for pixel what attention_figure draws from nothing, at the first frame and at later ones with
    other weights and another title (another layer's, a later evaluation's), where a tick mark meets a heatmap's
    edge too."""
    rng = np.random.default_rng(0)
    labels = [f"t{i}" for i in range(t)]
    frames, kept = AttentionFrames(labels), []
    for step, layer in ((0, 0), (0, 1), (10, 0)):  # the first frame, another layer's, then a later evaluation's
        w = causal_rows(rng, nh, t)
        title = f"layer {layer}, step {step}"
        want = figure_to_array(attention_figure(w, labels, title, dpi=72))
        got = frames.pixels(w, title)
        assert_same_pixels(got, want, f"step {step} layer {layer}")
        kept.append((want, got))
    # each frame is the caller's to keep: a later frame leaves the earlier ones as they were drawn
    assert all(np.array_equal(got, want) for want, got in kept), "a later frame drew over an earlier one's pixels"


@pytest.mark.parametrize("n_layer, n_head", [(2, 2), (3, 8)])
def test_fingerprint_frames_draw_the_pixels_of_a_fresh_figure_at_every_frame(n_layer, n_head):
    """The trainer's head-role fingerprint (FingerprintFrames: grids and labels drawn once, the cells' colours and
    numbers and the title redrawn) is pixel for pixel what role_fingerprint_figure draws from nothing, at every
    frame: scores under 1 (".42", white on dark cells), at 1 and past it ("1.2", black), and a negative ablation."""
    rng = np.random.default_rng(1)
    frames, kept = FingerprintFrames(), []
    for step in (0, 10, 20):
        scores = {role: rng.random((n_layer, n_head)) * 1.3 for role in TRACKED_ROLES}
        scores["ablation (probe repeat, nats)"] = rng.normal(0.0, 0.5, (n_layer, n_head))
        title = f"head roles at step {step} (repeated-tokens probe)"
        want = figure_to_array(role_fingerprint_figure(scores, title))
        got = frames.pixels(scores, title)
        assert_same_pixels(got, want, f"step {step}")
        kept.append((want, got))
    assert all(np.array_equal(got, want) for want, got in kept), "a later frame drew over an earlier one's pixels"


def test_log_attention_to_tensorboard_writes_images_and_summary(tmp_path):
    model = tiny_model()
    ids = list(range(T))
    w = capture_attention(model, ids)
    writer = SummaryWriter(log_dir=str(tmp_path))
    tags = log_attention_to_tensorboard(writer, w, [str(i) for i in ids], step=7, tag_prefix="probe", token_ids=ids)
    writer.close()
    assert tags == ["probe/layer_00", "probe/layer_01", "probe/head_summary"], f"tags: {tags}"
    acc = EventAccumulator(str(tmp_path), size_guidance={"images": 0, "tensors": 0})
    acc.Reload()
    assert sorted(acc.Tags()["images"]) == ["probe/layer_00", "probe/layer_01"], acc.Tags()
    image = acc.Images("probe/layer_01")[0]
    assert image.step == 7 and image.width > 200 and image.height > 100, \
        f"image event: step {image.step}, {image.width}x{image.height}"
    assert image.encoded_image_string[:8] == b"\x89PNG\r\n\x1a\n", "TensorBoard images are stored as PNG"
    assert "probe/head_summary/text_summary" in acc.Tags()["tensors"], acc.Tags()["tensors"]
    # each layer's image is that layer's heads (PNG is lossless: the very pixels of its figure)
    from PIL import Image

    for layer in (0, 1):
        png = acc.Images(f"probe/layer_{layer:02d}")[0].encoded_image_string
        got = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
        want = figure_to_array(attention_figure(w[layer], [str(i) for i in ids], f"layer {layer}, step 7", dpi=72))
        assert got.shape == want.shape and np.array_equal(got, want), f"probe/layer_{layer:02d} is not layer {layer}'s map"
