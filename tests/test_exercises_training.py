"""Training with the learner's attention (model.attn_impl): the reference loaded as a learner's file trains exactly
like the built-in attention; a file with the mask after the softmax trains and its honest loss shows the leak;
the run records the file and reopens with it (a clear error when it is gone); the attention maps are the learner's
own; bad code in training is one error naming the line; export to transformers refuses a learner's attention.

Each test names the planted bug it catches (tests/mutations.py, "the exercises (issue 31)")."""

from __future__ import annotations

import inspect
import json
import math
import re
import shutil

import numpy as np
import pytest
import torch

import train as train_mod
from attention_lab.exercises import answers
from attention_lab.exercises.learner import LearnerError, learner_of, plug
from attention_lab.interop import export as export_mod
from attention_lab.interop.hf import export_pretrained
from attention_lab.interp.measures import honest_position_losses, position_losses
from attention_lab.store.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from attention_lab.training.config import compose
from data.prepare import prepare_data
from data.tokenizer import Tokenizer
from model import GPT, GPTConfig, generate, hooked

STEPS = 40
COMMON = ["experiment=debug", f"train.max_steps={STEPS}", f"train.eval_interval={STEPS // 2}", "train.log_interval=1",
          "train.head_roles=false", "train.tensorboard=false", "train.film=false", "train.sample_tokens=0"]

REFERENCE_FILE = '''import torch
from model.attention import math_attention, visible_keys


def attention(q, k, v):
    pos = torch.arange(q.size(-2), device=q.device)
    return math_attention(q, k, v, visible_keys(pos, pos))[0]
'''

AFTER_SOFTMAX_FILE = '''import math

import torch


def attention(q, k, v):
    t = q.size(-2)
    s = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.size(-1)))
    w = torch.softmax(s, dim=-1)
    future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    return w.masked_fill(future, 0.0) @ v  # the mask after the softmax
'''


def _losses(run):
    return [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data_cache):
    """Four debug runs of STEPS steps: the built-in attention (math backend), the reference as a learner's file,
    the project's answer as a learner's file, and a learner's file with the mask after the softmax."""
    root = tmp_path_factory.mktemp("learner_runs")
    files = {"reference": REFERENCE_FILE, "answer": "import math\n\nimport torch\n\n\n"
             + inspect.getsource(answers.attention), "after": AFTER_SOFTMAX_FILE}
    out = {}
    for name, text in files.items():
        (root / f"{name}.py").write_text(text)
    arms = {"builtin": ["model.attn_backend=math"],
            **{name: [f"model.attn_impl={root / name}.py:attention"] for name in files}}
    arms["after"].append("train.tensorboard=true")  # the leak's line in TensorBoard too
    for name, extra in arms.items():
        train_mod.train(compose(COMMON + [f"data.cache_dir={data_cache}"] + extra), root / name)
        out[name] = root / name
    out["root"] = root
    out["cfg"] = compose(COMMON + [f"data.cache_dir={data_cache}"])
    return out


def test_the_reference_as_a_learners_file_trains_exactly_like_the_builtin(runs):
    """Bit for bit on the CPU where the same operations run (the math backend).
    Planted bugs: exercise_learner_not_called_in_training (the check below on the after-softmax file)."""
    base = _losses(runs["builtin"])
    assert len(base) == STEPS
    for name in ("reference", "answer"):
        assert _losses(runs[name]) == base, f"{name} as a learner's file: losses differ from the built-in attention"
        a = load_checkpoint(runs[name], "latest").build_model()
        b = load_checkpoint(runs["builtin"], "latest").build_model()
        for (k, p), q in zip(a.state_dict().items(), b.state_dict().values()):
            assert torch.equal(p, q), f"{name}: weight {k} differs after {STEPS} steps"
    after = _losses(runs["after"])
    assert after != base, "the after-softmax learner's file trained like the built-in: its function was not called"


