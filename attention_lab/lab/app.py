"""The lab's web app: one page and a small JSON API (docs/lab.md), a thin layer over the library's functions.

    GET  /               the page (attention_lab.viewer.page.lab_page)
    GET  /api/models     the models named at start, their checkpoints and configs, and the limits
    POST /api/analyze    one text: the sample page's data island (interp.analysis.analyze, viewer.report.page_data)
                         and `live` (loss per token, the next-token distributions; `before` with interventions);
                         "ablation": false leaves out the ablation pass, the slowest part (the page's maps first)
    POST /api/ablation   one text: every head's Δloss when zeroed (interp.analysis.batched_ablation), the model
                         view's ablation column, asked for by the page once the maps are drawn
    POST /api/inside     one text: the step-inside panel's numbers but q, k, v (the logit lens, head shares,
                         circuits): "inside": false leaves the panel out of /api/analyze (and its lens uncomputed),
                         and this answers it from what that analysis kept (or a pass of its own)
    POST /api/qkv        one text: every head's q, k, v as little-endian float32 bytes (3, L, nh, T, hs), the
                         panel's q, k, v (most of a full answer's bytes), from the same kept analysis
    POST /api/generate   a continuation, streamed as NDJSON one token a line (sampling.generate_text, one step
                         at a time); a client that disconnects stops it
    POST /api/intervene  the clean and the edited model on one text (interp.analysis.text_losses), and their
                         continuations with the same seed
    POST /api/compare    two models on one text: the loss per token and its difference

One thread touches the models (Worker): every computation is a job submitted to it, so requests queue instead of
failing and no two forward passes share a model at once. A generation is one job per token, so an analysis
asked for meanwhile waits one token, not a whole continuation. Everything a request sends is checked in
requests.py before it reaches the worker; an error is {"error": "..."} with a 4xx status, and the server goes on.

No work nobody waits for: guard.py refuses what is not the lab's own page before any route runs; a request's
Watch listens for its client leaving, and a job whose client has gone is dropped before it starts and stopped
between its steps (Gone: one INFO line, no traceback); at most MAX_WAITING requests hold work at once (429 with
Retry-After past it); make_server times out idle and slow connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.gzip import DEFAULT_EXCLUDED_CONTENT_TYPES
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, Response, StreamingResponse
from starlette.routing import Route

from attention_lab.interp.analysis import analyze, batched_ablation, text_losses
from attention_lab.interp.capture import token_window
from attention_lab.interp.inside import steppable
from attention_lab.interp.interventions import intervention_edits, parse_interventions
from attention_lab.lab.compression import Compression
from attention_lab.lab.guard import Guard
from attention_lab.lab.models import Loaded, NotFound, Registry
from attention_lab.lab.requests import (
    LIMITS,
    MAX_WAITING,
    Invalid,
    RequestError,
    Sampling,
    check_sampling,
    parse_ablation,
    parse_analyze,
    parse_compare,
    parse_generate,
    parse_intervene,
    read_json,
    token_ids,
)
from attention_lab.sampling import generate_text
from attention_lab.viewer.page import json_safe, lab_page, role_info
from attention_lab.viewer.report import inside_data, model_circuits, page_data, text_circuits
from model import hooked

TOP_K = 10  # next-token predictions reported after each position
IDLE_SECONDS = 5  # a connection with no request under way is closed after this long (uvicorn's keep-alive timeout)
HEAD_SECONDS = 10  # a request's head (its line and headers) must arrive within this long of the connection being free
GZIP_LEVEL = 1  # zlib's fastest: most of an answer is base64 of floats, which a higher level shrinks little more
MAX_CONNECTIONS = 64  # uvicorn's limit_concurrency: past it, a new request is answered 503 at once

log = logging.getLogger("attention_lab.lab")


class Gone(Exception):
    """The client of a request has left: its work is dropped (before a job starts) or stopped (between steps)."""


class Watch:
    """Whether the client of one request is still there. Once the body has been read, the server's next message
    on the request's channel is http.disconnect when the client leaves: a task waits for it and sets `gone`, which
    the worker thread reads between steps (a flag set once: no lock needed). Not for a streamed response, which
    listens for the disconnect itself (Starlette's StreamingResponse)."""

    def __init__(self, request: Request, worker: "Worker | None" = None):
        self.request, self.worker = request, worker
        self.gone = False
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> "Watch":
        self._task = asyncio.get_running_loop().create_task(self._listen())
        return self

    async def __aexit__(self, *exc) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _listen(self) -> None:
        while True:
            message = await self.request.receive()
            if message["type"] == "http.disconnect":
                self.gone = True
                if self.worker is not None:
                    self.worker.left += 1
                return

    def check(self) -> None:
        """Raise Gone if the client has left (called between the steps of a job, on the worker thread)."""
        if self.gone:
            raise Gone()


class Worker:
    """The one thread that touches models: a single-thread executor every model computation is submitted to.

    A job whose request is gone (the client hung up) is dropped before it runs. At most `max_waiting` jobs of new
    requests wait in the queue: past it a request is refused (429, Retry-After) rather than queued behind work
    that may take minutes; the later jobs of a request already under way (a generation's next token) are not
    refused (`admit=False`), so a stream is never cut by a full queue. Counters for the tests and the load
    benchmark: `started` jobs begun, `jobs` finished (or failed), `dropped` never begun because the client had
    left, `queued` waiting now, `left` requests whose client went away before the answer, `open` requests under way.
    `idle`: nothing under way, nothing queued, no job running."""

    def __init__(self, max_waiting: int = MAX_WAITING):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lab-model")
        self._lock = threading.Lock()
        self.max_waiting = max_waiting
        self.queued = self.started = self.jobs = self.dropped = 0
        self.left = 0  # requests whose client left before their answer (Watch)
        self.busy = 0  # requests refused because the queue was full (429)
        self.open = self.refused = 0  # requests under way, requests refused by guard.Guard (it keeps both)

    async def run(self, fn: Callable, *args, watch: Watch | None = None, admit: bool = True):
        if watch is not None:
            watch.check()
        with self._lock:
            if admit and self.queued >= self.max_waiting:
                self.busy += 1
                raise RequestError(429, f"the lab is busy: {self.queued} requests wait for the model (at most "
                                        f"{self.max_waiting}); try again in a second", headers={"Retry-After": "1"})
            self.queued += 1
        future = self._pool.submit(self._job, watch, fn, *args)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if future.cancel():  # still queued: it never starts
                with self._lock:
                    self.queued -= 1
                    self.dropped += 1
            raise

    def _job(self, watch, fn, *args):
        with self._lock:
            self.queued -= 1
            if watch is not None and watch.gone:
                self.dropped += 1
                raise Gone()
            self.started += 1
        try:
            return fn(*args)
        finally:
            self.jobs += 1

    @property
    def idle(self) -> bool:
        return self.open == 0 and self.queued == 0 and self.jobs == self.started

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


# ----------------------------------------------------------------------------------------------------------
# JSON out


def _plain(x):
    """json.dumps' default for what it cannot write itself: numpy arrays and scalars (a NaN among them still
    raises, below)."""
    if isinstance(x, (np.ndarray, np.generic)):
        return x.tolist()
    raise TypeError(type(x).__name__)


def json_response(obj, status: int = 200) -> Response:
    """obj as JSON. Written as it is when it can be (numpy turned into lists on the way): walking a 500-token
    answer with json_safe first took longer than writing it; only an answer holding a NaN, an infinity or a key
    json cannot write is made safe first (json_safe: None for every non-finite number)."""
    try:
        text = json.dumps(obj, separators=(",", ":"), allow_nan=False, default=_plain)
    except (ValueError, TypeError):
        text = json.dumps(json_safe(obj), separators=(",", ":"), allow_nan=False)
    return Response(text, status_code=status, media_type="application/json")


MAX_MESSAGE = 600  # characters of an error message: whatever a request holds, what is said back stays short


def error_response(status: int, message: str, headers: dict | None = None) -> Response:
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 3] + "..."
    response = json_response({"error": message}, status)
    response.headers.update(headers or {})
    return response


