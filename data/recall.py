"""A synthetic task that needs one token at a known distance d: a delayed copy, for the claim that attention relates
distant words directly.

Each example is a block of `distance` random symbols followed by the same block again, so from the copy on, the
next token is the one exactly `distance` back: x[t] = x[t - distance]. A model that can look back `distance`
tokens predicts the copy exactly; one that sees only the last k < distance tokens has nothing to go on (the block is
uniform and independent of what follows it), so it is right 1 / `symbols` of the time. The first block is noise to
every model: only the copy is scored (`scored`).

    copy_task(n, distance, symbols, seed)  -> x (n, 2 * distance) int64 in [0, symbols), scored (2 * distance,) bool
    as_text(x)                              -> the examples as strings of letters, one an example
    examples(distance, n_train, n_val, ...) -> (train, val) strings: the corpus of `data.source=recall`
                                               (data/sources.py; configs/data/recall.yaml), one example a document
    write_text(out, distance, ...)          -> text files of letters (one example a line), for `data=text` with the
                                               char tokenizer: python -m data.recall --distance 64 --out DIR

Imports nothing of the project (data/__init__.py).
"""

from __future__ import annotations

import argparse
import string
import sys
from pathlib import Path

import numpy as np

LETTERS = string.ascii_lowercase  # the symbols as text: 26 letters, a newline between examples


def copy_task(n: int, distance: int, symbols: int = 16, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """n delayed-copy examples: x (n, 2 * distance) whose second half repeats its first, and `scored` (2 *
    distance,), True at the positions whose next token is a copy (targets x[t + 1] = x[t + 1 - distance])."""
    if distance < 1 or symbols < 2 or n < 1:
        raise ValueError(f"copy_task needs distance >= 1, symbols >= 2 and n >= 1, got {distance}, {symbols}, {n}")
    block = np.random.default_rng(seed).integers(0, symbols, size=(n, distance))
    x = np.concatenate([block, block], axis=1)
    scored = np.zeros(2 * distance, dtype=bool)
    scored[distance - 1:2 * distance - 1] = True  # input position t predicts x[t + 1]: the copy starts at distance
    return x, scored


def as_text(x: np.ndarray) -> list[str]:
    """(n, L) symbols -> n strings of letters (symbol i is LETTERS[i])."""
    letters = np.array(list(LETTERS))
    return ["".join(row) for row in letters[x]]


def examples(distance: int, n_train: int, n_val: int, symbols: int = 16, seed: int = 0) -> tuple[list[str], list[str]]:
    """The task as letters: n_train training examples and n_val held-out ones, drawn from other seeds (seed and
    seed + 1), so no held-out block is a training block but by chance (16^distance blocks)."""
    if symbols > len(LETTERS):
        raise ValueError(f"the task has {len(LETTERS)} letters for symbols, got symbols={symbols}")
    return tuple(as_text(copy_task(n, distance, symbols, s)[0]) for n, s in ((n_train, seed), (n_val, seed + 1)))


def write_text(out: Path, distance: int, n_train: int = 2000, n_val: int = 200, symbols: int = 16,
               seed: int = 0) -> list[Path]:
    """The task as letters, one example a line, in train.txt and val.txt under `out` (for `data=text`,
    data.tokenizer=char, data.val_docs=[val]); -> the files."""
    if symbols > len(LETTERS):
        raise ValueError(f"write_text has {len(LETTERS)} letters for symbols, got symbols={symbols}")
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, lines in zip(("train", "val"), examples(distance, n_train, n_val, symbols, seed)):
        path = out / f"{name}.txt"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        paths.append(path)
    return paths


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m data.recall", description=__doc__.split("\n")[0])
    p.add_argument("--distance", type=int, required=True, help="how far back the copied token is")
    p.add_argument("--out", type=Path, required=True, help="a folder for train.txt and val.txt")
    p.add_argument("--symbols", type=int, default=16, help="how many letters (2-26)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        for path in write_text(args.out, args.distance, symbols=args.symbols, seed=args.seed):
            print(path)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
