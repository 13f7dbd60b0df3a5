"""The run's typed configuration and its Hydra schema.

Hydra stops at the entry point: the dataclasses below are registered as structured-config schemas, so a
misspelt key in a YAML file or an override fails when the config is composed; `to_config` turns the composed
DictConfig into these typed objects (running every `__post_init__` check) and nothing below the entry point
sees a DictConfig.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from data.config import DataConfig
from model import ARCHS, ATTENTION_BACKENDS, GPTConfig, LSTMConfig, arch_of, lstm_matching

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"  # attention_lab/training/config.py -> the repo
DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "float32", "bfloat16", "float16")
STOPS = ("steps", "budget")  # train.stop: what ends a run with a time budget
# model.attn_backend: GPTConfig's two, or auto, which train.py turns into one of them by a measurement on a CPU
# (sdpa on a GPU) before the model is built (attention_lab/training/backend.py); the model never sees "auto"
ATTN_BACKENDS = ("auto", *ATTENTION_BACKENDS)


OPTIMIZERS = ("adamw", "muon")
SCHEDULES = ("cosine", "wsd")


@dataclass
class OptimConfig:
    name: str = "adamw"  # adamw, or muon: Muon for the blocks' matrices, AdamW for the rest (attention_lab/training/optim.py)
    lr: float = 1e-3  # AdamW's peak learning rate, reached after warmup
    min_lr: float = 1e-4  # the schedule ends here (Muon's ends at the same fraction of muon_lr)
    muon_lr: float = 0.02  # Muon's peak learning rate (name=muon)
    muon_momentum: float = 0.95
    muon_ns_steps: int = 5  # Newton-Schulz iterations per Muon update (each: 3 matmuls per matrix)
    muon_ns_dtype: str = "auto"  # Muon's Newton-Schulz iteration: auto (bf16 on a GPU or a CPU with native bf16), float32, bfloat16
    schedule: str = "cosine"  # cosine, or wsd: warmup, constant, then linear decay over decay_frac of the run
    decay_frac: float = 0.5  # wsd: the share of the run spent decaying
    warmup_steps: int = 100
    decay_steps: Optional[int] = None  # where the schedule reaches min_lr; None: at train.max_steps
    weight_decay: float = 0.1  # on matrices only: not on biases, LayerNorm gains or positions
    beta1: float = 0.9
    beta2: float = 0.99
    eps: float = 1e-8
    grad_clip: float = 1.0  # clip the global gradient norm; 0 disables

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise ValueError(f"optim.name={self.name!r} is not one of {', '.join(OPTIMIZERS)}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"optim.schedule={self.schedule!r} is not one of {', '.join(SCHEDULES)}")
        if not 0.0 < self.decay_frac <= 1.0:
            raise ValueError(f"optim.decay_frac={self.decay_frac} must be in (0, 1]")
        if self.muon_ns_dtype not in ("auto", "float32", "bfloat16"):
            raise ValueError(f"optim.muon_ns_dtype={self.muon_ns_dtype!r} is not one of auto, float32, bfloat16")
        if not 0.0 <= self.muon_momentum < 1.0:
            raise ValueError(f"optim.muon_momentum={self.muon_momentum} must be in [0, 1)")
        _positive("optim", self, ("lr", "eps", "muon_lr", "muon_ns_steps"))
        _non_negative("optim", self, ("min_lr", "warmup_steps", "weight_decay", "grad_clip"))
        if self.min_lr > self.lr:
            raise ValueError(f"optim.min_lr={self.min_lr} must not exceed optim.lr={self.lr}")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"optim.{name}={getattr(self, name)} must be in [0, 1)")
        if self.decay_steps is not None and self.decay_steps < 1:
            raise ValueError(f"optim.decay_steps={self.decay_steps} must be None or >= 1")


@dataclass
class TrainConfig:
    seed: int = 1337
    device: str = "auto"  # auto: cuda if available, else Apple's mps if available, else cpu
    dtype: str = "auto"  # auto: bf16 autocast on a GPU that has it or a CPU with AMX/AVX512-BF16; float32 elsewhere
    # torch.compile the model (inductor): true, false, or auto = compiled on CUDA, and on a CPU with AMX-BF16 when its
    # own training step measures faster, the compile's seconds paid from the budget (attention_lab/training/compiling.py);
    # never on MPS
    compile: Any = False
    batch_size: int = 16  # sequences per micro-batch per process
    grad_accum: int = 1  # micro-batches per optimizer step
    # the training loss over this many positions' logits at a time (model.gpt.chunked_next_token_loss): the same
    # number and gradient without a float32 copy of every logit; 0 = all at once (model(x, y).loss); auto = the
    # faster of the two as measured on this CPU at the run's shape (attention_lab/training/loss_chunk.py; 0 on a GPU)
    loss_chunk: Any = 0
    repeat_frac: float = 0.0  # share of training windows that hold a passage twice (induction curriculum)
    max_steps: int = 2000
    max_minutes: Optional[float] = None  # wall-clock budget: evaluate, save and stop once it is spent
    # what ends a run that has a time budget: "steps" max_steps, or the budget if it is spent first (the schedule
    # by steps, or by the budget's share when further along) | "budget" the budget alone: max_steps is the steps
    # it was sized for, the schedule follows the clock, and a faster machine trains more steps instead of stopping
    # early at max_steps (loop.schedule_position). Without max_minutes both are "steps"
    stop: str = "steps"
    eval_interval: int = 250  # evaluate, log attention and save a checkpoint every this many steps
    eval_batches: int = 20  # fixed validation batches per evaluation
    log_interval: int = 10
    keep_checkpoints: int = 2  # newest step folders kept besides the best
    # snapshots between evaluations, at each 1/N of the run (steps or the time budget, whichever is further along,
    # as the schedule counts): the film's prompt's attention (a film frame) and a light checkpoint (weights only,
    # never pruned, never resumed from), for the film and the lab's slider; milliseconds each, where an
    # evaluation costs seconds. 0 = none
    snapshots: int = 0
    resume: Optional[str] = None  # a run or checkpoint folder; a run folder that has checkpoints resumes itself
    init_from: Optional[str] = None  # start from weights: a Hugging Face GPT-2 id or folder (e.g. gpt2)
    sample_tokens: int = 200  # text generated at each evaluation for TensorBoard
    # the film's prompt: its attention at every evaluation is the film (attention/probe.json); samples start from it
    probe_prompt: str = "ROMEO:\nBut soft, what light through yonder window breaks?"
    tensorboard: bool = True
    head_roles: bool = True  # measure every head's role (attention_lab/interp/heads.py) at evaluations
    head_roles_every: int = 1  # ... at every this-many-th evaluation
    head_ablation: bool = True  # ... and the loss change when each head alone is zeroed
    probe_batch: int = 8  # sequences in the repeated-tokens probe and the validation windows it scores
    film: bool = True  # rewrite <run>/attention.html, the interactive training film, at every evaluation
    progress: bool = True  # tqdm progress bar
    peak_flops: Optional[float] = None  # MFU denominator in FLOP/s; None: measured at start
    num_threads: Optional[int] = None  # torch CPU threads; None: torch's default

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"train.device={self.device!r} is not one of {', '.join(DEVICES)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"train.dtype={self.dtype!r} is not one of {', '.join(DTYPES)}")
        _positive("train", self, ("batch_size", "grad_accum", "max_steps", "eval_interval", "eval_batches",
                                  "log_interval", "keep_checkpoints", "head_roles_every", "probe_batch"))
        _non_negative("train", self, ("sample_tokens", "snapshots"))
        if self.compile not in ("auto", True, False):
            raise ValueError(f"train.compile={self.compile!r} must be auto, true or false")
        self.compile = self.compile if self.compile == "auto" else bool(self.compile)
        if self.loss_chunk != "auto" and (isinstance(self.loss_chunk, bool) or not isinstance(self.loss_chunk, int)
                                          or self.loss_chunk < 0):
            raise ValueError(f"train.loss_chunk={self.loss_chunk!r} must be auto, 0 (the loss all at once) or a "
                             "number of positions a block")
        if self.peak_flops is not None and self.peak_flops <= 0:
            raise ValueError(f"train.peak_flops={self.peak_flops} must be positive FLOP/s, or null to measure it")
        if self.stop not in STOPS:
            raise ValueError(f"train.stop={self.stop!r} is not one of {', '.join(STOPS)}")
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise ValueError(f"train.max_minutes={self.max_minutes} must be positive, or null for no time limit")
        if not 0.0 <= self.repeat_frac <= 1.0:
            raise ValueError(f"train.repeat_frac={self.repeat_frac} must be in [0, 1] (a share of training windows)")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"train.num_threads={self.num_threads} must be >= 1 or null")


@dataclass
class ModelConfig(GPTConfig):
    """The schema's model section: GPTConfig's fields, and which network the run trains.

    arch=lstm trains the recurrent baseline (model/lstm.py) on the same data, tokenizer and loss: with the GPT's
    vocabulary, context, n_layer, dropout and tie_embeddings, and as many parameters as the GPT these fields
    describe (lstm_hidden=0: model.lstm_matching picks its width) or lstm_hidden wide. Nothing below the entry
    point sees this class: `network` hands down a plain GPTConfig or LSTMConfig.
    """

    arch: str = "gpt"  # gpt | lstm
    lstm_hidden: int = 0  # arch=lstm: its embedding and hidden size; 0 = as many parameters as the GPT
    # your attention(q, k, v) -> y in place of the built-in, "path/to/file.py:attention" (attention_lab/exercises):
    # loaded where the model is built, recorded in every checkpoint's meta.json; "" = the built-in attention
    attn_impl: str = ""

    def __post_init__(self) -> None:
        if self.attn_backend not in ATTN_BACKENDS:
            raise ValueError(f"model.attn_backend={self.attn_backend!r} is not one of {', '.join(ATTN_BACKENDS)} "
                             "(auto: the faster of the two, measured on this machine at the run's shape and dtype)")
        asked = self.attn_backend
        self.attn_backend = "sdpa" if asked == "auto" else asked  # GPTConfig's checks know the concrete two only
        try:
            super().__post_init__()
        finally:
            self.attn_backend = asked
        if self.arch not in ARCHS:
            raise ValueError(f"model.arch={self.arch!r} is not one of {', '.join(ARCHS)}")
        if isinstance(self.lstm_hidden, bool) or not isinstance(self.lstm_hidden, int) or self.lstm_hidden < 0:
            raise ValueError(f"model.lstm_hidden={self.lstm_hidden!r} must be an integer >= 0 (0 = as many "
                             "parameters as the GPT of the model section)")
        if self.lstm_hidden and self.arch != "lstm":
            raise ValueError(f"model.lstm_hidden={self.lstm_hidden} sizes the LSTM only; add model.arch=lstm or "
                             "leave it at 0")
        if self.attn_impl:
            from attention_lab.exercises.learner import parse_spec, refuse_unsupported

            parse_spec(self.attn_impl)
            refuse_unsupported(self)

    def gpt(self, **changes) -> GPTConfig:
        """The GPT these fields describe, as a plain GPTConfig (without arch and lstm_hidden), with `changes`.
        attn_backend auto, where nothing resolved it (a model built outside train.py, which measures first:
        training/backend.py), is sdpa, the reference that auto keeps unless math measures faster."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(GPTConfig)}
        if fields["attn_backend"] == "auto":
            fields["attn_backend"] = "sdpa"
        return GPTConfig(**fields | changes)

    def network(self, vocab_size: int) -> GPTConfig | LSTMConfig:
        """The config of the network to train, for a vocabulary of vocab_size tokens."""
        gpt = self.gpt(vocab_size=vocab_size)
        if self.arch == "gpt":
            return gpt
        if self.lstm_hidden == 0:
            return lstm_matching(gpt)
        return LSTMConfig(vocab_size=vocab_size, block_size=gpt.block_size, n_layer=gpt.n_layer,
                          n_embd=self.lstm_hidden, dropout=gpt.dropout, tie_embeddings=gpt.tie_embeddings)

    def to_dict(self) -> dict:
        """GPTConfig's fields only: a GPT built from this section directly saves a config any GPT loads."""
        return self.gpt().to_dict()


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    name: str = "run"  # a label for the run, shown in TensorBoard's hparams

    def hparams(self, model: GPTConfig | LSTMConfig) -> dict:
        """The run's settings as TensorBoard's hparams plugin compares them (model: the resolved model config)."""
        hp = {"model.arch": arch_of(model)} | {f"model.{k}": v for k, v in dataclasses.asdict(model).items()}
        hp |= {f"optim.{k}": v for k, v in dataclasses.asdict(self.optim).items()}
        return hp | {"train.batch_size": self.train.batch_size, "train.max_steps": self.train.max_steps,
                     "data.name": self.data.name}


