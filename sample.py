"""Continue a prompt with a trained run, streaming the text, then dump the attention maps of the result.

    python sample.py --prompt "ROMEO:"                          # the latest default run's best checkpoint
    python sample.py --preset debug --prompt "ROMEO:"           # the latest run of another preset
    python sample.py --run runs/shakespeare/x --prompt-file prompt.txt --num-samples 3 --seed 1
    python sample.py --prompt "ROMEO:" --greedy --no-cache      # the uncached path, for comparison
    python sample.py --model gpt2 --prompt "The animal didn't cross the street because it"   # a transformers model

For each sample (in the output folder, or in sample_00/, sample_01/, ... when there are several), over the
final window of the sequence (its last block_size tokens): attention.npy (n_layer, n_head, T, T), tokens.json,
layer_XX.png, summary.json / .txt (each head's role scores and ablation effect) and attention.html, the
interactive page (attention_lab/viewer/report.py). The folder defaults to <run>/samples/<YYYYmmdd-HHMMSS>/; the
same maps, text and summary go to TensorBoard under <run>/tb/samples/<same name>/. The generated text goes to
stdout, everything else to stderr, so `python sample.py ... > out.txt` keeps only the text. A run of the LSTM baseline
(model.arch=lstm) generates the same way and writes no attention files: it has no attention.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from attention_lab.runtime.omp import DECODING_SPINCOUNT, bound_spinning

# before torch loads OpenMP: a waiting thread spins long enough to stay awake between a token's small ops, then
# sleeps (attention_lab/runtime/omp.py)
bound_spinning(DECODING_SPINCOUNT)

import torch  # noqa: E402

from attention_lab.runtime import cli  # noqa: E402
from attention_lab.runtime.device import pick_device  # noqa: E402
from attention_lab.sampling import encode_prompt, generate_text, open_source  # noqa: E402
from attention_lab.store.checkpoint import CheckpointError  # noqa: E402
from attention_lab.viewer.report import write_samples  # noqa: E402
from model import has_attention  # noqa: E402


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="sample.py",
                                description="Continue a prompt with a trained run; write the attention maps of the result.")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="text to continue; empty starts from <|endoftext|>")
    src.add_argument("--prompt-file", type=Path, help="read the prompt from this UTF-8 file (for long prompts)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--run", type=Path, help="run folder (default: the latest run under --runs-root)")
    where.add_argument("--checkpoint", type=Path, help="one checkpoint folder (checkpoints/step_XXXXXXXX)")
    where.add_argument("--model", help="a transformers GPT-2 or GPT-NeoX model: hub id (e.g. gpt2) or local folder")
    where.add_argument("--preset", metavar="NAME",
                       help="the latest run of this preset (default: of the default preset, `python train.py`; "
                            "debug, claims and exercise runs open only when named or given here)")
    p.add_argument("--runs-root", type=Path, default=Path("runs"),
                   help="where to look for the run to open when none is named (default: runs)")
    p.add_argument("--which", choices=("best", "latest"), default="best", help="checkpoint of the run (default: best)")
    p.add_argument("--max-new-tokens", type=int, default=200, help="tokens to generate (default: 200)")
    p.add_argument("--temperature", type=float, default=0.8, help="softmax temperature; 0 is greedy (default: 0.8)")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens")
    p.add_argument("--top-p", type=float, default=None, help="sample from the smallest set holding this mass")
    p.add_argument("--greedy", action="store_true", help="always take the most likely token")
    p.add_argument("--num-samples", type=int, default=1, help="samples, one after the other (default: 1)")
    p.add_argument("--seed", type=int, default=None, help="same seed, same text (default: a random one, printed)")
    p.add_argument("--device", default="auto",
                   help="auto (default: cuda if available, else Apple's mps, else cpu), cpu, cuda, cuda:N, mps")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                   help="decoding dtype (bfloat16: on a CPU the weights cast to bf16 once, on a GPU autocast); auto: "
                        "on a CPU whichever of float32 and bf16 decodes faster here (timed once per machine and "
                        "model on a few steps, kept in ~/.cache/attention-lab/measurements.json), bf16 on CUDA "
                        "GPUs, else float32 (MPS too)")
    p.add_argument("--threads", type=threads_flag, default="auto", metavar="{auto,N}",
                   help="CPU threads to decode in; auto (default): with the KV cache one thread or all of torch's, "
                        "whichever decodes faster here (timed once per machine and model, kept beside the dtype's "
                        "measurement), all of them without the cache")
    p.add_argument("--layout", choices=("auto", "rows", "columns"), default="auto",
                   help="how cached decoding on a CPU stores the weights: rows (as trained) or columns (each weight's "
                        "transpose contiguous: the same numbers, another path through memory); auto (default): the "
                        "faster measured here, kept beside the dtype's measurement")
    p.add_argument("--no-cache", action="store_true", help="recompute the whole context at every step")
    p.add_argument("--keep-first", type=int, default=0,
                   help="past the context, keep the first N tokens in the window (StreamingLLM's sinks; default 0)")
    p.add_argument("--out", type=Path, default=None, help="attention output folder (default <run>/samples/<time>)")
    p.add_argument("--no-attention", action="store_true", help="only generate: no attention files or TensorBoard")
    p.add_argument("--no-html", action="store_true", help="no attention.html (the interactive page) beside the maps")
    return p.parse_args(argv)


def threads_flag(text: str) -> int | str:
    """--threads: auto or a whole number >= 1 (argparse prints the error line and the usage)."""
    if text == "auto":
        return text
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be auto or a whole number of threads >= 1, got {text!r}")
    return int(text)


def check_args(args: argparse.Namespace) -> None:
    """Refuse numbers that make no sense, naming the flag (ValueError)."""
    checks = (
        ("--max-new-tokens", args.max_new_tokens, args.max_new_tokens >= 0, "0 or more"),
        ("--temperature", args.temperature, math.isfinite(args.temperature) and args.temperature >= 0,
         "a finite number >= 0 (0 is greedy; 0.8 is the default)"),
        ("--top-k", args.top_k, args.top_k is None or args.top_k >= 1, "1 or more (leave it out to sample from every token)"),
        ("--top-p", args.top_p, args.top_p is None or 0.0 < args.top_p <= 1.0,
         "in (0, 1], e.g. 0.9 (leave it out to sample from every token)"),
        ("--num-samples", args.num_samples, args.num_samples >= 1, "1 or more"),
        ("--keep-first", args.keep_first, args.keep_first >= 0, "0 or more, below the model's block_size"),
    )
    for flag, value, ok, allowed in checks:
        if not ok:
            raise ValueError(f"{flag} must be {allowed}, got {value}")
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out} is a file; give a folder for the attention maps")


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt_file is None:
        return args.prompt or ""
    try:
        return args.prompt_file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"--prompt-file {args.prompt_file} does not exist") from None
    except (IsADirectoryError, UnicodeDecodeError) as e:
        raise ValueError(f"--prompt-file {args.prompt_file} cannot be read as UTF-8 text ({e})") from None


def decoding_line(dtype: torch.dtype, threads: int, layout: str, device: torch.device, args: argparse.Namespace
                  ) -> str:
    """How the sample decoded, e.g. 'decoded in bfloat16 weights stored by columns, 1 CPU thread (auto's ...)'."""
    name = str(dtype).removeprefix("torch.")
    if device.type != "cpu":
        return f"decoded in {name}"
    how = f"{name} weights" if dtype != torch.float32 or layout != "rows" else name
    how += " stored by columns" if layout == "columns" else ""
    how += f", {threads} CPU thread{'s' if threads != 1 else ''}"
    auto = [flag for flag, value in (("--dtype", args.dtype), ("--layout", args.layout), ("--threads", args.threads))
            if value == "auto"]
    if auto:
        flags = " and ".join([", ".join(auto[:-1]), auto[-1]] if len(auto) > 1 else auto)
        how += f" ({flags} auto: the faster measured on this machine; name a value to choose)"
    return f"decoded in {how}"


