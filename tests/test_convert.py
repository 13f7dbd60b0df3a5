"""Parity with Hugging Face GPT-2: tiny random-init models built locally (never downloaded), weights moved by our
converter (attention_lab/interop/convert.py) and our file layer (attention_lab/interop/hf.py), logits compared.

Tolerances: both sides compute the same float32 function with different kernels (transformers' Conv1D + its
attention vs our Linear + sdpa); measured, logits of size ~4 differ by ~1e-6. We assert atol=1e-5, rtol=1e-4:
headroom for other BLAS builds, while a real mapping error (a missed transpose, swapped LayerNorms, a lost bias)
moves logits by ~1e-1, because every parameter is re-drawn below instead of keeping GPT-2's zero biases and unit
LayerNorms.
Round trips through files are bit-exact and compared with torch.equal.
"""

from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers")

import huggingface_hub  # noqa: E402 (after the importorskip)
import huggingface_hub.constants  # noqa: E402
import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from attention_lab.interop.convert import config_from_hf, state_dict_from_hf  # noqa: E402
from attention_lab.interop.hf import export_gpt2, load_gpt2  # noqa: E402
from data.tokenizer import Tokenizer  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

V, BLOCK, LAYERS, HEADS, EMBD = 64, 16, 2, 4, 32
TOL = dict(atol=1e-5, rtol=1e-4)


def randomise(module: torch.nn.Module, seed: int) -> None:
    """Re-draw every parameter (biases and LayerNorms too), so that a mis-mapped one cannot go unnoticed."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))


def hf_model(tie: bool = True, seed: int = 0):
    cfg = transformers.GPT2Config(
        vocab_size=V,
        n_positions=BLOCK,
        n_embd=EMBD,
        n_layer=LAYERS,
        n_head=HEADS,
        tie_word_embeddings=tie,
        bos_token_id=None,  # the defaults (50256) lie outside this tiny vocabulary
        eos_token_id=None,
    )
    model = transformers.GPT2LMHeadModel(cfg).eval()
    randomise(model, seed)
    return model


def our_model(tie: bool = True, seed: int = 0, **overrides) -> GPT:
    cfg = GPTConfig(
        vocab_size=V, block_size=BLOCK, n_layer=LAYERS, n_head=HEADS, n_embd=EMBD, tie_embeddings=tie, **overrides
    )
    model = GPT(cfg).eval()
    randomise(model, seed)
    return model


def tokens() -> torch.Tensor:
    return torch.randint(0, V, (2, BLOCK), generator=torch.Generator().manual_seed(1))


def assert_same_logits(ours: GPT, theirs, what: str) -> None:
    idx = tokens()
    with torch.no_grad():
        expected = theirs(idx).logits
        got = ours(idx).logits
    assert expected.abs().max() > 0.5, "logits this small would make the comparison meaningless"
    torch.testing.assert_close(got, expected, **TOL, msg=lambda m: f"{what}: logits differ from transformers\n{m}")


# ------------------------------------------------------------------------------------------------ HF -> ours


@pytest.mark.parametrize("tie", [True, False])
def test_load_gpt2_from_save_pretrained_matches_transformers(tmp_path, tie):
    theirs = hf_model(tie)
    theirs.save_pretrained(tmp_path)
    ours = load_gpt2(tmp_path)
    assert not ours.training, "load_gpt2 should return the model in eval mode"
    assert ours.config.tie_embeddings is tie
    assert (ours.lm_head.weight is ours.transformer.wte.weight) is tie, "tying should follow tie_word_embeddings"
    assert_same_logits(ours, theirs, f"load_gpt2(save_pretrained dir), tie={tie}")


def test_load_gpt2_reads_sharded_safetensors_and_pytorch_bin(tmp_path):
    theirs = hf_model()
    sharded = tmp_path / "sharded"
    theirs.save_pretrained(sharded, max_shard_size="20KB")
    assert (sharded / "model.safetensors.index.json").exists(), "expected save_pretrained to shard this model"
    assert_same_logits(load_gpt2(sharded), theirs, "sharded safetensors")

    legacy = tmp_path / "bin"
    theirs.config.save_pretrained(legacy)
    torch.save(theirs.state_dict(), legacy / "pytorch_model.bin")
    assert_same_logits(load_gpt2(str(legacy)), theirs, "pytorch_model.bin fallback")


@pytest.mark.parametrize("tie", [True, False])
def test_state_dict_conversion_without_files(tie):
    theirs = hf_model(tie)
    cfg = config_from_hf(theirs.config.to_dict())
    ours = GPT(cfg).eval()
    ours.load_state_dict(state_dict_from_hf(theirs.state_dict(), cfg), strict=True)
    assert_same_logits(ours, theirs, f"state_dict_from_hf, tie={tie}")


def test_state_dict_conversion_of_original_gpt2_key_names():
    """The original "gpt2" checkpoint has GPT2Model keys ("h.0.attn.c_attn.weight"), causal-mask buffers, no head."""
    theirs = hf_model(tie=True)
    legacy = {k.removeprefix("transformer."): v for k, v in theirs.state_dict().items() if k != "lm_head.weight"}
    for i in range(LAYERS):
        legacy[f"h.{i}.attn.bias"] = torch.ones(1, 1, BLOCK, BLOCK).tril()
    cfg = config_from_hf(theirs.config.to_dict())
    ours = GPT(cfg).eval()
    ours.load_state_dict(state_dict_from_hf(legacy, cfg), strict=True)
    assert_same_logits(ours, theirs, "original GPT-2 key names")


def test_unsupported_gpt2_variants_are_refused():
    base = hf_model().config.to_dict()
    with pytest.raises(ValueError, match="activation_function"):
        config_from_hf({**base, "activation_function": "relu"})
    with pytest.raises(ValueError, match="scale_attn_by_inverse_layer_idx"):
        config_from_hf({**base, "scale_attn_by_inverse_layer_idx": True})


# ------------------------------------------------------------------------------------------------ ours -> HF


def char_tokenizer_json() -> str:
    """A char-level tokenizer with fewer tokens than the tiny models' vocabulary."""
    return Tokenizer.train_char([["to be, or not to be: that is the question.\n"]]).to_str()