async def _request_error(request: Request, exc: RequestError) -> Response:
    return error_response(exc.status, exc.message, exc.headers)


async def _gone(request: Request, exc: Exception) -> Response:
    """The client left (Gone, or the body cut off): one INFO line; the answer goes nowhere."""
    log.info("client left: %s %s dropped", request.method, request.url.path)
    return Response(status_code=499)


async def _invalid(request: Request, exc: Invalid) -> Response:
    return error_response(422, str(exc))


async def _not_found(request: Request, exc: NotFound) -> Response:
    return error_response(404, str(exc))


async def _http_error(request: Request, exc) -> Response:  # starlette's own: unknown route, wrong method
    return error_response(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}; see docs/lab.md "
                                           "for the endpoints")


async def _bug(request: Request, exc: Exception) -> Response:
    return error_response(500, f"the lab failed on this request ({type(exc).__name__}: {exc}); this is a bug, "
                               "please report it with the request")


# ----------------------------------------------------------------------------------------------------------
# the computations (each runs on the worker thread)


def _interventions(items, cfg, n_tokens: int):
    """parse_interventions' ValueError (layer, head or key outside the model or the text) as a 422."""
    try:
        return parse_interventions(list(items), cfg, n_tokens)
    except (ValueError, TypeError, KeyError) as e:
        raise Invalid(str(e)) from None


