"""Cached decoding's weight layout (runtime/decoding.decoding_layout, decoding_model's layout, by_columns): the
weights stored by columns are the same matrices, so every variant decodes the same tokens; the choice follows its
measurement both ways, is kept, and is made only where a token is a matrix-vector product (cached, on a CPU)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attention_lab import sampling
from attention_lab.runtime import decoding
from model import GPT, LSTMLM, GPTConfig, LSTMConfig

CPU = torch.device("cpu")
F32, BF16 = torch.float32, torch.bfloat16
PROMPT = [1, 2, 3, 4]
ROWS_WIN, COLUMNS_WIN = {"rows": 1.0, "columns": 2.0}, {"rows": 2.0, "columns": 1.0}

pytestmark = pytest.mark.usefixtures("fresh_measurements")  # conftest.py: a measurement file of its own

VARIANTS = {
    "default (rope, qk-norm)": dict(pos_encoding="rope", qk_norm=True),
    "learned positions, biases, dropout": dict(pos_encoding="learned", bias=True, dropout=0.1),
    "alibi, grouped keys": dict(pos_encoding="alibi", n_kv_head=1),
    "sliding window": dict(pos_encoding="rope", window=8),
    "linear attention": dict(attention="linear"),
    "untied output layer, tied queries and keys": dict(tie_embeddings=False, qk_tied=True),
}


def tiny(**kw) -> GPT:
    torch.manual_seed(0)
    cfg = dict(vocab_size=64, block_size=32, n_layer=2, n_head=2, n_embd=32) | kw
    return GPT(GPTConfig(**cfg)).eval()


def linears(model: nn.Module) -> list[nn.Linear]:
    return [m for m in model.modules() if isinstance(m, nn.Linear)]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_columns_hold_the_same_matrices_and_decode_the_same_tokens(variant):
    """Every nn.Linear weight of the copy is the same matrix stored column after column (its transpose
    contiguous); the model itself is untouched; logits agree to float32 rounding and greedy tokens are equal,
    with and without the cache, in every variant a user switches on."""
    model = tiny(**VARIANTS[variant])
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    columns, cast = decoding.decoding_model(model, F32, CPU, "columns")
    assert columns is not model and cast == F32
    for mine, theirs in zip(linears(model), linears(columns), strict=True):
        w = theirs.weight
        assert w.shape == mine.weight.shape and w.stride() == (1, w.shape[0]), f"not stored by columns: {w.stride()}"
        assert torch.equal(w, mine.weight), "the layout changed the numbers"
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]) and p.is_contiguous(), f"{name}: the model itself changed"
    if model.config.tie_embeddings:
        assert columns.transformer.wte.weight.is_contiguous(), "the embedding's rows must stay rows for its lookups"
    idx = torch.tensor([PROMPT * 3])
    with torch.no_grad():
        torch.testing.assert_close(columns(idx).logits, model(idx).logits, rtol=1e-5, atol=1e-5)
    for use_cache in (True, False):
        want = sampling.generate_text(model, None, PROMPT, 20, greedy=True, use_cache=use_cache, dtype="float32",
                                      layout="rows", threads=1)
        got = sampling.generate_text(model, None, PROMPT, 20, greedy=True, use_cache=use_cache, dtype="float32",
                                     layout="columns", threads=1)
        assert got == want, f"{variant}, cache {use_cache}: columns decoded other tokens"


def test_bf16_columns_and_the_lstm_decode_too():
    """bf16 weights by columns are bf16's matrices; the LSTM baseline (its output layer an nn.Linear) decodes."""
    model = tiny(pos_encoding="rope", qk_norm=True)
    rows, _ = decoding.decoding_model(model, BF16, CPU, "rows")
    columns, _ = decoding.decoding_model(model, BF16, CPU, "columns")
    assert rows is not columns, "one copy served two layouts"
    for a, b in zip(linears(rows), linears(columns), strict=True):
        assert b.weight.dtype == BF16 and torch.equal(a.weight, b.weight) and not b.weight.is_contiguous()
    torch.manual_seed(0)
    lstm = LSTMLM(LSTMConfig(vocab_size=64, block_size=32, n_layer=1, n_embd=16)).eval()
    want = sampling.generate_text(lstm, None, PROMPT, 12, greedy=True, dtype="float32", layout="rows")
    assert sampling.generate_text(lstm, None, PROMPT, 12, greedy=True, dtype="float32", layout="columns") == want