@pytest.mark.parametrize("tie", [True, False])
def test_export_loads_in_transformers(tmp_path, tie):
    ours = our_model(tie)
    out = export_gpt2(ours, tmp_path / "export", tokenizer_json=char_tokenizer_json())
    assert out == tmp_path / "export"
    expected = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert sorted(p.name for p in out.iterdir()) == expected, (
        f"unexpected files (a leftover temp dir?): {sorted(p.name for p in out.iterdir())}"
    )
    assert not [p for p in tmp_path.iterdir() if p.name != "export"], "a temporary folder was left beside the export"
    with safe_open(out / "model.safetensors", "pt") as f:
        assert f.metadata() == {"format": "pt"}, f"safetensors metadata {f.metadata()}"
        assert ("lm_head.weight" in f.keys()) is not tie, "a tied head is stored once, as transformer.wte.weight"

    theirs = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    assert (theirs.lm_head.weight.data_ptr() == theirs.transformer.wte.weight.data_ptr()) is tie
    assert_same_logits(ours, theirs, f"export_gpt2 -> GPT2LMHeadModel.from_pretrained, tie={tie}")


@pytest.mark.parametrize("tie", [True, False])
def test_export_then_load_gpt2_round_trip_is_exact(tmp_path, tie):
    ours = our_model(tie)
    back = load_gpt2(export_gpt2(ours, tmp_path))
    assert back.config == ours.config, f"config changed in the round trip:\n{back.config}\n!= {ours.config}"
    original = ours.state_dict()
    restored = back.state_dict()
    assert restored.keys() == original.keys()
    for key, value in original.items():
        assert torch.equal(restored[key], value), f"{key} changed in the export -> load_gpt2 round trip"


def test_export_overwrites_an_existing_export(tmp_path):
    export_gpt2(our_model(seed=0), tmp_path)
    second = our_model(seed=1)
    back = load_gpt2(export_gpt2(second, tmp_path))
    assert torch.equal(back.transformer.wte.weight, second.transformer.wte.weight), "re-export kept the old weights"
    assert json.loads((tmp_path / "config.json").read_text())["n_layer"] == LAYERS


@pytest.mark.parametrize(
    "overrides, named",
    [({"pos_encoding": "rope"}, "pos_encoding='rope'"), ({"pos_encoding": "alibi"}, "pos_encoding='alibi'"),
     ({"qk_norm": True}, "qk_norm=True")],
)
def test_export_of_a_non_gpt2_model_raises_before_writing(tmp_path, overrides, named):
    with pytest.raises(ValueError, match=f"cannot export to GPT-2: .*{named}"):
        export_gpt2(our_model(**overrides), tmp_path / "out")
    assert not (tmp_path / "out").exists(), "a refused export should write nothing"


