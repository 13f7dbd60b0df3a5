"""A bounded load test of the live lab on loopback: the real app under uvicorn, N clients x M requests.

    python -m bench.lab_load                          # the latest run under runs/, 8 clients x 25 requests
    python -m bench.lab_load runs/default/A --clients 4 --requests 10 --text-tokens 100
    python -m bench.lab_load --abandon --rounds 5 --requests 16   # requests sent, then abandoned unanswered

The server runs in this process, in a thread, on 127.0.0.1 and a free port; each client is a thread with its own
httpx connection sending its requests one after the other, alternating /api/analyze (a text of --text-tokens
tokens, a different window each time) and /api/generate (--max-new-tokens streamed, read to the last line). All
of them queue on the lab's one worker thread, so the latencies include the wait behind the other clients: p50
and p95 per kind say what a user gets when N people share one lab. An error is a status other than 200, an
exception, or a stream that does not end with its `done` line. The resident memory is read after a warm-up (the
model and its circuits loaded), half-way and after the run: the first half also pays the allocator's warm-up for
concurrent requests, so growth in the second half is what requests leave behind.

--abandon: each round sends --requests requests on their own sockets (analyses with the ablation pass, the
ablation alone, interventions with 64-token continuations on both sides, comparisons, 64-token generations),
then closes every socket unanswered: what people do who type on or close the tab. The lab should drop what has
not started and stop what has at its next step. Per round: the model jobs started (a full answer of every request
would take about 90 per request), dropped and left as the worker counts them, the time from the last close to
the worker idle, the CPU the server's threads (the model worker and the event loop) spend in the second after
that (idle: about 0), and the resident memory. Loopback only, bounded: rounds x requests sockets in all.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import threading
import time
import warnings
from pathlib import Path

from attention_lab.runtime.omp import bound_spinning

bound_spinning()  # before torch loads OpenMP, as the lab's command does (no effect when torch is loaded already)

import numpy as np  # noqa: E402

from attention_lab.lab.app import create_app, serving_in_thread  # noqa: E402
from attention_lab.lab.models import Registry  # noqa: E402
from attention_lab.runtime.device import pick_device  # noqa: E402

from .common import Column, Table, describe_machine, log  # noqa: E402

PARAGRAPH = ("It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
             "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, "
             "it was the season of Darkness, it was the spring of hope, it was the winter of despair, we had "
             "everything before us, we had nothing before us, we were all going direct to Heaven, we were all going "
             "direct the other way. ") * 4


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _texts(tokenizer, n_tokens: int, count: int) -> list[str]:
    """`count` different texts of n_tokens tokens each: windows of the paragraph at different offsets."""
    with warnings.catch_warnings():  # a char vocabulary maps what it never saw to <|unk|>: fine for timing
        warnings.simplefilter("ignore")
        ids = tokenizer.encode(PARAGRAPH)
    n_tokens = max(1, min(n_tokens, len(ids) - count))
    return [tokenizer.decode(ids[i : i + n_tokens]) for i in range(count)]


def _client(url: str, jobs: list[tuple[str, dict]], results: list, barrier: threading.Barrier) -> None:
    import httpx

    with httpx.Client(base_url=url, timeout=300) as http:
        barrier.wait()  # every client starts at once
        for kind, body in jobs:
            t0 = time.perf_counter()
            error = None
            try:
                if kind == "analyze":
                    r = http.post("/api/analyze", json=body)
                    if r.status_code != 200:
                        error = f"{r.status_code} {r.text[:200]}"
                else:
                    with http.stream("POST", "/api/generate", json=body) as r:
                        lines = [line for line in r.iter_lines() if line]
                    if r.status_code != 200 or not lines or not json.loads(lines[-1]).get("done"):
                        error = f"{r.status_code} {lines[-1][:200] if lines else 'no lines'}"
            except Exception as e:  # noqa: BLE001 - every failure counts as an error of this request
                error = f"{type(e).__name__}: {e}"
            results.append((kind, time.perf_counter() - t0, error))


def run_load(registry: Registry, *, clients: int, requests: int, text_tokens: int, max_new_tokens: int) -> dict:
    """Serve the registry on loopback, send clients x requests mixed requests, stop; the raw measurements."""
    tokenizer = registry.load("0", None).tokenizer  # before serving: the worker does not exist yet
    texts = _texts(tokenizer, text_tokens, clients * requests)
    app = create_app(registry)
    with serving_in_thread(app) as url:
        warm: list = []
        _client(url, [("analyze", {"text": texts[0]}), ("generate", {"text": texts[0], "max_new_tokens": 2})],
                warm, threading.Barrier(1))  # the model, its circuits and the code paths warm
        if any(error for _, _, error in warm):
            raise RuntimeError(f"the warm-up failed: {warm}")
        rss_before = _rss()
        plans = []
        for c in range(clients):
            jobs = []
            for i in range(requests):
                text = texts[c * requests + i]
                if (c + i) % 2 == 0:
                    jobs.append(("analyze", {"text": text}))
                else:
                    jobs.append(("generate", {"text": text, "max_new_tokens": max_new_tokens, "seed": i}))
            plans.append(jobs)
        results: list = []
        barrier = threading.Barrier(clients)
        threads = [threading.Thread(target=_client, args=(url, jobs, results, barrier)) for jobs in plans]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        rss_half = None
        while any(t.is_alive() for t in threads):
            if rss_half is None and len(results) >= clients * requests / 2:
                rss_half = _rss()  # the allocator has seen every kind of request by now: growth past here is kept
            time.sleep(0.02)
        wall = time.perf_counter() - t0
        rss_after = _rss()
        rss_half = rss_half if rss_half is not None else rss_after
    return {"results": results, "wall_s": wall, "rss_before": rss_before, "rss_half": rss_half, "rss_after": rss_after,
            "jobs": app.state.worker.jobs, "url": url}


ABANDONED = [  # (path, body) of the requests each round sends and abandons, in turn
    ("/api/analyze", lambda text: {"text": text}),
    ("/api/intervene", lambda text: {"text": text, "interventions": [{"kind": "zero", "layer": 0, "head": 0}],
                                     "generate": {"max_new_tokens": 64}}),
    ("/api/compare", lambda text: {"text": text, "models": ["0", "0"]}),
    ("/api/ablation", lambda text: {"text": text}),
    ("/api/generate", lambda text: {"text": text, "max_new_tokens": 64}),
]


def thread_cpu(prefixes: tuple[str, ...]) -> float:
    """CPU seconds (user + system) the threads of this process whose names start with one of `prefixes` have
    used (Linux /proc/self/task/<id>/stat; 0 elsewhere)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0.0
    for t in threading.enumerate():
        if t.name.startswith(prefixes) and t.native_id:
            try:
                fields = Path(f"/proc/self/task/{t.native_id}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _send(url: str, path: str, body: dict) -> socket.socket:
    host, port = url.split("//")[1].strip("/").split(":")
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def run_abandon(registry: Registry, *, rounds: int, requests: int, text_tokens: int, limit_s: float = 120.0) -> dict:
    """Serve the registry on loopback; `rounds` times send `requests` requests and close them all unanswered;
    per round the worker's counts, the time to idle, the server threads' CPU in the second after, the memory."""
    import httpx

    tokenizer = registry.load("0", None).tokenizer
    texts = _texts(tokenizer, text_tokens, rounds * requests)
    app = create_app(registry)
    worker = app.state.worker
    server_threads = ("lab-model", "lab-server")
    out = []
    with serving_in_thread(app) as url:
        with httpx.Client(base_url=url, timeout=300) as http:  # warm: the model, its circuits, the code paths
            for path, body in ABANDONED:
                r = http.post(path, json=body(texts[0]) | ({"generate": {"max_new_tokens": 2}}
                                                             if path == "/api/intervene" else {})
                              | ({"max_new_tokens": 2} if path == "/api/generate" else {}))
                if r.status_code != 200:
                    raise RuntimeError(f"the warm-up failed: {path} {r.status_code} {r.text[:200]}")
        for rnd in range(rounds):
            before = {k: getattr(worker, k) for k in ("started", "dropped", "left", "busy")}
            socks = [_send(url, *(lambda p, b: (p, b(texts[rnd * requests + i])))(*ABANDONED[i % len(ABANDONED)]))
                     for i in range(requests)]
            time.sleep(0.05)  # the requests arrive and queue
            t_close = time.perf_counter()
            for sock in socks:
                sock.close()
            deadline = t_close + limit_s
            while not worker.idle:
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"the lab did not go idle within {limit_s:g} s of the clients leaving: "
                                       f"{worker.open} requests open, {worker.queued} queued")
                time.sleep(0.002)
            idle_ms = (time.perf_counter() - t_close) * 1000
            model0, loop0 = thread_cpu(server_threads[:1]), thread_cpu(server_threads[1:])
            time.sleep(1.0)
            out.append({"round": rnd + 1, "sent": requests,
                        **{k: getattr(worker, k) - v for k, v in before.items()},
                        "idle_after_ms": idle_ms, "model_cpu_ms": (thread_cpu(server_threads[:1]) - model0) * 1000,
                        "loop_cpu_ms": (thread_cpu(server_threads[1:]) - loop0) * 1000, "rss_mib": _rss() / 2**20})
        ok = httpx.post(url + "api/analyze", json={"text": texts[0]}, timeout=300).status_code
    return {"rounds": out, "answers_after": ok, "url": url}