def _qkv_key(req, lm: Loaded) -> tuple:
    """What q, k, v depend on: the checkpoint in memory, the text, the interventions."""
    return (id(lm), req.text, json.dumps(req.interventions, sort_keys=True))


def _kept(found):
    """What the panel needs of an analysis, kept per checkpoint between requests (not the maps' weights)."""
    return dataclasses.replace(found, weights=None)


def _top(tokenizer, top_ids: np.ndarray, top_probs: np.ndarray) -> list:
    """(T, k) ids and probabilities -> T x [[token, p] x k], the tokens as readable strings."""
    distinct = sorted({int(i) for i in np.unique(top_ids)})
    name = dict(zip(distinct, tokenizer.token_strings(distinct)))
    return [[[name[i], round(p, 5)] for i, p in zip(ids, probs)]
            for ids, probs in zip(top_ids.tolist(), top_probs.astype(np.float64).tolist())]


def _losses(tokenizer, found) -> dict:
    """text_losses' (loss, loss_mean, top_ids, top_probs) as the API's {"loss", "loss_mean", "top"}."""
    loss, loss_mean, top_ids, top_probs = found
    return {"loss": np.asarray(loss, np.float64).tolist(), "loss_mean": loss_mean,
            "top": _top(tokenizer, top_ids, top_probs)}


def _circuits(lm: Loaded, ids: list[int]) -> dict:
    """head_circuits of the text, from what this checkpoint already computed: the weight-only part once, and
    each token's OV writes the first time a text holds it (typing adds a token or two at a time)."""
    if "circuits" not in lm.memo:  # from the weights alone: once per loaded checkpoint
        lm.memo["circuits"] = model_circuits(lm.model, lm.tokenizer)
    known = lm.memo.setdefault("ov_writes", {})  # token id -> L x nh [[written token, logit] x k]
    new = sorted({int(i) for i in ids} - set(known))
    if new:
        writes = text_circuits(lm.model, new, lm.tokenizer)["ov_writes"]  # L x nh x {label: ...}
        for token, label in zip(new, lm.tokenizer.token_strings(new)):
            known[token] = [[head[label] for head in layer] for layer in writes]
    distinct = sorted({int(i) for i in ids})
    labels = lm.tokenizer.token_strings(distinct)
    n_layer, n_head = lm.config.n_layer, lm.config.n_head
    ov = [[{label: known[t][layer][head] for t, label in zip(distinct, labels)} for head in range(n_head)]
          for layer in range(n_layer)]
    return lm.memo["circuits"] | {"ov_writes": ov}


