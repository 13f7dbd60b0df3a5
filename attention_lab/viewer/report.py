"""The sample report: what sample.py writes for one generated text (SampleLayout names each file).

    attention.npy           float32 (n_layer, n_head, T, T): every layer's and head's weights over the last window
    tokens.json             {"text", "token_ids", "tokens", "start", "shape"} for those T tokens
    layer_00.png, ...       one grid of heads per layer
    summary.json / .txt     each head's role scores (measured on this text), ablation effect and copying score, and
                            the logit lens at the last token
    attention.html          all of it in one interactive page that opens offline (--no-html: none), with the
                            "step inside" panel: one head's computation for one query with the model's own numbers
    page.json               the page's data beyond attention.npy (step inside, logit lens, circuits, scores, title):
                            `python -m attention_lab.viewer FOLDER` rebuilds the same page from it

and, given a TensorBoard SummaryWriter, the same heatmaps, the text and the summary table. write_samples does it for
each of sample.py's samples, into the run's samples/ folder and its TensorBoard.
"""

from __future__ import annotations

import base64
import contextlib
import json
import time
from collections.abc import Sequence
from pathlib import Path

import matplotlib.image
import numpy as np
import torch

from attention_lab.interp.analysis import TextAnalysis, analyze
from attention_lab.interp.circuits import copying_of, copying_score, ov_logits, qk_token_pairs
from attention_lab.interp.figures import AttentionFrames, markdown_code
from attention_lab.interp.heads import format_head_table, head_rows
from attention_lab.interp.inside import steppable
from attention_lab.interp.roles import ROLE_HELP
from attention_lab.store.layout import RunLayout, SampleLayout, run_of_checkpoint
from attention_lab.viewer.page import sample_data, save_page_data, write_page
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
    checkpoint: str | None = None,
) -> dict:
    """Capture the attention of the last block_size tokens of `ids` and write the report into out_dir.

    checkpoint: the checkpoint folder the model came from, kept in tokens.json (a full rebuild names it).
    With a SummaryWriter, also the heatmaps (`<tag_prefix>attention/layer_XX`), the text and the summary table.
    Returns what it wrote: {"weights", "token_ids", "tokens", "text", "summary", "table", "scores", "ablation",
    "files"}.
    """
    out = SampleLayout(out_dir)
    out.root.mkdir(parents=True, exist_ok=True)
    window = [int(i) for i in ids[-model.config.block_size :]]
    found = analyze(model, window)  # one recorded forward pass (and one batched pass for the ablations)
    weights, scores, ablation, lens = found.weights, found.scores, found.ablation, found.lens
    labels = tokenizer.token_strings(window)
    text = tokenizer.decode(window)
    circuits = head_circuits(model, window, tokenizer)
    rows = head_rows(scores, ablation, np.asarray(circuits["copying"]), in_text_copying(model, found))
    table = format_head_table(rows) + "\n" + lens_lines(lens, tokenizer, labels)

    files = [out.weights, out.tokens, out.summary, out.summary_text]
    np.save(out.weights, weights.astype(np.float32))
    write_json_atomic(out.tokens, {
        "text": text,
        "token_ids": window,
        "tokens": labels,
        "start": len(ids) - len(window),  # position of the first of these tokens in the whole sequence
        "shape": "attention.npy is (n_layer, n_head, T, T): [layer, head, query, key]",
    } | ({"checkpoint": str(checkpoint)} if checkpoint else {}))
    last = [tokenizer.token_strings([int(i)])[0] for i in lens.ids[:, -1, 0]]
    write_json_atomic(out.summary, {"heads": rows, "roles": ROLE_HELP,
                                    "ablation": "loss change in nats/token on this text when the head is zeroed",
                                    "copying": "share of tokens whose own logit the head's OV circuit raises most",
                                    "copying_text": "the same on this text: the head's output raises most the "
                                                    "logit of the token it attends to most",
                                    "logit_lens_last_token": {"layers": ["embeddings"] + [f"after block {i}" for i in
                                                                                          range(len(last) - 1)],
                                                              "top1": last,
                                                              "p": lens.probs[:, -1, 0].round(4).tolist()}})
    out.summary_text.write_text(table + "\n", encoding="utf-8")
    if html:  # the page, and beside it what it shows beyond attention.npy, so a rebuild gives the same page
        data = page_data(model, tokenizer, found, circuits)
        files.append(write_page(out.page, data, title or "attention"))
        files.append(save_page_data(out.page_data, data, title or "attention"))

    frames = AttentionFrames(labels, dpi=dpi)  # the layers' figures differ only in their heatmaps: laid out once
    for layer in range(weights.shape[0]):
        pixels = frames.pixels(weights[layer], f"{title}, layer {layer}".lstrip(", "))  # for the PNG and TensorBoard
        matplotlib.image.imsave(out.layer_png(layer), pixels)
        files.append(out.layer_png(layer))
        if writer is not None:
            writer.add_image(f"{tag_prefix}attention/layer_{layer:02d}", pixels, step, dataformats="HWC")
    if writer is not None:
        writer.add_text(f"{tag_prefix}text", markdown_code(text), step)
        writer.add_text(f"{tag_prefix}head_summary", markdown_code(table), step)
    return {"weights": weights, "token_ids": window, "tokens": labels, "text": text, "summary": rows, "table": table,
            "scores": scores, "ablation": ablation, "files": files}