def test_the_run_records_the_learners_file(runs):
    meta = json.loads((load_checkpoint(runs["answer"], "latest").path / "meta.json").read_text())
    assert meta["attn_impl"] == f"{runs['root'] / 'answer.py'}:attention" and len(meta["attn_impl_sha256"]) == 64
    assert "attn_impl" not in load_checkpoint(runs["builtin"], "latest").meta
    config = json.loads((runs["answer"] / "config.json").read_text())
    assert config["model"]["attn_impl"] == meta["attn_impl"], "config.json: the learner's file, by absolute path"
    assert config["model"]["attn_impl_sha256"] == meta["attn_impl_sha256"], "config.json: the file's hash"
    assert "causal_mask" not in config["model"] and "attn_scale" not in config["model"], (
        "config.json records the built-in switches beside the learner's file, which replaces them")
    assert json.loads((runs["builtin"] / "config.json").read_text())["model"]["causal_mask"] == "before_softmax"
    assert "your " in (runs["answer"] / "console.log").read_text().split("attention: ")[1][:5]


def test_a_mask_after_the_softmax_trains_and_its_honest_loss_shows_the_leak(runs):
    """The learner's after-softmax file trains exactly as the built-in switch causal_mask=after_softmax would
    (the same numbers as claims mask's arm), and with every later token cut off its loss rises; the correct file's
    does not move. Planted bug: exercise_learner_not_called_in_training."""
    cfg = runs["cfg"]
    val = prepare_data(cfg.data, log=lambda *a: None).tokens("val")
    g = torch.Generator().manual_seed(0)
    starts = torch.randint(0, len(val) - 33, (8,), generator=g).tolist()
    x = torch.stack([torch.as_tensor(val[i:i + 32].astype(np.int64)) for i in starts])
    y = torch.stack([torch.as_tensor(val[i + 1:i + 33].astype(np.int64)) for i in starts])
    gaps = {}
    for name in ("after", "answer"):
        model = load_checkpoint(runs[name], "latest").build_model()
        assert learner_of(model) is not None, f"{name}: reopened without the learner's attention"
        gaps[name] = float(honest_position_losses(model, x, y).mean() - position_losses(model, x, y).mean())
    assert gaps["after"] > 0.005, f"the mask after the softmax leaks: honest - leaky loss {gaps['after']:.4f}"
    assert abs(gaps["answer"]) < 1e-4, f"a causal learner's honest loss equals its loss, got {gaps['answer']:.2e}"


LEAK = re.compile(r"your attention reads the future: loss ([\d.]+) with it, ([\d.]+) without \(nats/token on "
                  r"(\d+) validation windows")


