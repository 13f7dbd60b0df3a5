"""Text in, text out: the model to sample from (a run's checkpoint, or a transformers GPT-2 / GPT-NeoX folder or
hub id), a prompt encoded for its context, and its continuation generated and streamed as text piece by piece
(model/generate.py does the token-level sampling; this adds the tokenizer, the dtype and the decoding threads).
sample.py is the command line over it.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from attention_lab.runtime.decoding import decoding_dtype, decoding_layout, decoding_model, decoding_thread_count
from attention_lab.runtime.device import autocast, decoding_threads
from attention_lab.store.checkpoint import choose_run, load_checkpoint, run_summary
from attention_lab.store.layout import run_of_checkpoint
from data.tokenizer import Tokenizer
from model import GPT, GPTConfig, generate_stream

# decoding steps a probe of dtype auto runs per dtype and round (runtime/decoding.py times each but the first, the
# prompt's prefill): cached steps cost one token each, an uncached step a forward pass over the whole context
PROBE_TOKENS = {True: 8, False: 2}


@dataclass
class Source:
    """What sample.py samples from, and where its outputs go (a run folder's samples/ and tb/samples/)."""

    model: GPT
    tokenizer: Tokenizer
    label: str  # the checkpoint folder, or the transformers model
    step: int
    run_dir: Path
    summary: str = ""  # which run (or model) this is, in one line: say it first

    @property
    def config(self) -> GPTConfig:
        return self.model.config


def open_source(run: Path | None, checkpoint: Path | None, hf_model: str | None, which: str, runs_root: Path,
                device: torch.device, preset: str | None = None) -> Source:
    """A run's checkpoint (by default the run choose_run picks under runs_root: the latest of the default preset,
    or of `preset`), or a transformers GPT-2 / GPT-NeoX model: a hub id such as 'gpt2' or a local folder (whose
    samples go to runs_root/hf/<name>/)."""
    if hf_model is not None:
        from attention_lab.interop.hf import load_with_tokenizer  # transformers' side: only when asked for

        model, tokenizer = load_with_tokenizer(hf_model)
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(hf_model).name if Path(hf_model).exists() else hf_model)
        return Source(model.to(device), tokenizer, hf_model, 0, runs_root / "hf" / name,
                      f"model: {hf_model} (transformers)")
    choice = choose_run(runs_root, preset) if checkpoint is None and run is None else None
    ckpt = load_checkpoint(checkpoint or run or choice.path, which)
    return Source(ckpt.build_model(device), ckpt.tokenizer(), str(ckpt.path), ckpt.step, run_of_checkpoint(ckpt.path),
                  run_summary(ckpt, choice))


def encode_prompt(tokenizer: Tokenizer, text: str, block_size: int) -> tuple[list[int], list[str]]:
    """Prompt text -> (at most block_size token ids, never empty; warnings for the user)."""
    notes = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ids = tokenizer.encode(text) if text else []
    notes += [f"prompt: {w.message}" for w in caught]  # e.g. characters a char vocabulary never saw -> <|unk|>
    if not ids:
        if text:
            notes.append("the prompt encodes to no tokens")
        return [tokenizer.eot_id], notes  # start from a document boundary, as the training data does
    if len(ids) > block_size:
        notes.append(f"the prompt is {len(ids)} tokens, longer than the model's context (block_size={block_size}); "
                     f"keeping its last {block_size} tokens")
        ids = ids[-block_size:]
    return ids, notes


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
    keep_first: int = 0,
    threads: int | str = "auto",
    layout: str = "auto",
    on_decoding: Callable[[torch.dtype, int, str], None] | None = None,
) -> list[int]:
    """Continue prompt_ids (1 <= len <= block_size); return the max_new_tokens generated ids.

    on_text receives the decoded continuation piece by piece as tokens arrive (data.tokenizer.TextStream:
    constant work per token). The context slides past block_size (model.generate.generate_stream), keeping the
    first keep_first tokens (StreamingLLM); bf16 decodes with a bf16 copy of the weights on a CPU, under autocast
    on a GPU (runtime/decoding.decoding_model). dtype auto: on a CPU, whichever of float32 and bf16 decodes this
    model faster here, timed on a few greedy steps like these once per machine setup and model shape and kept in a
    file that later processes read (runtime/decoding.py); elsewhere pick_dtype's choice. Cached decoding on a CPU
    then runs in one thread or all of torch's, whichever those steps measured faster in that dtype, kept the same
    way (runtime/decoding.decoding_thread_count); threads=N decodes in N CPU threads, measuring none. Before the
    threads, cached decoding on a CPU measures how to store the weights, by rows as trained or by columns, in one
    thread (runtime/decoding.decoding_layout), whatever the dtype was asked for; layout="rows" or "columns" decodes
    so, measuring none (uncached steps and GPUs keep the rows: decoding_layout).
    on_decoding receives (the dtype, torch's thread count, the layout) once all are settled, before the first token.
    """
    device = next(model.parameters()).device
    idx = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)  # (1, T)
    stream = tokenizer.text_stream(prompt_ids) if on_text is not None else None
    new_ids: list[int] = []
    # cached decoding without window rebuilds: one small matrix-vector step per token
    cached = use_cache and (len(prompt_ids) + max_new_tokens <= model.config.block_size
                            or (model.config.bounded_cache and not keep_first))  # keep_first rebuilds

    def probe(candidate: torch.dtype, layout: str = "rows") -> Iterator[None]:
        """A few greedy steps the way this call decodes, one a next() (runtime/decoding times each step)."""
        start = idx[:, -PROBE_TOKENS[cached]:] if cached else idx
        decoder, cast = decoding_model(model, candidate, device, layout)
        with autocast(device, cast):
            for _ in generate_stream(decoder, start, PROBE_TOKENS[cached], greedy=True, use_cache=cached):
                yield

    # "bf16 weights": bf16 on a CPU is a bf16 copy of the weights (decoding_model), not the autocast of before;
    # "steps timed": the probes' single steps are timed, not whole probes (a new key measures once again)
    key = (repr(model.config), str(next(model.parameters()).dtype), cached, "bf16 weights", "steps timed")
    with decoding_threads(device, 1 if cached else None):  # cached steps' dtype is measured in one thread
        chosen = decoding_dtype(dtype, device, probe, key)

    def probe_layout(layout: str) -> Iterator[None]:  # what the layout's measurement times, in one thread
        with decoding_threads(device, 1):
            yield from probe(chosen, layout)

    if layout == "auto":
        layout = decoding_layout(device, cached, probe_layout, (*key, str(chosen)))

    def probe_threads(count: int) -> Iterator[None]:  # what the thread count's measurement times
        with decoding_threads(device, count):
            yield from probe(chosen, layout)

    if threads == "auto":
        threads = decoding_thread_count(device, cached, probe_threads, (*key, str(chosen), layout))
    with decoding_threads(device, threads):
        if on_decoding is not None:
            on_decoding(chosen, torch.get_num_threads(), layout)
        decoder, cast = decoding_model(model, chosen, device, layout)
        with autocast(device, cast):
            for nxt in generate_stream(
                decoder, idx, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy,
                use_cache=use_cache, generator=generator, keep_first=keep_first,
            ):  # nxt (1, 1)
                new_ids.append(int(nxt.item()))
                if stream is not None and (piece := stream.step(new_ids[-1])):
                    on_text(piece)
    if stream is not None and (rest := stream.flush()):
        on_text(rest)
    return new_ids
