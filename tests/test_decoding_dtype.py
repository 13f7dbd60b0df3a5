"""dtype auto for decoding (attention_lab/runtime/decoding.py): chosen from a measurement, in both directions,
and the measurement kept in a file that a later process reads instead of measuring again.

Nothing here is timed: the measurement runs on a fake clock that each dtype's decode advances by a stated amount,
and the decision is driven by stubbed timings. Speed itself lives in bench/decoding_dtype.py. A "second process"
is this one with its memory forgotten (forget_measurements): what it knows then comes from the file.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from attention_lab import sampling
from attention_lab.runtime import decoding, omp
from attention_lab.runtime.decoding import decoding_dtype, faster_dtype, time_decoding
from model import GPT, GPTConfig

CPU = torch.device("cpu")
F32, BF16 = torch.float32, torch.bfloat16
BF16_CPU = {"avx512_bf16": True, "amx_bf16": False}  # what torch.cpu.get_capabilities reports, stubbed
PLAIN_CPU = {"avx512_bf16": False, "amx_bf16": False, "avx2": True}


pytestmark = pytest.mark.usefixtures("fresh_measurements")  # conftest.py: a measurement file of its own


class FakeClock:
    """A clock that decode(dtype) advances: a probe of `steps` decoding steps (a generator, one step a next()),
    its first (the prompt's prefill) `prefill` seconds whatever the dtype, each other cost[dtype] seconds."""

    def __init__(self, cost: dict, steps: int = 4, prefill: float = 8.0):
        self.now, self.cost, self.calls, self.steps, self.prefill = 0.0, cost, [], steps, prefill

    def __call__(self) -> float:
        return self.now

    def decode(self, dtype: torch.dtype):
        self.calls.append(dtype)
        self.now += self.prefill
        yield
        for _ in range(self.steps - 1):
            self.now += self.cost[dtype]
            yield


@pytest.mark.parametrize("cost, want", [({F32: 1.0, BF16: 2.0}, F32), ({F32: 2.0, BF16: 1.0}, BF16)])
def test_the_measurement_times_each_dtype_interleaved(cost, want):
    """Seconds per decoding step, the prefill not counted: with two steps a probe (as uncached decoding probes),
    a counted prefill would be half the samples."""
    clock = FakeClock(cost, steps=2)
    seconds = time_decoding(clock.decode, CPU, rounds=3, clock=clock)
    assert seconds == cost, f"time_decoding measured {seconds}, the decodes cost {cost}"
    assert clock.calls == [F32, BF16] * 4, f"warm-up once each, then 3 rounds taken in turn; got {clock.calls}"
    assert faster_dtype(seconds) == want, f"{seconds}: the faster dtype is {want}"


def test_bf16_displaces_float32_only_beyond_the_margin():
    assert faster_dtype({F32: 1.0, BF16: 0.97}) == F32, "3% is inside the 5% margin: float32 (the reference) stays"
    assert faster_dtype({F32: 1.0, BF16: 0.90}) == BF16, "10% faster than float32: bf16"
    assert faster_dtype({F32: 1.0, BF16: 1.50}) == F32


def stub_measure(seconds: dict[torch.dtype, float], calls: list):
    def measure(decode, device):
        calls.append(device)
        return dict(seconds)
    return measure


@pytest.mark.parametrize("seconds, want", [({F32: 1.0, BF16: 2.0}, F32), ({F32: 2.0, BF16: 1.0}, BF16)])
def test_auto_follows_the_measurement_on_a_cpu_with_native_bf16(monkeypatch, seconds, want):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: BF16_CPU)
    calls = []
    measure = stub_measure(seconds, calls)
    for _ in range(3):
        assert decoding_dtype("auto", CPU, lambda d: None, "model-a", measure) == want, seconds
    assert len(calls) == 1, f"measured {len(calls)} times for one model: once per key"
    decoding_dtype("auto", CPU, lambda d: None, "model-b", measure)
    assert len(calls) == 2, "another model (key) is measured on its own"


