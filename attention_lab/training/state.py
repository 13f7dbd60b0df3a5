"""TrainState: everything an exact resume needs besides the weights, saved and restored by one object.

    step, best_val, tokens_seen     counters
    seconds                         the run's clock: seconds trained in earlier sessions and this one (the time
                                    budget's, with train.stop=budget)
    optimizer                       AdamW (and Muon) moments and step counts (attention_lab/training/optim.py)
    sampler                         the data stream's position and random state (data/batches.py)
    RNG                             torch's CPU generator, and the GPU's when training on one

`state_dict()` is what a checkpoint's train_state.pt holds (attention_lab/store/checkpoint.py, read with
torch.load(weights_only=True)): plain tensors, numbers and dicts, so checkpoints written by earlier versions of
this code load unchanged (the keys are the same; `seconds`, added later, reads as 0 where absent).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from data.batches import BatchSampler


@dataclass
class TrainState:
    optimizer: torch.optim.Optimizer  # or attention_lab.training.optim.Optimizers, which holds one or two
    sampler: BatchSampler
    device: torch.device
    step: int = 0
    best_val: float = float("inf")
    tokens_seen: int = 0
    seconds: float = 0.0

    def state_dict(self) -> dict:
        cuda, mps = self.device.type == "cuda", self.device.type == "mps"  # a GPU's dropout draws from its own RNG
        return {
            "step": self.step, "optimizer": self.optimizer.state_dict(), "sampler": self.sampler.state_dict(),
            "rng": {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state(self.device) if cuda else None,
                    "mps": torch.mps.get_rng_state() if mps else None},
            "best_val_loss": self.best_val, "tokens_seen": self.tokens_seen, "seconds": self.seconds,
        }

    def load_state_dict(self, state: dict) -> None:
        """Optimizer, data stream, RNG and counters as they were saved: the run goes on as if never stopped."""
        self.optimizer.load_state_dict(state["optimizer"])
        self.sampler.load_state_dict(state["sampler"])
        torch.set_rng_state(state["rng"]["torch"])
        if self.device.type == "cuda" and state["rng"].get("cuda") is not None:
            torch.cuda.set_rng_state(state["rng"]["cuda"], self.device)
        if self.device.type == "mps" and state["rng"].get("mps") is not None:
            torch.mps.set_rng_state(state["rng"]["mps"])
        self.step, self.best_val, self.tokens_seen = state["step"], state["best_val_loss"], state["tokens_seen"]
        self.seconds = float(state.get("seconds", 0.0))  # checkpoints from before the run's clock: none spent
