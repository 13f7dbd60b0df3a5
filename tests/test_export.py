"""Export to transformers (attention_lab.interop.export, attention_lab/interop/hf.py, attention_lab/interop/convert.py, attention_lab/interop/remote_code/):
for every positional encoding, every model option and the default config, the loaded transformers model gives our
logits, `pipeline("text-generation")` greedy gives sample.py --greedy's text, AutoTokenizer encodes as ours, and
load_pretrained gives the exported model back bit for bit.

Tolerances: GPT2LMHeadModel and GPTNeoXForCausalLM run the same float32 kernels as ours (tanh GELU, sdpa); measured,
their logits equal ours exactly (max |diff| 0.0), as do the remote code's without ALiBi. With ALiBi the remote code
adds its bias through a float mask built in another order: measured max |diff| 1.9e-6 to 3.1e-6 on logits of size
3 to 5. We assert atol=1e-5, rtol=1e-4; every parameter is
re-drawn (biases and LayerNorms too), so a real mapping error moves logits by ~1e-1 (test_each_neox_mapping_detail_
matters shows the four GPT-NeoX details each do). Round trips through files are compared with torch.equal.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import sample as sample_mod  # noqa: E402
from attention_lab import sampling  # noqa: E402
from attention_lab.interop import export as export_mod  # noqa: E402
from attention_lab.interop.convert import FIELD_ROLES, config_from_neox, plan_export  # noqa: E402
from attention_lab.interop.hf import (  # noqa: E402
    REMOTE_CODE_DIR,
    REMOTE_FILES,
    export_pretrained,
    load_pretrained,
    remote_code_fields,
)
from attention_lab.store.checkpoint import save_checkpoint  # noqa: E402
from attention_lab.training.config import compose  # noqa: E402
from data.tokenizer import EOT, Tokenizer  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TOL = dict(atol=1e-5, rtol=1e-4)
TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
        "First Citizen:\nYou are all resolved rather to die than to famish?\n\nAll:\nResolved. resolved.\n")
PROMPT = "First Citizen:\nYou"
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def bpe_json() -> str:
    return Tokenizer.train_bpe([[TEXT] * 4], 300).to_str()


@pytest.fixture(scope="module")
def char_json() -> str:
    return Tokenizer.train_char([[TEXT]]).to_str()


def randomise(model: GPT, seed: int) -> GPT:
    """Re-draw every parameter (biases and LayerNorms too), so that a mis-mapped one cannot go unnoticed."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("value_lambda"):
                p.fill_(0.3)
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    return model.eval()


def tiny(tokenizer_json: str, seed: int = 0, **overrides) -> GPT:
    vocab = Tokenizer.from_str(tokenizer_json).vocab_size
    fields = dict(vocab_size=vocab, block_size=32, n_layer=2, n_head=4, n_embd=32, bias=False) | overrides
    return randomise(GPT(GPTConfig(**fields)), seed)


def load_hf(out: Path):
    remote = json.loads((out / "config.json").read_text()).get("model_type") == "attention_lab"
    return transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=remote).eval()