def test_named_dtypes_are_never_measured_and_a_cpu_without_bf16_units_is(monkeypatch):
    """A CPU without bf16 units computes bf16 by emulation, but a decoding step mostly reads weights: bf16 weights
    decoded faster than float32 on such an AMD EPYC (docs/benchmarks.md), so auto measures there too."""
    def measure(decode, device):
        raise AssertionError("measured where no choice was to be made")

    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: BF16_CPU)
    assert decoding_dtype("float32", CPU, lambda d: None, "k", measure) == F32
    assert decoding_dtype("bfloat16", CPU, lambda d: None, "k", measure) == BF16
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: PLAIN_CPU)
    calls = []
    assert decoding_dtype("auto", CPU, lambda d: None, "k", stub_measure({F32: 2.0, BF16: 1.0}, calls)) == BF16
    assert calls == [CPU], "a CPU without bf16 units was not measured"


# ---------------------------------------------------------------------------------- in generate_text, end to end


def tiny_model() -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=2, n_embd=32, pos_encoding="rope", qk_norm=True)
    return GPT(cfg).eval()


def decoding_seen(monkeypatch) -> list:
    """(the weights' dtype, the autocast dtype or None) of every generate_stream call in sampling from now on: the
    way each decode ran."""
    seen = []
    real = sampling.generate_stream

    def spy(model, *args, **kwargs):
        cast = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
        seen.append((next(model.parameters()).dtype, cast))
        return real(model, *args, **kwargs)

    monkeypatch.setattr(sampling, "generate_stream", spy)
    return seen


WAY = {F32: (F32, None), BF16: (BF16, None)}  # on a CPU: bf16 is the weights in bf16, no autocast


PROMPT = [1, 5, 9, 2, 7, 3]


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("seconds, want", [({F32: 1.0, BF16: 2.0}, F32), ({F32: 2.0, BF16: 1.0}, BF16)])
def test_generate_text_decodes_in_the_measured_dtype_and_gives_its_tokens(monkeypatch, seconds, want, use_cache):
    """auto's tokens are the chosen dtype's own tokens (the same path), and every decode after the measurement
    runs that dtype's way (bf16: a bf16 copy of the weights, no autocast); the measurement ran the real model in
    each way."""
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: BF16_CPU)
    model = tiny_model()
    named = "float32" if want == F32 else "bfloat16"
    expected = sampling.generate_text(model, None, PROMPT, 12, greedy=True, use_cache=use_cache, dtype=named)

    probed = []

    def measure(decode, device):
        for dtype in (F32, BF16):
            for _ in decode(dtype):  # the probe: one decoding step a next()
                pass
        probed.append(list(seen))
        return dict(seconds)

    monkeypatch.setattr(decoding, "time_decoding", measure)
    seen = decoding_seen(monkeypatch)
    got = sampling.generate_text(model, None, PROMPT, 12, greedy=True, use_cache=use_cache, dtype="auto")
    assert probed == [[WAY[F32], WAY[BF16]]], f"auto's probe should decode each way once: {probed}"
    after = seen[2:]
    assert after == [WAY[want]], f"measured {seconds}: decoding should run as {WAY[want]}, ran as {after}"
    assert got == expected, f"auto ({want}) gave {got}, {named} gives {expected}"
    assert next(model.parameters()).dtype == F32, "the caller's model was cast: it must stay as it was"


