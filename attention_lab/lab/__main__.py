"""`python -m attention_lab.lab`: serve the live lab for the runs and models named (docs/lab.md).

    python -m attention_lab.lab                                   # the latest run under runs/
    python -m attention_lab.lab runs/default/A runs/default/B --port 8010
    python -m attention_lab.lab --model path/to/gpt2-folder       # a transformers GPT-2 / GPT-NeoX

Loads what it is given once (the first run's checkpoint at start, so a broken one fails here, not on the first
request), prints the URL, serves until Ctrl-C. A run or model that cannot be opened, or an address that cannot
be listened on, is one `error:` line and exit code 2 (attention_lab/runtime/cli.py).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from attention_lab.runtime.omp import bound_spinning

bound_spinning()  # before torch loads OpenMP, as sample.py: a waiting thread spins briefly, then sleeps

from attention_lab.runtime import cli  # noqa: E402
from attention_lab.runtime.device import pick_device  # noqa: E402
from attention_lab.store.checkpoint import CheckpointError  # noqa: E402

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m attention_lab.lab",
                                description="The live lab: a local page where any text, checkpoint and head "
                                            "intervention answers at once (docs/lab.md).")
    p.add_argument("runs", nargs="*", type=Path, metavar="RUN",
                   help="run folders (or checkpoint folders) to serve, side by side (default: the latest run)")
    p.add_argument("--model", action="append", default=[], metavar="PATH_OR_HUB_ID",
                   help="a transformers GPT-2 or GPT-NeoX model: a local folder or hub id (repeatable)")
    p.add_argument("--port", type=int, default=8008, help="port to listen on (default: 8008; 0: a free one)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--runs-root", type=Path, default=Path("runs"),
                   help="where to look for the latest run when none is named (default: runs)")
    p.add_argument("--preset", default=None, metavar="NAME",
                   help="with no RUN: the latest run of this preset (default: of the default preset, `python "
                        "train.py`; debug, claims and exercise runs open only when named or given here)")
    p.add_argument("--which", choices=("best", "latest"), default="best",
                   help="each run's checkpoint to open at (default: best); the page can switch to the others")
    p.add_argument("--device", default="auto", help="auto (default: cuda if available, else cpu), cpu, cuda, cuda:N")
    return p.parse_args(argv)


def say(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as e:  # argparse has printed the usage and its "error: ..." (or --help)
        return e.code if isinstance(e.code, int) else 2
    from attention_lab.lab.app import create_app, make_server, open_socket, url_of
    from attention_lab.lab.models import Registry

    try:
        if not 0 <= args.port <= 65535:
            raise ValueError(f"--port must be in 0..65535 (0: a free one), got {args.port}")
        device = pick_device(args.device, "--device")
        registry = Registry.open(args.runs, args.model, runs_root=args.runs_root, which=args.which, device=device,
                                 preset=args.preset)
        registry.load("0", None)  # the first model's weights now: a corrupt checkpoint fails before the URL
        try:
            sock = open_socket(args.host, args.port)
        except OSError as e:
            raise ValueError(f"cannot listen on {args.host}:{args.port} ({e.strerror or e}); pass another --port, "
                             "or --port 0 for a free one") from None
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    except (CheckpointError, OSError, *cli.USER_ERRORS) as e:
        return cli.fail(e)

    for line in registry.summaries.values():  # which run it opened (path, preset, step, bits/byte), first
        say(line)
    if args.host not in LOOPBACK:
        say(f"warning: --host {args.host} serves the lab beyond this machine: anyone who can reach this address "
            "can run the models (there is no login). Use the default 127.0.0.1 unless you mean it. It answers "
            f"requests naming it as {args.host} or a loopback name only (docs/lab.md).")
    for e in registry.entries.values():
        what = f"step {e.step}, {e.default}" if e.kind == "run" else "transformers"
        say(f"model {e.id}: {e.label} ({what}; {len(e.checkpoints()) or 1} checkpoint(s)) on {device}")
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("attention_lab.lab").setLevel(logging.INFO)  # "client left: ..." one line each
    server = make_server(create_app(registry, hosts=[args.host]))
    print(f"attention lab: {url_of(sock)}  (Ctrl-C stops it)", flush=True)
    try:
        server.run(sockets=[sock])  # uvicorn handles Ctrl-C: stops taking requests, lets open ones finish
    except KeyboardInterrupt:  # a second Ctrl-C during the shutdown
        pass
    finally:
        sock.close()
    say("attention lab stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
