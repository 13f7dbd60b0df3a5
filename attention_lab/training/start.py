"""What a run starts from: the model's config checked against the corpus, and its weights: a fresh model,
this run's (or train.resume's) latest checkpoint, or GPT-2's weights (train.init_from)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from attention_lab.exercises.learner import learner_of, plug
from attention_lab.store.checkpoint import load_checkpoint
from attention_lab.store.layout import RunLayout
from attention_lab.training.config import Config
from data.prepare import PreparedData
from model import GPTConfig, LSTMConfig, arch_of, build_model

# the fields that decide the shapes of the weights: a checkpoint must agree on all of them to be resumed
SHAPE_FIELDS = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "bias", "pos_encoding",
                "tie_embeddings", "mlp_ratio", "n_kv_head", "attn_sinks", "attention")
LSTM_SHAPE_FIELDS = ("vocab_size", "block_size", "n_layer", "n_embd", "tie_embeddings")


class TrainingError(RuntimeError):
    """A problem the user can fix (bad config for this corpus, checkpoint mismatch, diverged loss)."""


def resolve_model_config(cfg: Config, data: PreparedData) -> GPTConfig | LSTMConfig:
    """The config of the network to train (the GPT, or the LSTM: model.arch) with the tokenizer's vocabulary
    size, checked against the corpus."""
    model_cfg = cfg.model.network(vocab_size=data.meta["vocab_size"])
    for split in ("train", "val"):
        n = data.meta[split]["tokens"]
        if n < model_cfg.block_size + 1:
            raise TrainingError(
                f"the {split} split has {n} tokens, fewer than one context window plus one "
                f"(model.block_size={model_cfg.block_size}); lower model.block_size or use a larger corpus"
            )
    return model_cfg


def check_resumable(saved: GPTConfig | LSTMConfig, wanted: GPTConfig | LSTMConfig, where: Path) -> None:
    if arch_of(saved) != arch_of(wanted):
        diff = [f"model.arch: checkpoint {arch_of(saved)!r}, config {arch_of(wanted)!r}"]
    else:
        diff = [f"{f}: checkpoint {getattr(saved, f)!r}, config {getattr(wanted, f)!r}"
                for f in (SHAPE_FIELDS if arch_of(saved) == "gpt" else LSTM_SHAPE_FIELDS)
                if getattr(saved, f) != getattr(wanted, f)]
    if diff:
        raise TrainingError(
            f"cannot resume from {where}: the checkpoint's model has another shape ({'; '.join(diff)}). "
            "Use the same model settings as the checkpoint, or start a fresh run (another hydra.run.dir, "
            "without train.resume)."
        )


def resume_source(cfg: Config, run_dir: Path) -> Path | None:
    """What this run resumes from: train.resume, else its own folder when that has checkpoints; None: a fresh
    start."""
    if cfg.train.resume:
        return Path(cfg.train.resume)
    return run_dir if RunLayout(run_dir).latest_pointer.exists() else None


def load_model(cfg: Config, model_cfg: GPTConfig | LSTMConfig, data: PreparedData, run_dir: Path, say=print):
    """The model from this run's (or train.resume's) latest checkpoint, from GPT-2 weights, or fresh, with the
    learner's attention plugged in when model.attn_impl names one (this run's setting, also on resume).

    Returns (model on the CPU, its config, the checkpoint's train state (TrainState.state_dict) or None,
    the checkpoint's meta.json or {}).
    """
    model, model_cfg, state, meta = _load_model(cfg, model_cfg, data, run_dir, say)
    if cfg.model.attn_impl:
        plug(model, cfg.model.attn_impl)
        say(f"attention: your {learner_of(model).spec} (model.attn_impl), not the built-in"
            + (f"; model.dropout={model_cfg.dropout} still drops the residual and MLP outputs, but not attention "
               "weights: your attention(q, k, v) returns none to drop" if model_cfg.dropout else ""))
    return model, model_cfg, state, meta


def _load_model(cfg: Config, model_cfg: GPTConfig | LSTMConfig, data: PreparedData, run_dir: Path, say=print):
    tc = cfg.train
    if tc.init_from and arch_of(model_cfg) != "gpt":
        raise TrainingError(f"train.init_from={tc.init_from} loads GPT-2 weights into a GPT; model.arch=lstm "
                            "trains from scratch (leave train.init_from out)")
    resume_from = resume_source(cfg, run_dir)
    if resume_from is not None:
        ckpt = load_checkpoint(resume_from, which="latest")
        if tc.init_from:  # the run began from GPT-2 weights: the checkpoint has that model's shape
            model_cfg = dataclasses.replace(model_cfg, **{f: getattr(ckpt.config, f) for f in SHAPE_FIELDS})
        check_resumable(ckpt.config, model_cfg, ckpt.path)
        if ckpt.tokenizer_json != data.tokenizer.to_str():
            raise TrainingError(
                f"cannot resume from {ckpt.path}: it was trained with another tokenizer than the prepared data's "
                f"({data.dir}). Use the same data settings as that run."
            )
        # this run's dropout, backend (auto: the checkpoint's, training/backend.py) and attention (load_model plugs
        # it), the checkpoint's weights
        model = ckpt.build_model("cpu", model_cfg, attn_impl="")
        state = ckpt.train_state()
        say(f"resuming from {ckpt.path} (step {state['step']})")
        return model, model_cfg, state, ckpt.meta
    if tc.init_from:
        from attention_lab.interop.hf import load_gpt2

        model = load_gpt2(tc.init_from)
        if model.config.vocab_size != model_cfg.vocab_size:
            raise TrainingError(
                f"train.init_from={tc.init_from} has a {model.config.vocab_size}-token vocabulary but the prepared "
                f"data's tokenizer has {model_cfg.vocab_size}; use that model's tokenizer: "
                "data.tokenizer=file data.tokenizer_file=<its tokenizer.json>"
            )
        return model, model.config, None, {}
    return build_model(model_cfg), model_cfg, None, {}
