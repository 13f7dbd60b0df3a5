"""The live lab's latency as a person sees it: from a request leaving the page to its maps drawn, in a real browser.

    python -m bench.lab_latency                          # the latest run under runs/: 50, 100, 500 tokens, 20 each
    python -m bench.lab_latency --run runs/default/A --tokens 100 --repeats 50
    python -m bench.lab_latency --default-shape --repeats 10   # no run needed: the default model's shape, random

--default-shape builds a checkpoint of the default model's shape (configs/model/small.yaml: 4 layers x 4 heads, 256
wide, RoPE + QK-norm, context 512) with a byte-level BPE of 4096 trained on the first works of the default corpus,
random weights (the lab's work does not depend on them), in a temporary folder: the same numbers on any machine
without `make train` first.

The lab's server (attention_lab.lab.app under uvicorn, as `python -m attention_lab.lab` serves it) runs in this
process, in a thread, on 127.0.0.1 and a free port; headless Chromium (selenium, as tests/test_lab_page.py drives
it) opens its page. For each size the text box is set to a text of exactly that many tokens and the page does what
it does when a person pauses typing: one POST /api/analyze, then the head view and model view re-rendered in place
(then the step-inside panel, POST /api/inside and /api/qkv, and the ablation column: after the clock stops, but
each text waits for them, so no two texts overlap). The times are the page's own (window.labTimings, assets/lab.js): server compute (live.ms,
the model's work inside the request), request to answer (sent to parsed JSON: the queue, the compute, the JSON
and the transfer on loopback), drawing (the answer handed to the components to the browser's next paint), total,
and the answer's size. Each repetition's text is the next window of one fixed text (one token further), so no two
requests in a row are the same and nothing is answered from a cache; --warmup texts per size are drawn first and
not counted (the model loaded, the circuits of the text's tokens computed, the page's code compiled). The page's
debounce (the pause it waits for after the last key) is not counted: the clock starts when the request leaves.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

from attention_lab.runtime.omp import bound_spinning

bound_spinning()  # before torch loads OpenMP, as the lab's command does (no effect when torch is loaded already)

import numpy as np  # noqa: E402

from attention_lab.lab.app import create_app, serving_in_thread  # noqa: E402
from attention_lab.lab.models import Registry  # noqa: E402
from attention_lab.runtime.device import pick_device  # noqa: E402

from .common import Column, Table, describe_machine, log  # noqa: E402

# any fixed text: English prose the default corpus's tokenizer splits as it would a play's lines
PARAGRAPH = ("It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
             "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, "
             "it was the season of Darkness, it was the spring of hope, it was the winter of despair, we had "
             "everything before us, we had nothing before us, we were all going direct to Heaven, we were all going "
             "direct the other way. ")
INSTALL = "apt-get install chromium chromium-driver, and pip install -e '.[test]' for selenium"
SIZES = (50, 100, 500)
TARGETS = ((100, 300.0, "issue 24"), (500, 500.0, "issue 38"))  # total p50 at most this many ms at this many tokens


def texts_of(tokenizer, n_tokens: int, count: int) -> list[str]:
    """`count` texts of exactly n_tokens tokens each, no two in a row alike: windows of the paragraph (repeated as
    often as needed) one token apart, each kept only if it tokenizes back to n_tokens (a BPE window can merge
    differently at its ends)."""
    text = PARAGRAPH
    with warnings.catch_warnings():  # a char vocabulary maps what it never saw to <|unk|>: fine for timing
        warnings.simplefilter("ignore")
        while len(tokenizer.encode(text)) < n_tokens + 4 * count + 8:
            text += PARAGRAPH
        ids = tokenizer.encode(text)
        out: list[str] = []
        for start in range(len(ids) - n_tokens + 1):
            window = tokenizer.decode(ids[start : start + n_tokens])
            if len(tokenizer.encode(window)) == n_tokens and (not out or window != out[-1]):
                out.append(window)
                if len(out) == count:
                    return out
    raise ValueError(f"found only {len(out)} windows of exactly {n_tokens} tokens in the text, {count} wanted")


def default_shape_run(root: Path) -> Path:
    """A run folder under root holding one checkpoint of the default model's shape with random weights (seed 0)
    and a byte-level BPE of 4096 tokens trained on the first six works of the default corpus."""
    import torch

    from attention_lab.store.checkpoint import save_checkpoint
    from attention_lab.training.config import compose
    from data.sources import shakespeare_files
    from data.tokenizer import Tokenizer
    from model import GPT

    cfg = compose([])
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in shakespeare_files()[:6]]
    tokenizer = Tokenizer.train_bpe([texts], cfg.data.vocab_size)
    torch.manual_seed(0)
    model = GPT(cfg.model.gpt(vocab_size=tokenizer.vocab_size)).eval()
    run = root / "default-shape"
    save_checkpoint(run / "checkpoints", 0, model, tokenizer.to_str(), {"val_loss": float("nan")}, best=True)
    return run


def find_chromium() -> tuple[str, str]:
    """(chromium, chromedriver) or a RuntimeError saying what to install (as the page tests look for them)."""
    chrome = shutil.which(os.environ.get("CHROME_BIN", "")) or next(
        (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    driver = shutil.which(os.environ.get("CHROMEDRIVER", "")) or shutil.which("chromedriver")
    try:
        import selenium  # noqa: F401
    except ImportError:
        raise RuntimeError(f"the lab's latency benchmark needs selenium ({INSTALL})") from None
    if not chrome or not driver:
        missing = " and ".join(name for name, p in (("chromium", chrome), ("chromedriver", driver)) if not p)
        raise RuntimeError(f"the lab's latency benchmark needs {missing} ({INSTALL})")
    return chrome, driver


def serving(registry: Registry):
    """The lab's app under uvicorn on 127.0.0.1 (a free port), in a thread; yields its URL."""
    return serving_in_thread(create_app(registry))


