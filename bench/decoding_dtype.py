"""Decoding speed per dtype, and what `--dtype auto` picks here (attention_lab/runtime/decoding.py).

    python -m bench.decoding_dtype              the default run's model shape, 5 rounds (about a minute)
    python -m bench.decoding_dtype --quick      a tiny model, seconds: checks that it runs

Each round decodes with sampling.generate_text (the path sample.py and the lab take) in float32, then in bf16
(on a CPU: the weights cast to bf16 once, no autocast; runtime/decoding.decoding_model), the cached path with the
weights stored by rows and by columns (runtime/decoding.decoding_layout), interleaved (A, B, A, B, ...), so a
neighbour's load falls on all; tokens/s are medians, the ratio is the median of the per-round ratios.
Two paths:
    cached     sample.py: a 16-token prompt and N new tokens with the KV cache (one token per forward pass)
    uncached   the lab: one new token after a full window (a forward pass over block_size / 2 tokens)
"auto picks" runs the real measurement once per path, afresh (what a first `sample.py` on this machine pays), and
its one-time cost; it overwrites auto's stored measurement for these shapes (the file named under the table:
runtime/decoding.py keeps one per CPU, torch version, bf16 flags, thread count and model shape, so later processes
read it instead of measuring). Weights are random: a step's cost does not depend on them.
"""

from __future__ import annotations

import argparse
import statistics
import time

from attention_lab.runtime.omp import DECODING_SPINCOUNT, bound_spinning

bound_spinning(DECODING_SPINCOUNT)  # before torch loads OpenMP, as sample.py does

import torch  # noqa: E402

from attention_lab.runtime import decoding  # noqa: E402
from attention_lab.runtime.device import cpu_model  # noqa: E402
from attention_lab.sampling import generate_text  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402


def default_model(quick: bool) -> GPT:
    torch.manual_seed(0)
    if quick:
        return GPT(GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=2, n_embd=32, bias=False,
                             pos_encoding="rope", qk_norm=True)).eval()
    # the default run's model: configs/model/small.yaml with the BPE-4096 vocabulary
    return GPT(GPTConfig(vocab_size=4096, block_size=512, n_layer=4, n_head=4, n_embd=256, bias=False,
                         pos_encoding="rope", qk_norm=True)).eval()


def machine() -> str:
    caps = torch.cpu.get_capabilities()
    return (f"CPU {caps.get('cpu_name') or cpu_model()} (avx512_bf16: {bool(caps.get('avx512_bf16'))}, "
            f"amx_bf16: {bool(caps.get('amx_bf16'))}), {torch.get_num_threads()} torch threads, torch {torch.__version__}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tokens", type=int, default=200, help="new tokens per cached decode")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    model = default_model(args.quick)
    block = model.config.block_size
    rounds, tokens = (2, 8) if args.quick else (args.rounds, args.tokens)
    prompt_cached = list(range(1, 17))
    if len(prompt_cached) + tokens > block:  # past the context the cache is rebuilt: that would be timed instead
        p.error(f"--tokens {tokens}: at most {block - len(prompt_cached)} with this model (block_size {block} holds "
                f"the {len(prompt_cached)}-token prompt and the new tokens; past it every step is a full window)")
    prompt_window = [1 + i % 200 for i in range(block // 2)]
    most = torch.get_num_threads()
    threads = sorted({1, most})

    def cached(dtype: str, count: int | str = "auto", layout: str = "auto", **kwargs) -> object:
        return generate_text(model, None, prompt_cached, tokens, greedy=True, dtype=dtype, threads=count,
                             layout=layout, **kwargs)

    def uncached(dtype: str, count: int | str = "auto", layout: str = "auto", **kwargs) -> object:
        return generate_text(model, None, prompt_window, 1, greedy=True, use_cache=False, dtype=dtype, threads=count,
                             layout=layout, **kwargs)

    # (path, new tokens a call, the ways timed: (dtype, threads, layout)); the lab's uncached path keeps every
    # thread and the rows
    paths = [("cached (sample.py)", cached, tokens,
              [(d, n, lay) for d in ("float32", "bfloat16") for lay in ("rows", "columns") for n in threads]),
             ("uncached (the lab)", uncached, 1, [(d, most, "rows") for d in ("float32", "bfloat16")])]
    print(f"### Decoding: float32 vs bf16 (weights), one thread vs {most}, and auto\n\n{machine()}; shared cores "
          f"(other work ran beside it)\n\n- {rounds} rounds, interleaved; model {model.config.n_layer} layers x "
          f"{model.config.n_embd} wide, vocab {model.config.vocab_size}; tok/s medians, 'x' the median of "
          f"per-round ratios against float32 in one thread (cached) or in {most} (uncached)\n")
    print("| path | dtype | threads | weights stored by | tok/s | against the first row | auto picks | "
          "auto's one-time measurement |")
    print("|---|---|--:|---|--:|--:|---|--:|")
    for name, decode, new, ways in paths:
        repeat = 1 if new > 1 else (2 if args.quick else 5)  # the uncached path: 5 one-token calls a sample
        times: dict[tuple[str, int, str], list[float]] = {way: [] for way in ways}
        for way in ways:  # warm-up
            decode(*way)
        for _ in range(rounds):
            for way in ways:
                start = time.perf_counter()
                for _ in range(repeat):
                    decode(*way)
                times[way].append((time.perf_counter() - start) / repeat)
        decoding.forget_measurements()
        picked = []
        with decoding.measuring_afresh():
            start = time.perf_counter()
            decode("auto", on_decoding=lambda dtype, count, layout: picked.append(
                (str(dtype).removeprefix("torch."), count, layout)))
            first = time.perf_counter() - start
        (picked,) = picked  # what sampling decoded in: its own choice, said by generate_text
        tok_s = {way: new / statistics.median(t) for way, t in times.items()}
        spent = first - new / tok_s.get(picked, tok_s[ways[0]])
        for i, way in enumerate(ways):
            ratio = statistics.median(a / b for a, b in zip(times[ways[0]], times[way], strict=True))
            pick = (f"{picked[0]}, {picked[1]} thread(s), {picked[2]}", f"{spent * 1e3:,.0f} ms") if i == 0 else ("", "")
            print(f"| {name if i == 0 else ''} | {way[0]} | {way[1]} | {way[2]} | {tok_s[way]:,.0f} | {ratio:.2f}x | "
                  f"{pick[0]} | {pick[1]} |")
    print(f"\nauto's measurements are kept in {decoding.cache_file()} (paid once per CPU, torch version, thread count "
          f"and model shape; delete the file to measure again)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