def say(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


def write(piece: str) -> None:
    sys.stdout.write(piece)
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as e:  # argparse has printed the usage and its "error: ..." (or --help)
        return e.code if isinstance(e.code, int) else 2
    try:
        check_args(args)
        device = pick_device(args.device, "--device")
        src = open_source(args.run, args.checkpoint, args.model, args.which, args.runs_root, device, args.preset)
        say(src.summary)  # which run: the first line a person reads
        if args.keep_first >= src.config.block_size:
            raise ValueError(f"--keep-first must be below the model's block_size {src.config.block_size}, got "
                             f"{args.keep_first}")
        prompt_text = read_prompt(args)
    except (CheckpointError, OSError, *cli.USER_ERRORS) as e:
        return cli.fail(e)
    model, tok = src.model, src.tokenizer
    prompt_ids, notes = encode_prompt(tok, prompt_text, src.config.block_size)
    for note in notes:
        say(f"warning: {note}")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    cfg = src.config
    shape = f"{cfg.n_layer} layers, {cfg.n_head} heads" if has_attention(cfg) else f"LSTM, {cfg.n_layer} layers"
    say(f"{src.label} (step {src.step}; {shape}, context {cfg.block_size}; {tok.kind} tokenizer, "
        f"{tok.vocab_size} tokens) on {device}; seed {seed}")
    if args.greedy and args.num_samples > 1:
        say("warning: --greedy makes every sample the same text")
    if not prompt_text:
        say("empty prompt: starting from <|endoftext|>, as a new document")
    generator = torch.Generator(device=device).manual_seed(seed)
    samples = []
    decoded_in = []  # (dtype, threads) of each sample, said once after the first
    try:
        for i in range(args.num_samples):
            if args.num_samples > 1:
                write(("\n" if i else "") + f"--- sample {i + 1}/{args.num_samples} ---\n")
            write(tok.decode(prompt_ids) if prompt_text else "")
            t0 = time.perf_counter()
            new_ids = generate_text(model, tok, prompt_ids, args.max_new_tokens, temperature=args.temperature,
                                    top_k=args.top_k, top_p=args.top_p, greedy=args.greedy,
                                    use_cache=not args.no_cache, generator=generator, on_text=write, dtype=args.dtype,
                                    keep_first=args.keep_first, threads=args.threads, layout=args.layout,
                                    on_decoding=lambda *how: decoded_in.append(how))
            write("\n")
            seconds = time.perf_counter() - t0
            say(f"[{len(new_ids)} tokens in {seconds:.2f} s, {len(new_ids) / max(seconds, 1e-9):.1f} tokens/s]")
            if i == 0 and decoded_in:
                say(decoding_line(*decoded_in[0], device, args))
            samples.append(prompt_ids + new_ids)
    except KeyboardInterrupt:
        write("\n")
        say("interrupted")
        return 130
    if args.no_attention:
        return 0
    if not has_attention(src.config):  # the maps, summary, page, step inside, circuits and lens all read attention
        say("no attention maps, head summary or page: the run is an LSTM (model.arch=lstm), it has no attention")
        return 0
    header = (f"{src.label} (step {src.step})\nseed {seed}, temperature {args.temperature}, top_k {args.top_k}, "
              f"top_p {args.top_p}, greedy {args.greedy}")
    try:  # the report of each sample: files in the output folder, and TensorBoard beside the run's curves
        write_samples(model, tok, samples, src.run_dir, src.step, header, args.out, not args.no_html, say,
                      checkpoint=src.label if args.model is None else None)
    except OSError as e:
        return cli.fail(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
