"""Greedy decoding tokens/s: ours with and without the KV cache, and Hugging Face `generate` with and without.

One prompt (batch 1) and a block_size that holds prompt + every new token: past block_size our cache is
rebuilt every step by design (model/generate.py), which would measure that instead of the cache. Both models
have the same weights (bench/twins.py), so greedy decoding should give the same tokens; the table says
whether it did. Random-init logits are nearly flat, so a 1e-6 difference may flip a near-tie and the sequences
part ways from there; so a difference alone proves nothing. What must hold is checked before any timing
(`check_greedy`): every token each decoder chose is a greedy choice of our model (uncached, full forward) up to
a near-tie; otherwise the run stops with an error naming the decoder and the position.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from attention_lab.runtime.decoding import decoding_layout, decoding_model, decoding_thread_count
from attention_lab.runtime.device import decoding_threads
from model import GPTConfig
from model.generate import generate, generate_stream

from .common import Column, Context, Table, interleaved, log, median, median_interval, paired_ratio, spread, verdict
from .twins import build_hf, build_ours, check_same_function, hf_attention

HF_SPEEDUP_TARGET = 2.0  # ours cached / HF cached, small size
CACHE_SPEEDUP_TARGET = 5.0  # ours cached / ours uncached, 500 new tokens

FULL = dict(
    cfg=GPTConfig(vocab_size=4096, block_size=1024, n_layer=4, n_head=4, n_embd=128), prompt=16, new=(200, 500),
    reps=6,
)
QUICK = dict(cfg=GPTConfig(vocab_size=256, block_size=64, n_layer=2, n_head=2, n_embd=32), prompt=4, new=(4, 8), reps=1)


def decoders(ours, hf, prompt: torch.Tensor, n_new: int, threads: int, cached=None) -> dict:
    """The greedy decoders being compared, each a closure returning prompt + n_new tokens (1, T + n_new).

    Ours run as sample.py runs them: cached decoding with `cached` (ours with its weights stored the way sampling
    measures faster: cached_decoder; ours itself when None) in `threads` (cached_threads: what sampling measures),
    uncached with every thread, ours as trained. Hugging Face's cached decoding runs both ways, with torch's
    threads (what a user of transformers gets) and with the same threads as ours, so the comparison is against its
    faster setting."""
    from transformers import GenerationConfig

    mask = torch.ones_like(prompt)
    device = prompt.device

    def hf_config(use_cache: bool) -> GenerationConfig:
        # eos None: a random model must not stop early; pad set so transformers does not warn about it
        return GenerationConfig(
            max_new_tokens=n_new, do_sample=False, use_cache=use_cache, pad_token_id=0, eos_token_id=None
        )

    hf_cached, hf_uncached = hf_config(True), hf_config(False)

    def ours_cached():
        with decoding_threads(device, threads):
            return generate(ours if cached is None else cached, prompt, n_new, greedy=True, use_cache=True)

    def hf_cached_our_threads():
        with decoding_threads(device, threads):
            return hf.generate(prompt, attention_mask=mask, generation_config=hf_cached)

    return {
        "ours_cached": ours_cached,
        "ours_uncached": lambda: generate(ours, prompt, n_new, greedy=True, use_cache=False),
        "hf_cached": lambda: hf.generate(prompt, attention_mask=mask, generation_config=hf_cached),
        "hf_cached_our_threads": hf_cached_our_threads,
        "hf_uncached": lambda: hf.generate(prompt, attention_mask=mask, generation_config=hf_uncached),
    }


TIE_TOL = 1e-4  # relative: a token whose logit is within TIE_TOL * (1 + max |logit|) of the best is a near-tie


@torch.no_grad()
def check_greedy(ours, outputs: dict[str, torch.Tensor], n_prompt: int, tol: float = TIE_TOL) -> int:
    """Raise RuntimeError unless every decoder's output (1, T) is greedy under `ours`: at each generated position
    the chosen token's logit, from one uncached forward pass over the sequence, is the maximum up to
    tol * (1 + max |logit|). Returns the number of generated tokens that were near-ties rather than the argmax.
    A broken cache or a wrong weight mapping picks tokens far below the maximum; float noise only flips ties."""
    ties = 0
    for name, seq in outputs.items():
        logits = ours(seq[:, :-1]).logits[0, n_prompt - 1:].float()  # (new, V): predictions of the new tokens
        chosen = logits.gather(-1, seq[0, n_prompt:, None])[:, 0]  # (new,)
        best = logits.max(-1).values
        gap = best - chosen
        allowed = tol * (1 + logits.abs().max(-1).values)
        bad = (gap > allowed).nonzero()
        if len(bad):
            i = bad[0, 0].item()
            raise RuntimeError(
                f"{name} chose token {seq[0, n_prompt + i].item()} at new position {i}, {gap[i].item():.2e} below "
                f"the best logit of our model (allowed {allowed[i].item():.1e}): it does not decode greedily the "
                "function the benchmark compares (a broken KV cache, or twins that differ), so its timing would "
                "mean nothing")
        ties += int((gap > 0).sum())
    return ties


def cached_decoder(ours, prompt: torch.Tensor) -> tuple[torch.nn.Module, str]:
    """(what our cached decoding runs, its layout): ours with its weights stored by rows or by columns, chosen as
    sample.py chooses: the faster measured on a few greedy steps in one thread (runtime/decoding.decoding_layout,
    kept with sampling's measurements)."""
    device = prompt.device

    def probe(layout: str) -> Iterator:  # one greedy step a next(), as runtime/decoding times them
        with decoding_threads(device, 1):
            yield from generate_stream(decoding_model(ours, torch.float32, device, layout)[0], prompt, 8, greedy=True)

    layout = decoding_layout(device, True, probe, ("bench.generation", repr(ours.config), "steps timed"))
    return decoding_model(ours, torch.float32, device, layout)[0], layout


def cached_threads(ours, prompt: torch.Tensor, layout: str = "rows") -> int:
    """The torch threads our cached decoding runs in here, chosen as sample.py chooses them: one or all, the faster
    measured on a few greedy steps with the weights stored by `layout` (runtime/decoding.decoding_thread_count,
    kept with sampling's measurements)."""
    device = prompt.device
    decoder = decoding_model(ours, torch.float32, device, layout)[0]

    def probe(threads: int) -> Iterator:  # one greedy step a next(), as runtime/decoding times them
        with decoding_threads(device, threads):
            yield from generate_stream(decoder, prompt, 8, greedy=True)

    return decoding_thread_count(device, True, probe, ("bench.generation", repr(ours.config), layout, "steps timed"))


def run(ctx: Context) -> Table:
    setting = QUICK if ctx.quick else FULL
    cfg, device = setting["cfg"], ctx.device
    check_same_function(cfg, device)  # the twins compute one function (checked where an error would show)
    ours = build_ours(cfg, device).eval()
    hf = build_hf(ours, device).eval()
    gen = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, cfg.vocab_size, (1, setting["prompt"]), generator=gen).to(device)
    cached, layout = cached_decoder(ours, prompt)
    threads = cached_threads(ours, prompt, layout)

    rows = []
    for n_new in setting["new"]:
        assert setting["prompt"] + n_new <= cfg.block_size, "prompt + new tokens must fit in block_size"
        log(f"generation: {n_new} new tokens ...")
        fns = decoders(ours, hf, prompt, n_new, threads, cached)
        outputs = {name: fn() for name, fn in fns.items()}  # doubles as the first warmup round
        same = all(torch.equal(outputs["ours_cached"], out) for out in outputs.values())
        ties = check_greedy(ours, outputs, setting["prompt"])  # raises unless every token is greedy
        times = interleaved(fns, device, reps=setting["reps"], warmup=0)
        tps = {name: n_new / median(t) for name, t in times.items()}
        # Hugging Face's faster cached setting, round by round
        hf_best = [min(a, b) for a, b in zip(times["hf_cached"], times["hf_cached_our_threads"], strict=True)]
        # the round-by-round ratios, their median and an interval for it: the verdict may be "cannot tell"
        vs_hf = [h / o for h, o in zip(hf_best, times["ours_cached"], strict=True)]
        lo, hi, coverage = median_interval(vs_hf)
        rows.append(
            {
                "new_tokens": n_new,
                **{f"{name}_tok_s": v for name, v in tps.items()},
                "cached_vs_hf_cached": median(vs_hf),
                "cached_vs_hf_interval": f"{lo:.2f}x-{hi:.2f}x ({coverage:.0%})",
                "hf_verdict": verdict(lo, hi, HF_SPEEDUP_TARGET),
                "cached_vs_uncached": paired_ratio(times["ours_uncached"], times["ours_cached"]),
                "uncached_vs_hf_uncached": paired_ratio(times["hf_uncached"], times["ours_uncached"]),
                "same_tokens": same,
                "near_ties": ties,
                "spread": max(spread(t) for t in times.values()),
            }
        )
    last = rows[-1]
    summary = {
        "hf_target": ("met" if all(r["hf_verdict"] == "met" for r in rows)
                      else "missed" if any(r["hf_verdict"] == "missed" for r in rows) else "cannot tell"),
        "cache_target_met": last["cached_vs_uncached"] >= CACHE_SPEEDUP_TARGET,
        "hf_attn_implementation": hf_attention(hf),
    }
    return Table(
        name="generate",
        title="Greedy generation: ours (KV cache / none) vs Hugging Face generate (cache / none)",
        machine=ctx.machine,
        columns=[
            Column("new_tokens", "new tokens"),
            Column("ours_cached_tok_s", "ours cache tok/s", "{:,.0f}"),
            Column("ours_uncached_tok_s", "ours no-cache tok/s", "{:,.0f}"),
            Column("hf_cached_tok_s", "HF cache tok/s", "{:,.0f}"),
            Column("hf_cached_our_threads_tok_s", "HF cache, our threads tok/s", "{:,.0f}"),
            Column("hf_uncached_tok_s", "HF no-cache tok/s", "{:,.0f}"),
            Column("cached_vs_hf_cached", "ours cache / HF cache (its faster)", "{:.2f}x"),
            Column("cached_vs_hf_interval", "interval of that median (coverage)"),
            Column("hf_verdict", ">= 2x HF?"),
            Column("cached_vs_uncached", "ours cache / ours no-cache", "{:.2f}x"),
            Column("uncached_vs_hf_uncached", "ours no-cache / HF no-cache", "{:.2f}x"),
            Column("same_tokens", "same tokens"),
            Column("near_ties", "near-tie tokens"),
            Column("spread", "spread", "{:.0%}"),
        ],
        rows=rows,
        notes=[
            f"Model L{cfg.n_layer} H{cfg.n_head} C{cfg.n_embd} V{cfg.vocab_size}, block_size {cfg.block_size}; "
            f"batch 1, random {setting['prompt']}-token prompt; tok/s = new tokens / wall time of the whole call "
            "(prefill included).",
            f"HF: GPT2LMHeadModel.generate(do_sample=False, use_cache=True/False, pad_token_id=0, eos_token_id=None), "
            f"attn_implementation={hf_attention(hf)!r}; the five calls interleaved, {setting['reps']} rounds after "
            "one warmup round; ratios are medians of per-round time ratios.",
            f"Ours cached as sample.py decodes: float32 weights stored by {layout} (rows as trained or columns, the "
            "faster measured: attention_lab.runtime.decoding.decoding_layout), in "
            f"{threads} torch thread(s) (one or all, the faster measured: "
            "attention_lab.runtime.decoding.decoding_thread_count); every other call with torch's threads; HF cached "
            "also with "
            "ours ('our threads'), and ours cache / HF cache compares with the faster of HF's two, round by round.",
            f"Checked before timing: every token of every decoder is a greedy choice of our model (one uncached "
            f"forward pass) up to a near-tie (within {TIE_TOL:g} x (1 + max |logit|)); near-tie tokens counts the "
            "tokens that were such a tie rather than the argmax (they explain a 'no' under same tokens).",
            ("--quick: tiny model, the targets below mean nothing here. " if ctx.quick else "")
            + f"Targets: ours cache / HF cache >= {HF_SPEEDUP_TARGET:.0f}x: {summary['hf_target']} (met: every "
            "row's interval at or above it; missed: one below it; the interval is the distribution-free one for the "
            "median of the rounds' ratios, bench.common.median_interval); ours cache / ours no-cache >= "
            f"{CACHE_SPEEDUP_TARGET:.0f}x at {last['new_tokens']} tokens: "
            f"{'met' if summary['cache_target_met'] else 'MISSED'}.",
        ],
        summary=summary,
    )