def test_each_layout_copy_is_kept_and_made_again_when_the_weights_change():
    model = tiny()
    first, _ = decoding.decoding_model(model, F32, CPU, "columns")
    assert decoding.decoding_model(model, F32, CPU, "columns")[0] is first, "a second copy of unchanged weights"
    assert decoding.decoding_model(model, F32, CPU, "rows") == (model, F32), "float32 by rows is the model itself"
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)  # tied: the embedding doubles too
    fresh, _ = decoding.decoding_model(model, F32, CPU, "columns")
    assert fresh is not first and torch.equal(fresh.lm_head.weight, model.lm_head.weight), "a stale copy decoded"
    assert len(decoding._copies[model]) == 1, "the stale weights' copy was kept beside the fresh one"


def test_a_watched_model_decodes_itself_whatever_the_layout():
    model = tiny()
    handle = model.transformer.h[0].mlp.register_forward_hook(lambda m, a, out: out)
    assert decoding.decoding_model(model, F32, CPU, "columns") == (model, F32), "the hook would be lost"
    handle.remove()
    with pytest.raises(ValueError, match="layout must be one of"):
        decoding.decoding_model(model, F32, CPU, "diagonal")


@pytest.mark.parametrize("seconds, want", [(ROWS_WIN, "rows"), (COLUMNS_WIN, "columns")])
def test_the_layout_follows_its_measurement_both_ways_and_is_kept(seconds, want):
    calls = []

    def measure(decode):
        calls.append(1)
        return dict(seconds)

    for _ in range(3):
        assert decoding.decoding_layout(CPU, True, lambda layout: None, "model-a", measure) == want
    assert calls == [1], f"one measurement, kept: {len(calls)}"
    decoding.forget_measurements()  # a second process: the file answers
    assert decoding.decoding_layout(CPU, True, lambda layout: None, "model-a", measure) == want and calls == [1]


def test_columns_must_win_by_more_than_the_margin():
    def pick(seconds, key):
        return decoding.decoding_layout(CPU, True, lambda layout: None, key, lambda decode: seconds)

    assert pick({"rows": 1.0, "columns": 0.97}, "a") == "rows", "3% is inside the margin: the weights as trained"
    assert pick({"rows": 1.0, "columns": 0.90}, "b") == "columns"


@pytest.mark.parametrize("where", ["uncached", "GPU"])
def test_the_layout_is_measured_only_for_cached_cpu_decoding(where):
    device, cached = (CPU, False) if where == "uncached" else (torch.device("cuda"), True)

    def refuse(decode):
        raise AssertionError(f"measured the layout where every step is a matrix product ({where})")

    assert decoding.decoding_layout(device, cached, lambda layout: None, "k", refuse) == "rows"


def test_the_measurement_times_both_layouts_interleaved_on_the_real_decode():
    """time_layouts, the default measure: both layouts warmed up once, then taken in turn."""
    seen = []
    ticks = iter(range(1000))

    def decode(layout):
        seen.append(layout)
        yield  # the prefill
        yield  # a step

    got = decoding.time_layouts(decode, rounds=3, clock=lambda: next(ticks))
    assert seen == ["rows", "columns"] * 4 and set(got) == {"rows", "columns"}, seen


class Probe:
    """A clock and a decode(layout) that advances it: a probe of len(step_costs[layout]) steps, one a next(), each
    the stated seconds (the first is the prompt's prefill)."""

    def __init__(self, step_costs: dict[str, list[float]]):
        self.now, self.step_costs = 0.0, step_costs

    def __call__(self) -> float:
        return self.now

    def decode(self, layout: str):
        for cost in self.step_costs[layout]:
            self.now += cost
            yield


