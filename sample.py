"""Continue a prompt with a trained run, streaming the text, then dump the attention maps of the result.

    python sample.py --prompt "ROMEO:"                          # the latest run's best checkpoint
    python sample.py --run runs/shakespeare/x --prompt-file prompt.txt --num-samples 3 --seed 1
    python sample.py --prompt "ROMEO:" --greedy --no-cache      # the uncached path, for comparison

For each sample (in the output folder itself, or in sample_00/, sample_01/, ... when there are several),
over the final window of the sequence (its last block_size tokens):

    attention.npy           float32 (n_layer, n_head, T, T): every layer's and head's attention weights
    tokens.json             {"text", "token_ids", "tokens", ...} for those T tokens
    layer_00.png, ...       one grid of heads per layer (attention_lab.attention_maps.attention_figure)
    summary.json / .txt     each head's measured role scores and ablation effect (attention_lab.heads)
    attention.html          all of it in one interactive page that opens offline (attention_lab.viewer; --no-html)

The output folder defaults to <run>/samples/<YYYYmmdd-HHMMSS>/. The same heatmaps, the text and the summary
also go to TensorBoard under <run>/tb/samples/<YYYYmmdd-HHMMSS>/, so `tensorboard --logdir <run>` shows them
beside the training curves. The generated text goes to stdout; everything else (progress, warnings, the
head summary, where files went) to stderr, so `python sample.py ... > out.txt` keeps only the text.

    weights = np.load("attention.npy"); tokens = json.load(open("tokens.json"))["tokens"]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import random
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from attention_lab.omp import bound_spinning

bound_spinning()  # before torch loads OpenMP: a waiting thread spins briefly, then sleeps (attention_lab/omp.py)

import matplotlib.image  # noqa: E402
import numpy as np
import torch

from attention_lab.attention_maps import (
    attention_figure,
    capture_attention,
    figure_to_array,
    markdown_code,
)
from attention_lab.checkpoint import Checkpoint, CheckpointError, latest_run, load_checkpoint
from attention_lab.device import autocast, decoding_threads, pick_device, pick_dtype
from attention_lab.files import write_json_atomic
from attention_lab.heads import ROLE_HELP, ablation_effects, format_head_table, head_rows, role_scores
from attention_lab.viewer import write_sample_page
from data.tokenizer import Tokenizer
from model import GPT, generate_stream

# ----------------------------------------------------------------------------------------------------------
# arguments


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="sample.py",
        description="Continue a prompt with a trained run; write the attention maps of the result.",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="text to continue; empty starts from <|endoftext|>")
    src.add_argument("--prompt-file", type=Path, help="read the prompt from this UTF-8 file (for long prompts)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--run", type=Path, help="run folder (default: the latest run under --runs-root)")
    where.add_argument("--checkpoint", type=Path, help="one checkpoint folder (checkpoints/step_XXXXXXXX)")
    p.add_argument("--runs-root", type=Path, default=Path("runs"),
                   help="where to look for the latest run (default: runs)")
    p.add_argument("--which", choices=("best", "latest"), default="best",
                   help="checkpoint of the run to use (default: best)")
    p.add_argument("--max-new-tokens", type=int, default=200, help="tokens to generate (default: 200)")
    p.add_argument("--temperature", type=float, default=0.8, help="softmax temperature; 0 is greedy (default: 0.8)")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens")
    p.add_argument("--top-p", type=float, default=None, help="sample from the smallest set holding this mass")
    p.add_argument("--greedy", action="store_true", help="always take the most likely token")
    p.add_argument("--num-samples", type=int, default=1, help="samples, one after the other (default: 1)")
    p.add_argument("--seed", type=int, default=None, help="same seed, same text (default: a random one, printed)")
    p.add_argument("--device", default="auto", help="auto (default: cuda if available, else cpu), cpu, cuda, cuda:N")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                   help="autocast dtype; auto: bf16 on GPUs and on CPUs with native bf16, else float32")
    p.add_argument("--no-cache", action="store_true", help="recompute the whole context at every step")
    p.add_argument("--out", type=Path, default=None, help="attention output folder (default <run>/samples/<time>)")
    p.add_argument("--no-attention", action="store_true", help="only generate: no attention files or TensorBoard")
    p.add_argument("--no-html", action="store_true", help="no attention.html (the interactive page) beside the maps")
    return p.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
    """Refuse numbers that make no sense, naming the flag; ValueError."""

    def bad(flag: str, value, allowed: str) -> ValueError:
        return ValueError(f"{flag} must be {allowed}, got {value}")

    if args.max_new_tokens < 0:
        raise bad("--max-new-tokens", args.max_new_tokens, "0 or more")
    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise bad("--temperature", args.temperature, "a finite number >= 0 (0 is greedy; 0.8 is the default)")
    if args.top_k is not None and args.top_k < 1:
        raise bad("--top-k", args.top_k, "1 or more (leave it out to sample from every token)")
    if args.top_p is not None and not (0.0 < args.top_p <= 1.0):
        raise bad("--top-p", args.top_p, "in (0, 1], e.g. 0.9 (leave it out to sample from every token)")
    if args.num_samples < 1:
        raise bad("--num-samples", args.num_samples, "1 or more")
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out} is a file; give a folder for the attention maps")


def say(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


def warn(message: str) -> None:
    say(f"warning: {message}")


# ----------------------------------------------------------------------------------------------------------
# loading


@dataclass
class Loaded:
    ckpt: Checkpoint
    model: GPT
    tokenizer: Tokenizer
    device: torch.device
    run_dir: Path


def run_dir_of(checkpoint_dir: Path) -> Path:
    """runs/<run>/checkpoints/step_X -> runs/<run>; a loose checkpoint folder is its own 'run'."""
    checkpoint_dir = Path(checkpoint_dir)
    if checkpoint_dir.parent.name == "checkpoints":
        return checkpoint_dir.parent.parent
    return checkpoint_dir


def load(args: argparse.Namespace, device: torch.device) -> Loaded:
    """The checkpoint the flags name, its model on `device` and its tokenizer; CheckpointError if unusable."""
    if args.checkpoint is not None:
        ckpt = load_checkpoint(args.checkpoint, args.which)
    else:
        ckpt = load_checkpoint(args.run if args.run is not None else latest_run(args.runs_root), args.which)
    model = ckpt.build_model(device)
    try:
        tokenizer = Tokenizer.from_str(ckpt.tokenizer_json)
    except Exception as e:  # noqa: BLE001 - the tokenizers library raises plain Exception for bad JSON
        raise CheckpointError(f"{ckpt.path / 'tokenizer.json'} cannot be read as a tokenizer ({e})") from e
    if tokenizer.vocab_size > ckpt.config.vocab_size:
        raise CheckpointError(
            f"{ckpt.path}: the tokenizer has {tokenizer.vocab_size} tokens but the model only "
            f"{ckpt.config.vocab_size}; tokenizer.json belongs to another model"
        )
    return Loaded(ckpt, model, tokenizer, device, run_dir_of(ckpt.path))


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt_file is None:
        return args.prompt or ""
    try:
        return args.prompt_file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"--prompt-file {args.prompt_file} does not exist") from None
    except (IsADirectoryError, UnicodeDecodeError) as e:
        raise ValueError(f"--prompt-file {args.prompt_file} cannot be read as UTF-8 text ({e})") from None


def encode_prompt(tokenizer: Tokenizer, text: str, block_size: int) -> list[int]:
    """Prompt text -> at most block_size token ids, never empty; problems become warnings on stderr."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ids = tokenizer.encode(text) if text else []
    for w in caught:  # e.g. characters a char-level vocabulary has never seen, mapped to <|unk|>
        warn(f"prompt: {w.message}")
    if not ids:
        if text:
            warn("the prompt encodes to no tokens")
        return [tokenizer.eot_id]  # start from a document boundary, as the training data does
    if len(ids) > block_size:
        warn(
            f"the prompt is {len(ids)} tokens, longer than the model's context (block_size={block_size}); "
            f"keeping its last {block_size} tokens"
        )
        ids = ids[-block_size:]
    return ids