def assert_same_logits(ours: GPT, theirs, what: str, batch: int = 2) -> None:
    """Logits of `batch` random sequences of the full context length."""
    shape = (batch, ours.config.block_size)
    idx = torch.randint(0, ours.config.vocab_size, shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, got = ours(idx).logits, theirs(idx).logits
    assert expected.abs().max() > 0.5, "logits this small would make the comparison meaningless"
    torch.testing.assert_close(got.float(), expected.float(), **TOL,
                               msg=lambda m: f"{what}: transformers' logits differ from ours\n{m}")


def assert_round_trip(ours: GPT, out: Path) -> None:
    back = load_pretrained(out)
    assert back.config == ours.config, f"config changed in the round trip:\n{back.config}\n!= {ours.config}"
    original, restored = ours.state_dict(), back.state_dict()
    assert restored.keys() == original.keys(), sorted(set(restored) ^ set(original))
    for key, value in original.items():
        assert torch.equal(restored[key], value), f"{key} changed in the export -> load_pretrained round trip"


def greedy_text_from_sample_py(model: GPT, tokenizer_json: str, tmp_path: Path, capsys, monkeypatch) -> tuple[str, Path]:
    """What `sample.py --greedy` prints for PROMPT, from a checkpoint of `model`; and that checkpoint.

    In float32, as transformers runs: on a CPU with native bf16 sample.py's dtype "auto" may pick bf16 autocast.
    """
    ckpt = save_checkpoint(tmp_path / "run" / "checkpoints", 1, model, tokenizer_json, {"val_loss": 1.0})
    capsys.readouterr()
    monkeypatch.setattr(sampling, "decoding_dtype", lambda name, device, *rest: torch.float32)
    rc = sample_mod.main(["--checkpoint", str(ckpt), "--prompt", PROMPT, "--greedy", "--max-new-tokens",
                          str(NEW_TOKENS), "--no-attention", "--device", "cpu"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert captured.out.endswith("\n"), captured.out
    return captured.out[:-1], ckpt


def assert_pipeline_matches_sample_py(model: GPT, tokenizer_json: str, tmp_path: Path, capsys, monkeypatch,
                                      **export_kwargs):
    """Export the checkpoint with the CLI, run pipeline('text-generation') greedily, compare with sample.py."""
    text, ckpt = greedy_text_from_sample_py(model, tokenizer_json, tmp_path, capsys, monkeypatch)
    out = tmp_path / "hf"
    rc = export_mod.main([str(ckpt), str(out), *(["--remote-code"] if export_kwargs.get("remote_code") else [])])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    remote = json.loads((out / "config.json").read_text())["model_type"] == "attention_lab"
    assert ("trust_remote_code=True" in captured.out) is remote, captured.out
    generator = transformers.pipeline("text-generation", model=str(out), trust_remote_code=remote, device="cpu")
    got = generator(PROMPT, max_new_tokens=NEW_TOKENS, do_sample=False)[0]["generated_text"]
    # transformers stops at <|endoftext|> (eos_token_id) and leaves it out of the text; sample.py goes on
    expected = text.split(EOT)[0]
    assert len(expected) >= len(PROMPT) + 4, f"too little generated to compare: {expected!r}"
    assert got == expected, f"pipeline greedy text differs from sample.py --greedy:\n{got!r}\n!= {expected!r}"
    return out


# ------------------------------------------------------------------------------------------- what maps where


def test_every_config_field_is_classified_and_implemented_by_the_remote_code():
    names = {f.name for f in dataclasses.fields(GPTConfig)}
    assert set(FIELD_ROLES) == names, (
        f"attention_lab/interop/convert.py FIELD_ROLES must classify every GPTConfig field: unclassified "
        f"{sorted(names - set(FIELD_ROLES))}, stale {sorted(set(FIELD_ROLES) - names)}")
    assert set(remote_code_fields()) == names, (
        f"attention_lab/remote_code must implement every GPTConfig field: missing "
        f"{sorted(names - set(remote_code_fields()))}")


def test_an_unknown_config_field_is_refused_loudly(tmp_path, char_json):
    @dataclasses.dataclass
    class NewerConfig(GPTConfig):
        swiglu: bool = False

    cfg = NewerConfig(vocab_size=Tokenizer.from_str(char_json).vocab_size, block_size=8, n_layer=1, n_head=2, n_embd=8)
    with pytest.raises(ValueError, match="GPTConfig field\\(s\\) swiglu are unknown to the exporter"):
        plan_export(cfg)
    with pytest.raises(ValueError, match="swiglu"):
        export_pretrained(GPT(cfg), tmp_path / "out", char_json)
    assert not (tmp_path / "out").exists(), "a refused export must write nothing"


@pytest.mark.parametrize("overrides, target", [
    ({"pos_encoding": "learned"}, "gpt2"),
    ({"pos_encoding": "sinusoidal"}, "gpt2"),
    ({"pos_encoding": "none"}, "gpt2"),
    ({"pos_encoding": "rope"}, "gpt_neox"),
    ({"pos_encoding": "rope", "mlp_act": "relu2", "zero_init_proj": True, "attn_backend": "math"}, "gpt_neox"),
    ({"pos_encoding": "alibi"}, "remote"),
    ({"pos_encoding": "rope", "qk_norm": True}, "remote"),
    ({"pos_encoding": "learned", "logit_softcap": 15.0}, "remote"),
    ({"pos_encoding": "none", "value_residual": True}, "remote"),
    ({"pos_encoding": "learned", "n_kv_head": 1}, "gpt_bigcode"),
    ({"pos_encoding": "sinusoidal", "n_kv_head": 1, "bias": False}, "gpt_bigcode"),
    ({"pos_encoding": "rope", "n_kv_head": 1}, "remote"),
    ({"pos_encoding": "learned", "n_kv_head": 2}, "remote"),
    ({"pos_encoding": "learned", "n_kv_head": 1, "window": 4}, "remote"),
])
def test_plan_export_picks_the_architecture(overrides, target):
    plan = plan_export(GPTConfig(**overrides))
    assert plan.target == target, f"{overrides} should export to {target}, planned {plan}"
    assert bool(plan.reasons) == (target == "remote"), plan.reasons
    if overrides.get("pos_encoding") == "alibi":
        assert "erf GELU" in plan.reasons[0] and "MptForCausalLM" in plan.reasons[0], plan.reasons


# ------------------------------------------------------------------------------- parity for every encoding


CASES = {
    "learned": dict(pos_encoding="learned", bias=True),
    "learned-untied-nobias": dict(pos_encoding="learned", tie_embeddings=False),
    "sinusoidal": dict(pos_encoding="sinusoidal"),
    "none": dict(pos_encoding="none", bias=True),
    "rope": dict(pos_encoding="rope"),
    "rope-bias-untied-base500": dict(pos_encoding="rope", bias=True, tie_embeddings=False, rope_base=500.0),
    "alibi": dict(pos_encoding="alibi", bias=True),
    "alibi-3-heads": dict(pos_encoding="alibi", n_head=3, n_embd=24),
}
ARCHITECTURES = {"learned": "GPT2LMHeadModel", "sinusoidal": "GPT2LMHeadModel", "none": "GPT2LMHeadModel",
                 "rope": "GPTNeoXForCausalLM", "alibi": "AttentionLabForCausalLM"}


@pytest.mark.parametrize("case", list(CASES))
def test_every_positional_encoding_exports_with_our_logits_and_round_trips(tmp_path, bpe_json, case):
    ours = tiny(bpe_json, **CASES[case])
    result = export_pretrained(ours, tmp_path / "out", bpe_json)
    theirs = load_hf(result.path)
    assert type(theirs).__name__ == ARCHITECTURES[ours.config.pos_encoding], type(theirs).__name__
    tied = theirs.get_output_embeddings().weight.data_ptr() == theirs.get_input_embeddings().weight.data_ptr()
    assert tied is ours.config.tie_embeddings, f"tying lost: transformers tied={tied}"
    assert_same_logits(ours, theirs, case)
    assert_round_trip(ours, result.path)


@pytest.mark.parametrize("pos_encoding", ["learned", "sinusoidal", "none", "rope", "alibi"])
def test_pipeline_greedy_equals_sample_py_for_every_positional_encoding(tmp_path, capsys, monkeypatch, bpe_json,
                                                                       pos_encoding):
    ours = tiny(bpe_json, seed=5, pos_encoding=pos_encoding)
    assert_pipeline_matches_sample_py(ours, bpe_json, tmp_path, capsys, monkeypatch)


OPTIONS = {
    "qk_norm": dict(pos_encoding="rope", qk_norm=True),
    "relu2-native": dict(pos_encoding="rope", mlp_act="relu2"),
    "relu2-gpt2": dict(pos_encoding="learned", mlp_act="relu2"),
    "logit_softcap": dict(pos_encoding="sinusoidal", logit_softcap=3.0),
    "value_residual": dict(pos_encoding="rope", value_residual=True, n_layer=3),
    "zero_init_proj": dict(pos_encoding="rope", zero_init_proj=True),
    "everything": dict(pos_encoding="alibi", qk_norm=True, mlp_act="relu2", logit_softcap=3.0, value_residual=True,
                       tie_embeddings=False, n_layer=3),
    "grouped-query": dict(pos_encoding="rope", n_kv_head=1),
    "multi-query-native": dict(pos_encoding="learned", n_kv_head=1),
    "multi-query-native-no-bias": dict(pos_encoding="sinusoidal", n_kv_head=1, bias=False, tie_embeddings=False),
    "window": dict(pos_encoding="alibi", window=5, window_pattern="LG", n_kv_head=2),
    "sinks": dict(pos_encoding="learned", attn_sinks=True),
    "linear": dict(pos_encoding="learned", attention="linear", linear_out_norm=True),
    "linear-no-denominator": dict(pos_encoding="none", attention="linear", linear_denominator=False),
}


@pytest.mark.parametrize("option", list(OPTIONS))
def test_every_model_option_exports_with_our_logits(tmp_path, bpe_json, option):
    ours = tiny(bpe_json, seed=2, **OPTIONS[option])
    result = export_pretrained(ours, tmp_path / "out", bpe_json)
    theirs = load_hf(result.path)
    if option.startswith("multi-query-native"):
        assert type(theirs).__name__ == "GPTBigCodeForCausalLM", f"{option} should export natively: {result.plan}"
    assert_same_logits(ours, theirs, option)
    assert_round_trip(ours, result.path)
    if option == "logit_softcap":
        assert theirs(torch.tensor([[1, 2, 3]])).logits.abs().max() < 3.0, "the soft cap was not applied"
    if option == "sinks":  # a sink of 0 would hide a bug that drops it: give each head its own
        with torch.no_grad():
            for block in ours.transformer.h:
                block.attn.sink.copy_(torch.linspace(-2, 2, block.attn.sink.numel()))
        result = export_pretrained(ours, tmp_path / "out2", bpe_json)
        assert_same_logits(ours, load_hf(result.path), "sinks, non-zero")


def test_any_model_exports_as_remote_code_on_request(tmp_path, capsys, monkeypatch, bpe_json):
    ours = tiny(bpe_json, seed=5, pos_encoding="learned", bias=True)
    out = assert_pipeline_matches_sample_py(ours, bpe_json, tmp_path, capsys, monkeypatch, remote_code=True)
    assert sorted(p.name for p in out.glob("*.py")) == sorted(REMOTE_FILES)
    assert_same_logits(ours, load_hf(out), "learned, as remote code")
    assert_round_trip(ours, out)


@pytest.mark.parametrize("experiment", ["shakespeare_cpu", "classic"])
def test_the_default_config_exports(tmp_path, capsys, monkeypatch, bpe_json, experiment):
    """The default run's model (experiment=shakespeare_cpu; with QK-norm it needs the remote code) and the earlier
    default (experiment=classic: 6x6x192 RoPE without biases, GPT-NeoX). The vocabulary is the tokenizer's."""
    cfg = compose([f"experiment={experiment}"]).model.gpt(vocab_size=Tokenizer.from_str(bpe_json).vocab_size)
    ours = randomise(GPT(cfg), seed=7)
    with torch.no_grad():  # a deeper random model: keep the logits of the order of those of the tiny ones
        ours.lm_head.weight.mul_(0.25)
    out = assert_pipeline_matches_sample_py(ours, bpe_json, tmp_path, capsys, monkeypatch)
    theirs = load_hf(out)
    assert type(theirs).__name__ == plan_export(cfg).architecture
    if experiment == "classic":
        assert type(theirs).__name__ == "GPTNeoXForCausalLM", "a RoPE model without new options exports natively"
    assert_same_logits(ours, theirs, f"experiment={experiment} ({plan_export(cfg).architecture})", batch=1)
    assert_round_trip(ours, out)


# ------------------------------------------------------------------------------------ GPT-NeoX, claim by claim


def test_each_neox_mapping_detail_matters(tmp_path, bpe_json):
    """Undo one detail of the GPT-NeoX mapping at a time: each moves the logits far beyond the tolerance."""
    ours = tiny(bpe_json, seed=3, pos_encoding="rope", bias=True)
    out = export_pretrained(ours, tmp_path / "out", bpe_json).path
    idx = torch.randint(0, ours.config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = ours(idx).logits
    config = json.loads((out / "config.json").read_text())
    weights = load_file(out / "model.safetensors")

    def logits_with(what: str, config_changes: dict, weight_changes: dict) -> float:
        folder = tmp_path / what
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({**config, **config_changes}))
        save_file({**weights, **weight_changes}, folder / "model.safetensors", metadata={"format": "pt"})
        model = transformers.GPTNeoXForCausalLM.from_pretrained(folder).eval()
        with torch.no_grad():
            return (model(idx).logits - expected).abs().max().item()

    assert logits_with("as-exported", {}, {}) <= TOL["atol"]
    ours_sd = ours.state_dict()  # our c_attn rows [q | k | v], as they are before the per-head regrouping
    qkv = {k: ours_sd[k.replace("gpt_neox.layers", "transformer.h").replace("attention.query_key_value", "attn.c_attn")]
           for k in weights if "query_key_value" in k}
    changes = {
        "qkv rows as [q | k | v], not regrouped per head": ({}, qkv),
        "use_parallel_residual=True": ({"use_parallel_residual": True}, {}),
        "rotary fraction 0.25 (GPT-NeoX's default)": (
            {"rope_parameters": {**config["rope_parameters"], "partial_rotary_factor": 0.25}}, {}),
        "exact erf GELU (hidden_act=gelu)": ({"hidden_act": "gelu"}, {}),
    }
    for i, (what, (config_changes, weight_changes)) in enumerate(changes.items()):
        diff = logits_with(f"change{i}", config_changes, weight_changes)
        assert diff > 100 * TOL["atol"], f"{what}: logits moved only {diff:.2e}; the mapping detail looks untested"


def test_neox_folders_saved_by_transformers_load_and_foreign_variants_are_refused(tmp_path):
    config = transformers.GPTNeoXConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=16, hidden_act="gelu_pytorch_tanh", use_parallel_residual=False, rotary_pct=1.0,
        rotary_emb_base=1000.0, tie_word_embeddings=False, attention_bias=False, bos_token_id=None,
        eos_token_id=None)
    theirs = transformers.GPTNeoXForCausalLM(config).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(0.2 * torch.randn(p.shape, generator=g) + (1.0 if p.dim() == 1 else 0.0))
    theirs.save_pretrained(tmp_path / "neox")
    ours = load_pretrained(tmp_path / "neox")
    assert ours.config.pos_encoding == "rope" and ours.config.rope_base == 1000.0 and ours.config.bias, ours.config
    assert_same_logits(ours, theirs, "GPT-NeoX folder saved by transformers (attention_bias=False)")

    pythia_like = json.loads((tmp_path / "neox" / "config.json").read_text()) | {"use_parallel_residual": True}
    with pytest.raises(ValueError, match="use_parallel_residual=True"):
        config_from_neox(pythia_like)
    partial = json.loads((tmp_path / "neox" / "config.json").read_text())
    partial["rope_parameters"] = {**partial["rope_parameters"], "partial_rotary_factor": 0.25}
    with pytest.raises(ValueError, match="rotary fraction 0.25"):
        config_from_neox(partial)


# ------------------------------------------------------------------------------------------------- tokenizer


@pytest.mark.parametrize("kind", ["bpe", "char"])
def test_auto_tokenizer_encodes_and_decodes_as_ours(tmp_path, bpe_json, char_json, kind):
    tokenizer_json = bpe_json if kind == "bpe" else char_json
    ours = Tokenizer.from_str(tokenizer_json)
    export_pretrained(tiny(tokenizer_json), tmp_path, tokenizer_json)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    texts = [TEXT, PROMPT, "", " ", "\n\n", "speak,  speak .", f"All:{EOT}First", "Citizen" * 9]
    if kind == "bpe":
        texts += ["héllo wörld — ünïcode 😀\ttab"]  # byte-level: any text
    for text in texts:
        ids = ours.encode(text)
        assert theirs(text)["input_ids"] == ids, f"AutoTokenizer encodes {text!r} differently"
        assert theirs.decode(ids) == ours.decode(ids), f"AutoTokenizer decodes {text!r} differently"
    assert theirs.eos_token == EOT and theirs.eos_token_id == ours.eot_id
    assert theirs.model_max_length == 32
    if kind == "char":
        assert theirs.unk_token_id == ours.unk_id and theirs("Q~")["input_ids"] == [ours.unk_id] * 2


def test_a_template_post_processor_is_left_out_so_encodings_match(tmp_path, bpe_json):
    spec = json.loads(bpe_json)
    eot = Tokenizer.from_str(bpe_json).eot_id
    spec["post_processor"] = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": EOT, "type_id": 0}},
                                                                       {"Sequence": {"id": "A", "type_id": 0}}],
                              "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                              "special_tokens": {EOT: {"id": EOT, "ids": [eot], "tokens": [EOT]}}}
    templated = json.dumps(spec)
    export_pretrained(tiny(templated), tmp_path, templated)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert theirs(PROMPT)["input_ids"] == Tokenizer.from_str(templated).encode(PROMPT), "a template added tokens"


# ------------------------------------------------------------------------------------------------ remote code


def test_remote_code_imports_only_torch_and_transformers():
    for name in REMOTE_FILES:
        tree = ast.parse((REMOTE_CODE_DIR / name).read_text())
        roots = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for alias in node.names}
        roots |= {node.module.split(".")[0] for node in ast.walk(tree)
                  if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module}
        assert roots <= {"math", "torch", "transformers"}, f"{name} imports {sorted(roots)}"