# ------------------------------------------------------------------------------------------------------ errors


def test_missing_local_directory_errors_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such directory: .*Check the path"):
        load_gpt2(tmp_path / "does-not-exist")
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        load_gpt2(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(hf_model().config.to_dict()))
    with pytest.raises(FileNotFoundError, match="has no weights: expected model.safetensors"):
        load_gpt2(tmp_path)


def test_weights_of_another_shape_fail_to_load(tmp_path):
    theirs = hf_model()
    theirs.save_pretrained(tmp_path)
    sd = {k: v.contiguous() for k, v in theirs.state_dict().items() if k != "lm_head.weight"}
    del sd["transformer.h.1.mlp.c_fc.bias"]
    save_file(sd, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(RuntimeError, match="transformer.h.1.mlp.c_fc.bias"):
        load_gpt2(tmp_path)


def test_hub_id_fetches_only_config_and_safetensors(tmp_path, monkeypatch):
    """A stand-in for snapshot_download (no network): load_gpt2 asks for the right files and loads what comes back."""
    theirs = hf_model()
    theirs.save_pretrained(tmp_path)
    calls = []

    def fake_snapshot_download(repo_id, **kwargs):
        calls.append((repo_id, kwargs))
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    ours = load_gpt2("someone/tiny-gpt2", revision="abc123")
    assert len(calls) == 1, f"expected one snapshot_download call, got {calls}"
    repo_id, kwargs = calls[0]
    assert repo_id == "someone/tiny-gpt2" and kwargs["revision"] == "abc123"
    patterns = kwargs["allow_patterns"]
    assert "config.json" in patterns and all(p.endswith((".json", ".safetensors")) for p in patterns), (
        f"load_gpt2 should fetch config.json and safetensors only, asked for {patterns}"
    )
    assert_same_logits(ours, theirs, "load_gpt2(hub id)")


def test_unreachable_hub_errors_clearly_without_touching_the_network(tmp_path, monkeypatch):
    # huggingface_hub reads HF_HUB_OFFLINE once, at import: set the variable and the constant it became
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))  # an empty cache
    with pytest.raises(OSError, match="could not fetch 'attention-lab-tests/no-such-model'.*HF_HUB_OFFLINE"):
        load_gpt2("attention-lab-tests/no-such-model", revision="main")


def test_load_gpt2_reads_the_layer_norm_epsilon_it_was_saved_with(tmp_path):
    """A GPT-2 folder with a non-default layer_norm_epsilon loads with that epsilon and transformers' logits."""
    theirs = hf_model()
    theirs.config.layer_norm_epsilon = 0.5  # large, so a model built with 1e-5 computes visibly different logits
    for module in theirs.modules():
        if isinstance(module, torch.nn.LayerNorm):
            module.eps = 0.5
    theirs.save_pretrained(tmp_path)
    ours = load_gpt2(tmp_path)
    assert ours.config.layer_norm_eps == 0.5, f"layer_norm_epsilon 0.5 read as {ours.config.layer_norm_eps}"
    assert_same_logits(ours, theirs, "load_gpt2 with layer_norm_epsilon=0.5")


@pytest.mark.parametrize("overrides", [["model=gpt2"], ["experiment=gpt2_124m"]], ids=["model=gpt2", "gpt2_124m"])
def test_the_gpt2_preset_is_gpt2s_architecture_and_exports_as_gpt2(overrides):
    """model=gpt2 (and experiment=gpt2_124m) train GPT-2 small as transformers defines it: learned positions,
    biases, tied embeddings, 12 x 12 x 768, 1024 positions; its run exports to GPT2LMHeadModel, not remote code.
    Planted bug: gpt2_preset_rope."""
    import dataclasses

    from attention_lab.interop.convert import plan_export
    from attention_lab.training.config import compose

    want = config_from_hf(transformers.GPT2Config().to_dict())
    got = compose(overrides).model.network(vocab_size=50257)
    differ = {f.name: (getattr(got, f.name), getattr(want, f.name)) for f in dataclasses.fields(want)
              if getattr(got, f.name) != getattr(want, f.name)}
    assert not differ, f"{overrides[0]} differs from GPT-2 small (preset, GPT-2): {differ}"
    assert plan_export(got).target == "gpt2", plan_export(got)