def write_samples(model: GPT, tokenizer: Tokenizer, samples: Sequence[Sequence[int]], run_dir: Path, step: int,
                  header: str, out_dir: Path | None = None, html: bool = True, say=print,
                  checkpoint: str | None = None) -> Path:
    """Each sample's report (dump_attention) into out_dir (default <run>/samples/<YYYYmmdd-HHMMSS>/; sample_00/,
    sample_01/, ... when there are several), and into TensorBoard under <run>/tb/samples/<same name>/, beside the
    run's curves, `header` (checkpoint, seed, sampling settings) as its first text. `say` gets the head tables and
    where everything went. Returns out_dir; OSError, in words, when the folders cannot be made."""
    run = RunLayout(run_dir)
    name = run.new_sample_name(time.strftime("%Y%m%d-%H%M%S"))
    out_dir, tb_dir = out_dir or run.samples / name, run.tb_samples / name
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        tb_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(f"cannot create the output folders ({e}); pass --out with a writable folder") from None
    from torch.utils.tensorboard import SummaryWriter  # imported late: it takes a second

    several = len(samples) > 1
    with contextlib.closing(SummaryWriter(log_dir=str(tb_dir))) as writer:
        writer.add_text("checkpoint", markdown_code(header), step)
        for i, ids in enumerate(samples):
            result = dump_attention(
                model, tokenizer, ids, out_dir / f"sample_{i:02d}" if several else out_dir, writer=writer,
                tag_prefix=f"sample_{i:02d}/" if several else "", step=step, html=html, checkpoint=checkpoint,
                title=f"{run.root.name} step {step}" + (f", sample {i}" if several else ""))
            say(f"\nattention heads{f' (sample {i})' if several else ''}, last {len(result['token_ids'])} tokens:")
            say(result["table"])
            for page in (p for p in result["files"] if p.name == "attention.html"):
                say(f"attention page: {page}  (open it in a browser; it works offline)")
    say(f"\nattention maps: {out_dir}\ntensorboard:    tensorboard --logdir {run.root}  (samples under {tb_dir})")
    return out_dir