def abandon_table(raw: dict, args: argparse.Namespace, machine: dict, label: str) -> Table:
    rows = raw["rounds"]
    growth = rows[-1]["rss_mib"] - rows[min(1, len(rows) - 1)]["rss_mib"]
    notes = [f"{label}; each round {args.requests} requests on 127.0.0.1 closed unanswered 50 ms after sending "
             f"(analyze, intervene with 64-token continuations, compare, ablation, generate 64 tokens, in turn; "
             f"{args.text_tokens} tokens each)",
             "a request beyond the 8 the queue holds is refused at once (429): the page would retry, these clients "
             "have left; "
             f"started: model jobs begun in the round (answering every request would take about "
             f"{_full_jobs(args.requests)}); CPU: the model worker's and the event loop's threads in the second after "
             f"the worker went idle (the clock ticks in 10 ms steps); memory {rows[0]['rss_mib']:.0f} MiB after round 1, {rows[-1]['rss_mib']:.0f} MiB "
             f"after round {len(rows)} ({growth:+.1f} MiB from round {min(2, len(rows))}); the page answered after: "
             f"{raw['answers_after']}"]
    return Table(
        name="lab_abandon", title="Live lab, requests abandoned (loopback)", machine=machine,
        columns=[Column("round", "round"), Column("sent", "sent"), Column("started", "jobs started"),
                 Column("dropped", "dropped"), Column("busy", "refused (429)"), Column("left", "clients left"),
                 Column("idle_after_ms", "idle after ms", "{:.0f}"),
                 Column("model_cpu_ms", "model thread CPU next 1 s, ms", "{:.0f}"),
                 Column("loop_cpu_ms", "event loop CPU next 1 s, ms", "{:.0f}"),
                 Column("rss_mib", "RSS MiB", "{:.0f}")],
        rows=rows, notes=notes, summary={"rss_growth_mib": growth, "answers_after": raw["answers_after"]})