@contextmanager
def chromium(chrome: str, driver_path: str):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chrome
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
                "--window-size=1280,900", "--disable-extensions", "--no-first-run", "--disable-background-networking"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        driver.set_script_timeout(300)
        yield driver
    finally:
        driver.quit()


# Set the text as typing or pasting does (its value, one input event) and wait, inside the page, for the answer to
# that text to be drawn (lab.drawn) or for the error line: no polling from here competes with the page for the CPU.
TYPE_AND_WAIT = """
const [text, done] = [arguments[0], arguments[arguments.length - 1]];
const box = document.getElementById('lab-text'), error = document.getElementById('lab-error');
const finish = () => {
  if (window.lab.drawn && window.lab.drawn.text === text) {
    observer.disconnect(); done({timing: window.labTimings[window.labTimings.length - 1]}); return true;
  }
  if (!error.hidden) { observer.disconnect(); done({error: error.textContent}); return true; }
  return false;
};
const observer = new MutationObserver(finish);
observer.observe(document.body, {attributes: true, attributeFilter: ['data-rendered']});
observer.observe(error, {attributes: true, attributeFilter: ['hidden']});
box.value = text;
box.dispatchEvent(new Event('input'));
"""


def measure(driver, texts: list[str], n_tokens: int) -> list[dict]:
    """Each text drawn in turn on the open page; the page's timing of each."""
    out = []
    for text in texts:
        got = driver.execute_async_script(TYPE_AND_WAIT, text)
        if "error" in got:
            raise RuntimeError(f"the lab's page shows an error for a {n_tokens}-token text: {got['error']}")
        timing = got["timing"]
        if timing["tokens"] != n_tokens:
            raise RuntimeError(f"the page drew {timing['tokens']} tokens for a text of {n_tokens}")
        out.append(timing)
    return out


def run_latency(registry: Registry, sizes: list[int], repeats: int, warmup: int) -> dict:
    """Serve the registry, open the page, draw warmup + repeats texts of each size; the raw timings per size."""
    chrome, driver_path = find_chromium()
    tokenizer = registry.load("0", None).tokenizer  # before serving: the worker does not exist yet
    load_before = os.getloadavg()[0]
    texts = {n: texts_of(tokenizer, n, warmup + repeats) for n in sizes}
    with serving(registry) as url, chromium(chrome, driver_path) as driver:
        driver.get(url)
        deadline = time.monotonic() + 60
        # the page opens with its example analysed (viewer.page.LAB_EXAMPLE): measured texts start after it
        while not driver.execute_script("return document.body.dataset.ready === '1' && window.lab && "
                                        "window.lab.model !== null && (window.lab.drawn !== null || "
                                        "!document.getElementById('lab-error').hidden)"):
            if time.monotonic() > deadline:
                raise RuntimeError("the lab's page did not list its models and draw its example within 60 s")
            time.sleep(0.05)
        browser = f"Chromium {driver.capabilities.get('browserVersion', '?')} (headless)"
        timings = {}
        for n in sizes:
            log(f"lab latency: {n} tokens, {warmup} warm-up + {repeats} measured")
            measure(driver, texts[n][:warmup], n)
            timings[n] = measure(driver, texts[n][warmup:], n)
    return {"timings": timings, "browser": browser, "url": url, "load": (load_before, os.getloadavg()[0])}


def _pct(values: list, q: float) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.percentile(values, q)) if values else None


KEYS = (("server", "server_ms"), ("request", "request_ms"), ("draw", "draw_ms"), ("total", "total_ms"))


