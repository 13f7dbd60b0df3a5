"""Export a trained run as a Hugging Face folder: model, tokenizer and generation settings.

    python -m attention_lab.export runs/default/2025-01-01_12-00-00 exported/
    python -m attention_lab.export runs/.../checkpoints/step_00001500 exported/ --which latest
    python -m attention_lab.export RUN OUT --remote-code      # ship our own model code even where not needed

then, anywhere with transformers installed (no attention-lab needed):

    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline
    model = AutoModelForCausalLM.from_pretrained("exported/", trust_remote_code=True)  # the default model's code
    tokenizer = AutoTokenizer.from_pretrained("exported/", trust_remote_code=True)      # (it reads config.json)
    pipeline("text-generation", model=model, tokenizer=tokenizer)("ROMEO:", max_new_tokens=50, do_sample=False)
    model(**tokenizer("ROMEO:", return_tensors="pt"), output_attentions=True).attentions  # sample.py's maps

What each model becomes (attention_lab/interop/convert.py): learned, sinusoidal or no positions -> GPT2LMHeadModel; RoPE ->
GPTNeoXForCausalLM; ALiBi, QK-norm, soft-capped logits, value residual -> our own code in the folder
(`auto_map` in config.json; load with trust_remote_code=True). attention_lab.interop.hf.load_pretrained reads any of them
back, exactly.

A run trained with a learner's attention (model.attn_impl) is refused: every architecture above computes the
built-in attention, not theirs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from attention_lab.interop.hf import export_pretrained, refuse_learner_attention
from attention_lab.runtime import cli
from attention_lab.store.checkpoint import CheckpointError, load_checkpoint


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m attention_lab.export",
        description="Write a run's checkpoint as a folder that transformers' AutoModelForCausalLM, AutoTokenizer "
        "and pipeline('text-generation') load.",
    )
    p.add_argument("source", type=Path, help="a run folder, its checkpoints/ folder, or one checkpoint folder")
    p.add_argument("out", type=Path, help="folder to write (new, empty, or an earlier export, which is replaced)")
    p.add_argument("--which", choices=("best", "latest"), default="best",
                   help="checkpoint of a run folder to export (default: best, else latest)")
    p.add_argument("--remote-code", action="store_true",
                   help="ship attention-lab's model code (trust_remote_code=True) even where GPT-2 / GPT-NeoX fit")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as e:  # argparse printed the usage and its error (or --help)
        return e.code if isinstance(e.code, int) else 2
    return cli.run(lambda: export(args), CheckpointError)


def export(args: argparse.Namespace) -> None:
    ckpt = load_checkpoint(args.source, args.which)
    refuse_learner_attention(ckpt.meta.get("attn_impl"))  # before build_model, which would run the learner's file
    result = export_pretrained(ckpt.build_model("cpu"), args.out, ckpt.tokenizer_json, remote_code=args.remote_code)
    cfg = ckpt.config
    print(f"exported {ckpt.path} (step {ckpt.step}; {cfg.n_layer} layers x {cfg.n_head} heads x {cfg.n_embd} wide, "
          f"{cfg.pos_encoding} positions, context {cfg.block_size}) as {result.plan.architecture} to {result.path}")
    remote = result.plan.target == "remote"
    if remote:
        print("with attention-lab's model code in the folder, because " + "; ".join(result.plan.reasons))
    trust = ", trust_remote_code=True" if remote else ""
    print(f"files: {', '.join(result.files)}")
    print("load it with:\n"
          f"    AutoModelForCausalLM.from_pretrained({str(result.path)!r}{trust})\n"
          f"    AutoTokenizer.from_pretrained({str(result.path)!r}{trust})\n"
          f"    pipeline('text-generation', model={str(result.path)!r}{trust})")
    when = "" if remote else " (load with attn_implementation='eager': transformers' own class returns none under sdpa)"
    print(f"attention weights, as sample.py writes them: model(**inputs, output_attentions=True).attentions{when}")


if __name__ == "__main__":
    sys.exit(main())