def test_a_learners_run_says_once_when_its_attention_reads_the_future(runs):
    """The after-softmax file's run prints the two losses once, the numbers of metrics.jsonl at that evaluation,
    and writes the line to TensorBoard; causal learners' files (and the built-in attention) never do.
    Planted bug: exercise_leak_never_told."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    said = LEAK.findall((runs["after"] / "console.log").read_text())
    assert len(said) == 1, f"the leak is said {len(said)} times, not once"
    with_it, without, windows = float(said[0][0]), float(said[0][1]), int(said[0][2])
    rows = [r for r in map(json.loads, (runs["after"] / "metrics.jsonl").read_text().splitlines())
            if "honest_loss" in r]
    assert len(rows) == 2 and windows == 16, rows
    first = next(r for r in rows if r["honest_loss"] - r["leaky_loss"] > 1e-3)
    assert (with_it, without) == (float(f"{first['leaky_loss']:.4g}"), float(f"{first['honest_loss']:.4g}")), (
        "the sentence's numbers are not the evaluation's")
    assert without > with_it
    acc = EventAccumulator(str(runs["after"] / "tb"), size_guidance={"scalars": 0, "tensors": 0}).Reload()
    assert "val/honest_loss" in acc.Tags()["scalars"], acc.Tags()
    texts = [t for t in acc.Tags()["tensors"] if "future_leak" in t]
    assert texts, f"no future_leak text in TensorBoard: {acc.Tags()['tensors']}"
    for name in ("answer", "reference", "builtin"):
        assert not LEAK.search((runs[name] / "console.log").read_text()), f"{name}: a causal attention told of a leak"
    for name in ("answer", "reference"):
        for r in map(json.loads, (runs[name] / "metrics.jsonl").read_text().splitlines()):
            if "honest_loss" in r:
                assert abs(r["honest_loss"] - r["leaky_loss"]) < 1e-5, (name, r)
    assert not any("honest_loss" in line for line in (runs["builtin"] / "metrics.jsonl").read_text().splitlines())


def test_a_model_trained_with_a_learners_attention_samples_the_same_text_with_the_cache(runs):
    """sample.py and the lab decode with the KV cache. A model trained with model.attn_impl must give there the
    next-token distributions of its own uncached forward pass at every position (a prefill, then pieces of a few
    tokens, then one at a time), so the same greedy text. A random tiny model hides a wrong row (its attention
    barely moves the logits): this one was trained with the learner's attention, whose maps it relies on.
    Planted bug: exercise_cache_keeps_the_padded_rows (the first T rows, the zero queries', kept)."""
    model = load_checkpoint(runs["answer"], "latest").build_model().eval()
    assert learner_of(model) is not None, "the run reopened without the learner's attention: the test proves nothing"
    val = prepare_data(runs["cfg"].data, log=lambda *a: None).tokens("val")
    block = model.config.block_size
    x = torch.stack([torch.as_tensor(val[i:i + block].astype(np.int64)) for i in (0, 5000)])
    with torch.no_grad():
        full = model(x).logits
        cache, got = model.new_kv_cache(), []
        for a, b in [(0, 8), (8, 11), (11, 17), *((i, i + 1) for i in range(17, block))]:
            got.append(model(x[:, a:b], kv_cache=cache).logits)
    torch.testing.assert_close(torch.cat(got, 1), full, atol=1e-4, rtol=0,
                               msg="with the KV cache the learner's model predicts other next tokens than without it")
    prompt = x[:, :8]
    cached = generate(model, prompt, 40, greedy=True, use_cache=True)
    uncached = generate(model, prompt, 40, greedy=True, use_cache=False)
    assert torch.equal(cached, uncached), (f"the learner's model samples other text with the cache "
                                           f"({(cached != uncached).sum().item()} of {cached.numel()} tokens differ)")


def test_a_learners_run_reopens_with_its_file_and_says_so_when_it_is_gone(runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs["after"], run)
    ckpt = load_checkpoint(run, "latest")
    assert learner_of(ckpt.build_model()).spec == f"{runs['root'] / 'after.py'}:attention"
    assert learner_of(ckpt.build_model(attn_impl="")) is None, "attn_impl='' must reopen with the built-in"
    moved = runs["root"] / "after.py.away"
    (runs["root"] / "after.py").rename(moved)
    try:
        with pytest.raises(CheckpointError, match="that file is missing: put the same file back"):
            ckpt.build_model()
    finally:
        moved.rename(runs["root"] / "after.py")
    edited = runs["root"] / "after.py"
    text = edited.read_text()
    edited.write_text(text + "\n# changed\n")
    try:
        with pytest.warns(UserWarning, match="has changed since this checkpoint was trained"):
            ckpt.build_model()
    finally:
        edited.write_text(text)


def _tiny(**kw) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=40, block_size=24, n_layer=2, n_head=3, n_embd=24, pos_encoding="rope",
                         attn_backend="math", **kw)).eval()


def _learner_file(tmp_path, text: str, name: str = "mine.py"):
    path = tmp_path / name
    path.write_text(text)
    return f"{path}:attention"


