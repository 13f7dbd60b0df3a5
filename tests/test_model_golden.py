"""Golden numbers: the loss of a fixed tiny model over five AdamW steps on a fixed batch, on CPU in float32.

Any change to the model's math, its initialisation or the order in which parameters are created (which moves the
seeded random draws) changes these numbers. Different CPUs and BLAS builds agree to ~1e-6, so 1e-4 absolute is a
safe tolerance that still catches a real change (those move the loss by 1e-3 or more).

To re-record after an intended change: ATTENTION_LAB_PRINT_GOLDEN=1 pytest -s tests/test_model_golden.py
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from model import GPT, GPTConfig

V = 64
# recorded with torch 2.13.0+cpu, float32
EXPECTED = [4.1667318344, 4.0693955421, 3.9931333065, 3.9302120209, 3.8730649948, 3.8217883110]
TOL = 1e-4


@pytest.fixture
def deterministic():
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(previous)


def run_golden() -> list[float]:
    """Loss before each of 5 AdamW steps, and after the last one (6 values)."""
    torch.manual_seed(1337)
    cfg = GPTConfig(
        vocab_size=V, block_size=16, n_layer=2, n_head=4, n_embd=32, pos_encoding="learned", attn_backend="sdpa"
    )
    model = GPT(cfg).train()  # dropout is 0: train mode is deterministic
    batch = torch.randint(0, V, (4, 17), generator=torch.Generator().manual_seed(0))
    idx, targets = batch[:, :-1], batch[:, 1:]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    losses = []
    for _ in range(5):
        loss = model(idx, targets).loss
        losses.append(loss.item())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    with torch.no_grad():
        losses.append(model(idx, targets).loss.item())
    return losses


def test_golden_losses(deterministic):
    losses = run_golden()
    if os.environ.get("ATTENTION_LAB_PRINT_GOLDEN") == "1":
        print("\nEXPECTED = [" + ", ".join(f"{x:.10f}" for x in losses) + "]")

    # sanity, independent of the recording: near-uniform predictions at init, and training reduces the loss
    assert abs(losses[0] - math.log(V)) < 0.05, (
        f"initial loss {losses[0]:.4f} is far from ln(vocab_size) = {math.log(V):.4f}: the init is not near-uniform"
    )
    assert losses[-1] < losses[0] - 0.1, f"5 AdamW steps on one batch should lower the loss: {losses}"

    for step, (got, expected) in enumerate(zip(losses, EXPECTED)):
        assert abs(got - expected) <= TOL, (
            f"golden loss changed: got {got:.6f}, expected {expected:.6f} at step {step} (all: {losses}). "
            "If you changed the model's math, init or parameter order on purpose, re-record EXPECTED in "
            "tests/test_model_golden.py (run ATTENTION_LAB_PRINT_GOLDEN=1 pytest -s tests/test_model_golden.py "
            "to print the new values) and say why in the commit; otherwise this is a regression."
        )