def test_a_burst_in_one_step_of_each_probe_does_not_decide():
    """Single steps are timed and their median taken, not whole probes: columns 10% faster at every step but one
    of each probe, which a neighbour's burst made 6x slower, still win. (By whole probes rows would: 7.0 against
    6 x 0.875 + 5.25 = 10.5 seconds.)"""
    probe = Probe({"rows": [2.0] + [1.0] * 7, "columns": [2.0, 5.25] + [0.875] * 6})
    seconds = decoding.time_layouts(probe.decode, rounds=3, clock=probe)
    assert seconds == {"rows": 1.0, "columns": 0.875}, seconds
    assert decoding.faster_layout(seconds) == "columns"


def test_the_prompts_prefill_is_not_a_step():
    """The first step of each probe (the prompt's prefill and the cache's allocation) is not counted: here it is
    the only step where columns are slower, and there are only two steps a probe."""
    probe = Probe({"rows": [1.0, 1.0], "columns": [4.0, 0.5]})
    seconds = decoding.time_layouts(probe.decode, rounds=5, clock=probe)
    assert seconds == {"rows": 1.0, "columns": 0.5}, seconds


@pytest.mark.parametrize("seconds, want", [(ROWS_WIN, "rows"), (COLUMNS_WIN, "columns")])
def test_generate_text_decodes_in_the_measured_layout(monkeypatch, seconds, want):
    """The probe decodes each layout in one thread; the sample then decodes in the faster, and says so."""
    model = tiny()
    probes, seen = [], []

    def measure(decode):
        for layout in decoding.LAYOUTS:
            start = len(seen)
            for _ in decode(layout):  # the probe: one decoding step a next()
                pass
            probes.append((layout, seen[start:]))
        return dict(seconds)

    real = sampling.generate_stream

    def spy(m, *a, **k):
        w = m.lm_head.weight
        seen.append(("columns" if not w.is_contiguous() else "rows", torch.get_num_threads()))
        return real(m, *a, **k)

    monkeypatch.setattr(decoding, "time_layouts", measure)
    monkeypatch.setattr(sampling, "generate_stream", spy)
    told = []
    sampling.generate_text(model, None, PROMPT, 6, greedy=True, dtype="float32", threads=1,
                           on_decoding=lambda *how: told.append(how))
    assert probes == [("rows", [("rows", 1)]), ("columns", [("columns", 1)])], probes
    assert seen[-1][0] == want and told == [(F32, 1, want)], (seen, told)


class CountingProbe(Probe):
    """A Probe that counts the calls of each layout."""

    def __init__(self, step_costs: dict[str, list[float]]):
        super().__init__(step_costs)
        self.calls = {layout: 0 for layout in step_costs}

    def decode(self, layout: str):
        self.calls[layout] += 1
        yield from super().decode(layout)


def test_a_candidate_far_slower_in_its_warm_up_is_not_timed_further():
    """Columns 4x slower than rows in the warm-up (more than OUT = 3x) cannot win: one call (the warm-up) and its
    median stands, while rows are timed in every round; 2.5x slower is still timed in every round."""
    probe = CountingProbe({"rows": [2.0] + [1.0] * 3, "columns": [2.0] + [4.0] * 3})
    seconds = decoding.time_layouts(probe.decode, rounds=3, clock=probe)
    assert probe.calls == {"rows": 4, "columns": 1}, probe.calls
    assert seconds == {"rows": 1.0, "columns": 4.0} and decoding.faster_layout(seconds) == "rows", seconds

    probe = CountingProbe({"rows": [2.0] + [1.0] * 3, "columns": [2.0] + [2.5] * 3})
    seconds = decoding.time_layouts(probe.decode, rounds=3, clock=probe)
    assert probe.calls == {"rows": 4, "columns": 4}, probe.calls
    assert seconds == {"rows": 1.0, "columns": 2.5}, seconds


def test_the_warm_up_steps_do_not_count_in_the_rounds():
    """The warm-up call's steps (cold: allocations, kernel choice, a thread pool starting) only decide what is left
    out; each way's seconds are the rounds' steps alone, even with a single round."""
    calls, now = {"rows": 0, "columns": 0}, [0.0]

    def decode(layout):
        calls[layout] += 1
        cold = calls[layout] == 1
        for cost in [2.0] + [2.5 if cold else 1.0] * 3:
            now[0] += cost
            yield

    seconds = decoding.time_layouts(decode, rounds=1, clock=lambda: now[0])
    assert seconds == {"rows": 1.0, "columns": 1.0}, seconds


