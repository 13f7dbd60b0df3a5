"""Validation at the edge: each endpoint's body becomes a small typed dataclass, every bound of docs/lab.md checked
here, before anything reaches the worker that holds the models.

Two steps, because some bounds belong to the request and some to the model it names:

    read_json(request)          the body: its size from Content-Length and from the bytes actually read (413 past
                                MAX_BODY, so a text far past the context is refused before it is parsed or
                                tokenized), all of it within BODY_SECONDS (408: a body a byte a second holds no
                                connection), UTF-8 (400), JSON (400, a number of thousands of digits included), an
                                object (400)
    parse_<endpoint>(body)      the fields: types and the fixed ranges (ValueError -> 422, naming the field and
                                what to send instead); unknown fields are refused, so a typo is not ignored; a text
                                must be encodable (no lone surrogate such as "\ud800", which JSON can carry)

Every value said back in an error is cut short (_show): a request of 60 KiB of digits gets a line, not an echo.
    token_ids / check_sampling  what needs the model: the text's token count against its block_size, top_k
                                against its vocabulary (parse_interventions in interp/ checks layer, head, key)

A request names a model by its id and a checkpoint by its folder name; neither is ever a path (models.py looks
both up among what was named at start).
"""

from __future__ import annotations

import asyncio
import json
import math
import warnings
from dataclasses import dataclass

from attention_lab.interp.interventions import MAX_INTERVENTIONS

MAX_BODY = 64 * 1024  # bytes of a request body
MAX_NEW_TOKENS = 256
MAX_TEMPERATURE = 5.0
MAX_SEED = 2**31 - 1
BODY_SECONDS = 10.0  # the whole body must arrive within this long (408 otherwise)
MAX_WAITING = 8  # jobs of new requests waiting for the model (app.Worker): 429 past it

LIMITS = {  # what GET /api/models reports, so a page or a script can stay inside them
    "body_bytes": MAX_BODY,
    "max_new_tokens": [1, MAX_NEW_TOKENS],
    "temperature": [0.0, MAX_TEMPERATURE],
    "top_p": "(0, 1] or null",
    "top_k": "1 .. vocab_size or null",
    "seed": [0, MAX_SEED],
    "interventions": MAX_INTERVENTIONS,
    "text": "1 .. block_size tokens",
    "waiting": MAX_WAITING,
}


class RequestError(Exception):
    """A request the server refuses before it is understood: the HTTP status and the message for the user."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


class Invalid(ValueError):
    """A value out of range or of the wrong type (422); the message names the field and what to send instead."""


# ----------------------------------------------------------------------------------------------------------
# the body


async def read_json(request, max_bytes: int = MAX_BODY, seconds: float | None = None) -> dict:
    """The request's body as a JSON object; RequestError 413 / 408 / 400 before anything larger than max_bytes is
    held, a slow body holds the connection past `seconds`, or anything malformed is parsed. A client that leaves
    while sending raises starlette's ClientDisconnect (the app logs one line)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not (declared.strip().isascii() and declared.strip().isdigit()) or len(declared.strip()) > 18:
            raise RequestError(400, f"Content-Length {_cut(declared)} is not a number of bytes; send the body's "
                                    "length in bytes, or leave the header to the HTTP client")
        if int(declared) > max_bytes:
            raise RequestError(413, f"the request body is {int(declared)} bytes; the lab accepts at most {max_bytes} "
                                    "(a text longer than any model's context does not need more)")
    chunks: list[bytes] = []

    async def receive() -> None:
        size = 0
        async for chunk in request.stream():  # a chunked body has no Content-Length: count what arrives
            size += len(chunk)
            if size > max_bytes:
                raise RequestError(413, f"the request body is over {max_bytes} bytes, the most the lab accepts; "
                                        "send a shorter text (a model reads at most its context)")
            chunks.append(chunk)

    seconds = BODY_SECONDS if seconds is None else seconds
    try:
        await asyncio.wait_for(receive(), seconds)
    except asyncio.TimeoutError:
        raise RequestError(408, f"the request body did not arrive within {seconds:g} s; send it at once",
                           headers={"Connection": "close"}) from None
    raw = b"".join(chunks)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(400, f"the request body is not UTF-8 (byte {e.start} is {raw[e.start:e.start + 1]!r}); "
                                "send JSON encoded as UTF-8") from None
    if not text.strip():
        raise RequestError(400, 'the request body is empty; send a JSON object such as {"text": "Hello"}')
    try:
        body = json.loads(text)
    except json.JSONDecodeError as e:
        raise RequestError(400, f"the request body is not JSON ({e.msg} at line {e.lineno} column {e.colno}); "
                                'send a JSON object such as {"text": "Hello"}') from None
    except RecursionError:
        raise RequestError(400, "the request body is JSON nested too deeply; send a flat object such as "
                                '{"text": "Hello"}') from None
    except ValueError as e:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise RequestError(400, f"the request body holds a number the lab cannot read ({_cut(str(e))}); every "
                                "number it takes is small") from None
    if not isinstance(body, dict):
        raise RequestError(400, f"the request body must be a JSON object, got {_json_type(body)}; send one "
                                'such as {"text": "Hello"}')
    return body


