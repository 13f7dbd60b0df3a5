"""python -m attention_lab.exercises [list | start NAME [DIR] | check NAME [FILE] | solution NAME [FILE]]

Exit codes: 0 pass (or done), 1 fail (a mistake named or located), 2 error (a file that does not import, an
exception in it, a wrong shape, a timeout: one `error:` line naming the exercise and the line)."""

from __future__ import annotations

import argparse
import sys

from attention_lab.exercises import EXERCISES, check, listing, solution, start
from attention_lab.exercises.checking import DEFAULT_TIMEOUT
from attention_lab.runtime import cli


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m attention_lab.exercises", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command")
    sub.add_parser("list", help="the exercises, in the tutorials' order")
    s = sub.add_parser("start", help="write the skeleton of an exercise into a folder of yours")
    s.add_argument("name", choices=list(EXERCISES))
    s.add_argument("folder", nargs="?", default=None, help="default: my_attention/")
    s.add_argument("--force", action="store_true", help="overwrite the file if it exists")
    c = sub.add_parser("check", help="check your function against the model's")
    c.add_argument("name", choices=list(EXERCISES))
    c.add_argument("file", nargs="?", default=None, help="default: my_attention/NAME.py")
    c.add_argument("--function", default=None, help="the function's name in the file (default: the exercise's)")
    c.add_argument("--rope", choices=["adjacent"], default=None,
                   help="rope: check against RoPE's adjacent-pairs convention (2i, 2i+1) instead of the model's halves")
    c.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds for every case together")
    o = sub.add_parser("solution", help="the project's answer (once yours passes, or --anyway)")
    o.add_argument("name", choices=list(EXERCISES))
    o.add_argument("file", nargs="?", default=None, help="your file (default: my_attention/NAME.py)")
    o.add_argument("--anyway", action="store_true", help="show it even though yours does not pass yet")
    o.add_argument("--rope", choices=["adjacent"], default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.command in (None, "list"):
        print(listing())
        return 0
    if args.command == "start":
        path = start(args.name, args.folder, args.force)
        print(f"wrote {path}: fill in {EXERCISES[args.name].function}, then: python -m attention_lab.exercises "
              f"check {args.name} {path}")
        return 0
    if args.command == "check":
        return check(args.name, args.file, function=args.function, rope=args.rope, timeout=args.timeout).exit_code
    shown, text = solution(args.name, args.file, args.anyway, args.rope)
    print(text)
    return 0 if shown else 1


if __name__ == "__main__":
    sys.exit(cli.run(lambda: main()))
