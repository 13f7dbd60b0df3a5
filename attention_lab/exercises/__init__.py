"""Write attention yourself: exercises that check a learner's own code against the model's, name the mistake in
the tutorials' words, and then train the real model with their attention.

    python -m attention_lab.exercises                     # the exercises, in the tutorials' order
    python -m attention_lab.exercises start mask [DIR]    # DIR/mask.py (default my_attention/): signature, shapes
    python -m attention_lab.exercises check mask [FILE]   # pass, fail (the mistake named) or error (the line)
    python -m attention_lab.exercises solution mask       # the project's answer, once yours passes
    python train.py experiment=debug model.attn_impl=my_attention/attention.py:attention

In a notebook: `from attention_lab.exercises import check; check("mask", my_function)` prints the same message
and returns a Result (truthy on a pass); `check("mask", mask, stop=True)` in a "your turn" cell raises NotPassedYet
with the message until it passes; `answer("mask")` is the project's function, for a notebook's SOLVED switch (it
runs the answer without printing it).

    book.py      the exercises: the reference each is checked against (model/), the cases, the tolerance, the
                 catalogue of known mistakes, each computed from the reference
    checking.py  running the cases, comparing, naming the mistake or locating the difference
    learner.py   the learner's file loaded and run with guards (the line of an error, a timeout); their
                 attention plugged into a model (CausalSelfAttention.attn_fn) and recorded in its checkpoints
    answers.py   the project's own answers in plain torch (`solution`)
    __main__.py  the command line

Imports model/ only (and runtime/ for the CLI's error line): the store and the trainer call `learner.plug`.
"""

from __future__ import annotations

import inspect
from pathlib import Path

from attention_lab.exercises.book import EXERCISES
from attention_lab.exercises.checking import NotPassedYet, Result, check, default_file, exercise_named, train_command

__all__ = ["EXERCISES", "NotPassedYet", "Result", "answer", "check", "listing", "solution", "start"]

PACKAGE = Path(__file__).resolve().parents[1]  # attention_lab/: never written into


def listing() -> str:
    """The exercises, numbered in the tutorials' order, with what each checks against."""
    lines = ["The exercises, in the tutorials' order (start NAME writes a skeleton; check NAME tests it):", ""]
    for i, ex in enumerate(EXERCISES.values(), 1):
        lines.append(f"  {i}. {ex.name:<11} {ex.title}")
        lines.append(f"     {'':<11} checked against {ex.reference_name}; {len(ex.mistakes)} known mistakes")
    lines += ["", f"Then train with your attention: {train_command(default_file('attention'))}"]
    return "\n".join(lines)


def skeleton(name: str, path: str | Path | None = None) -> str:
    """The file `start` writes: the signature, the shapes and what to compute, and the commands that check it and
    train with it, naming `path` (where it is written; default my_attention/NAME.py)."""
    ex = exercise_named(name)
    number = list(EXERCISES).index(name) + 1
    doc = "\n".join(("    " + line) if line else "" for line in ex.doc.splitlines())
    return (f'"""Exercise {number} of {len(EXERCISES)}: {ex.title}.\n\n'
            f"Check it: python -m attention_lab.exercises check {name} THIS_FILE\n"
            f'(or in a notebook: check("{name}", {ex.function}))\n"""\n\n'
            "import math\n\nimport torch\n\n\n"
            f"def {ex.function}({ex.signature}):\n"
            f'    """{doc.strip()}\n    """\n'
            f"    # {ex.hint}\n"
            f'    raise NotImplementedError("write {ex.function}")\n'
            ).replace("THIS_FILE", Path(path or default_file(name)).as_posix())


def start(name: str, folder: str | Path | None = None, force: bool = False) -> Path:
    """Write the skeleton of exercise `name` to folder/NAME.py (default my_attention/), never into the package;
    an existing file is kept unless force."""
    exercise_named(name)
    folder = Path(folder) if folder is not None else default_file(name).parent
    target = (folder / f"{name}.py").resolve()
    if target == PACKAGE or PACKAGE in target.parents:
        raise ValueError(f"{folder} is inside the attention_lab package; write your exercises to a folder of your own "
                         "(the default is my_attention/)")
    if target.exists() and not force:
        raise ValueError(f"{folder / f'{name}.py'} exists already: check it with `python -m attention_lab.exercises "
                         f"check {name} {folder / f'{name}.py'}`, or add --force to start over")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(skeleton(name, folder / f"{name}.py"), encoding="utf-8")
    return folder / f"{name}.py"


def answer(name: str):
    """The project's answer to exercise `name` as a function (answers.py): a notebook's SOLVED switch puts it in
    place of the learner's stub, so the notebook runs on without the answer's text ever shown under the stub."""
    from attention_lab.exercises import answers

    return getattr(answers, exercise_named(name).function)


def answer_source(name: str, convention: str | None = None) -> str:
    """The project's answer to exercise `name` (answers.py), with the functions it calls."""
    from attention_lab.exercises import answers

    exercise_named(name)
    wanted = {"multi_head": ["attention", "multi_head"], "rope": ["rope_adjacent" if convention == "adjacent" else "rope"]}
    return "\n\n".join(inspect.getsource(getattr(answers, f)) for f in wanted.get(name, [name]))


def solution(name: str, file: str | Path | None = None, anyway: bool = False, convention: str | None = None
             ) -> tuple[bool, str]:
    """(shown, text): the project's answer once the learner's file passes (or anyway); else why not."""
    ex = exercise_named(name)
    file = Path(file) if file is not None else default_file(name)
    if not anyway:
        if not file.is_file():
            return False, (f"you have no {file} yet: write yours first (python -m attention_lab.exercises start "
                           f"{name}), or see the answer now with: solution {name} --anyway")
        result = check(name, file, convention=convention, quiet=True)
        if not result:
            return False, (f"your {file} does not pass yet ({result.status}); the answer is shown once it does, or "
                           f"now with: python -m attention_lab.exercises solution {name} --anyway\n{result.message}")
    head = f"# the project's answer to {name} ({ex.title}); checked against {ex.reference_name}\n"
    return True, head + answer_source(name, convention)