# ----------------------------------------------------------------------------------------------------------
# the fields


@dataclass(frozen=True)
class Target:
    """A model by its id ("0", "1", ... in the order named at start) and one of its checkpoints by folder name
    (None: the one the lab opened it at)."""

    model: str = "0"
    checkpoint: str | None = None


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int = 40
    temperature: float = 0.8  # 0: greedy
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0


@dataclass(frozen=True)
class AnalyzeRequest:
    text: str
    target: Target
    interventions: tuple[dict, ...] = ()
    ablation: bool = True  # the ablation pass (every head's Δloss) in the answer
    inside: bool = True  # the step-inside panel's q, k, v in the answer


@dataclass(frozen=True)
class GenerateRequest:
    text: str
    target: Target
    sampling: Sampling
    interventions: tuple[dict, ...] = ()


@dataclass(frozen=True)
class InterveneRequest:
    text: str
    target: Target
    interventions: tuple[dict, ...]
    generate: Sampling | None = None


@dataclass(frozen=True)
class CompareRequest:
    text: str
    targets: tuple[Target, Target]


SAMPLING_FIELDS = ("max_new_tokens", "temperature", "top_k", "top_p", "seed")


def parse_analyze(body: dict) -> AnalyzeRequest:
    _only(body, ("text", "model", "checkpoint", "interventions", "ablation", "inside"))
    ablation, inside = body.get("ablation", True), body.get("inside", True)
    if not isinstance(ablation, bool):
        raise Invalid(f"ablation must be true (every head's Δloss in the answer) or false (left out: "
                      f"POST /api/ablation), got {_show(ablation)}")
    if not isinstance(inside, bool):
        raise Invalid(f"inside must be true (the step-inside panel in the answer) or false (left out: POST "
                      f"/api/inside and /api/qkv), got {_show(inside)}")
    return AnalyzeRequest(_text(body), _target(body), _interventions(body), ablation, inside)


def parse_ablation(body: dict) -> AnalyzeRequest:
    _only(body, ("text", "model", "checkpoint", "interventions"))
    return AnalyzeRequest(_text(body), _target(body), _interventions(body))


def parse_generate(body: dict) -> GenerateRequest:
    _only(body, ("text", "model", "checkpoint", "interventions", *SAMPLING_FIELDS))
    return GenerateRequest(_text(body), _target(body), _sampling(body, ""), _interventions(body))


def parse_intervene(body: dict) -> InterveneRequest:
    _only(body, ("text", "model", "checkpoint", "interventions", "generate"))
    gen = body.get("generate")
    if gen is not None:
        if not isinstance(gen, dict):
            raise Invalid(f"generate must be an object with {', '.join(SAMPLING_FIELDS)}, or null; "
                          f"got {_json_type(gen)}")
        _only(gen, SAMPLING_FIELDS, "generate.")
    return InterveneRequest(_text(body), _target(body), _interventions(body),
                            _sampling(gen, "generate.") if gen is not None else None)


def parse_compare(body: dict) -> CompareRequest:
    _only(body, ("text", "models", "checkpoints"))
    models = body.get("models", ["0", "1"])
    if not isinstance(models, list) or len(models) != 2:
        raise Invalid(f'models must be a list of two model ids, such as ["0", "1"]; got {_show(models)}')
    checkpoints = body.get("checkpoints", [None, None])
    if not isinstance(checkpoints, list) or len(checkpoints) != 2:
        raise Invalid(f"checkpoints must be a list of two checkpoint names or nulls, such as [null, null]; "
                      f"got {_show(checkpoints)}")
    targets = tuple(Target(_model_id(m, f"models[{i}]"), _checkpoint(c, f"checkpoints[{i}]"))
                    for i, (m, c) in enumerate(zip(models, checkpoints)))
    return CompareRequest(_text(body), targets)


def _only(body: dict, allowed: tuple[str, ...], prefix: str = "") -> None:
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise Invalid(f"unknown field '{prefix}{unknown[0][:40]}'; send only the fields {', '.join(allowed)}")