class Generation:
    """One continuation, a token at a time: each step() is one job on the worker. A step continues the window
    (the last block_size tokens) by one token with sampling.generate_text, without a KV cache, so the positions
    an intervention names are the window's indices and the clean and the edited runs take the same path."""

    def __init__(self, lm: Loaded, prompt_ids: list[int], sampling: Sampling, edits: dict):
        self.lm, self.sampling, self.edits = lm, sampling, edits
        self.ids = list(prompt_ids)
        self.new: list[int] = []
        self.pieces: list[str] = []
        device = next(lm.model.parameters()).device
        self.generator = torch.Generator(device=device).manual_seed(sampling.seed)
        self.stream = lm.tokenizer.text_stream(prompt_ids)

    def step(self) -> tuple[int, str]:
        s, block = self.sampling, self.lm.config.block_size
        with hooked(self.lm.model, self.edits) if self.edits else contextlib.nullcontext():
            (nxt,) = generate_text(self.lm.model, self.lm.tokenizer, self.ids[-block:], 1,
                                   temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                                   greedy=s.temperature == 0, use_cache=False, generator=self.generator)
        self.ids.append(nxt)
        self.new.append(nxt)
        piece = self.stream.step(nxt)
        self.pieces.append(piece)
        return nxt, piece

    def finish(self) -> str:
        """The whole continuation as text (with whatever the decoder held back for an incomplete character)."""
        self.pieces.append(self.stream.flush())
        return "".join(self.pieces)


def _prepare(registry: Registry, target, text: str, items, sampling: Sampling | None = None,
             sampling_field: str = ""):
    """Load the checkpoint, tokenize the text (after the body's size check) and check what depends on the model:
    the text's length, top_k, the interventions' layers, heads and keys."""
    lm = registry.load(target.model, target.checkpoint)
    ids = token_ids(lm.tokenizer, text, lm.config.block_size)
    if sampling is not None:
        check_sampling(sampling, lm.config.vocab_size, sampling_field)
    if items:
        registry.require_attention(target.model, "intervene on")
    return lm, ids, _interventions(items, lm.config, len(ids)) if items else []


# ----------------------------------------------------------------------------------------------------------
# the app


