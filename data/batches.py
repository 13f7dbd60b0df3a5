"""Token array -> (x, y) batches: x a window of block_size tokens, y the same window shifted by one.

    BatchSampler   random windows for training, from a seeded generator whose state a checkpoint can carry
    eval_batches   fixed windows spread evenly over the array, the same at every evaluation

Shapes: B = batch_size, T = block_size; x and y are int64 tensors of shape (B, T).
"""

import warnings
from typing import Iterator

import numpy as np
import torch


class BatchSampler:
    """Random contiguous windows of `tokens`, reproducible from `seed` and resumable from `state_dict()`.

    Every rank draws the same global batch of world_size * batch_size window starts and keeps its own
    slice, rows [rank * B, (rank + 1) * B): ranks see different windows, the generator state is the same on
    all of them (rank 0 can save it for everyone), and N ranks together see exactly the windows one process
    would with batch_size N * B.
    """

    def __init__(self, tokens: np.ndarray, block_size: int, batch_size: int, seed: int, rank: int = 0,
                 world_size: int = 1, repeat_frac: float = 0.0, repeat_random: bool = False):
        check_length(tokens, block_size)
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
        self.tokens = tokens
        self.block_size = block_size
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        if not 0.0 <= repeat_frac <= 1.0:
            raise ValueError(f"repeat_frac={repeat_frac} must be in [0, 1]")
        self.repeat_frac = repeat_frac
        self.repeat_random = repeat_random
        # random passages draw from the token ids the corpus holds (a prepared vocabulary may have unused ids)
        self.vocab = torch.from_numpy(np.unique(np.asarray(tokens)).astype(np.int64)) if repeat_random else None
        self.generator = torch.Generator().manual_seed(seed)
        self.batches_drawn = 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next (x, y), each (B, T) int64 on the CPU."""
        n_starts = len(self.tokens) - self.block_size  # the last window's y ends on the last token
        starts = torch.randint(n_starts, (self.world_size * self.batch_size,), generator=self.generator)
        rows = slice(self.rank * self.batch_size, (self.rank + 1) * self.batch_size)
        self.batches_drawn += 1
        if self.repeat_frac == 0:  # draws nothing more: the stream of a plain run stays as it always was
            return windows(self.tokens, starts[rows].numpy(), self.block_size)
        n = self.world_size * self.batch_size
        repeat = torch.rand(n, generator=self.generator) < self.repeat_frac
        lengths = torch.randint(4, (self.block_size + 1) // 2 + 1, (n,), generator=self.generator)
        lengths = np.where(repeat[rows].numpy(), lengths[rows].numpy(), 0)
        x, y = repeated_windows(self.tokens, starts[rows].numpy(), self.block_size, lengths)
        if self.repeat_random:  # the passage and its repeat are random tokens; the text after them stays natural
            noise = self.vocab[torch.randint(len(self.vocab), (n, self.block_size + 1), generator=self.generator)]
            noise = noise[rows]
            for i, h in enumerate(lengths):
                if h:
                    seq = torch.cat([noise[i, :h], noise[i, :h], torch.cat([x[i], y[i, -1:]])[2 * h:]])
                    x[i], y[i] = seq[:-1], seq[1:]
        return x, y

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict:
        """Tensors and ints only, so torch.load(weights_only=True) reads it back."""
        return {
            "generator": self.generator.get_state(),
            "batches_drawn": self.batches_drawn,
            "seed": self.seed,
            # what the stream also depends on; checked when loading
            "num_tokens": len(self.tokens),
            "block_size": self.block_size,
            "global_batch_size": self.world_size * self.batch_size,
        }

    def load_state_dict(self, state: dict) -> None:
        mine = self.state_dict()
        changed = [
            f"{k} {state[k]} -> {mine[k]}" for k in ("num_tokens", "block_size", "global_batch_size")
            if k in state and state[k] != mine[k]
        ]
        if changed:
            warnings.warn(
                f"resuming the batch sampler with different settings ({', '.join(changed)}): it continues from "
                f"the saved random state, but the batches differ from those of an uninterrupted run",
                stacklevel=2,
            )
        self.generator.set_state(state["generator"])
        self.batches_drawn = int(state["batches_drawn"])
        self.seed = int(state["seed"])


class EvalBatches:
    """Evaluation batches at fixed, evenly spaced windows; iterate as often as needed, same batches each time.

    As many full batches as it takes to cover the array once (windows overlap only when they must), at most
    max_batches."""

    def __init__(self, tokens: np.ndarray, block_size: int, batch_size: int, max_batches: int):
        check_length(tokens, block_size)
        if batch_size < 1 or max_batches < 1:
            raise ValueError(f"batch_size={batch_size} and max_batches={max_batches} must be >= 1")
        cover = -(-(len(tokens) - 1) // block_size)  # windows that tile the array once
        n_batches = min(max_batches, -(-cover // batch_size))
        last_start = len(tokens) - block_size - 1
        self.starts = np.linspace(0, last_start, n_batches * batch_size).round().astype(np.int64)
        self.tokens = tokens
        self.block_size = block_size
        self.batch_size = batch_size

    def __len__(self) -> int:
        return len(self.starts) // self.batch_size

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for i in range(len(self)):
            yield windows(self.tokens, self.starts[i * self.batch_size:(i + 1) * self.batch_size], self.block_size)


def eval_batches(tokens: np.ndarray, block_size: int, batch_size: int, max_batches: int) -> EvalBatches:
    return EvalBatches(tokens, block_size, batch_size, max_batches)


def windows(tokens: np.ndarray, starts: np.ndarray, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows tokens[s : s + T + 1] for each start s -> x = first T, y = last T, both (B, T) int64."""
    rows = np.asarray(tokens[starts[:, None] + np.arange(block_size + 1)])  # (B, T+1), reads only these
    x = torch.from_numpy(rows[:, :-1].astype(np.int64))  # astype copies: contiguous, so y.view(-1) works
    y = torch.from_numpy(rows[:, 1:].astype(np.int64))
    return x, y


def repeated_windows(tokens: np.ndarray, starts: np.ndarray, block_size: int,
                     lengths: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Like `windows`, but a row with length h > 0 reads h tokens from its start, then starts over: it holds a
    passage twice, the second time continuing past it, so the text after the repeat is natural again.

    The repeat begins h tokens after the passage did, with h drawn per row, so no fixed attention offset
    predicts it: only looking up what followed the earlier occurrence of the current token (an induction head)
    does. An induction curriculum (Olsson et al. 2022 found such heads form where in-context copying pays).
    """
    offsets = np.arange(block_size + 1)[None, :]  # (1, T+1)
    h = np.asarray(lengths)[:, None]  # (B, 1)
    offsets = np.where((h > 0) & (offsets >= h), offsets - h, offsets)
    rows = np.asarray(tokens[starts[:, None] + offsets])  # (B, T+1)
    x = torch.from_numpy(rows[:, :-1].astype(np.int64))
    y = torch.from_numpy(rows[:, 1:].astype(np.int64))
    return x, y


def check_length(tokens: np.ndarray, block_size: int) -> None:
    if block_size < 1:
        raise ValueError(f"block_size={block_size} must be >= 1")
    if len(tokens) < block_size + 1:
        raise ValueError(
            f"corpus smaller than one context window: {len(tokens)} tokens < block_size+1 = {block_size + 1}; "
            f"lower block_size or add text"
        )