def _text(body: dict) -> str:
    if "text" not in body:
        raise Invalid('text is missing: send {"text": "..."} with 1 to block_size tokens of text')
    text = body["text"]
    if not isinstance(text, str):
        raise Invalid(f"text must be a string, got {_json_type(text)}")
    if not text:
        raise Invalid("text is empty: send at least one token of text (at most the model's block_size)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # JSON can carry "\ud800" alone; no text of any tokenizer holds it
        raise Invalid(f"text holds a lone surrogate ({_show(text[e.start])} at character {e.start}), which is no "
                      "character: send the pair it belongs to, or leave it out") from None
    return text


def _model_id(value, field: str = "model") -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 10**6:
        value = str(value)  # 0 for "0": an id, not a position in a list the client has to guess at
    if not isinstance(value, str) or not value:
        raise Invalid(f'{field} must be a model id such as "0" (GET /api/models lists them), got {_show(value)}')
    return value


def _checkpoint(value, field: str = "checkpoint") -> str | None:
    if value is None or isinstance(value, str) and value:
        return value
    raise Invalid(f"{field} must be a checkpoint name such as \"step_00005000\" (GET /api/models lists them) or "
                  f"null for the model's own, got {_show(value)}")


def _target(body: dict) -> Target:
    return Target(_model_id(body.get("model", "0")), _checkpoint(body.get("checkpoint")))


def _interventions(body: dict) -> tuple[dict, ...]:
    items = body.get("interventions")
    if items is None:
        return ()
    if not isinstance(items, list):
        raise Invalid(f'interventions must be a list such as [{{"kind": "zero", "layer": 0, "head": 1}}], '
                      f"got {_json_type(items)}")
    if len(items) > MAX_INTERVENTIONS:
        raise Invalid(f"interventions holds {len(items)} items; at most {MAX_INTERVENTIONS}")
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise Invalid(f'interventions[{i}] must be an object such as {{"kind": "zero", "layer": 0, "head": 1}}, '
                          f"got {_json_type(item)}")
        for name in ("layer", "head", "key"):  # the model's bounds come later (interp/interventions.py): the
            value = item.get(name)  # sizes here, so no number of thousands of digits is said back
            if isinstance(value, int) and not isinstance(value, bool) and not -10**6 < value < 10**6:
                raise Invalid(f"interventions[{i}].{name} must be a small integer (a layer, head or token "
                              f"position), got {_show(value)}")
        if not isinstance(item.get("kind", ""), str) or len(item.get("kind", "")) > 40:
            raise Invalid(f'interventions[{i}].kind must be "zero", "uniform" or "hide_key", got '
                          f"{_show(item.get('kind'))}")
    return tuple(items)


def _sampling(body: dict, prefix: str) -> Sampling:
    d = Sampling()
    return Sampling(
        max_new_tokens=_integer(body, "max_new_tokens", d.max_new_tokens, 1, MAX_NEW_TOKENS, prefix),
        temperature=_number(body, "temperature", d.temperature, 0.0, MAX_TEMPERATURE, prefix, "0 is greedy"),
        top_k=_integer(body, "top_k", None, 1, None, prefix, "null samples from every token", nullable=True),
        top_p=_top_p(body, prefix),
        seed=_integer(body, "seed", d.seed, 0, MAX_SEED, prefix),
    )


def _integer(body: dict, name: str, default, lo: int, hi: int | None, prefix: str = "", hint: str = "",
             nullable: bool = False) -> int | None:
    value = body.get(name, default)
    if value is None and nullable:
        return None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)  # 40.0 is 40 (a script's arithmetic), 40.5 is not
    allowed = f"an integer in [{lo}, {hi}]" if hi is not None else f"an integer >= {lo}"
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        more = "; ".join(filter(None, [hint, "or null" if nullable else ""]))
        raise Invalid(f"{prefix}{name} must be {allowed}{f' ({more})' if more else ''}, got {_show(value)}")
    return value


def _number(body: dict, name: str, default: float, lo: float, hi: float, prefix: str = "", hint: str = "") -> float:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi \
            or not math.isfinite(value):  # the range first: an int of 400 digits is no float (OverflowError)
        raise Invalid(f"{prefix}{name} must be a number in [{lo:g}, {hi:g}]{f' ({hint})' if hint else ''}, "
                      f"got {_show(value)}")
    return float(value)


def _top_p(body: dict, prefix: str) -> float | None:
    value = body.get("top_p")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0 \
            or not math.isfinite(value):
        raise Invalid(f"{prefix}top_p must be a number in (0, 1], such as 0.9, or null (every token), "
                      f"got {_show(value)}")
    return float(value)


# ----------------------------------------------------------------------------------------------------------
# what needs the model


def token_ids(tokenizer, text: str, block_size: int, field: str = "text") -> list[int]:
    """The text's token ids, 1 .. block_size of them (Invalid otherwise). Characters the vocabulary never saw
    become its unknown token, as in sample.py (the warning is not an error here)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ids = [int(i) for i in tokenizer.encode(text)]
    if not ids:
        raise Invalid(f"{field} encodes to no tokens; send at least one token of text")
    if len(ids) > block_size:
        raise Invalid(f"{field} is {len(ids)} tokens; this model reads at most {block_size} (its block_size): "
                      f"shorten it by {len(ids) - block_size} tokens")
    return ids


def check_sampling(sampling: Sampling, vocab_size: int, prefix: str = "") -> None:
    """The bound that depends on the model: top_k at most its vocabulary."""
    if sampling.top_k is not None and sampling.top_k > vocab_size:
        raise Invalid(f"{prefix}top_k must be in [1, {vocab_size}] (this model's vocab_size) or null, "
                      f"got {_show(sampling.top_k)}")


def _json_type(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def _show(value) -> str:
    """A value for an error message: short, whatever the client sent."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**60:
        return f"an integer of {len(str(abs(value)))} digits"  # (str() of 4,000 digits is allowed; of 5,000 not)
    text = json.dumps(value) if isinstance(value, (str, int, float, bool, type(None))) else _json_type(value)
    return _cut(text)


def _cut(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."
