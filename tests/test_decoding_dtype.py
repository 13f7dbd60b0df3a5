"""dtype auto for decoding (attention_lab/runtime/decoding.py): chosen from a measurement, in both directions.

Nothing here is timed: the measurement runs on a fake clock that each dtype's decode advances by a stated amount,
and the decision is driven by stubbed timings. Speed itself lives in bench/decoding_dtype.py.
"""

from __future__ import annotations

import pytest
import torch

from attention_lab import sampling
from attention_lab.runtime import decoding
from attention_lab.runtime.decoding import decoding_dtype, faster_dtype, time_decoding
from model import GPT, GPTConfig

CPU = torch.device("cpu")
F32, BF16 = torch.float32, torch.bfloat16
BF16_CPU = {"avx512_bf16": True, "amx_bf16": False}  # what torch.cpu.get_capabilities reports, stubbed
PLAIN_CPU = {"avx512_bf16": False, "amx_bf16": False, "avx2": True}


@pytest.fixture(autouse=True)
def fresh_measurements():
    decoding.forget_measurements()
    yield
    decoding.forget_measurements()


class FakeClock:
    """A clock that decode() advances: by cost[dtype] seconds for the autocast dtype it runs under."""

    def __init__(self, cost: dict[torch.dtype, float]):
        self.now, self.cost, self.calls = 0.0, cost, []

    def __call__(self) -> float:
        return self.now

    def decode(self) -> None:
        dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else F32
        self.calls.append(dtype)
        self.now += self.cost[dtype]


@pytest.mark.parametrize("cost, want", [({F32: 1.0, BF16: 2.0}, F32), ({F32: 2.0, BF16: 1.0}, BF16)])
def test_the_measurement_times_each_dtype_under_its_autocast_interleaved(cost, want):
    clock = FakeClock(cost)
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
        assert decoding_dtype("auto", CPU, lambda: None, "model-a", measure) == want, seconds
    assert len(calls) == 1, f"measured {len(calls)} times for one model: once per process and key"
    decoding_dtype("auto", CPU, lambda: None, "model-b", measure)
    assert len(calls) == 2, "another model (key) is measured on its own"


def test_named_dtypes_and_cpus_without_bf16_units_are_never_measured(monkeypatch):
    def measure(decode, device):
        raise AssertionError("measured where no choice was to be made")

    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: BF16_CPU)
    assert decoding_dtype("float32", CPU, lambda: None, "k", measure) == F32
    assert decoding_dtype("bfloat16", CPU, lambda: None, "k", measure) == BF16
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: PLAIN_CPU)
    assert decoding_dtype("auto", CPU, lambda: None, "k", measure) == F32, "emulated bf16: float32"


# ---------------------------------------------------------------------------------- in generate_text, end to end


def tiny_model() -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=2, n_embd=32, pos_encoding="rope", qk_norm=True)
    return GPT(cfg).eval()


def autocast_seen(model: GPT) -> list:
    """The autocast dtype (or float32 without autocast) of each forward pass of the model from now on."""
    seen = []

    def record(module, args):
        seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else F32)

    model.register_forward_pre_hook(record)
    return seen


PROMPT = [1, 5, 9, 2, 7, 3]


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("seconds, want", [({F32: 1.0, BF16: 2.0}, F32), ({F32: 2.0, BF16: 1.0}, BF16)])
def test_generate_text_decodes_in_the_measured_dtype_and_gives_its_tokens(monkeypatch, seconds, want, use_cache):
    """auto's tokens are the chosen dtype's own tokens (the same path), and every forward pass after the
    measurement runs in that dtype; the measurement ran the real model (its probe decodes)."""
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: BF16_CPU)
    model = tiny_model()
    named = "float32" if want == F32 else "bfloat16"
    expected = sampling.generate_text(model, None, PROMPT, 12, greedy=True, use_cache=use_cache, dtype=named)

    probed = []

    def measure(decode, device):
        with torch.autocast("cpu", dtype=BF16):
            decode()
        probed.append(len(seen))
        return dict(seconds)

    monkeypatch.setattr(decoding, "time_decoding", measure)
    seen = autocast_seen(model)
    got = sampling.generate_text(model, None, PROMPT, 12, greedy=True, use_cache=use_cache, dtype="auto")
    assert probed and probed[0] > 0, "auto never ran the model to measure it"
    after = seen[probed[0]:]
    assert after and set(after) == {want}, f"measured {seconds}: decoding should run in {want}, ran in {set(after)}"
    assert got == expected, f"auto ({want}) gave {got}, {named} gives {expected}"


def test_bf16_decoding_keeps_float32s_greedy_tokens_where_the_margin_is_clear():
    """Where bf16 is the faster path, its logits are float32's within bf16's rounding (atol 0.05 + rtol 0.05,
    measured about 0.01 here), so wherever float32's best token leads the next by more than twice that bound,
    bf16 picks the same token. Teacher-forced on float32's own greedy continuation."""
    model = tiny_model()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # spread the logits: a random model's are nearly flat
    ids = PROMPT + sampling.generate_text(model, None, PROMPT, 20, greedy=True, dtype="float32")
    x = torch.tensor([ids])
    with torch.no_grad():
        ref = model(x).logits[0].float()
        with torch.autocast("cpu", dtype=BF16):
            low = model(x).logits[0].float()
    torch.testing.assert_close(low, ref, atol=0.05, rtol=0.05, msg=lambda m: f"bf16 logits drift from float32\n{m}")
    bound = ((low - ref).abs().max()).item()
    top2 = ref.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * bound
    assert clear.sum() >= 5, f"only {int(clear.sum())} positions with a clear margin: the check would be empty"
    assert torch.equal(low.argmax(-1)[clear], ref.argmax(-1)[clear]), "bf16 changed a token float32 chose clearly"