# ----------------------------------------------------------------------------------------------------------
# generation


class StreamDecoder:
    """Tokens in, printable text out, one token at a time.

    Decodes the whole sequence each time and hands out what is new, holding back trailing U+FFFD: with
    byte-level BPE one character can span several tokens, and it decodes only once its last byte is in.
    """

    def __init__(self, tokenizer: Tokenizer, prefix_ids: Sequence[int]):
        self.tokenizer = tokenizer
        self.prefix_len = len(prefix_ids)
        self.ids = list(prefix_ids)
        self.base = tokenizer.decode(self.ids)
        self.emitted = ""

    def push(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        return self._emit(self._text().rstrip("\ufffd"))

    def flush(self) -> str:
        return self._emit(self._text())

    def _text(self) -> str:
        full = self.tokenizer.decode(self.ids)
        if full.startswith(self.base):
            return full[len(self.base) :]
        return self.tokenizer.decode(self.ids[self.prefix_len :])  # a decoder that rewrites across the seam

    def _emit(self, text: str) -> str:
        if not text.startswith(self.emitted):  # the decoder rewrote what is already printed: wait for flush
            return ""
        new, self.emitted = text[len(self.emitted) :], text
        return new


def generate_text(
    model: GPT,
    tokenizer: Tokenizer,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    *,
    temperature: float = 0.8,
    top_k: int | None = None,
    top_p: float | None = None,
    greedy: bool = False,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    on_text: Callable[[str], None] | None = None,
    dtype: str = "auto",
) -> list[int]:
    """Continue prompt_ids (1 <= len <= block_size); return the max_new_tokens generated ids.

    on_text receives the decoded continuation piece by piece as tokens arrive. The context slides past
    block_size (model.generate.generate_stream); with a bf16 dtype the forward passes run under autocast.
    """
    device = next(model.parameters()).device
    idx = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)  # (1, T)
    stream = StreamDecoder(tokenizer, prompt_ids) if on_text is not None else None
    new_ids: list[int] = []
    cached = use_cache and len(prompt_ids) + max_new_tokens <= model.config.block_size  # no window rebuilds
    with autocast(device, pick_dtype(dtype, device)), decoding_threads(device, cached):
        for nxt in generate_stream(
            model, idx, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy,
            use_cache=use_cache, generator=generator,
        ):  # nxt (1, 1)
            new_ids.append(int(nxt.item()))
            if stream is not None and (piece := stream.push(new_ids[-1])):
                on_text(piece)
    if stream is not None and (rest := stream.flush()):
        on_text(rest)
    return new_ids


