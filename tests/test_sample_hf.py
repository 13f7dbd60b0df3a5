"""sample.py --model: a transformers GPT-2 or GPT-NeoX model (a local folder here; a hub id for a user who is
online) in the same tools as a run: generation, maps, role scores, ablation, the page, step inside, circuits and
the logit lens. Tiny random models saved by transformers itself; logits equal transformers'."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import sample
from attention_lab.interop.hf import load_with_tokenizer
from data.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")

TEXT = "The animal didn't cross the street because it was too tired. " * 20


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.train_bpe([[TEXT] * 4], 300)


def gpt2_folder(path, tok: Tokenizer):
    config = transformers.GPT2Config(vocab_size=tok.vocab_size, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                                     activation_function="gelu_new", bos_token_id=tok.eot_id, eos_token_id=tok.eot_id)
    return save(transformers.GPT2LMHeadModel(config), path, tok)


def neox_folder(path, tok: Tokenizer):
    config = transformers.GPTNeoXConfig(
        vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=64, hidden_act="gelu_pytorch_tanh", use_parallel_residual=False, rotary_pct=1.0,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=None)
    return save(transformers.GPTNeoXForCausalLM(config), path, tok)


def save(model, path, tok: Tokenizer):
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.2 * torch.randn(p.shape, generator=g) + (1.0 if p.dim() == 1 else 0.0))
    model.eval().save_pretrained(path)
    tok.save(path / "tokenizer.json")
    return model


@pytest.mark.parametrize("kind", ["gpt2", "gpt_neox"])
def test_sample_py_opens_a_transformers_model_and_writes_what_a_run_gets(kind, tokenizer, tmp_path, capsys):
    folder = tmp_path / kind
    theirs = (gpt2_folder if kind == "gpt2" else neox_folder)(folder, tokenizer)
    ours, tok = load_with_tokenizer(folder)
    idx = torch.tensor([tok.encode(TEXT)[:40]])
    with torch.no_grad():
        torch.testing.assert_close(ours(idx).logits, theirs(idx).logits, atol=1e-4, rtol=1e-4)
    out = tmp_path / "out"
    rc = sample.main(["--model", str(folder), "--prompt", "The animal didn't cross the street because it",
                      "--max-new-tokens", "8", "--seed", "0", "--out", str(out), "--runs-root", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert rc == 0, err
    names = {p.name for p in out.iterdir()}
    assert {"attention.npy", "tokens.json", "summary.json", "summary.txt", "attention.html", "layer_00.png",
            "layer_01.png"} <= names, names
    summary = json.loads((out / "summary.json").read_text())
    assert {"copying", "copying_text", "ablation", "induction"} <= set(summary["heads"][0]), summary["heads"][0]
    assert len(summary["logit_lens_last_token"]["top1"]) == 3, "the embeddings and 2 blocks"
    assert "copy" in err and "logit lens" in err, err
    page = (out / "attention.html").read_text()
    assert '"inside"' in page, "the page carries the step-inside panel's numbers"
    weights = np.load(out / "attention.npy")
    assert weights.shape[:2] == (2, 4)
    assert (tmp_path / "runs" / "hf" / kind / "tb" / "samples").is_dir(), "TensorBoard beside the model's samples"


def test_an_unknown_hub_id_or_folder_is_one_error_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no network here: the hub answers like an unknown repo
    for name in ("no-such-user/no-such-model-xyz", str(tmp_path / "missing" / "folder")):
        rc = sample.main(["--model", name, "--prompt", "x"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and err[0].startswith("error: "), err