def rebuild_sample(folder: Path, checkpoint: Path) -> Path:
    """Recompute a sample folder's report (maps, summary, page and page.json) for its tokens.json token ids with a
    checkpoint (`python -m attention_lab.viewer FOLDER --checkpoint CKPT`); returns the page. ValueError when the
    checkpoint's tokenizer or context cannot hold those tokens."""
    from attention_lab.store.checkpoint import load_checkpoint  # the weights: only for a full rebuild

    sample = SampleLayout(folder)
    saved = json.loads(sample.tokens.read_text(encoding="utf-8"))
    ckpt = load_checkpoint(Path(checkpoint), "best")
    model, tokenizer = ckpt.build_model("cpu").eval(), ckpt.tokenizer()
    ids = [int(i) for i in saved["token_ids"]]
    if tokenizer.token_strings(ids) != saved["tokens"] or len(ids) > model.config.block_size:
        raise ValueError(f"{folder}'s tokens are not {ckpt.path}'s tokens (another tokenizer or a shorter context): "
                         "give the checkpoint that wrote the sample (sample.py prints it first)")
    dump_attention(model, tokenizer, ids, folder, html=True, checkpoint=str(ckpt.path),
                   title=f"{run_of_checkpoint(ckpt.path).name} step {ckpt.step}")
    return sample.page


def in_text_copying(model: GPT, found: TextAnalysis) -> np.ndarray | None:
    """(L, nh) each head's copying on this text (circuits.copying_of), from the analysis' shares and weights."""
    return copying_of(model, found.shares, found.weights, found.ids) if len(found.ids) > 1 else None


def page_data(model: GPT, tokenizer: Tokenizer, found: TextAnalysis, circuits: dict | None = None,
              panel: bool = True) -> dict:
    """The sample page's JSON data island for one analysed text (what attention.html embeds and the live lab's
    /api/analyze answers): the weights, role scores and ablation of `found`, and, for a causal model, the "step
    inside" panel's numbers with the logit lens and `circuits` (head_circuits; the lab keeps the weight-only part
    per checkpoint). panel=False leaves the panel out (the live lab sends it apart, after the maps)."""
    labels = tokenizer.token_strings([int(i) for i in found.ids])
    page_scores = dict(found.scores) | ({"ablation": found.ablation} if found.ablation is not None else {})
    # the panel steps through causal rows (keys 0..i): left out for a model whose rows reach later keys
    inside = None
    if panel and steppable(model.config) is None:
        circuits = circuits if circuits is not None else head_circuits(model, [int(i) for i in found.ids], tokenizer)
        inside = inside_data(model, found.qkv, found.shares, tokenizer, found.lens_of(model), circuits)
    return sample_data(found.weights, labels, page_scores, inside=inside)


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a, dtype="<f4").tobytes()).decode("ascii")


@torch.no_grad()
def head_circuits(model: GPT, window: list[int], tokenizer: Tokenizer, k: int = 5) -> dict:
    """Per head, from its weights alone (attention_lab/interp/circuits.py): the copying score, the top query-key
    token pairs (model_circuits: the same for every text), and for each distinct token of the text the tokens
    whose logits the head raises most when it attends to it (text_circuits)."""
    return model_circuits(model, tokenizer, k) | text_circuits(model, window, tokenizer, k)


def _names(tokenizer: Tokenizer, ids) -> list[str]:
    return tokenizer.token_strings([int(i) for i in ids])


@torch.no_grad()
def model_circuits(model: GPT, tokenizer: Tokenizer, k: int = 5) -> dict:
    """The text-independent part of head_circuits: {"copying": (L, nh), "qk_pairs": L x nh x k [query, key,
    score]}. Seconds on the default model: the live lab computes it once per checkpoint."""
    cfg = model.config
    copying, pairs = [], []
    for layer in range(cfg.n_layer):
        copying.append([copying_score(model, layer, h) for h in range(cfg.n_head)])
        pairs.append([])
        for h in range(cfg.n_head):
            top = qk_token_pairs(model, layer, h, k=k)
            pairs[-1].append([[q, key, round(float(s), 3)] for q, key, s in
                              zip(_names(tokenizer, top.query), _names(tokenizer, top.key), top.score)])
    return {"copying": copying, "qk_pairs": pairs}