# ----------------------------------------------------------------------------------------------------------
# attention maps


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
    """Capture the attention of the last block_size tokens of `ids` and write them into out_dir.

    Writes attention.npy, tokens.json, layer_XX.png, summary.json, summary.txt and (html) attention.html, the
    interactive page of attention_lab/viewer.py; with a SummaryWriter, also
    the heatmaps (`<tag_prefix>attention/layer_XX`), the text and the summary table. Returns what it wrote:
    {"weights", "token_ids", "tokens", "text", "summary", "files"}.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
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

    files = [out_dir / "attention.npy", out_dir / "tokens.json", out_dir / "summary.json", out_dir / "summary.txt"]
    np.save(files[0], weights.astype(np.float32))
    write_json_atomic(files[1], {
        "text": text,
        "token_ids": window,
        "tokens": labels,
        "start": len(ids) - len(window),  # position of the first of these tokens in the whole sequence
        "shape": "attention.npy is (n_layer, n_head, T, T): [layer, head, query, key]",
    })
    write_json_atomic(files[2], {"heads": rows, "roles": ROLE_HELP,
                                 "ablation": "loss change in nats/token on this text when the head is zeroed"})
    files[3].write_text(table + "\n", encoding="utf-8")
    if html:
        page_scores = dict(scores) | ({"ablation": ablation} if ablation is not None else {})
        files.append(write_sample_page(out_dir / "attention.html", weights, labels, page_scores,
                                       title=title or "attention"))

    for layer in range(weights.shape[0]):
        fig = attention_figure(weights[layer], labels, f"{title}, layer {layer}".lstrip(", "), dpi=dpi)
        pixels = figure_to_array(fig)  # (H, W, 3) drawn once, for both the PNG and TensorBoard
        png = out_dir / f"layer_{layer:02d}.png"
        matplotlib.image.imsave(png, pixels)
        files.append(png)
        if writer is not None:
            writer.add_image(f"{tag_prefix}attention/layer_{layer:02d}", pixels, step, dataformats="HWC")
    if writer is not None:
        writer.add_text(f"{tag_prefix}text", markdown_code(text), step)
        writer.add_text(f"{tag_prefix}head_summary", markdown_code(table), step)
    return {"weights": weights, "token_ids": window, "tokens": labels, "text": text, "summary": rows, "table": table,
            "scores": scores, "ablation": ablation, "files": files}


def unique_name(parents: Sequence[Path], stamp: str) -> str:
    """stamp, or stamp-2, stamp-3, ... : the first name free in every parent (two calls in one second)."""
    name, n = stamp, 1
    while any((parent / name).exists() for parent in parents):
        n += 1
        name = f"{stamp}-{n}"
    return name


# ----------------------------------------------------------------------------------------------------------
# entry point


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as e:  # argparse has printed the usage and its "error: ..." (or --help)
        return e.code if isinstance(e.code, int) else 2
    try:
        check_args(args)
        device = pick_device(args.device, "--device")
        loaded = load(args, device)
        prompt_text = read_prompt(args)
        prompt_ids = encode_prompt(loaded.tokenizer, prompt_text, loaded.ckpt.config.block_size)
    except (CheckpointError, ValueError, FileNotFoundError) as e:
        say(f"error: {e}")
        return 2

    cfg, tok = loaded.ckpt.config, loaded.tokenizer
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    say(
        f"checkpoint {loaded.ckpt.path} (step {loaded.ckpt.step}; {cfg.n_layer} layers, {cfg.n_head} heads, "
        f"context {cfg.block_size}; {tok.kind} tokenizer, {tok.vocab_size} tokens) on {device}; seed {seed}"
    )
    if args.greedy and args.num_samples > 1:
        warn("--greedy makes every sample the same text")
    generator = torch.Generator(device=device).manual_seed(seed)
    if not prompt_text:
        say("empty prompt: starting from <|endoftext|>, as a new document")
    shown_prompt = tok.decode(prompt_ids) if prompt_text else ""

    def write(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    samples = []
    try:
        for i in range(args.num_samples):
            if args.num_samples > 1:
                write(("\n" if i else "") + f"--- sample {i + 1}/{args.num_samples} ---\n")
            write(shown_prompt)
            t0 = time.perf_counter()
            new_ids = generate_text(
                loaded.model, tok, prompt_ids, args.max_new_tokens, temperature=args.temperature,
                top_k=args.top_k, top_p=args.top_p, greedy=args.greedy, use_cache=not args.no_cache,
                generator=generator, on_text=write, dtype=args.dtype,
            )
            write("\n")
            seconds = time.perf_counter() - t0
            say(f"[{len(new_ids)} tokens in {seconds:.2f} s, {len(new_ids) / max(seconds, 1e-9):.1f} tokens/s]")
            samples.append(prompt_ids + new_ids)
    except KeyboardInterrupt:
        write("\n")
        say("interrupted")
        return 130

    if args.no_attention:
        return 0
    samples_dir, tb_samples_dir = loaded.run_dir / "samples", loaded.run_dir / "tb" / "samples"
    name = unique_name([samples_dir, tb_samples_dir], time.strftime("%Y%m%d-%H%M%S"))
    out_dir = args.out if args.out is not None else samples_dir / name
    tb_dir = tb_samples_dir / name
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        tb_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        say(f"error: cannot create the output folders ({e}); pass --out with a writable folder")
        return 2

    from torch.utils.tensorboard import SummaryWriter  # imported late: it takes a second

    run_name = loaded.run_dir.name
    with contextlib.closing(SummaryWriter(log_dir=str(tb_dir))) as writer:
        writer.add_text("checkpoint", markdown_code(
            f"{loaded.ckpt.path} (step {loaded.ckpt.step})\nseed {seed}, temperature {args.temperature}, "
            f"top_k {args.top_k}, top_p {args.top_p}, greedy {args.greedy}"
        ), loaded.ckpt.step)
        for i, ids in enumerate(samples):
            several = len(samples) > 1
            result = dump_attention(
                loaded.model, tok, ids, out_dir / f"sample_{i:02d}" if several else out_dir, writer=writer,
                tag_prefix=f"sample_{i:02d}/" if several else "", step=loaded.ckpt.step,
                title=f"{run_name} step {loaded.ckpt.step}" + (f", sample {i}" if several else ""),
                html=not args.no_html,
            )
            say(f"\nattention heads{f' (sample {i})' if several else ''}, last {len(result['token_ids'])} tokens:")
            say(result["table"])
            for page in (p for p in result["files"] if p.name == "attention.html"):
                say(f"attention page: {page}  (open it in a browser; it works offline)")
    say(f"\nattention maps: {out_dir}\ntensorboard:    tensorboard --logdir {loaded.run_dir}  (samples under {tb_dir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