def _full_jobs(requests: int) -> int:
    per = {"/api/analyze": 1, "/api/intervene": 1 + 2 * 64, "/api/compare": 1, "/api/ablation": 1,
           "/api/generate": 1 + 64}
    return sum(per[ABANDONED[i % len(ABANDONED)][0]] for i in range(requests))


def table_of(raw: dict, args: argparse.Namespace, machine: dict, label: str) -> Table:
    results = raw["results"]
    rows = []
    for kind in ("analyze", "generate", "all"):
        mine = [r for r in results if kind == "all" or r[0] == kind]
        ms = np.array([r[1] * 1000 for r in mine]) if mine else np.array([0.0])
        rows.append({"kind": kind, "requests": len(mine), "errors": sum(1 for r in mine if r[2]),
                     "p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95)),
                     "max_ms": float(ms.max())})
    mib = 2**20
    summary = {"rss_before_mib": raw["rss_before"] / mib, "rss_half_mib": raw["rss_half"] / mib,
               "rss_after_mib": raw["rss_after"] / mib,
               "rss_growth_mib": (raw["rss_after"] - raw["rss_before"]) / mib,
               "rss_growth_second_half_mib": (raw["rss_after"] - raw["rss_half"]) / mib, "wall_s": raw["wall_s"],
               "requests_per_s": len(results) / raw["wall_s"], "errors": sum(1 for r in results if r[2])}
    notes = [
        f"{label}; {args.clients} clients x {args.requests} requests on 127.0.0.1 (uvicorn, one worker thread), "
        f"alternating /api/analyze ({args.text_tokens} tokens) and /api/generate ({args.max_new_tokens} tokens, "
        "streamed); latency from request to the last byte, waiting in the queue included",
        f"{len(results)} requests in {raw['wall_s']:.1f} s ({summary['requests_per_s']:.1f}/s); resident memory "
        f"(this process: server and clients) {summary['rss_before_mib']:.0f} MiB after the warm-up, "
        f"{summary['rss_half_mib']:.0f} MiB half-way, {summary['rss_after_mib']:.0f} MiB after the run: "
        f"{summary['rss_growth_mib']:+.1f} MiB in all, {summary['rss_growth_second_half_mib']:+.1f} MiB in the "
        "second half (the first half includes the allocator's warm-up for concurrent requests: new threads, "
        "new arenas; a leak grows in both halves)",
    ]
    notes += [f"error: {kind}: {error}" for kind, _, error in results if error][:5]
    return Table(
        name="lab_load", title="Live lab under load (loopback)", machine=machine,
        columns=[Column("kind", "request"), Column("requests", "requests"), Column("errors", "errors"),
                 Column("p50_ms", "p50 ms", "{:.0f}"), Column("p95_ms", "p95 ms", "{:.0f}"),
                 Column("max_ms", "max ms", "{:.0f}")],
        rows=rows, notes=notes, summary=summary)