def test_cached_decoding_with_a_learners_attention_gives_the_uncached_tokens(tmp_path):
    """The model pads the queries after a cache to a square so the learner's own mask lines up."""
    model = plug(_tiny(n_kv_head=1), _learner_file(tmp_path, "import math\nimport torch\n\n\n"
                                                   + inspect.getsource(answers.attention)))
    idx = torch.randint(0, 40, (2, 5), generator=torch.Generator().manual_seed(1))
    a = generate(model, idx, 12, greedy=True, use_cache=True)
    b = generate(model, idx, 12, greedy=True, use_cache=False)
    assert torch.equal(a, b), "cached and uncached decoding differ with the learner's attention"


def test_the_attention_maps_and_edits_of_a_learners_model_are_its_own(tmp_path):
    """The pages and the lab read the learner's weights (their function's output for one-hot values), and an
    edit of the scores (hide a key) acts on them as on the built-in's."""
    builtin = _tiny()
    mine = plug(_tiny(), _learner_file(tmp_path, "import math\nimport torch\n\n\n" + inspect.getsource(answers.attention)))
    x = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(2))
    a, b = builtin(x, return_attention=True), mine(x, return_attention=True)
    for wa, wb in zip(a.attentions, b.attentions):
        torch.testing.assert_close(wb, wa, atol=1e-6, rtol=0)
    torch.testing.assert_close(b.logits, a.logits, atol=1e-5, rtol=0)

    def hide(scores):
        return scores.masked_fill(torch.arange(scores.size(-1)) == 3, float("-inf")) if scores.size(-1) > 4 else scores

    edits = {f"h.{i}.attn.hook_scores": hide for i in range(2)}
    with hooked(builtin, edits=edits):
        ea = builtin(x).logits
    with hooked(mine, edits=edits):
        eb = mine(x).logits
    torch.testing.assert_close(eb, ea, atol=1e-5, rtol=0, msg="hiding a key acts differently on the learner's model")
    assert not torch.allclose(ea, a.logits), "the edit changed nothing: the test proves nothing"
    after = plug(_tiny(), _learner_file(tmp_path, AFTER_SOFTMAX_FILE, "after.py"))
    sums = after(x, return_attention=True).attentions[0].sum(-1)
    assert sums[0, 0, 0] < 0.99, "the after-softmax learner's maps must be its own (rows below 1)"


def test_export_refuses_a_learners_attention(tmp_path, capsys):
    """Every exported architecture computes the built-in attention, so exporting the learner's model would write
    another function with its weights: `python -m attention_lab.export` refuses their run with one error line naming
    model.attn_impl (before reopening their file: also when it is gone), export_pretrained refuses the model, and
    nothing is written; the same model with the built-in attention exports.
    Planted bug: exercise_export_writes_the_builtin."""
    spec = _learner_file(tmp_path, "import math\nimport torch\n\n\n" + inspect.getsource(answers.attention))
    tok = Tokenizer.train_char([["the quick brown fox\n"]]).to_str()
    model = plug(_tiny(), spec)
    out = tmp_path / "hf"
    with pytest.raises(ValueError, match=r"learner's function \(model.attn_impl=.*mine.py:attention\)"):
        export_pretrained(model, out, tok)
    assert not out.exists(), "a refused export wrote its folder"
    save_checkpoint(tmp_path / "run" / "checkpoints", 1, model, tok, {})
    for file_there in (True, False):
        if not file_there:
            (tmp_path / "mine.py").unlink()
        capsys.readouterr()
        rc = export_mod.main([str(tmp_path / "run"), str(out)])
        captured = capsys.readouterr()
        lines = captured.err.splitlines()
        assert rc == 2 and captured.out == "", f"the learner's run was exported (file there: {file_there})"
        assert len(lines) == 1 and lines[0].startswith("error: cannot export: "), captured.err
        assert f"model.attn_impl={spec}" in lines[0] and "computes the built-in attention" in lines[0], lines[0]
        assert "train without model.attn_impl" in lines[0], lines[0]
        assert not out.exists(), "a refused export wrote its folder"
    export_pretrained(plug(model, None), out, tok)
    assert (out / "model.safetensors").is_file(), "the built-in attention's model must still export"