def test_bf16_decoding_keeps_float32s_greedy_tokens_where_the_margin_is_clear():
    """Where bf16 is the faster path, its logits (bf16 weights and activations) are float32's within bf16's
    rounding (atol 0.05 + rtol 0.05), so wherever float32's best token leads the next by more than twice that bound,
    bf16 picks the same token. Teacher-forced on float32's own greedy continuation."""
    model = tiny_model()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # spread the logits: a random model's are nearly flat
    ids = PROMPT + sampling.generate_text(model, None, PROMPT, 20, greedy=True, dtype="float32")
    x = torch.tensor([ids])
    decoder, cast = decoding.decoding_model(model, BF16, CPU)  # what bf16 decodes with on a CPU
    assert next(decoder.parameters()).dtype == BF16 and cast == F32, "bf16 on a CPU: bf16 weights, no autocast"
    with torch.no_grad():
        ref = model(x).logits[0].float()
        low = decoder(x).logits[0].float()
    torch.testing.assert_close(low, ref, atol=0.05, rtol=0.05, msg=lambda m: f"bf16 logits drift from float32\n{m}")
    bound = ((low - ref).abs().max()).item()
    top2 = ref.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * bound
    assert clear.sum() >= 5, f"only {int(clear.sum())} positions with a clear margin: the check would be empty"
    assert torch.equal(low.argmax(-1)[clear], ref.argmax(-1)[clear]), "bf16 changed a token float32 chose clearly"


def test_the_bf16_copy_is_made_once_and_made_again_when_the_weights_change():
    """decoding_model keeps one bf16 copy per model while its weights are unchanged; an optimizer step (an
    in-place change) makes a new one, so a notebook that trains a little and samples again samples the new
    weights."""
    model = tiny_model()
    first, _ = decoding.decoding_model(model, BF16, CPU)
    again, _ = decoding.decoding_model(model, BF16, CPU)
    assert again is first, "a second decode made a second copy of unchanged weights"
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model.train()
    model(torch.tensor([PROMPT]), torch.tensor([PROMPT])).loss.backward()
    opt.step()
    model.eval()
    fresh, _ = decoding.decoding_model(model, BF16, CPU)
    assert fresh is not first, "the weights changed, the stale bf16 copy was kept"
    for (name, p), q in zip(model.named_parameters(), fresh.parameters(), strict=True):
        torch.testing.assert_close(q.float(), p.detach(), atol=0, rtol=2**-8, msg=lambda m: f"{name}: {m}")
    assert not fresh.training, "the copy decodes in the model's mode"
    assert decoding.decoding_model(model, F32, CPU) == (model, F32), "float32 decodes with the model itself"


def test_a_watched_model_decodes_itself_so_its_hooks_and_edits_apply():
    """The lab continues a text under an intervention (model.hooks.hooked: forward hooks on the model's points):
    a bf16 copy would decode without them. While hooks are on, bf16 decodes with the model itself under autocast,
    and the edit applies at every step."""
    from model.hooks import hooked

    model = tiny_model()
    decoding.decoding_model(model, BF16, CPU)  # a copy already kept, made before the hooks
    calls = []

    def edit(x):
        calls.append(x.dtype)
        return x * 0  # the last block's output zeroed: the logits no longer depend on the text

    with hooked(model, {"h.1.hook_resid_post": edit}):
        decoder, cast = decoding.decoding_model(model, BF16, CPU)
        assert decoder is model and cast == BF16, "a watched model was swapped for its unwatched copy"
        ids = sampling.generate_text(model, None, PROMPT, 5, greedy=True, use_cache=False, dtype="bfloat16")
    assert len(calls) == 5, f"the edit ran {len(calls)} times in 5 steps"
    assert len(set(ids)) == 1, f"with the residual zeroed every step predicts the same token, got {ids}"
    assert decoding.decoding_model(model, BF16, CPU)[0] is not model, "unwatched again: the bf16 copy"