def main(argv: list[str] | None = None) -> Table:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", nargs="?", type=Path, help="run folder (default: the latest run under --runs-root)")
    p.add_argument("--runs-root", type=Path, default=Path("runs"))
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=25, help="requests per client")
    p.add_argument("--text-tokens", type=int, default=100, help="tokens of each analysed text (at most block_size)")
    p.add_argument("--max-new-tokens", type=int, default=20, help="tokens each generation streams")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", type=Path, default=None, help="also write the table as JSON here")
    p.add_argument("--abandon", action="store_true", help="send --requests requests a round and abandon them")
    p.add_argument("--rounds", type=int, default=5, help="rounds of abandoned requests (--abandon)")
    args = p.parse_args(argv)
    if args.clients < 1 or args.requests < 1 or args.rounds < 1:
        p.error("--clients, --requests and --rounds must be at least 1")
    device = pick_device(args.device, "--device")
    registry = Registry.open([args.run] if args.run else [], runs_root=args.runs_root, device=device)
    entry = registry.entries["0"]
    args.text_tokens = min(args.text_tokens, entry.config.block_size)
    if args.abandon:
        log(f"lab load: {entry.label} (step {entry.step}), {args.rounds} x {args.requests} requests abandoned")
        raw = run_abandon(registry, rounds=args.rounds, requests=args.requests, text_tokens=args.text_tokens)
        table = abandon_table(raw, args, describe_machine(device), f"{entry.label} step {entry.step}")
        print(table.markdown(), flush=True)
        if args.json:
            args.json.write_text(json.dumps(table.to_json(), indent=2) + "\n")
        return table
    log(f"lab load: {entry.label} (step {entry.step}), {args.clients} x {args.requests} requests")
    raw = run_load(registry, clients=args.clients, requests=args.requests, text_tokens=args.text_tokens,
                   max_new_tokens=args.max_new_tokens)
    table = table_of(raw, args, describe_machine(device), f"{entry.label} step {entry.step}")
    print(table.markdown(), flush=True)
    if args.json:
        args.json.write_text(json.dumps(table.to_json(), indent=2) + "\n")
    return table


if __name__ == "__main__":
    main()