def create_app(registry: Registry, *, worker: Worker | None = None, page: Callable[[], str] | None = None,
               hosts: Iterable[str] = ()) -> Starlette:
    """The lab over `registry`. worker: the thread the models run on (a fresh one by default); page: a function
    returning the HTML of GET / (default: viewer.page.lab_page with the limits); hosts: the names it answers to
    besides the loopback ones (the --host given; guard.py)."""
    worker = worker or Worker()

    html: list[str] = []  # the page, rendered on the first GET /

    async def index(request: Request) -> Response:
        if not html:
            html.append(page() if page is not None else lab_page(LIMITS))
        return HTMLResponse(html[0])

    async def models(request: Request) -> Response:
        return json_response({"models": registry.describe(), "limits": LIMITS})

    async def on_text(request: Request, parse, verb: str, job):
        """One text's job on the model thread: the request parsed, its model found and able to `verb` (404, and
        422 for an LSTM, before the queue), then job(req, watch) run while the client still waits."""
        req = parse(await read_json(request))
        registry.resolve(req.target.model, req.target.checkpoint)
        registry.require_attention(req.target.model, verb)
        async with Watch(request, worker) as watch:
            return await worker.run(job, req, watch, watch=watch)

    async def analyze_text(request: Request) -> Response:
        def job(req, watch: Watch):
            lm, ids, items = _prepare(registry, req.target, req.text, req.interventions)
            t0 = time.perf_counter()
            # without the panel unless asked for: its logit lens is read later, from the stream kept
            found = analyze(lm.model, ids, interventions=items, top_k=TOP_K, ablation=req.ablation, lens=req.inside)
            watch.check()  # the client left during the pass: the page's data is not built for nobody
            lm.memo["panel"] = (_qkv_key(req, lm), _kept(found))  # for the POST /api/inside and /api/qkv that follow
            data = page_data(lm.model, lm.tokenizer, found, _circuits(lm, ids) if req.inside else None,
                             panel=req.inside)
            live = {"model": req.target.model, "checkpoint": lm.checkpoint, "step": lm.step, "ids": ids,
                    **_losses(lm.tokenizer, (found.loss, found.loss_mean, found.top_ids, found.top_probs))}
            if items:
                watch.check()
                live["before"] = _losses(lm.tokenizer, text_losses(lm.model, ids, top_k=TOP_K))
            live["ms"] = round((time.perf_counter() - t0) * 1000, 1)
            pending = []
            if not req.inside and steppable(lm.config) is None:
                pending.append("inside")  # the step-inside panel: POST /api/inside, then its q, k, v (POST /api/qkv)
            if not req.ablation and len(ids) > 1:  # the column is named now and filled by POST /api/ablation
                data["roles"] = role_info([*data["roles"], "ablation"])
                pending.append("ablation")
            if pending:
                data["pending"] = pending
            return data | {"live": live}

        return json_response(await on_text(request, parse_analyze, "analyze", job))

    async def ablation(request: Request) -> Response:
        def job(req, watch: Watch):
            lm, ids, items = _prepare(registry, req.target, req.text, req.interventions)
            t0 = time.perf_counter()
            idx = token_window(lm.model, ids)[None]  # (1, T)
            values = batched_ablation(lm.model, idx, items) if len(ids) > 1 else None
            return {"model": req.target.model, "checkpoint": lm.checkpoint, "step": lm.step, "ids": ids,
                    "ablation": None if values is None else np.round(values, 5), "role": role_info(["ablation"]),
                    "ms": round((time.perf_counter() - t0) * 1000, 1)}

        return json_response(await on_text(request, parse_ablation, "ablate", job))

    def panel_of(req):
        """The analysis the panel reads (on the worker thread): the last one of this checkpoint, if it was of
        this text and these interventions, else a pass of its own."""
        lm, ids, items = _prepare(registry, req.target, req.text, req.interventions)
        key, kept = lm.memo.get("panel", (None, None))
        if key != _qkv_key(req, lm):
            kept = _kept(analyze(lm.model, ids, interventions=items, top_k=1, ablation=False, lens=False))
            lm.memo["panel"] = (_qkv_key(req, lm), kept)
        return lm, ids, kept

    async def inside(request: Request) -> Response:
        def job(req, watch: Watch):
            why = steppable(registry.load(req.target.model, req.target.checkpoint).config)
            if why is not None:  # before any pass
                raise Invalid(f"model {req.target.model} has no step-inside panel: {why}")
            lm, ids, kept = panel_of(req)
            t0 = time.perf_counter()
            kept.lens = kept.lens_of(lm.model)  # read once from the stream kept, then kept too
            panel = inside_data(lm.model, np.zeros((3, 0), np.float32), kept.shares, lm.tokenizer, kept.lens,
                                _circuits(lm, ids))
            return {"model": req.target.model, "checkpoint": lm.checkpoint, "step": lm.step, "ids": ids,
                    "inside": panel | {"q": None, "k": None, "v": None},
                    "ms": round((time.perf_counter() - t0) * 1000, 1)}

        return json_response(await on_text(request, parse_ablation, "step inside", job))

    async def qkv(request: Request) -> Response:
        def job(req, watch: Watch):
            return np.ascontiguousarray(panel_of(req)[2].qkv, dtype="<f4")

        values = await on_text(request, parse_ablation, "step inside", job)
        return Response(values.tobytes(), media_type="application/octet-stream",
                        headers={"X-Shape": ",".join(str(n) for n in values.shape)})

    async def generate(request: Request) -> Response:
        req = parse_generate(await read_json(request))
        registry.resolve(req.target.model, req.target.checkpoint)

        def prepare() -> Generation:
            lm, ids, items = _prepare(registry, req.target, req.text, req.interventions, req.sampling)
            return Generation(lm, ids, req.sampling, intervention_edits(lm.config, items) if items else {})

        async with Watch(request, worker) as watch:  # the stream listens for the disconnect itself once it has started
            gen = await worker.run(prepare, watch=watch)  # a bad request fails here, with its status

        async def lines():
            try:
                for _ in range(req.sampling.max_new_tokens):
                    nxt, piece = await worker.run(gen.step, admit=False)  # cancelled when the client disconnects
                    yield json.dumps({"id": nxt, "text": piece}) + "\n"
                yield json.dumps({"done": True, "text": gen.finish(), "ids": gen.new}) + "\n"
            except asyncio.CancelledError:
                log.info("client left: POST /api/generate stopped after %d tokens", len(gen.new))
                raise
            except Exception as e:  # noqa: BLE001 - the status line has gone: the error is the stream's last line
                yield json.dumps({"error": f"generation stopped ({type(e).__name__}: {e})"}) + "\n"

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    async def intervene(request: Request) -> Response:
        req = parse_intervene(await read_json(request))
        registry.resolve(req.target.model, req.target.checkpoint)
        registry.require_attention(req.target.model, "intervene on")

        def job(watch: Watch):
            lm, ids, items = _prepare(registry, req.target, req.text, req.interventions, req.generate, "generate.")
            before = _losses(lm.tokenizer, text_losses(lm.model, ids, top_k=TOP_K))
            watch.check()
            after = _losses(lm.tokenizer, text_losses(lm.model, ids, interventions=items, top_k=TOP_K))
            return lm, ids, items, (before, after)

        async with Watch(request, worker) as watch:
            lm, ids, items, (before, after) = await worker.run(job, watch, watch=watch)
            if req.generate is not None:  # both continuations with the same seed, a token per job
                for side, edits in ((before, {}), (after, intervention_edits(lm.config, items) if items else {})):
                    gen = Generation(lm, ids, req.generate, edits)
                    for _ in range(req.generate.max_new_tokens):
                        await worker.run(gen.step, watch=watch, admit=False)  # Gone once the client has left
                    side["continuation"] = gen.finish()
                    side["continuation_ids"] = gen.new
            else:
                before["continuation"] = after["continuation"] = None
        delta = after["loss_mean"] - before["loss_mean"]
        return json_response({"before": before, "after": after, "delta_loss_mean": delta,
                              "interventions": [it.label() for it in items]})

    async def compare(request: Request) -> Response:
        req = parse_compare(await read_json(request))
        if len(registry.entries) == 1 and any(t.model not in registry.entries for t in req.targets):
            only = next(iter(registry.entries))
            raise Invalid(f'/api/compare compares two models (or checkpoints) on one text, and this lab serves one '
                          f'model ({only}): send {{"text": "...", "models": ["{only}", "{only}"], "checkpoints": '
                          f'["step_A", "step_B"]}} with two of its checkpoints (GET /api/models lists them), or start '
                          f'the lab with two runs')
        for t in req.targets:
            registry.resolve(t.model, t.checkpoint)

        def job(watch: Watch):
            (a, b) = [registry.load(t.model, t.checkpoint) for t in req.targets]
            if a.tokenizer.to_str() != b.tokenizer.to_str():
                raise Invalid(f"models {req.targets[0].model} and {req.targets[1].model} use different tokenizers, "
                              "so their tokens do not line up; compare models trained on one tokenizer")
            # the shorter context bounds the text: past it one model would read a cropped window, and the
            # per-token difference would pair different positions
            block = min(a.config.block_size, b.config.block_size)
            ids = token_ids(a.tokenizer, req.text, block)
            runs = []
            for t, lm in zip(req.targets, (a, b)):
                watch.check()
                loss, loss_mean, _, _ = text_losses(lm.model, ids, top_k=1)
                runs.append({"model": t.model, "checkpoint": lm.checkpoint, "step": lm.step,
                             "loss": [float(x) for x in loss], "loss_mean": loss_mean})
            diff = [lb - la for la, lb in zip(runs[0]["loss"], runs[1]["loss"])]
            return {"tokens": a.tokenizer.token_strings(ids), "ids": ids, "runs": runs, "diff": diff,
                    "block_size": block}

        async with Watch(request, worker) as watch:
            return json_response(await worker.run(job, watch, watch=watch))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        worker.shutdown()

    from starlette.exceptions import HTTPException

    app = Starlette(
        routes=[
            Route("/", index, methods=["GET"]),
            Route("/api/models", models, methods=["GET"]),
            Route("/api/analyze", analyze_text, methods=["POST"]),
            Route("/api/ablation", ablation, methods=["POST"]),
            Route("/api/inside", inside, methods=["POST"]),
            Route("/api/qkv", qkv, methods=["POST"]),
            Route("/api/generate", generate, methods=["POST"]),
            Route("/api/intervene", intervene, methods=["POST"]),
            Route("/api/compare", compare, methods=["POST"]),
        ],
        middleware=[
            Middleware(Guard, hosts=list(hosts), counts=worker),  # outermost: a refused request reaches nothing
            # answers of a few MiB: compressed when the client accepts it (zstd, else gzip at its fastest level;
            # in a thread past 128 KiB); the generation's stream is left alone, so each token arrives when made
            Middleware(Compression, minimum_size=1024, compresslevel=GZIP_LEVEL,
                       exclude_content_types=(*DEFAULT_EXCLUDED_CONTENT_TYPES, "application/x-ndjson",
                                              "application/octet-stream")),  # float32 bytes hardly shrink
        ],
        exception_handlers={RequestError: _request_error, Invalid: _invalid, NotFound: _not_found,
                            Gone: _gone, ClientDisconnect: _gone, HTTPException: _http_error, Exception: _bug},
        lifespan=lifespan,
    )
    app.state.registry, app.state.worker = registry, worker
    return app


