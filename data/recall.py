"""Synthetic tasks that need one token at a known distance d, for the claim that attention relates distant words
directly: the delayed copy, and the recall of one item (the claim's task since issue 43).

The delayed copy (task "copy") asks for a block of d letters back: its load grows with d, since a model that reads
one token at a time must hold all d letters (4d bits for 16 letters) at once. The recall of one item (task "item")
holds the load constant: one letter of `symbols` (4 bits for 16), then d - 2 filler letters from other letters,
then a marker, then the item again, so the token d back is the one to recall and nothing else need be held:

    item   a b c ... (one of `symbols` letters)       position 0
    filler q r ... y (the letters after the items')    positions 1 .. d-2, random
    marker z                                           position d-1: "the item comes next"
    item   the letter at position 0                    position d: the one scored token

The marker means no model need count to d: a recurrent network holds one letter and writes it out when the
marker comes; attention finds it one step away. `load_bits` says what each task asks to be held.

Each example is a block of `distance` random symbols followed by the same block again, so from the copy on, the
next token is the one exactly `distance` back: x[t] = x[t - distance]. A model that can look back `distance`
tokens predicts the copy exactly; one that sees only the last k < distance tokens has nothing to go on (the block is
uniform and independent of what follows it), so it is right 1 / `symbols` of the time. The first block is noise to
every model: only the copy is scored (`scored`).

    copy_task(n, distance, symbols, seed)  -> x (n, 2 * distance) int64 in [0, symbols), scored (2 * distance,) bool
    item_task(n, distance, symbols, seed)  -> x (n, distance + 1) int64 in [0, 26), scored (distance + 1,) bool
    load_bits(task, distance, symbols)     -> the bits a model reading left to right must hold to answer
    as_text(x)                              -> the examples as strings of letters, one an example
    examples(distance, n_train, n_val, ..., task) -> (train, val) strings: the corpus of `data.source=recall`
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


TASKS = ("copy", "item")
MARKER = len(LETTERS) - 1  # "z": the item comes next


def item_task(n: int, distance: int, symbols: int = 16, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """n examples of the recall of one item at `distance`: x (n, distance + 1) with x[:, distance] == x[:, 0] (an
    item letter, < symbols), filler letters (symbols .. MARKER - 1) between, the marker at distance - 1; and
    `scored` (distance + 1,), True only at the input position whose next token is the recalled item."""
    if distance < 2 or n < 1 or not 2 <= symbols <= MARKER - 1:
        raise ValueError(f"item_task needs distance >= 2, n >= 1 and symbols in 2-{MARKER - 1} (one filler letter and "
                         f"the marker left), got {distance}, {n}, {symbols}")
    rng = np.random.default_rng(seed)
    x = rng.integers(symbols, MARKER, size=(n, distance + 1))  # filler everywhere first
    x[:, 0] = rng.integers(0, symbols, size=n)
    x[:, distance - 1] = MARKER
    x[:, distance] = x[:, 0]
    scored = np.zeros(distance + 1, dtype=bool)
    scored[distance - 1] = True  # input position d - 1 (the marker) predicts x[d], the item
    return x, scored


def load_bits(task: str, distance: int, symbols: int = 16) -> float:
    """What a model reading left to right must hold to answer every scored token: the copy, all d letters of the
    block at once (d log2 symbols); the item task, one letter (log2 symbols), whatever the distance."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    return float(np.log2(symbols)) * (distance if task == "copy" else 1)


def as_text(x: np.ndarray) -> list[str]:
    """(n, L) symbols -> n strings of letters (symbol i is LETTERS[i])."""
    letters = np.array(list(LETTERS))
    return ["".join(row) for row in letters[x]]


def examples(distance: int, n_train: int, n_val: int, symbols: int = 16, seed: int = 0,
             task: str = "copy") -> tuple[list[str], list[str]]:
    """The task as letters: n_train training examples and n_val held-out ones, drawn from other seeds (seed and
    seed + 1), so no held-out block is a training block but by chance (16^distance blocks; the item task's
    examples differ in their filler)."""
    if symbols > len(LETTERS):
        raise ValueError(f"the task has {len(LETTERS)} letters for symbols, got symbols={symbols}")
    make = {"copy": copy_task, "item": item_task}.get(task)
    if make is None:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    return tuple(as_text(make(n, distance, symbols, s)[0]) for n, s in ((n_train, seed), (n_val, seed + 1)))


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