def test_the_bf16_copy_decodes_in_the_models_mode_now_not_the_one_it_was_made_in():
    """A copy made while the model trained (dropout on) must not keep dropping activations once the model is put
    in eval mode: same weights, so the same kept copy, in the model's mode of the moment."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=2, n_embd=32, dropout=0.5)).train()
    made, _ = decoding.decoding_model(model, BF16, CPU)
    assert made.training and all(m.training for m in made.modules())
    model.eval()
    later, _ = decoding.decoding_model(model, BF16, CPU)
    assert later is made and not any(m.training for m in later.modules()), "the copy decodes with dropout on"
    model.train()
    assert decoding.decoding_model(model, BF16, CPU)[0].training


@pytest.mark.parametrize("kind", ["forward hook", "forward pre-hook"])
def test_any_hook_on_any_module_keeps_the_model_itself(kind):
    model = tiny_model()
    block = model.transformer.h[1].mlp
    handle = (block.register_forward_hook(lambda m, a, out: out) if kind == "forward hook"
              else block.register_forward_pre_hook(lambda m, a: None))
    assert decoding.watched(model)
    assert decoding.decoding_model(model, BF16, CPU) == (model, BF16), f"a {kind} on one block's MLP was dropped"
    handle.remove()
    assert not decoding.watched(model)


@pytest.mark.parametrize("arch", ["gpt", "lstm"])
def test_bf16_weights_decode_every_architecture_with_and_without_the_cache(arch):
    from model import LSTMLM, LSTMConfig

    torch.manual_seed(0)
    model = tiny_model() if arch == "gpt" else LSTMLM(LSTMConfig(vocab_size=64, block_size=32, n_layer=1, n_embd=16)).eval()
    for use_cache in (True, False):
        ids = sampling.generate_text(model, None, PROMPT, 30, greedy=True, use_cache=use_cache, dtype="bfloat16")
        assert len(ids) == 30 and all(0 <= i < 64 for i in ids)


# ------------------------------------------------------------------------ kept across processes, in a file


def refuse(decode, device):
    raise AssertionError("measured again, though a measurement of this key was stored")


def counting(seconds: dict[torch.dtype, float]):
    """A stub measurement and the list it appends to at each call."""
    calls = []
    return stub_measure(seconds, calls), calls


F32_WINS, BF16_WINS = {F32: 1.0, BF16: 2.0}, {F32: 2.0, BF16: 1.0}


def stored_entries() -> list[dict]:
    data = json.loads(decoding.cache_file().read_text())
    assert data["format"] == decoding.FORMAT, data
    return data["entries"]


@pytest.mark.parametrize("seconds, want", [(F32_WINS, F32), (BF16_WINS, BF16)])
def test_a_second_process_with_the_same_key_reads_the_choice_without_measuring(monkeypatch, seconds, want):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: BF16_CPU)
    measure, calls = counting(seconds)
    assert decoding_dtype("auto", CPU, lambda d: None, "model-a", measure) == want
    assert len(calls) == 1
    (entry,) = stored_entries()
    assert entry["seconds"] == {"float32": seconds[F32], "bfloat16": seconds[BF16]}, entry
    key = entry["key"]
    assert key["cpu"] == decoding.cpu_model() and key["torch"] == torch.__version__, key
    assert key["threads"] == torch.get_num_threads() and key["avx512_bf16"] is True and key["amx_bf16"] is False
    assert "model-a" in key["model"], key

    decoding.forget_measurements()  # the next process
    assert decoding_dtype("auto", CPU, lambda d: None, "model-a", refuse) == want, "the stored choice, unmeasured"


def other_torch(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "9.9.9+other")


def other_cpu(monkeypatch):
    monkeypatch.setattr(decoding, "cpu_model", lambda: "Some Other CPU @ 3.0GHz")


def amx_too(monkeypatch):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {**BF16_CPU, "amx_bf16": True, "amx_tile": True})


def other_threads(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 7)


def other_wait(monkeypatch):  # sample.py's long spin against train.py's short one (runtime/omp.py)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    spin = os.environ.get("GOMP_SPINCOUNT")
    monkeypatch.setenv("GOMP_SPINCOUNT", omp.DECODING_SPINCOUNT if spin != omp.DECODING_SPINCOUNT else omp.SPINCOUNT)


CHANGES = {"torch version": (other_torch, "model-a"), "CPU name": (other_cpu, "model-a"),
           "AMX flags": (amx_too, "model-a"), "thread count": (other_threads, "model-a"),
           "OpenMP wait": (other_wait, "model-a"), "model shape": (None, "model-b")}


@pytest.mark.parametrize("change", CHANGES)
def test_a_changed_key_measures_afresh_and_both_measurements_are_kept(monkeypatch, change):
    """Each thing the speed depends on, changed alone, is a new measurement: the CPU under another torch (or
    another CPU sharing the home folder, another model) may decode faster in the other dtype."""
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: BF16_CPU)
    first, _ = counting(F32_WINS)
    assert decoding_dtype("auto", CPU, lambda d: None, "model-a", first) == F32

    alter, key = CHANGES[change]
    with monkeypatch.context() as m:
        if alter is not None:
            alter(m)
        decoding.forget_measurements()
        second, calls = counting(BF16_WINS)
        got = decoding_dtype("auto", CPU, lambda d: None, key, second)
        assert calls, f"another {change} read the stored measurement instead of measuring"
        assert got == BF16, f"another {change}: its own measurement says bf16, auto gave {got}"
        decoding.forget_measurements()
        assert decoding_dtype("auto", CPU, lambda d: None, key, refuse) == BF16, "the new key is stored too"
    decoding.forget_measurements()
    assert decoding_dtype("auto", CPU, lambda d: None, "model-a", refuse) == F32, "the first key's entry survived"
    assert len(stored_entries()) == 2


def test_cached_and_uncached_decoding_keep_their_own_measurements(monkeypatch):
    """sample.py (KV cache, one token a step) and the lab (a full window a step) measured opposite winners on
    the AMD EPYC (docs/benchmarks.md): generate_text keys them apart, and a later process reads each."""
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: BF16_CPU)
    model = tiny_model()
    seconds = {True: F32_WINS, False: BF16_WINS}
    measured = []

    def measure(decode, device):
        measured.append(use_cache)
        return dict(seconds[use_cache])

    monkeypatch.setattr(decoding, "time_decoding", measure)
    seen = decoding_seen(monkeypatch)
    for use_cache in (True, False):
        sampling.generate_text(model, None, PROMPT, 3, greedy=True, use_cache=use_cache, dtype="auto")
    assert measured == [True, False], f"each path measured once: {measured}"

    decoding.forget_measurements()  # the next process
    monkeypatch.setattr(decoding, "time_decoding", refuse)
    for use_cache, want in ((True, F32), (False, BF16)):
        seen.clear()
        sampling.generate_text(model, None, PROMPT, 3, greedy=True, use_cache=use_cache, dtype="auto")
        assert seen == [WAY[want]], f"use_cache={use_cache}: stored winner {want}, decoded as {seen}"


def warning_lines(err: str) -> list[str]:
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) <= 1 and all(line.startswith("warning: ") for line in lines), f"one warning line at most:\n{err}"
    return lines


CORRUPT = {"half a file": b'{"format": 1, "entries": [{"key": {"cpu"',
           "not text": b"\x00\xff binary junk",
           "another format": json.dumps({"format": 999, "entries": []}).encode(),
           "a list": b"[1, 2, 3]",
           "bad seconds": None}  # written by the test: the right key with a negative and a string time


@pytest.mark.parametrize("kind", CORRUPT)
def test_a_corrupt_file_is_measured_again_and_rewritten(monkeypatch, capsys, kind):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: BF16_CPU)
    path = decoding.cache_file()
    path.parent.mkdir(parents=True)
    if CORRUPT[kind] is None:
        key = decoding.measurement_key("model-a")
        path.write_text(json.dumps({"format": decoding.FORMAT, "entries": [
            {"key": key, "seconds": {"float32": -1.0, "bfloat16": "fast"}}, {"key": "no dict", "seconds": 3}, 7]}))
    else:
        path.write_bytes(CORRUPT[kind])
    measure, calls = counting(BF16_WINS)
    assert decoding_dtype("auto", CPU, lambda d: None, "model-a", measure) == BF16
    assert len(calls) == 1, f"{kind}: measured {len(calls)} times"
    warning_lines(capsys.readouterr().err)
    assert len(stored_entries()) == 1, f"{kind}: the file is rewritten whole, with the new measurement"

    decoding.forget_measurements()
    assert decoding_dtype("auto", CPU, lambda d: None, "model-a", refuse) == BF16
    assert capsys.readouterr().err == "", "a good file is read in silence"


@pytest.mark.parametrize("where", ["a file where the folder should be", "a folder where the file should be"])
def test_an_unwritable_or_unreadable_cache_still_decodes(monkeypatch, capsys, tmp_path, where):
    """Works as root too (permissions would not stop root): the folder's place is taken by a file, or the
    file's by a folder."""
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: BF16_CPU)
    if where.startswith("a file"):
        (tmp_path / "blocked").write_text("")
        monkeypatch.setenv(decoding.CACHE_DIR_ENV, str(tmp_path / "blocked" / "cache"))
    else:
        decoding.cache_file().mkdir(parents=True)
    measure, calls = counting(BF16_WINS)
    for _ in range(3):
        assert decoding_dtype("auto", CPU, lambda d: None, "model-a", measure) == BF16
    assert len(calls) == 1, "this process keeps its measurement in memory"
    assert len(warning_lines(capsys.readouterr().err)) == 1, "say once that the measurement is not kept"

    decoding.forget_measurements()
    assert decoding_dtype("auto", CPU, lambda d: None, "model-a", measure) == BF16
    assert len(calls) == 2, "nothing was stored: the next process measures again"


