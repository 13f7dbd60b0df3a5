"""The sample report: what sample.py writes for one generated text (SampleLayout names each file).

    attention.npy           float32 (n_layer, n_head, T, T): every layer's and head's weights over the last window
    tokens.json             {"text", "token_ids", "tokens", "start", "shape"} for those T tokens
    layer_00.png, ...       one grid of heads per layer
    summary.json / .txt     each head's role scores (measured on this text) and ablation effect
    attention.html          all of it in one interactive page that opens offline (--no-html: none)

and, given a TensorBoard SummaryWriter, the same heatmaps, the text and the summary table.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib.image
import numpy as np
import torch

from attention_lab.interp.capture import capture_attention
from attention_lab.interp.figures import attention_figure, figure_to_array, markdown_code
from attention_lab.interp.heads import ablation_effects, format_head_table, head_rows
from attention_lab.interp.roles import ROLE_HELP, role_scores
from attention_lab.store.layout import SampleLayout
from attention_lab.viewer.page import write_sample_page
from data.files import write_json_atomic
from data.tokenizer import Tokenizer
from model import GPT


def dump_attention(
    model: GPT,
    tokenizer: Tokenizer,
    ids: Sequence[int],
    out_dir: Path,
    *,
    writer=None,
    tag_prefix: str = "",
    step: int = 0,
    title: str = "",
    dpi: int = 90,
    html: bool = True,
) -> dict:
    """Capture the attention of the last block_size tokens of `ids` and write the report into out_dir.

    With a SummaryWriter, also the heatmaps (`<tag_prefix>attention/layer_XX`), the text and the summary table.
    Returns what it wrote: {"weights", "token_ids", "tokens", "text", "summary", "table", "scores", "ablation",
    "files"}.
    """
    out = SampleLayout(out_dir)
    out.root.mkdir(parents=True, exist_ok=True)
    window = [int(i) for i in ids[-model.config.block_size :]]
    weights = capture_attention(model, window)  # (L, nh, T, T)
    labels = tokenizer.token_strings(window)
    text = tokenizer.decode(window)
    scores = role_scores(weights, np.asarray(window))  # role -> (L, nh), measured on this text
    ablation = None
    if len(window) > 1:  # the loss change on this text's own next tokens when each head alone is zeroed
        idx = torch.tensor([window], device=next(model.parameters()).device)
        ablation = ablation_effects(model, idx[:, :-1], idx[:, 1:])
    rows = head_rows(scores, ablation)
    table = format_head_table(rows)

    files = [out.weights, out.tokens, out.summary, out.summary_text]
    np.save(out.weights, weights.astype(np.float32))
    write_json_atomic(out.tokens, {
        "text": text,
        "token_ids": window,
        "tokens": labels,
        "start": len(ids) - len(window),  # position of the first of these tokens in the whole sequence
        "shape": "attention.npy is (n_layer, n_head, T, T): [layer, head, query, key]",
    })
    write_json_atomic(out.summary, {"heads": rows, "roles": ROLE_HELP,
                                    "ablation": "loss change in nats/token on this text when the head is zeroed"})
    out.summary_text.write_text(table + "\n", encoding="utf-8")
    if html:
        page_scores = dict(scores) | ({"ablation": ablation} if ablation is not None else {})
        files.append(write_sample_page(out.page, weights, labels, page_scores, title=title or "attention"))

    for layer in range(weights.shape[0]):
        fig = attention_figure(weights[layer], labels, f"{title}, layer {layer}".lstrip(", "), dpi=dpi)
        pixels = figure_to_array(fig)  # (H, W, 3) drawn once, for both the PNG and TensorBoard
        matplotlib.image.imsave(out.layer_png(layer), pixels)
        files.append(out.layer_png(layer))
        if writer is not None:
            writer.add_image(f"{tag_prefix}attention/layer_{layer:02d}", pixels, step, dataformats="HWC")
    if writer is not None:
        writer.add_text(f"{tag_prefix}text", markdown_code(text), step)
        writer.add_text(f"{tag_prefix}head_summary", markdown_code(table), step)
    return {"weights": weights, "token_ids": window, "tokens": labels, "text": text, "summary": rows, "table": table,
            "scores": scores, "ablation": ablation, "files": files}
