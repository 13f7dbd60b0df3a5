"""The LSTM baseline starts out remembering (model/lstm.py reset_parameters): the forget gates' bias is 1, on the
forget gate and nowhere else, in every layer, and the rest of the initialisation is what the docstring says.

torch's nn.LSTM stacks each layer's four gates in the order input, forget, cell (g), output: rows [0, C), [C, 2C),
[2C, 3C), [3C, 4C) of weight_ih_l{k}, weight_hh_l{k}, bias_ih_l{k} and bias_hh_l{k}; the gate sees the sum
b_ih + b_hh. A bias of 1 on the wrong slice (the input gate, say) trains, but the rnn claim's LSTM then starts out
forgetting: each step keeps about half of its cell state instead of about sigmoid(1) = 0.73 of it.
"""

from __future__ import annotations

import math

import pytest
import torch

from model import LSTMLM, LSTMConfig, build_model, config_from_dict

GATES = ("input", "forget", "cell", "output")  # torch's order, C rows each

SIZES = {"default": LSTMConfig(vocab_size=300, block_size=64),  # 4 layers, 128 wide
         "one layer, narrow": LSTMConfig(vocab_size=50, block_size=16, n_layer=1, n_embd=16),
         "deep, untied": LSTMConfig(vocab_size=200, block_size=32, n_layer=6, n_embd=64, tie_embeddings=False)}


def fresh(cfg: LSTMConfig, seed: int = 0) -> LSTMLM:
    torch.manual_seed(seed)
    return LSTMLM(cfg)


def gate(vector: torch.Tensor, name: str, c: int) -> torch.Tensor:
    i = GATES.index(name)
    return vector[i * c:(i + 1) * c]


@pytest.mark.parametrize("size", SIZES)
def test_the_forget_gate_bias_is_one_and_only_the_forget_gates(size):
    """b_ih's forget slice is 1 and b_hh's 0 in every layer (so the gate's bias, their sum, is exactly 1); no other
    gate's slice is 1: the other gates keep torch's random U(-1/sqrt(C), 1/sqrt(C)) biases, centred on 0."""
    cfg = SIZES[size]
    lstm, c = fresh(cfg).rnn.h, cfg.n_embd
    bound = 1 / math.sqrt(c)
    for layer in range(cfg.n_layer):
        b_ih, b_hh = getattr(lstm, f"bias_ih_l{layer}").detach(), getattr(lstm, f"bias_hh_l{layer}").detach()
        assert b_ih.shape == b_hh.shape == (4 * c,), f"layer {layer}: biases of 4 gates x {c}, got {tuple(b_ih.shape)}"
        forget_ih, forget_hh = gate(b_ih, "forget", c), gate(b_hh, "forget", c)
        assert torch.equal(forget_ih, torch.ones(c)), \
            f"layer {layer}: the forget gate's b_ih must be 1 for every unit (Jozefowicz et al.), got {forget_ih[:6]}"
        assert torch.equal(forget_hh, torch.zeros(c)), \
            f"layer {layer}: the forget gate's b_hh must be 0, so the gate's bias b_ih + b_hh is exactly 1; " \
            f"got {forget_hh[:6]}"
        for name in ("input", "cell", "output"):
            for which, vector in (("b_ih", b_ih), ("b_hh", b_hh)):
                part = gate(vector, name, c)
                assert part.abs().max() <= bound, \
                    f"layer {layer}: the {name} gate's {which} must stay in torch's U(-{bound:.3f}, {bound:.3f}), " \
                    f"got max |b| {part.abs().max():.3f} (a bias of 1 moved to the {name} gate?)"
                assert part.std() > bound / 4, \
                    f"layer {layer}: the {name} gate's {which} must be random (torch's init), got std {part.std():.4f}"
            total = gate(b_ih, name, c) + gate(b_hh, name, c)
            assert abs(total.mean()) < 4 * bound * math.sqrt(2 / 3 / c), \
                f"layer {layer}: the {name} gate's bias b_ih + b_hh must be centred on 0, got mean {total.mean():.3f}"