def table_of(raw: dict, args: argparse.Namespace, machine: dict, label: str, notes: list[str]) -> Table:
    rows = []
    for n, timings in raw["timings"].items():
        row = {"tokens": n, "n": len(timings)}
        for name, key in KEYS:
            row[f"{name}_p50"] = _pct([t[key] for t in timings], 50)
            row[f"{name}_p95"] = _pct([t[key] for t in timings], 95)
        size = _pct([t.get("bytes") for t in timings], 50)
        row["kib"] = None if size is None else size / 1024
        rows.append(row)
    summary = {f"total_p50_ms_{r['tokens']}": r["total_p50"] for r in rows}
    summary |= {f"total_p95_ms_{r['tokens']}": r["total_p95"] for r in rows}
    said = []
    for at, limit, issue in TARGETS:
        target = next((r for r in rows if r["tokens"] == at), None)
        if target is not None:
            summary[f"target_met_{at}"] = met = target["total_p50"] <= limit
            said.append(f"target ({issue}): total p50 at most {limit:.0f} ms at {at} tokens: "
                        f"{target['total_p50']:.0f} ms, {'met' if met else 'missed'}")
    notes = [
        f"{label}; the lab's server (uvicorn, one worker thread) and {raw['browser']} on this machine, "
        f"127.0.0.1; {args.repeats} texts per size after {args.warmup} warm-up, each one token further along a "
        "fixed text (no two alike in a row)",
        "server: the model's work inside the request (live.ms); request: the request sent to its answer parsed; "
        "draw: the answer to the browser's next paint (head view, model view; the step-inside panel follows, asked "
        "for once they are drawn, and is not counted); total: request + draw; size: the maps' answer on the wire "
        "(gzip, median)",
        f"load average (1 min) {raw['load'][0]:.2f} before the texts, {raw['load'][1]:.2f} after (this benchmark's "
        f"own server and browser included), {os.cpu_count()} cores: near 0 before means nothing else was running",
        *said, *notes,
    ]
    columns = [Column("tokens", "tokens"), Column("n", "n")]
    for name, _ in KEYS:
        columns += [Column(f"{name}_p50", f"{name} p50 ms", "{:.0f}"), Column(f"{name}_p95", f"{name} p95 ms", "{:.0f}")]
    columns.append(Column("kib", "size KiB", "{:.0f}"))
    return Table(name="lab_latency", title="Live lab: request to maps drawn (headless Chromium)", machine=machine,
                 columns=columns, rows=rows, notes=notes, summary=summary)


def main(argv: list[str] | None = None) -> Table:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=Path, default=None, help="run folder (default: the latest run under --runs-root)")
    p.add_argument("--runs-root", type=Path, default=Path("runs"))
    p.add_argument("--default-shape", action="store_true", help="a checkpoint of the default model's shape with "
                   "random weights, built in a temporary folder, instead of a run")
    p.add_argument("--tokens", type=int, nargs="+", default=list(SIZES), help="text sizes in tokens (default: "
                   "50 100 500; a size past the model's context is cut to it)")
    p.add_argument("--repeats", type=int, default=20, help="measured texts per size (default: 20)")
    p.add_argument("--warmup", type=int, default=2, help="texts per size drawn first and not counted (default: 2)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", type=Path, default=None, help="also write the table as JSON here")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.warmup < 0 or min(args.tokens) < 1:
        p.error("--repeats and every --tokens must be at least 1, --warmup at least 0")
    if args.run and args.default_shape:
        p.error("give --run or --default-shape, not both")
    device = pick_device(args.device, "--device")
    with tempfile.TemporaryDirectory(prefix="lab-latency-") as tmp:
        run = default_shape_run(Path(tmp)) if args.default_shape else args.run
        registry = Registry.open([run] if run else [], runs_root=args.runs_root, device=device)
        label = ("the default model's shape (4 x 4, 256 wide, RoPE + QK-norm, context 512, BPE 4096), random "
                 "weights (--default-shape)") if args.default_shape else None
        return _measure(registry, args, device, label)


def _measure(registry: Registry, args: argparse.Namespace, device, label: str | None = None) -> Table:
    entry = registry.entries["0"]
    block = entry.config.block_size
    sizes = list(dict.fromkeys(min(n, block) for n in args.tokens))
    notes = [f"{n} tokens: cut to the model's context of {block}" for n in args.tokens if n > block]
    log(f"lab latency: {entry.label} (step {entry.step}), sizes {sizes}, {args.repeats} each")
    raw = run_latency(registry, sizes, args.repeats, args.warmup)
    table = table_of(raw, args, describe_machine(device), label or f"{entry.label} step {entry.step}", notes)
    print(table.markdown(), flush=True)
    if args.json:
        args.json.write_text(json.dumps(table.to_json(), indent=2) + "\n")
    return table


if __name__ == "__main__":
    main()