def _positive(section: str, obj: Any, names: tuple[str, ...]) -> None:
    for name in names:
        if getattr(obj, name) <= 0:
            raise ValueError(f"{section}.{name}={getattr(obj, name)} must be positive")


def _non_negative(section: str, obj: Any, names: tuple[str, ...]) -> None:
    for name in names:
        if getattr(obj, name) < 0:
            raise ValueError(f"{section}.{name}={getattr(obj, name)} must not be negative")


def main_process_dir(path: str) -> str:
    """The run directory for the main process; a scratch one for the other torchrun ranks.

    Every rank runs Hydra, and each stamps its run directory with its own clock; the trainer uses rank 0's
    (attention_lab.runtime.distributed.same_on_all), so the others keep their Hydra files out of runs/.
    """
    rank = os.environ.get("RANK", "0")
    if rank == "0":
        return path
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    return os.path.join(tempfile.gettempdir(), f"attention-lab-{run_id}-rank{rank}")


def register_configs() -> None:
    """Register the schema so configs/config.yaml can name it first in its defaults list."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="schema", node=Config)
    if not OmegaConf.has_resolver("main_process_dir"):
        OmegaConf.register_new_resolver("main_process_dir", main_process_dir)


def to_config(cfg: DictConfig) -> Config:
    """Composed DictConfig -> typed Config; a bad value raises ValueError naming the field."""
    return OmegaConf.to_object(cfg)


def compose(overrides: list[str] | None = None) -> Config:
    """Compose configs/ with Hydra overrides outside a Hydra app (tests, notebooks)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return to_config(hydra_compose(config_name="config", overrides=list(overrides or [])))