def test_the_fastest_in_its_warm_up_is_never_left_out():
    """Rows 4x slower than columns in the warm-up: rows are left out, columns timed in every round and chosen."""
    probe = CountingProbe({"rows": [2.0] + [4.0] * 3, "columns": [2.0] + [1.0] * 3})
    seconds = decoding.time_layouts(probe.decode, rounds=3, clock=probe)
    assert probe.calls == {"rows": 1, "columns": 4}, probe.calls
    assert decoding.faster_layout(seconds) == "columns", seconds


def test_each_step_of_samplings_probe_is_one_decoding_step(monkeypatch):
    """The probe sampling hands to the measurements yields once a token: the prompt's prefill, then one forward
    pass of one new token a next(). So each timed step is one decoding step; a probe that decoded all its tokens in
    one next() would time whole probes again."""
    model = tiny()
    forwards = []  # the positions of each forward pass since the last step
    real_forward = GPT.forward

    def counting(self, idx, *args, **kwargs):
        forwards.append(idx.size(1))
        return real_forward(self, idx, *args, **kwargs)

    steps = {}

    def measure(decode):
        for layout in decoding.LAYOUTS:
            steps[layout] = []
            for _ in decode(layout):
                steps[layout].append(forwards[:])
                forwards.clear()
        return {"rows": 1.0, "columns": 1.0}

    monkeypatch.setattr(GPT, "forward", counting)
    monkeypatch.setattr(decoding, "time_layouts", measure)
    sampling.generate_text(model, None, PROMPT, 6, greedy=True, dtype="float32", threads=1)
    want = [[len(PROMPT)]] + [[1]] * (sampling.PROBE_TOKENS[True] - 1)
    assert steps == {"rows": want, "columns": want}, steps


def test_the_margin_is_a_fraction_of_the_time_even_for_a_few_milliseconds():
    """A probe is a few milliseconds: columns 20% faster at 10 ms wins, 3% faster does not (the margin is a
    fraction of the reference's time, not seconds)."""
    def pick(seconds, key):
        return decoding.decoding_layout(CPU, True, lambda layout: None, key, lambda decode: seconds)

    assert pick({"rows": 0.010, "columns": 0.008}, "ms-a") == "columns"
    assert pick({"rows": 0.010, "columns": 0.0097}, "ms-b") == "rows"
    assert decoding.faster_dtype({F32: 0.010, BF16: 0.008}) == BF16
    assert decoding.faster_threads({1: 0.010, 2: 0.008}) == 2


def test_each_dtype_measures_its_own_layout_and_each_layout_its_own_threads(monkeypatch, torch_threads):
    """The layout is measured per dtype (columns won in float32 and lost in bf16 on the Zen 4 EPYC: bf16 weights
    read half the bytes), and the thread count per dtype and layout: a measurement made for one is never read
    back for another, in this process or the next."""
    model = tiny()
    layouts, threads = [], []

    def measure_threads(run, counts):
        threads.append(tuple(counts))
        return {n: float(n) for n in counts}  # one thread faster

    monkeypatch.setattr(decoding, "time_layouts", lambda decode: (layouts.append(1), dict(COLUMNS_WIN))[1])
    monkeypatch.setattr(decoding, "time_candidates", measure_threads)  # named dtypes: only the threads measured

    def sample(dtype, layout="auto"):
        sampling.generate_text(model, None, PROMPT, 2, greedy=True, dtype=dtype, layout=layout)

    sample("float32")
    assert len(layouts) == 1 and len(threads) == 1
    sample("bfloat16")
    assert len(layouts) == 2, "bf16 weights read float32's layout measurement"
    assert len(threads) == 2
    sample("float32", "rows")
    assert len(threads) == 3, "the thread count measured by columns was read back for the weights by rows"
    decoding.forget_measurements()  # the next process: the file answers each, and nothing else
    for dtype, layout in (("float32", "auto"), ("bfloat16", "auto"), ("float32", "rows")):
        sample(dtype, layout)
    assert len(layouts) == 2 and len(threads) == 3
