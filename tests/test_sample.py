"""sample.py: generation from a saved run, the attention dump, TensorBoard events, and bad input.

The fixture is a tiny untrained GPT (2 layers, 2 heads, 32 wide, context 32) with a char-level tokenizer,
saved with save_checkpoint into a temporary run folder; everything runs in-process through sample.main.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer
from tensorboard.util.tensor_util import make_ndarray

import sample
from attention_lab.sampling import generate_text
from attention_lab.store.checkpoint import load_checkpoint, save_checkpoint
from data.tokenizer import Tokenizer
from model import GPT, GPTConfig

CORPUS = "ROMEO:\nBut soft, what light through yonder window breaks?\nJULIET:\nAy me! O Romeo, Romeo!\n"
BLOCK = 32
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_run(run_dir: Path, cfg_overrides: dict | None = None) -> Path:
    tok = Tokenizer.train_char([[CORPUS]])
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=tok.vocab_size, block_size=BLOCK, n_layer=2, n_head=2, n_embd=32,
                    **(cfg_overrides or {}))
    model = GPT(cfg)
    with torch.no_grad():  # larger than GPT-2's init: peaked next-token distributions, no near-ties in greedy
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    save_checkpoint(run_dir / "checkpoints", 100, model, tok.to_str(), {"val_loss": 3.5}, best=True)
    return run_dir


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("runs") / "tiny")


@pytest.fixture(scope="module")
def loaded(run_dir):
    ckpt = load_checkpoint(run_dir)
    return ckpt.build_model("cpu"), Tokenizer.from_str(ckpt.tokenizer_json)


def run_main(capsys, *argv) -> tuple[int, str, str]:
    rc = sample.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


# ----------------------------------------------------------------------------------------------------------
# generation


def test_same_seed_same_text_other_seed_other_text(run_dir, capsys):
    args = ("--run", run_dir, "--prompt", "ROMEO:", "--max-new-tokens", 40, "--no-attention")
    rc1, text1, err1 = run_main(capsys, *args, "--seed", 3)
    rc2, text2, _ = run_main(capsys, *args, "--seed", 3)
    rc3, text3, _ = run_main(capsys, *args, "--seed", 4)
    assert rc1 == rc2 == rc3 == 0, f"exit codes {rc1} {rc2} {rc3}; stderr:\n{err1}"
    assert text1.startswith("ROMEO:") and len(text1) > 26, f"prompt then continuation expected: {text1!r}"
    assert text1 == text2, f"same seed gave different text:\n{text1!r}\n{text2!r}"
    assert text1 != text3, "seeds 3 and 4 gave the same 40 sampled tokens"
    assert "seed 3" in err1, f"the seed should be reported on stderr:\n{err1}"


def test_greedy_is_the_same_with_and_without_cache(run_dir, loaded, capsys):
    model, tok = loaded
    prompt = tok.encode("JULIET:")
    kw = dict(greedy=True, temperature=1.0)
    cached = generate_text(model, tok, prompt, 70, use_cache=True, **kw)  # 77 tokens: slides past 32
    uncached = generate_text(model, tok, prompt, 70, use_cache=False, **kw)
    assert len(cached) == 70, f"asked for 70 tokens, got {len(cached)}"
    assert cached == uncached, f"greedy decoding differs with the KV cache:\n{cached}\n{uncached}"
    args = ("--run", run_dir, "--prompt", "JULIET:", "--max-new-tokens", 50, "--greedy", "--no-attention")
    rc1, out1, _ = run_main(capsys, *args)
    rc2, out2, _ = run_main(capsys, *args, "--no-cache")
    assert rc1 == rc2 == 0 and out1 == out2, f"main --greedy vs --no-cache:\n{out1!r}\n{out2!r}"


def test_streamed_text_is_the_decoded_continuation(loaded):
    model, tok = loaded
    pieces: list[str] = []
    prompt = tok.encode("O Romeo")
    gen = torch.Generator().manual_seed(5)
    new = generate_text(model, tok, prompt, 60, generator=gen, on_text=pieces.append)
    assert "".join(pieces) == tok.decode(new), "the streamed pieces must add up to the decoded continuation"
    assert len(pieces) > 10, f"text should arrive piece by piece, got {len(pieces)} pieces"


def test_stream_decoder_holds_back_partial_utf8_of_byte_level_bpe():
    tok = Tokenizer.train_bpe([["the quick brown fox jumps over the lazy dog. " * 4]], vocab_size=300)
    prompt, text = "fox", " ☃ naïve 日本"
    ids = tok.encode(prompt + text)
    n_prompt = len(tok.encode(prompt))
    assert len(ids) - n_prompt > len(text), "fixture: some characters should span several byte tokens"
    stream = tok.text_stream(ids[:n_prompt])
    pieces = [stream.step(i) for i in ids[n_prompt:]] + [stream.flush()]
    assert not any("\ufffd" in p for p in pieces), f"a partial UTF-8 character was printed: {pieces}"
    assert "".join(pieces) == text, f"streamed {''.join(pieces)!r}, want {text!r}"


def test_generation_past_the_context_dumps_the_last_window(run_dir, tmp_path, capsys):
    out = tmp_path / "maps"
    rc, text, err = run_main(capsys, "--run", run_dir, "--prompt", "ROMEO:", "--max-new-tokens", 60,
                             "--seed", 1, "--out", out)
    assert rc == 0, err
    assert len(text) >= len("ROMEO:") + 60, f"6 + 60 chars expected from a char model: {text!r}"
    tokens = json.loads((out / "tokens.json").read_text())
    assert len(tokens["token_ids"]) == BLOCK, f"66 tokens should be cropped to the last {BLOCK}"
    assert tokens["start"] == 66 - BLOCK, tokens["start"]
    assert text.rstrip("\n").endswith(tokens["text"]), "tokens.json holds the end of the printed text"
    assert np.load(out / "attention.npy").shape == (2, 2, BLOCK, BLOCK)


# ----------------------------------------------------------------------------------------------------------
# the attention dump


@pytest.fixture(scope="module")
def dumped(run_dir):
    """One ordinary sample.py run with attention output (in the default folder), shared by the checks below."""
    before = set((run_dir / "samples").glob("*"))
    rc = sample.main(["--run", str(run_dir), "--prompt", "ROMEO:\nBut", "--max-new-tokens", "15", "--seed", "0"])
    assert rc == 0, "sample.main failed on the fixture run"
    new = set((run_dir / "samples").glob("*")) - before
    assert len(new) == 1, f"one new folder under {run_dir / 'samples'} expected, got {sorted(new)}"
    return new.pop()


def test_dumped_weights_shape_rows_mask_and_match_the_model(dumped, loaded):
    model, _ = loaded
    weights = np.load(dumped / "attention.npy")
    tokens = json.loads((dumped / "tokens.json").read_text(encoding="utf-8"))
    t = len("ROMEO:\nBut") + 15
    assert weights.shape == (2, 2, t, t) and weights.dtype == np.float32, f"got {weights.shape} {weights.dtype}"
    assert len(tokens["token_ids"]) == len(tokens["tokens"]) == t, f"{t} tokens expected: {tokens}"
    assert tokens["text"].startswith("ROMEO:\nBut"), tokens["text"]
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5, err_msg="attention rows must sum to 1")
    rows, cols = np.triu_indices(t, k=1)
    assert (weights[..., rows, cols] == 0).all(), "masked (future) entries must be exactly 0"
    with torch.no_grad():
        direct = model(torch.tensor([tokens["token_ids"]]), return_attention=True).attentions
    for layer in range(2):
        np.testing.assert_allclose(weights[layer], direct[layer][0].numpy(), atol=1e-6,
                                   err_msg=f"layer {layer}: dumped weights differ from the model's")


def test_dumped_pngs_and_summary(dumped):
    for layer in range(2):
        png = dumped / f"layer_{layer:02d}.png"
        assert png.read_bytes()[:8] == PNG_MAGIC, f"{png} is not a PNG file"
        pixels = matplotlib.image.imread(png)
        assert pixels.shape[0] >= 300 and pixels.shape[1] >= 400, f"{png.name} is {pixels.shape}: too small to read"
    summary = json.loads((dumped / "summary.json").read_text())
    heads = summary["heads"]
    assert [(h["layer"], h["head"]) for h in heads] == [(0, 0), (0, 1), (1, 0), (1, 1)], heads
    assert all(h["role"] in summary["roles"] or h["role"] == "mixed" for h in heads), f"unknown roles: {heads}"
    assert all(0 <= h["entropy"] <= 1 + 1e-6 for h in heads), heads
    assert all(isinstance(h["ablation"], float) for h in heads), f"every head's ablation effect: {heads}"
    assert len({h["ablation"] for h in heads}) > 1, f"zeroing different heads should change the loss differently: {heads}"
    lines = (dumped / "summary.txt").read_text().splitlines()
    assert lines[5].startswith("what the columns say") and lines[-1].startswith("logit lens"), \
        "header, 4 heads, the legend, the logit lens:\n" + "\n".join(lines)


def test_each_layers_png_is_that_layers_heatmaps_as_a_fresh_figure_draws_them(dumped, run_dir):
    """The layers' figures are laid out once and redrawn (AttentionFrames): each layer's PNG is still, pixel for
    pixel, attention_figure of that layer's weights under that layer's title."""
    from attention_lab.interp.figures import attention_figure, figure_to_array

    weights = np.load(dumped / "attention.npy")
    labels = json.loads((dumped / "tokens.json").read_text(encoding="utf-8"))["tokens"]
    for layer in range(weights.shape[0]):
        got = matplotlib.image.imread(dumped / f"layer_{layer:02d}.png")[..., :3]
        want = figure_to_array(attention_figure(weights[layer], labels, f"{run_dir.name} step 100, layer {layer}",
                                                dpi=90))
        assert got.shape == want.shape, f"layer {layer}: {got.shape} != {want.shape}"
        assert np.array_equal(np.round(got * 255).astype(np.uint8), want), f"layer_{layer:02d}.png is not layer {layer}'s map"


def test_tensorboard_events_hold_the_heatmaps_and_the_text(dumped, run_dir):
    tb = run_dir / "tb" / "samples" / dumped.name
    assert list(tb.glob("events.out.tfevents.*")), f"no event file in {tb}"
    acc = EventAccumulator(str(tb), size_guidance={"images": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    assert sorted(tags["images"]) == ["attention/layer_00", "attention/layer_01"], tags
    for tag in ("text/text_summary", "head_summary/text_summary", "checkpoint/text_summary"):
        assert tag in tags["tensors"], f"{tag} missing: {tags['tensors']}"
    image = acc.Images("attention/layer_00")[0]
    assert image.step == 100, f"events should be at the checkpoint's step (100), got {image.step}"
    assert image.encoded_image_string[:8] == PNG_MAGIC and image.width > 400, (image.width, image.height)
    text = make_ndarray(acc.Tensors("text/text_summary")[0].tensor_proto).item().decode()
    assert "ROMEO:" in text, f"the sample text should be in TensorBoard: {text!r}"
    # `tensorboard --logdir <run>` finds the sample as a run of its own, beside the training logs in tb/
    mux = EventMultiplexer().AddRunsFromDirectory(str(run_dir))
    assert f"tb/samples/{dumped.name}" in mux.Runs(), sorted(mux.Runs())


def test_several_samples_get_a_folder_each(run_dir, tmp_path, capsys):
    rc, out, err = run_main(capsys, "--run", run_dir, "--prompt", "ROMEO:", "--num-samples", 2,
                            "--max-new-tokens", 5, "--seed", 2, "--out", tmp_path / "two")
    assert rc == 0, err
    assert "--- sample 1/2 ---" in out and "--- sample 2/2 ---" in out, out
    for i in range(2):
        assert np.load(tmp_path / "two" / f"sample_{i:02d}" / "attention.npy").shape == (2, 2, 11, 11)
    assert str(tmp_path / "two") in err, f"the output folder should be printed:\n{err}"


def test_output_folders_never_collide(run_dir, tmp_path, capsys):
    """Two calls within one second get two folders, under samples/ and tb/samples/ alike."""
    before = set((run_dir / "tb" / "samples").glob("*"))
    for _ in range(2):
        rc, _, err = run_main(capsys, "--run", run_dir, "--max-new-tokens", 3, "--seed", 0)
        assert rc == 0, err
    rc, _, err = run_main(capsys, "--run", run_dir, "--max-new-tokens", 3, "--out", tmp_path / "mine")
    assert rc == 0 and str(tmp_path / "mine") in err, err
    new = sorted(set((run_dir / "tb" / "samples").glob("*")) - before)
    assert len(new) == 3, f"three TensorBoard folders expected, got {new}"
    assert sum((run_dir / "samples" / p.name / "attention.npy").exists() for p in new) == 2, new


def test_an_output_folder_that_cannot_be_made_is_one_error_line(run_dir, tmp_path, capsys):
    """--out under a file: exit 2 and one `error:` line saying to pass a writable folder, after the text (the
    reports are written by attention_lab/viewer/report.py write_samples; the failure is said by sample.py)."""
    (tmp_path / "a_file").write_text("x")
    rc, out, err = run_main(capsys, "--run", run_dir, "--prompt", "RO", "--max-new-tokens", 3, "--seed", 0,
                            "--out", tmp_path / "a_file" / "maps")
    assert rc == 2, f"exit code {rc}; stderr:\n{err}"
    assert out.startswith("RO"), f"the text is generated before the reports: {out!r}"
    assert "error: cannot create the output folders" in err and "pass --out with a writable folder" in err, err
    assert "Traceback" not in err, err


# ----------------------------------------------------------------------------------------------------------
# prompts at the edges


def test_empty_prompt_starts_from_end_of_text(run_dir, tmp_path, loaded, capsys):
    _, tok = loaded
    rc, _, err = run_main(capsys, "--run", run_dir, "--prompt", "", "--max-new-tokens", 5, "--out", tmp_path)
    assert rc == 0, err
    ids = json.loads((tmp_path / "tokens.json").read_text())["token_ids"]
    assert ids[0] == tok.eot_id and len(ids) == 6, f"empty prompt: <|endoftext|> then 5 tokens, got {ids}"


def test_long_prompt_keeps_its_last_block_size_tokens(run_dir, tmp_path, loaded, capsys):
    _, tok = loaded
    prompt = "ROMEO: " * 10  # 70 characters > 32
    rc, _, err = run_main(capsys, "--run", run_dir, "--prompt", prompt, "--max-new-tokens", 0, "--out", tmp_path)
    assert rc == 0, err
    assert "warning:" in err and "longer than the model's context" in err, err
    ids = json.loads((tmp_path / "tokens.json").read_text())["token_ids"]
    assert ids == tok.encode(prompt)[-BLOCK:], "the last block_size tokens of the prompt should be kept"


def test_prompt_file_and_unknown_characters(run_dir, tmp_path, capsys):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("ROMEO: ☃ é\n", encoding="utf-8")
    rc, out, err = run_main(capsys, "--run", run_dir, "--prompt-file", prompt, "--max-new-tokens", 5, "--no-attention")
    assert rc == 0, err
    assert "warning:" in err and "<|unk|>" in err and "☃" in err, f"unknown characters should be named:\n{err}"
    assert out.startswith("ROMEO: <|unk|>"), f"the prompt as the model sees it: {out!r}"


# ----------------------------------------------------------------------------------------------------------
# bad input: exit code 2 and one clear `error:` line, never a traceback


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--temperature", "-1"], "--temperature"),
        (["--temperature", "nan"], "--temperature"),
        (["--top-p", "2"], "--top-p"),
        (["--top-k", "0"], "--top-k"),
        (["--max-new-tokens", "-5"], "--max-new-tokens"),
        (["--num-samples", "0"], "--num-samples"),
        (["--device", "quantum"], "--device"),
        (["--temperature", "hot"], "--temperature"),  # argparse's own error
        (["--which", "worst"], "--which"),
        (["--prompt-file", "/nonexistent/prompt.txt"], "does not exist"),
        (["--threads", "0"], "--threads"),
        (["--threads", "all"], "--threads"),
    ],
)
def test_bad_flags(run_dir, capsys, flags, needle):
    rc, _, err = run_main(capsys, "--run", run_dir, *flags)
    assert rc == 2, f"{flags}: exit code {rc}, want 2; stderr:\n{err}"
    assert "error:" in err and needle in err, f"{flags}: the error should name {needle!r}:\n{err}"
    assert "Traceback" not in err


def bad_checkpoint(run_dir: Path, tmp_path: Path, how: str) -> Path:
    broken = tmp_path / "broken"
    shutil.copytree(run_dir / "checkpoints", broken / "checkpoints")
    step = next((broken / "checkpoints").glob("step_*"))
    if how == "garbage":
        (step / "model.safetensors").write_bytes(b"this is not a safetensors file" * 10)
    elif how == "wider":  # the config of another model: the weights do not fit
        cfg = json.loads((step / "model_config.json").read_text())
        (step / "model_config.json").write_text(json.dumps({**cfg, "n_embd": 64}))
    elif how == "deeper":
        cfg = json.loads((step / "model_config.json").read_text())
        (step / "model_config.json").write_text(json.dumps({**cfg, "n_layer": 3}))
    return broken


@pytest.mark.parametrize(
    "how, needle",
    [("garbage", "cannot be read"), ("wider", "another model"), ("deeper", "does not fit")],
)
def test_corrupt_or_foreign_checkpoint(run_dir, tmp_path, capsys, how, needle):
    rc, _, err = run_main(capsys, "--run", bad_checkpoint(run_dir, tmp_path, how), "--prompt", "ROMEO:")
    assert rc == 2, f"{how}: exit code {rc}, want 2; stderr:\n{err}"
    assert "error:" in err and needle in err and str(tmp_path / "broken") in err, f"{how}:\n{err}"
    assert "Traceback" not in err


def test_missing_run_and_no_runs_at_all(tmp_path, capsys):
    rc, _, err = run_main(capsys, "--run", tmp_path / "no_such_run")
    assert rc == 2 and "error:" in err and "no such run" in err, err
    rc, _, err = run_main(capsys, "--runs-root", tmp_path / "empty")
    assert rc == 2 and "error:" in err and "no trained run found" in err, err


def test_checkpoint_flag_takes_one_checkpoint_folder(run_dir, capsys):
    step = next((run_dir / "checkpoints").glob("step_*"))
    rc, out, err = run_main(capsys, "--checkpoint", step, "--prompt", "ROMEO:", "--max-new-tokens", 3,
                            "--no-attention", "--seed", 0)
    assert rc == 0 and out.startswith("ROMEO:"), err
    assert str(step) in err, f"the checkpoint used should be named:\n{err}"


def test_the_speed_line_counts_generated_tokens_only(run_dir, capsys, monkeypatch):
    """[N tokens in S s, R tokens/s]: N and R count the new tokens, not the prompt (a fake clock: 2 s a sample)."""
    ticks = iter([10.0, 12.0])
    monkeypatch.setattr(sample.time, "perf_counter", lambda: next(ticks))
    rc, _, err = run_main(capsys, "--run", run_dir, "--prompt", "ROMEO: ROMEO: ROMEO:", "--max-new-tokens", 8,
                          "--no-attention", "--seed", 0)
    assert rc == 0, err
    assert "[8 tokens in 2.00 s, 4.0 tokens/s]" in err, f"8 new tokens in 2 s are 4.0 tokens/s:\n{err}"


@pytest.mark.parametrize("flag, want", [(None, "auto"), ("auto", "auto"), ("3", 3)])
def test_the_threads_flag_reaches_the_decoding(run_dir, capsys, monkeypatch, flag, want):
    """--threads N decodes in N CPU threads, measuring none; auto (the default) lets sampling measure one thread
    against all (runtime/decoding.decoding_thread_count)."""
    import sample as sample_cli

    asked = []
    real = sample_cli.generate_text
    monkeypatch.setattr(sample_cli, "generate_text", lambda *a, **k: (asked.append(k["threads"]), real(*a, **k))[1])
    rc, out, err = run_main(capsys, "--run", run_dir, "--max-new-tokens", 3, "--no-attention", "--seed", 1,
                            *(["--threads", flag] if flag else []))
    assert rc == 0, err
    assert asked == [want], f"--threads {flag}: generate_text got threads={asked}"


def test_sample_py_says_once_how_it_decoded_and_whether_auto_chose_it(run_dir, capsys, monkeypatch, fresh_measurements):
    """After the first sample, one line: the dtype, the CPU threads, and which of them auto chose (a person reading
    tokens/s can then tell what ran, and how to choose). The layout's measurement is stubbed (rows as fast as columns,
    so rows kept): which layout wins depends on the machine, and the CI's picked columns."""
    from attention_lab.runtime import decoding

    monkeypatch.setattr(decoding, "time_layouts", lambda decode: {"rows": 1.0, "columns": 1.0})
    rc, _, err = run_main(capsys, "--run", run_dir, "--max-new-tokens", 3, "--no-attention", "--seed", 1,
                          "--dtype", "float32", "--threads", 1, "--layout", "rows", "--num-samples", 2)
    assert rc == 0, err
    lines = [line for line in err.splitlines() if line.startswith("decoded in")]
    assert lines == ["decoded in float32, 1 CPU thread"], f"one line, nothing auto about it:\n{err}"
    rc, _, err = run_main(capsys, "--run", run_dir, "--max-new-tokens", 3, "--no-attention", "--seed", 1,
                          "--dtype", "float32", "--threads", 1, "--layout", "columns")
    (line,) = [line for line in err.splitlines() if line.startswith("decoded in")]
    assert line == "decoded in float32 weights stored by columns, 1 CPU thread", line
    rc, _, err = run_main(capsys, "--run", run_dir, "--max-new-tokens", 3, "--no-attention", "--seed", 1,
                          "--dtype", "float32")
    (line,) = [line for line in err.splitlines() if line.startswith("decoded in")]
    assert line.startswith("decoded in float32, ") and "(--layout and --threads auto: " in line, line
    assert "--dtype" not in line, line
