"""Batches: shapes and shift, seeded determinism, exact resume, rank slices, fixed evaluation windows."""

import io
import warnings

import numpy as np
import pytest
import torch

from data.batches import BatchSampler, eval_batches

TOKENS = np.arange(10_000, dtype=np.uint16)  # token value = position: windows are checkable


def take(sampler: BatchSampler, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [sampler.next_batch() for _ in range(n)]


def assert_same(a, b, what):
    assert len(a) == len(b), what
    for i, ((xa, ya), (xb, yb)) in enumerate(zip(a, b)):
        assert torch.equal(xa, xb) and torch.equal(ya, yb), f"{what}: batch {i} differs"


def test_windows_are_contiguous_and_y_is_x_shifted():
    x, y = BatchSampler(TOKENS, block_size=16, batch_size=8, seed=0).next_batch()
    assert x.shape == y.shape == (8, 16) and x.dtype == y.dtype == torch.int64, (x.shape, x.dtype)
    assert x.is_contiguous() and y.is_contiguous(), "y.view(-1) in the loss needs contiguous tensors"
    assert torch.equal(x[:, 1:], y[:, :-1]), "y must be x shifted by one"
    assert bool((x[:, 1:] - x[:, :-1] == 1).all()), "windows must be contiguous runs of the token array"


def test_same_seed_same_batches_other_seed_other_batches():
    a = take(BatchSampler(TOKENS, 16, 8, seed=1), 5)
    assert_same(a, take(BatchSampler(TOKENS, 16, 8, seed=1), 5), "same seed")
    b = take(BatchSampler(TOKENS, 16, 8, seed=2), 5)
    assert not all(torch.equal(xa, xb) for (xa, _), (xb, _) in zip(a, b)), "another seed must give other batches"


def test_resume_from_state_dict_continues_the_same_stream():
    uninterrupted = take(BatchSampler(TOKENS, 16, 8, seed=3), 10)

    first = BatchSampler(TOKENS, 16, 8, seed=3)
    before = take(first, 4)
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)  # as a checkpoint would
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    take(first, 3)  # the original goes on; the saved state must not follow it

    resumed = BatchSampler(TOKENS, 16, 8, seed=999)  # the seed comes from the state
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resumed.load_state_dict(state)
    assert resumed.batches_drawn == 4
    assert_same(before + take(resumed, 6), uninterrupted, "resumed stream")


def test_resume_with_other_settings_warns():
    state = BatchSampler(TOKENS, 16, 8, seed=0).state_dict()
    with pytest.warns(UserWarning, match=r"block_size 16 -> 32"):
        BatchSampler(TOKENS, 32, 8, seed=0).load_state_dict(state)


def test_ranks_take_disjoint_slices_of_one_global_batch():
    whole = take(BatchSampler(TOKENS, 16, 8, seed=4), 3)
    ranks = [take(BatchSampler(TOKENS, 16, 4, seed=4, rank=r, world_size=2), 3) for r in range(2)]
    for step in range(3):
        x0, x1 = ranks[0][step][0], ranks[1][step][0]
        assert not torch.equal(x0, x1), "ranks must see different windows"
        assert torch.equal(torch.cat([x0, x1]), whole[step][0]), "2 ranks x 4 rows = 1 process x 8 rows"
    states = [BatchSampler(TOKENS, 16, 4, seed=4, rank=r, world_size=2) for r in range(2)]
    for s in states:
        take(s, 2)
    assert torch.equal(states[0].state_dict()["generator"], states[1].state_dict()["generator"]), \
        "every rank holds the same generator state, so rank 0's checkpoint resumes all of them"


def test_memmap_input(tmp_path):
    path = tmp_path / "t.bin"
    TOKENS.tofile(path)
    mm = np.memmap(path, dtype=np.uint16, mode="r")
    assert_same(take(BatchSampler(mm, 16, 8, seed=5), 3), take(BatchSampler(TOKENS, 16, 8, seed=5), 3), "memmap")


def test_eval_batches_are_fixed_and_spread_over_the_array():
    batches = eval_batches(TOKENS, block_size=16, batch_size=8, max_batches=5)
    first, second = list(batches), list(batches)
    assert len(first) == len(batches) == 5, "5 full batches asked for, array long enough"
    assert_same(first, second, "two passes over the evaluation batches")
    starts = torch.cat([x[:, 0] for x, _ in first])
    assert starts[0] == 0 and int(starts.max()) > 9000, f"windows must span the whole array: {starts.tolist()}"
    last_x, last_y = first[-1]
    assert last_x.shape == (8, 16) and torch.equal(last_x[:, 1:], last_y[:, :-1])


def test_eval_batches_on_a_short_array_cover_it_once():
    short = np.arange(100, dtype=np.uint16)
    batches = eval_batches(short, block_size=10, batch_size=4, max_batches=50)
    assert len(batches) == 3, f"10 windows tile 100 tokens: 3 batches of 4, not 50; got {len(batches)}"
    ys = torch.cat([y for _, y in batches])
    assert int(ys.max()) == 99, "the last token must be a target"


@pytest.mark.parametrize("make", [
    lambda t: BatchSampler(t, block_size=64, batch_size=2, seed=0),
    lambda t: eval_batches(t, block_size=64, batch_size=2, max_batches=1),
])
def test_array_shorter_than_a_window_is_a_clear_error(make):
    with pytest.raises(ValueError, match=r"corpus smaller than one context window: 64 tokens < block_size\+1 = 65; "
                                         r"lower block_size or add text"):
        make(np.zeros(64, dtype=np.uint16))
    make(np.zeros(65, dtype=np.uint16))  # exactly one window fits


def test_bad_rank():
    with pytest.raises(ValueError, match="rank=2"):
        BatchSampler(TOKENS, 16, 8, seed=0, rank=2, world_size=2)