@pytest.mark.parametrize("size", SIZES)
def test_the_gates_weights_and_the_embeddings_keep_their_documented_init(size):
    """Gate weights: torch's U(-1/sqrt(C), 1/sqrt(C)) (std bound/sqrt(3)); the embedding, and an untied head,
    U(-0.1, 0.1) as AWD-LSTM (std 0.1/sqrt(3) = 0.058); a tied head is the embedding itself."""
    cfg = SIZES[size]
    model = fresh(cfg)
    lstm, c = model.rnn.h, cfg.n_embd
    bound = 1 / math.sqrt(c)
    for layer in range(cfg.n_layer):
        for which in ("weight_ih", "weight_hh"):
            w = getattr(lstm, f"{which}_l{layer}").detach()
            assert w.shape == (4 * c, c), f"{which}_l{layer}: (4C, C), got {tuple(w.shape)}"
            assert w.abs().max() <= bound and abs(w.std() / (bound / math.sqrt(3)) - 1) < 0.1, \
                f"{which}_l{layer} must be torch's U(-{bound:.3f}, {bound:.3f}): max {w.abs().max():.3f}, " \
                f"std {w.std():.4f}"
    heads = [("wte", model.rnn.wte.weight)] + ([] if cfg.tie_embeddings else [("lm_head", model.lm_head.weight)])
    for name, w in heads:
        w = w.detach()
        assert w.abs().max() <= 0.1 and abs(w.std() / (0.1 / math.sqrt(3)) - 1) < 0.1, \
            f"{name} must be U(-0.1, 0.1): max {w.abs().max():.3f}, std {w.std():.4f}"
    if cfg.tie_embeddings:
        assert model.lm_head.weight is model.rnn.wte.weight, "a tied head must be the embedding matrix itself"
    else:
        assert not torch.equal(model.lm_head.weight, model.rnn.wte.weight), "an untied head gets its own init"


def cell_retention(model: LSTMLM, steps: int = 10) -> list[float]:
    """For each layer, how much of a cell state written at step 0 is left after `steps` steps of zero input:
    ||c_T(c_0) - c_T(0)|| / ||c_0||, the state's own trace (what a run from a zero state would hold anyway
    subtracted)."""
    lstm, cfg = model.rnn.h, model.config
    c0 = torch.randn(cfg.n_layer, 1, cfg.n_embd, generator=torch.Generator().manual_seed(0))
    h0, x = torch.zeros_like(c0), torch.zeros(1, steps, cfg.n_embd)
    with torch.no_grad():
        _, (_, c_written) = lstm(x, (h0, c0))
        _, (_, c_blank) = lstm(x, (h0, torch.zeros_like(c0)))
    return ((c_written - c_blank).norm(dim=-1) / c0.norm(dim=-1)).flatten().tolist()


@pytest.mark.parametrize("size", SIZES)
def test_a_fresh_lstm_remembers_a_state_for_many_steps(size):
    """Behaviour, not bytes: with the forget gate's bias 1 each step keeps about sigmoid(1) = 0.73 of the cell
    state, so after 10 steps at least sigmoid(1)^10 = 4.4% of it is left in every layer (about 9-16% measured:
    the cell's own output feeds back); with the bias on another gate a step keeps about a half, and at most 2%
    is left (0.2-2% measured with the bias moved to the input or cell gate, or left out)."""
    cfg = SIZES[size]
    kept = cell_retention(fresh(cfg))
    floor = (1 / (1 + math.exp(-1))) ** 10
    assert min(kept) > floor, (f"a fresh LSTM forgets: after 10 steps each layer keeps {[f'{k:.4f}' for k in kept]} "
                               f"of its cell state, below sigmoid(1)^10 = {floor:.4f}; is the forget gate's bias 1, "
                               "on rows [C, 2C) (torch's gate order input, forget, cell, output) in every layer?")


def test_every_way_to_build_an_lstm_starts_remembering():
    """build_model (what train.py and the rnn claim's arms call) and a config read back from a checkpoint's
    model_config.json build the same remembering network as LSTMLM itself."""
    cfg = SIZES["default"]
    for how, make in (("build_model", lambda: build_model(cfg)),
                      ("config_from_dict", lambda: build_model(config_from_dict(cfg.to_dict())))):
        torch.manual_seed(0)
        model = make()
        assert isinstance(model, LSTMLM), how
        c = cfg.n_embd
        for layer in range(cfg.n_layer):
            assert torch.equal(gate(getattr(model.rnn.h, f"bias_ih_l{layer}").detach(), "forget", c), torch.ones(c)), \
                f"{how}: layer {layer}'s forget gate bias is not 1"
        assert min(cell_retention(model)) > (1 / (1 + math.exp(-1))) ** 10, f"{how}: the network forgets"