def test_a_failed_write_leaves_the_previous_file_whole_and_no_temporary_file(monkeypatch, capsys):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: BF16_CPU)
    decoding_dtype("auto", CPU, lambda d: None, "model-a", counting(F32_WINS)[0])
    before = decoding.cache_file().read_bytes()

    def crash(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", crash)
    assert decoding_dtype("auto", CPU, lambda d: None, "model-b", counting(BF16_WINS)[0]) == BF16
    assert decoding.cache_file().read_bytes() == before, "the file was changed in place, not replaced whole"
    assert sorted(p.name for p in decoding.cache_file().parent.iterdir()) == [decoding.FILE_NAME], "a temp file left"
    assert "No space left" in warning_lines(capsys.readouterr().err)[0]


def test_measuring_afresh_overwrites_the_stored_measurement(monkeypatch):
    """How bench/decoding_dtype.py re-measures: the stored entry is replaced, not added to."""
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: BF16_CPU)
    assert decoding_dtype("auto", CPU, lambda d: None, "model-a", counting(F32_WINS)[0]) == F32
    measure, calls = counting(BF16_WINS)
    with decoding.measuring_afresh():
        assert decoding_dtype("auto", CPU, lambda d: None, "model-a", measure) == BF16
    assert calls, "measuring_afresh read the stored measurement"
    decoding.forget_measurements()
    assert decoding_dtype("auto", CPU, lambda d: None, "model-a", refuse) == BF16, "the new measurement is stored"
    assert len(stored_entries()) == 1