@torch.no_grad()
def text_circuits(model: GPT, window: list[int], tokenizer: Tokenizer, k: int = 5) -> dict:
    """{"ov_writes": L x nh x {token: [[written token, logit] x k]}} for the distinct tokens of the text."""
    cfg = model.config
    distinct = sorted({int(t) for t in window})
    labels = dict(zip(distinct, tokenizer.token_strings(distinct)))
    writes = []
    for layer in range(cfg.n_layer):
        writes.append([])
        for h in range(cfg.n_head):
            logits = torch.as_tensor(ov_logits(model, layer, h, distinct))  # (n, V)
            best = logits.topk(k, dim=-1)
            writes[-1].append({labels[t]: [[s, round(float(v), 3)] for s, v in zip(_names(tokenizer, i), val)]
                               for t, i, val in zip(distinct, best.indices, best.values)})
    return {"ov_writes": writes}


def lens_lines(lens, tokenizer: Tokenizer, labels: list[str]) -> str:
    """The logit lens at the last token, one line: the most likely next token after the embeddings and each block,
    with its probability. Tokens are quoted as token_strings shows them (a newline once as \\n, never \\\\n)."""
    tops = [f"{name} '{tokenizer.token_strings([int(lens.ids[i, -1, 0])])[0]}' p={lens.probs[i, -1, 0]:.2f}"
            for i, name in enumerate(["emb"] + [f"L{i}" for i in range(lens.ids.shape[0] - 1)])]
    return (f"logit lens after '{labels[-1]}' (the most likely next token after the embeddings and after each layer, "
            "with its probability): " + " | ".join(tops))


def inside_data(model: GPT, qkv: np.ndarray, shares: np.ndarray, tokenizer: Tokenizer, lens, circuits: dict) -> dict:
    """What the page's "step inside" panel computes with: every head's q, k, v (T, hs) as the dot products and the
    weighted sum see them (float32, from the analysis' cache; the panel shows each v_j and w_j v_j), the kind of
    attention and its per-layer/per-head constants (whether the positions add a score bias, QK-norm), the norm of
    each head's share of the output projection at every query (the analysis' shares), the logit lens and the
    circuits."""
    cfg = model.config
    n_layer, n_head, hs = cfg.n_layer, cfg.n_head, cfg.head_size
    qkv = qkv.astype(np.float32)
    share_norm = np.linalg.norm(shares, axis=-1)  # (L, nh, T)
    pe = model.transformer.wpe
    slopes = pe.slopes.tolist() if hasattr(pe, "slopes") else [0.0] * n_head
    sinks = [block.attn.sink.detach().float().tolist() if getattr(block.attn, "sink", None) is not None else None
             for block in model.transformer.h]
    vocab = sorted({int(i) for i in lens.ids.reshape(-1)})
    strings = dict(zip(vocab, tokenizer.token_strings(vocab)))
    return {
        "kind": cfg.attention, "hs": hs, "scale": cfg.score_scale, "alibi": slopes,
        # what the panel names: a "+ bias" column only where the positions add one to the scores (ALiBi, not
        # RoPE); QK-norm's sentence only where the model normalises q and k
        "bias": bool(pe.has_score_bias), "qk_norm": bool(cfg.qk_norm), "positions": cfg.pos_encoding,
        "windows": [cfg.layer_window(i) for i in range(n_layer)], "sinks": sinks,
        "denominator": cfg.linear_denominator, "out_norm": cfg.linear_out_norm,
        "q": _b64(qkv[0]), "k": _b64(qkv[1]), "v": _b64(qkv[2]),
        "share_norm": share_norm.round(4).tolist(),
        "lens": [[[[strings[int(i)], round(float(p), 4)] for i, p in zip(ids_t, p_t)]
                  for ids_t, p_t in zip(ids_l, p_l)] for ids_l, p_l in zip(lens.ids, lens.probs)],
        **circuits,
    }
