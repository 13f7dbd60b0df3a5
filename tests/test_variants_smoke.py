"""Every attention variant through the whole house: trains in the debug preset (and resumes), samples with its
attention maps, exports to transformers with the same logits."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import sample
import train as train_mod
from attention_lab.interop.hf import export_pretrained
from attention_lab.store.checkpoint import load_checkpoint
from attention_lab.training.config import compose

VARIANTS = {
    "gqa": ["model.n_kv_head=1"],
    "window": ["model.window=8", "model.window_pattern=LG", "model.pos_encoding=alibi"],
    "sinks": ["model.attn_sinks=true", "model.n_kv_head=1"],
    "linear": ["model.attention=linear", "model.pos_encoding=learned", "model.linear_out_norm=true"],
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_variant_trains_resumes_samples_and_exports(variant, tmp_path, data_cache, capsys):
    transformers = pytest.importorskip("transformers")
    run = tmp_path / "run"
    common = ["experiment=debug", f"data.cache_dir={data_cache}", "train.eval_interval=2", "train.sample_tokens=4",
              "train.probe_batch=2", *VARIANTS[variant]]
    first = train_mod.train(compose([*common, "train.max_steps=2"]), run)
    final = train_mod.train(compose([*common, "train.max_steps=4"]), run)  # resumes from step 2
    assert first["step"] == 2 and final["step"] == 4 and np.isfinite(final["val_loss"]), final
    heads = [json.loads(line) for line in (run / "attention" / "heads.jsonl").read_text().splitlines()]
    assert [r["step"] for r in heads] == [2, 4], "head roles measured at every evaluation"

    out = tmp_path / "maps"
    assert sample.main(["--run", str(run), "--prompt", "ROMEO:", "--max-new-tokens", "40", "--seed", "0",
                        "--out", str(out)]) == 0
    weights = np.load(out / "attention.npy")
    if variant != "sinks":  # with sinks a row may sum to less than 1
        np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    assert (np.triu(weights, 1) == 0).all(), "no weight on future keys"
    if variant == "window":  # a windowed layer's band: nothing 8 or more tokens back
        t = weights.shape[-1]
        far = np.tril(np.ones((t, t)), -8).astype(bool)
        assert (weights[0][:, far] == 0).all() and (weights[1][:, far] > 0).any(), "layer 0 local, layer 1 global"
    assert (out / "attention.html").exists()

    ckpt = load_checkpoint(run, "latest")
    model = ckpt.build_model("cpu")
    result = export_pretrained(model, tmp_path / "hf", ckpt.tokenizer_json)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(result.path, trust_remote_code=True).eval()
    idx = torch.randint(0, model.config.vocab_size, (2, model.config.block_size),
                        generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(theirs(idx).logits.float(), model(idx).logits.float(), atol=1e-4, rtol=1e-4)
    capsys.readouterr()