def test_the_file_keeps_the_most_recent_entries_only(monkeypatch):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: BF16_CPU)
    monkeypatch.setattr(decoding, "KEEP", 3)
    for i in range(5):
        decoding_dtype("auto", CPU, lambda d: None, f"model-{i}", counting(F32_WINS)[0])
    assert [e["key"]["model"] for e in stored_entries()] == ["model-2", "model-3", "model-4"]


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(decoding.CACHE_DIR_ENV)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert decoding.cache_file() == tmp_path / "home" / ".cache" / "attention-lab" / "measurements.json"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert decoding.cache_file() == tmp_path / "xdg" / "attention-lab" / "measurements.json"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # the XDG spec: ignored
    assert decoding.cache_file() == tmp_path / "home" / ".cache" / "attention-lab" / "measurements.json"
    monkeypatch.setenv(decoding.CACHE_DIR_ENV, str(tmp_path / "mine"))
    assert decoding.cache_file() == tmp_path / "mine" / "measurements.json"


# ------------------------------------------------------------------------ cached decoding's threads: one or all

ONE_WINS, ALL_WIN = {1: 1.0, 2: 1.5}, {1: 1.5, 2: 1.0}


def thread_measure(seconds: dict[int, float], calls: list):
    def measure(run, counts):
        calls.append(tuple(counts))
        return {n: seconds[n] for n in counts}
    return measure