def test_bad_learner_code_in_training_is_one_error_naming_the_line(tmp_path, data_cache):
    crash = _learner_file(tmp_path, "import torch\n\n\ndef attention(q, k, v):\n    return q @ k @ v\n", "crash.py")
    short = COMMON[:1] + [f"data.cache_dir={data_cache}", "train.max_steps=2", "train.eval_interval=2"] + COMMON[3:]
    with pytest.raises(LearnerError, match=r"crash.py line 5\) raised RuntimeError.*check attention"):
        train_mod.train(compose(short + [f"model.attn_impl={crash}"]), tmp_path / "r1")
    shape = _learner_file(tmp_path, "import torch\n\n\ndef attention(q, k, v):\n    return q.mean(1)\n", "shape.py")
    with pytest.raises(LearnerError, match=r"returned shape \(4, 32, 16\) on cpu.*needs shape \(4, 2, 32, 16\)"):
        train_mod.train(compose(short + [f"model.attn_impl={shape}"]), tmp_path / "r2")
    with pytest.raises(LearnerError, match="there is no file"):
        train_mod.train(compose(short + [f"model.attn_impl={tmp_path / 'nowhere.py'}"]), tmp_path / "r3")
    with pytest.raises(ValueError, match="must name a Python file and a function"):
        compose(short + ["model.attn_impl=attention"])
    with pytest.raises(ValueError, match="cannot be combined with window=8"):
        compose(short + [f"model.attn_impl={crash}", "model.window=8"])
    assert math.isfinite(1.0)


def test_a_learners_attention_with_dropout_says_which_dropout_it_keeps(tmp_path, data_cache, capsys):
    """Attention dropout acts on the weights, which a learner's attention(q, k, v) never hands back: the run says
    so instead of silently training without it (residual and MLP dropout still apply)."""
    mine = _learner_file(tmp_path, REFERENCE_FILE, "mine.py")
    short = COMMON[:1] + [f"data.cache_dir={data_cache}", "train.max_steps=2", "train.eval_interval=2"] + COMMON[3:]
    train_mod.train(compose(short + [f"model.attn_impl={mine}", "model.dropout=0.1"]), tmp_path / "r")
    said = capsys.readouterr().out
    assert "model.dropout=0.1 still drops the residual and MLP outputs, but not attention weights" in said, said
    train_mod.train(compose(short + [f"model.attn_impl={mine}"]), tmp_path / "r0")
    assert "model.dropout" not in capsys.readouterr().out, "no dropout, nothing to say"


def test_the_leak_is_told_above_rounding_and_below_what_the_mask_after_the_softmax_leaks():
    """The sentence's rule on numbers with a known answer (no training): a pair of losses apart by float32 rounding
    at every position (1e-5, the bound the runs above hold causal files to), in either direction, is no leak; the
    honest loss above by 3e-3 (a fifth of the 0.015 the mask after the softmax leaks after 20 debug steps) is told,
    and with its numbers; the honest loss below by as much is not. Planted bugs: exercise_leak_gap_reversed,
    exercise_leak_noise_floor_zero."""
    from attention_lab.training.learner import leak_sentence

    leaky = np.linspace(2.0, 3.0, 64)
    spec = "mine.py:attention"
    for rounding in (1e-5, -1e-5):
        assert leak_sentence(leaky, leaky + rounding, 16, spec) is None, (
            f"honest - leaky = {rounding:g} at every position (float rounding) told as a leak")
    said = leak_sentence(leaky, leaky + 3e-3, 16, spec)
    assert said is not None and LEAK.search(said), "a leak of 3e-3 nats/token at every position not told"
    assert said.startswith(f"your attention reads the future: loss {leaky.mean():.4g} with it, "
                           f"{leaky.mean() + 3e-3:.4g} without"), said
    assert leak_sentence(leaky, leaky - 3e-3, 16, spec) is None, "the honest loss lower than the leaky one is no leak"