BLOCKED_LOAD = """
import importlib.abc, os, sys
REPO = os.path.realpath(sys.argv[2])
sys.path = [p for p in sys.path if p and os.path.realpath(p) != REPO]  # the checkout itself, not its .venv
class NoAttentionLab(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("attention_lab", "model", "data", "train", "sample"):
            raise ImportError(f"attention-lab is not installed here: import {name}")
sys.meta_path.insert(0, NoAttentionLab())
import torch, transformers
model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
tokenizer = transformers.AutoTokenizer.from_pretrained(sys.argv[1], trust_remote_code=True)
ids = tokenizer("First Citizen:", return_tensors="pt")["input_ids"]
out = model.generate(ids, max_new_tokens=5, do_sample=False)
leaked = [m for m in sys.modules if m.split(".")[0] in ("attention_lab", "model", "data")]
assert not leaked, leaked
print("ok", type(model).__name__, out.shape[1] - ids.shape[1])
"""


def test_remote_code_loads_where_attention_lab_is_not_installed(tmp_path, bpe_json):
    out = export_pretrained(tiny(bpe_json, pos_encoding="alibi", qk_norm=True), tmp_path / "out", bpe_json).path
    proc = subprocess.run([sys.executable, "-c", BLOCKED_LOAD, str(out), str(REPO)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules")})
    assert proc.returncode == 0 and proc.stdout.startswith("ok AttentionLabForCausalLM 5"), proc.stderr[-3000:]
    assert "custom code" not in proc.stdout + proc.stderr, "loading asked about running custom code"


# ------------------------------------------------------------------------------------------------- the command


def test_export_command_errors_and_replacing_an_earlier_export(tmp_path, capsys, bpe_json):
    assert export_mod.main([str(tmp_path / "no-such-run"), str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.startswith("error: no such run or checkpoint")

    ckpt = save_checkpoint(tmp_path / "run" / "checkpoints", 3, tiny(bpe_json, pos_encoding="rope"), bpe_json, {})
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    assert export_mod.main([str(tmp_path / "run"), str(busy)]) == 2
    assert "not an attention-lab export" in capsys.readouterr().err
    assert [p.name for p in busy.iterdir()] == ["notes.txt"], "a refused export touched the folder"

    out = tmp_path / "out"
    assert export_mod.main([str(tmp_path / "run"), str(out), "--remote-code"]) == 0
    assert (out / "modeling_attention_lab.py").exists()
    assert export_mod.main([str(ckpt), str(out)]) == 0, capsys.readouterr().err
    assert "GPTNeoXForCausalLM" in capsys.readouterr().out
    assert not list(out.glob("*.py")), "the earlier export's remote code was left in the replaced folder"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy", "out", "run"], "temporary folders left behind"
    shutil.rmtree(out)