@pytest.fixture
def two_threads(monkeypatch):
    """torch's thread count read as 2 (the machines here have two cores; a test must not depend on it)."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)


@pytest.mark.parametrize("seconds, want", [(ONE_WINS, 1), (ALL_WIN, 2)])
def test_the_thread_count_follows_its_measurement_both_ways(two_threads, seconds, want):
    calls = []
    for _ in range(3):
        got = decoding.decoding_thread_count(CPU, True, lambda n: None, "model-a", thread_measure(seconds, calls))
        assert got == want, f"measured {seconds}: decode in {want} thread(s), got {got}"
    assert calls == [(1, 2)], f"one measurement of one thread against all, kept: {calls}"


def test_a_second_thread_must_win_by_more_than_the_margin(two_threads):
    def pick(seconds, key):
        return decoding.decoding_thread_count(CPU, True, lambda n: None, key, thread_measure(seconds, []))

    assert pick({1: 1.0, 2: 0.97}, "a") == 1, "3% is inside the 5% margin: one thread (never kept waiting) stays"
    assert pick({1: 1.0, 2: 0.90}, "b") == 2, "10% faster in two threads: two"
    assert decoding.faster({1: 1.0, 2: 0.90}, 1, margin=0.2) == 1, "the margin is the caller's"


@pytest.mark.parametrize("where", ["uncached", "GPU", "one thread only"])
def test_threads_are_measured_only_where_there_is_a_choice(monkeypatch, where):
    """Full forward passes keep every thread, a GPU's decoding leaves the CPU's threads alone, and with one thread
    there is nothing to choose: none of them measures."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1 if where == "one thread only" else 4)
    device, cached = {"uncached": (CPU, False), "GPU": (torch.device("cuda"), True),
                      "one thread only": (CPU, True)}[where]

    def refuse_threads(run, counts):
        raise AssertionError(f"measured threads {counts} where there is no choice ({where})")

    got = decoding.decoding_thread_count(device, cached, lambda n: None, "k", refuse_threads)
    assert got == torch.get_num_threads(), f"{where}: torch's own threads, got {got}"


def test_the_thread_measurement_times_one_and_all_interleaved_on_the_real_decode(two_threads):
    """time_candidates, the default measure: each count warmed up once, then taken in turn, each call the
    decode in that many threads; medians of a fake clock the decode advances."""
    clock = FakeClock({1: 0.375, 2: 0.25})  # binary fractions: sums and differences exact
    got = decoding.decoding_thread_count(CPU, True, clock.decode, "k",
                                         lambda run, counts: decoding.time_candidates(run, counts, 3, clock))
    assert clock.calls == [1, 2] * 4, f"warm-up once each, then 3 rounds in turn; got {clock.calls}"
    assert got == 2
    decoding.forget_measurements()  # the next process reads it
    assert decoding.decoding_thread_count(CPU, True, clock.decode, "k", refuse) == 2
    assert clock.calls == [1, 2] * 4, "a second process measured again"
    (entry,) = stored_entries()
    assert entry["seconds"] == {"1": 0.375, "2": 0.25} and entry["key"]["threads"] == 2, entry


