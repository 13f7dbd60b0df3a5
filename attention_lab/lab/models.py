"""The models the lab serves: the runs and transformers models named at start, nothing else.

Each is an Entry with an id ("0", "1", ... in the order named). A run's checkpoints are the complete folders in
its checkpoints/ directory, listed again at each look-up (a run still training gains checkpoints and prunes old
ones); a request picks one by its folder name, which is looked up in that listing, so nothing in a request ever
becomes a path. Weights load lazily, on the worker thread, and the last CAPACITY loaded checkpoints stay in
memory (an LRU): moving a checkpoint slider back and forth does not reload.

A transformers model (sampling.open_source) loads at start, which is also how a wrong id or folder is found
before the URL is printed; it has one "checkpoint", null. The LSTM baseline is listed (it generates and has a
loss) but has no attention: analyze and intervene refuse it (422).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from attention_lab.lab.requests import Invalid
from attention_lab.sampling import open_source
from attention_lab.store.checkpoint import choose_run, find_checkpoint, load_checkpoint, run_summary
from attention_lab.store.layout import STEP_PREFIX, CheckpointFiles, RunLayout, run_of_checkpoint
from model import has_attention

CAPACITY = 3  # loaded checkpoints kept in memory


class NotFound(LookupError):
    """An unknown model id or checkpoint name (404); the message lists what there is."""


@dataclass
class Loaded:
    """One checkpoint in memory: what the worker computes with. `memo` keeps what depends only on the weights
    (for instance the circuits computed from them), computed once per loaded checkpoint."""

    model: torch.nn.Module
    tokenizer: object  # data.tokenizer.Tokenizer
    step: int
    checkpoint: str | None  # the folder name; None for a transformers model
    memo: dict = field(default_factory=dict)

    @property
    def config(self):
        return self.model.config


@dataclass
class Entry:
    id: str
    label: str
    kind: str  # "run" | "transformers"
    config: object  # GPTConfig | LSTMConfig of the checkpoint it opened at
    step: int
    default: str | None  # the checkpoint it opened at (--which, or the folder named); None: transformers
    root: Path | None = None  # the run folder, or a loose checkpoint folder; None: transformers
    hub: str | None = None  # the transformers id or folder

    def checkpoints(self) -> dict[str, Path]:
        """name -> folder, for every complete checkpoint on disk now, in step order."""
        if self.root is None:
            return {}
        folder = RunLayout(self.root).checkpoints
        if not folder.is_dir():  # a loose checkpoint folder: itself
            return {self.root.name: self.root}
        found = {}
        for p in sorted(folder.glob(f"{STEP_PREFIX}*")):
            if p.is_dir() and all((p / f).exists() for f in CheckpointFiles.REQUIRED):
                found[p.name] = p
        return found

    @property
    def attention(self) -> bool:
        return has_attention(self.config)

    def describe(self) -> dict:
        cfg = self.config
        steps = []
        for name in self.checkpoints():
            try:
                steps.append({"name": name, "step": int(name.removeprefix(STEP_PREFIX))})
            except ValueError:
                steps.append({"name": name, "step": None})
        return {
            "id": self.id, "label": self.label, "kind": self.kind, "step": self.step, "checkpoints": steps,
            "checkpoint": self.default,
            "config": {"n_layer": cfg.n_layer, "n_head": getattr(cfg, "n_head", 0), "block_size": cfg.block_size,
                       "vocab_size": cfg.vocab_size,
                       "attention": getattr(cfg, "attention", "softmax") if self.attention else "none",
                       "position": getattr(cfg, "pos_encoding", "none"), "arch": "gpt" if self.attention else "lstm"},
        }


class Registry:
    """The entries and the loaded checkpoints. `load` is called on the worker thread only (app.py): one thread
    touches the models, so the LRU needs no lock."""

    def __init__(self, entries: Sequence[Entry], device: torch.device, capacity: int = CAPACITY):
        if not entries:
            raise ValueError("the lab needs at least one run or model")
        self.entries = {e.id: e for e in entries}
        self.summaries: dict[str, str] = {}  # open(): per run entry, which run it is in one line
        self.device = torch.device(device)
        self.capacity = capacity
        self._loaded: OrderedDict[tuple[str, str | None], Loaded] = OrderedDict()
        self.loads = 0  # checkpoints read from disk so far (the LRU's misses)

    @classmethod
    def open(cls, runs: Sequence[Path], models: Sequence[str] = (), *, runs_root: Path = Path("runs"),
             which: str = "best", device: torch.device | str = "cpu", capacity: int = CAPACITY,
             preset: str | None = None) -> Registry:
        """Entries for the runs (a run folder or one checkpoint folder) and transformers models named; when none
        is, the run choose_run picks under runs_root (the latest of the default preset, or of `preset`).
        CheckpointError / FileNotFoundError / ValueError name the bad one. `summaries` holds, per run entry, the
        line that says which run it is (path, preset, step, bits/byte)."""
        device = torch.device(device)
        runs = list(runs)
        choice = None
        if not runs and not models:
            choice = choose_run(runs_root, preset)
            runs = [choice.path]
        entries, preloaded, summaries = [], [], {}
        for run in runs:
            path = find_checkpoint(Path(run), which)  # CheckpointError: no such run, or no checkpoint in it
            ckpt = load_checkpoint(path)  # config, meta, tokenizer (the weights load later)
            ckpt.tokenizer()  # a tokenizer that cannot be read fails now, not on the first request
            root = run_of_checkpoint(ckpt.path)
            summaries[str(len(entries))] = run_summary(ckpt, choice)
            entries.append(Entry(str(len(entries)), str(run), "run", ckpt.config, ckpt.step, ckpt.path.name, root))
        for name in models:
            src = open_source(None, None, name, which, runs_root, device)
            entry = Entry(str(len(entries)), src.label, "transformers", src.config, src.step, None, hub=name)
            entries.append(entry)
            preloaded.append((entry.id, Loaded(src.model, src.tokenizer, src.step, None)))
        registry = cls(entries, device, capacity)
        registry.summaries = summaries
        for model_id, loaded in preloaded:
            registry._keep((model_id, None), loaded)
        return registry

    def describe(self) -> list[dict]:
        return [e.describe() for e in self.entries.values()]

    def entry(self, model_id: str) -> Entry:
        try:
            return self.entries[model_id]
        except KeyError:
            raise NotFound(f"unknown model {_short(model_id)}: this lab serves models {', '.join(self.entries)} "
                           "(by id, as GET /api/models lists them; a request never names a path)") from None

    def resolve(self, model_id: str, checkpoint: str | None) -> tuple[Entry, str | None]:
        """The entry and the checkpoint's name (its default for None); NotFound if either is unknown."""
        entry = self.entry(model_id)
        if checkpoint is None:
            return entry, entry.default
        if entry.kind == "transformers":
            raise NotFound(f"model {model_id} ({entry.label}) is a transformers model with no checkpoints; "
                           "send checkpoint null")
        names = entry.checkpoints()
        if checkpoint not in names:
            listed = ", ".join(names) if len(names) <= 8 else ", ".join([*list(names)[:4], "...", *list(names)[-3:]])
            raise NotFound(f"model {model_id} has no checkpoint {_short(checkpoint)}; its checkpoints are {listed} "
                           "(GET /api/models)")
        return entry, checkpoint

    def require_attention(self, model_id: str, what: str) -> None:
        entry = self.entry(model_id)
        if not entry.attention:
            raise Invalid(f"model {model_id} ({entry.label}) is an LSTM (model.arch=lstm): it has no attention to "
                          f"{what}; /api/generate and /api/compare work with it")

    def load(self, model_id: str, checkpoint: str | None) -> Loaded:
        """The checkpoint in memory (read from disk on a miss). Worker thread only."""
        entry, name = self.resolve(model_id, checkpoint)
        key = (entry.id, name)
        if key in self._loaded:
            self._loaded.move_to_end(key)
            return self._loaded[key]
        if entry.kind == "transformers":  # evicted: read it again
            src = open_source(None, None, entry.hub, "best", Path("runs"), self.device)
            loaded = Loaded(src.model, src.tokenizer, src.step, None)
        else:
            folder = entry.checkpoints().get(name)
            if folder is None:  # pruned since it was listed (a run still training keeps only the last few)
                raise NotFound(f"checkpoint {name} of model {entry.id} is no longer on disk; pick another")
            ckpt = load_checkpoint(folder)
            loaded = Loaded(ckpt.build_model(self.device), ckpt.tokenizer(), ckpt.step, name)
        self.loads += 1
        self._keep(key, loaded)
        return loaded

    def _keep(self, key, loaded: Loaded) -> None:
        self._loaded[key] = loaded
        self._loaded.move_to_end(key)
        while len(self._loaded) > self.capacity:
            self._loaded.popitem(last=False)


def _short(value: str) -> str:
    return repr(value if len(value) <= 40 else value[:37] + "...")
