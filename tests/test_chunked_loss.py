"""model.gpt.chunked_next_token_loss: the loss a block of rows at a time gives next_token_loss's number and gradient.

Tolerances: float32 logits agree to float32 rounding (1e-6 relative on the loss, 1e-6 absolute on gradients whose
largest entry is about 1e-2); bf16 logits agree on the loss to 1e-5 relative (both sides reduce in float32) and
on each gradient entry to one bf16 rounding step of that entry (both sides round a float32 gradient to bf16 once).
"""

from __future__ import annotations

import math

import pytest
import torch

from model.gpt import chunked_next_token_loss, next_token_loss


def logits_and_targets(dtype, b=3, t=37, v=53, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = (3 * torch.randn(b, t, v, generator=g)).to(dtype).requires_grad_()
    y = torch.randint(0, v, (b, t), generator=g)
    y[0, :4] = -1  # ignored positions, as the trainer's padding and the claims' masks give
    y[2, -1] = -1
    return z, y


@pytest.mark.parametrize("rows", [1, 7, 64, 1000])  # one row, a block that does not divide B*T, one block, more
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_loss_and_gradient_equal_the_plain_loss(rows, dtype):
    z, y = logits_and_targets(dtype)
    plain = next_token_loss(z, y)
    (g_plain,) = torch.autograd.grad(plain * 1.7, z)  # an upstream gradient other than 1
    chunked = chunked_next_token_loss(z, y, rows=rows)
    (g_chunked,) = torch.autograd.grad(chunked * 1.7, z)
    assert chunked.dtype == torch.float32 and chunked.shape == ()
    assert chunked.item() == pytest.approx(plain.item(), rel=1e-5 if dtype == torch.bfloat16 else 1e-6)
    assert g_chunked.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(g_chunked, g_plain, rtol=0, atol=1e-6)
    else:
        step = torch.finfo(torch.bfloat16).eps * g_plain.float().abs()  # one bf16 rounding step of each entry
        assert ((g_chunked.float() - g_plain.float()).abs() <= step + 1e-12).all()


def test_ignored_positions_get_no_gradient_and_do_not_count():
    z, y = logits_and_targets(torch.float32)
    loss = chunked_next_token_loss(z, y, rows=5)
    (g,) = torch.autograd.grad(loss, z)
    assert (g[0, :4] == 0).all() and (g[2, -1] == 0).all()
    keep = y != -1
    by_hand = (torch.logsumexp(z, -1) - z.gather(-1, y.clamp_min(0).unsqueeze(-1)).squeeze(-1))[keep].mean()
    assert loss.item() == pytest.approx(by_hand.item(), rel=1e-6)
    # each kept row's gradient is (softmax - onehot) / kept rows: it sums to zero over the vocabulary
    assert g[keep].sum(-1).abs().max() < 1e-7


def test_every_position_ignored_gives_nan_as_cross_entropy_does():
    z, y = logits_and_targets(torch.float32)
    y[:] = -1
    assert math.isnan(chunked_next_token_loss(z, y).item()) and math.isnan(next_token_loss(z, y).item())