# ----------------------------------------------------------------------------------------------------------
# serving (the CLI and bench/lab_load.py)


def open_socket(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: a free one); OSError, e.g. when the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def make_server(app: Starlette, **config):
    """A uvicorn server for the app (started with .run(sockets=[open_socket(...)]); stopped with
    .should_exit = True or Ctrl-C). A few seconds' grace for open streams on the way out. Idle and slow
    connections time out: IDLE_SECONDS with no request under way (uvicorn's timeout_keep_alive), HEAD_SECONDS for a
    request's head to arrive (Impatient), BODY_SECONDS for its body (requests.read_json); past MAX_CONNECTIONS
    connections or tasks a request is answered 503 at once (uvicorn's limit_concurrency)."""
    import uvicorn

    settings = dict(log_level="warning", timeout_graceful_shutdown=3, lifespan="on", access_log=False,
                    timeout_keep_alive=IDLE_SECONDS, limit_concurrency=MAX_CONNECTIONS, http=_impatient())
    return uvicorn.Server(uvicorn.Config(app, **(settings | config)))


def _impatient():
    """uvicorn's h11 protocol with a deadline for each request's head: uvicorn times out a connection only after a
    response (keep-alive), and a byte a second resets even that, so a connection that sends nothing, or its
    headers a byte at a time, would be held for ever. Here one that has no request under way HEAD_SECONDS after it
    opened (or after its last answer) is closed, however many bytes trickled in."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Impatient(H11Protocol):
        def connection_made(self, transport):
            super().connection_made(transport)
            self._deadline()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._deadline()

        def connection_lost(self, exc) -> None:
            if getattr(self, "_head_timer", None) is not None:
                self._head_timer.cancel()
            super().connection_lost(exc)

        def _deadline(self) -> None:
            if getattr(self, "_head_timer", None) is not None:
                self._head_timer.cancel()
            self._head_timer = self.loop.call_later(HEAD_SECONDS, self._head_late)

        def _head_late(self) -> None:
            self._head_timer = None
            under_way = self.cycle is not None and not self.cycle.response_complete
            if not under_way and not self.transport.is_closing():
                self.transport.close()

    return Impatient


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


@contextlib.contextmanager
def serving_in_thread(app: Starlette, host: str = "127.0.0.1", start_timeout: float = 30.0):
    """The app under uvicorn on host and a free port, in a daemon thread: yields its URL, stops it on exit
    (the benchmarks' real server on loopback)."""
    import threading

    sock = open_socket(host, 0)
    server = make_server(app)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="lab-server")
    thread.start()
    try:
        deadline = time.monotonic() + start_timeout
        while not server.started and time.monotonic() < deadline and thread.is_alive():
            time.sleep(0.02)
        if not server.started:
            raise RuntimeError(f"the lab's server did not start within {start_timeout:g} s")
        yield url_of(sock)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