def threads_seen(monkeypatch) -> list:
    """torch's thread count in every generate_stream call in sampling from now on."""
    seen = []
    real = sampling.generate_stream

    def spy(model, *args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(model, *args, **kwargs)

    monkeypatch.setattr(sampling, "generate_stream", spy)
    return seen


@pytest.mark.parametrize("seconds, want", [(ONE_WINS, 1), (ALL_WIN, 2)])
def test_generate_text_decodes_in_the_measured_threads_keyed_by_its_dtype(monkeypatch, torch_threads, seconds,
                                                                          want):
    """The measurement's probe decodes in each count, the sample in the faster one, torch's count comes back
    after; each dtype keeps a measurement of its own (bf16 weights and float32 read different bytes)."""
    state = torch_threads
    model = tiny_model()
    measured = []

    def measure(run, counts):
        start = len(seen)
        for n in counts:
            for _ in run(n):  # the probe: one decoding step a next()
                pass
        measured.append(seen[start:])
        return {n: seconds[n] for n in counts}

    monkeypatch.setattr(decoding, "time_candidates", measure)  # named dtypes: only the threads are measured
    monkeypatch.setattr(decoding, "time_layouts", lambda decode: {"rows": 1.0, "columns": 1.0})  # (and rows kept)
    seen = threads_seen(monkeypatch)
    expected = sampling.generate_text(model, None, PROMPT, 8, greedy=True, dtype="float32", threads=1)
    assert not measured and seen == [1], f"threads=1 asked: no measurement, one thread ({seen})"
    told = []
    got = sampling.generate_text(model, None, PROMPT, 8, greedy=True, dtype="float32",
                                 on_decoding=lambda dtype, threads, layout: told.append((dtype, threads, layout)))
    assert measured == [[1, 2]], f"the probe should decode in one thread, then in two: {measured}"
    assert told == [(F32, want, "rows")], f"on_decoding should hear the dtype, threads and layout in effect: {told}"
    assert seen[-1] == want, f"measured {seconds}: the sample should decode in {want} thread(s), ran in {seen[-1]}"
    assert got == expected, "the thread count changed the tokens"
    assert state["n"] == 2, "torch's thread count was not restored"
    sampling.generate_text(model, None, PROMPT, 8, greedy=True, dtype="float32")
    assert len(measured) == 1, "a second sample of the same model and dtype measured again"
    sampling.generate_text(model, None, PROMPT, 8, greedy=True, dtype="bfloat16")
    assert len(measured) == 2, "bf16 decoding read float32's thread measurement"
    sampling.generate_text(model, None, PROMPT, 8, greedy=True, use_cache=False, dtype="float32")
    assert len(measured) == 2 and seen[-1] == 2, "uncached decoding (full passes) measured or dropped threads"


@pytest.mark.parametrize("use_cache", [True, False])
def test_auto_times_the_dtype_in_one_thread_and_the_threads_in_the_chosen_dtype(monkeypatch, torch_threads,
                                                                                 use_cache):
    """With the cache: the dtype is measured in one thread (the key's thread count says 1, as stored before), then
    the threads are measured decoding the chosen dtype's way (here bf16 weights), and the sample decodes so.
    Without it the dtype is measured in every thread, the way full forward passes run, and no thread count is."""
    state = torch_threads
    model = tiny_model()
    dtype_measured_in, thread_probes = [], []

    def measure_dtype(decode, device):
        dtype_measured_in.append(state["n"])
        return {F32: 2.0, BF16: 1.0}

    def measure_threads(run, counts):
        start = len(seen)
        for n in counts:
            for _ in run(n):  # the probe: one decoding step a next()
                pass
        thread_probes.append(seen[start:])
        return {1: 1.5, 2: 1.0}

    monkeypatch.setattr(decoding, "time_decoding", measure_dtype)
    monkeypatch.setattr(decoding, "time_candidates", measure_threads)
    monkeypatch.setattr(decoding, "time_layouts", lambda decode: {"rows": 1.0, "columns": 1.0})
    seen = []
    real = sampling.generate_stream
    monkeypatch.setattr(sampling, "generate_stream", lambda m, *a, **k: (
        seen.append((torch.get_num_threads(), next(m.parameters()).dtype)), real(m, *a, **k))[1])
    sampling.generate_text(model, None, PROMPT, 8, greedy=True, use_cache=use_cache, dtype="auto")
    if use_cache:
        assert dtype_measured_in == [1], f"the cached path's dtype is measured in one thread: {dtype_measured_in}"
        assert thread_probes == [[(1, BF16), (2, BF16)]], f"the threads are timed in bf16 weights: {thread_probes}"
        assert seen[-1] == (2, BF16), seen
    else:
        assert dtype_measured_in == [2] and not thread_probes, (dtype_measured_in, thread_probes)
        assert seen[-1] == (2, BF16), seen
