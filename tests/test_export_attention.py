"""An export returns its attention (attention_lab/interop/remote_code, the native GPT-2 / GPT-NeoX exports):
`model(**inputs, output_attentions=True).attentions` equals sample.py's attention.npy for the same text, under
attn_implementation "eager" and the default "sdpa", for the default model and the variants; bertviz's head_view
draws them; docs/transformers.md's snippet runs as written, without a deprecation warning.

Tolerance: the eager weights are the same float32 softmax as ours, in another order of operations; measured max
|diff| below 1e-6 on these tiny random models. We assert atol=1e-5 (a wrong head, layer, mask or position moves
weights by ~1e-1).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
from test_export import TEXT, randomise, tiny  # noqa: E402

import sample as sample_mod  # noqa: E402
from attention_lab import sampling  # noqa: E402
from attention_lab.interop.hf import export_pretrained  # noqa: E402
from attention_lab.store.checkpoint import save_checkpoint  # noqa: E402
from attention_lab.training.config import compose  # noqa: E402
from data.tokenizer import Tokenizer  # noqa: E402
from model import GPT  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
ATOL = 1e-5

VARIANTS = {  # name: (GPTConfig overrides for tiny(), the architecture it exports as)
    "default": (None, "AttentionLabForCausalLM"),  # experiment=shakespeare_cpu: RoPE + QK-norm, shipped code
    "gqa-window-alibi": (dict(pos_encoding="alibi", n_kv_head=2, window=5, window_pattern="LG"),
                         "AttentionLabForCausalLM"),
    "sinks": (dict(pos_encoding="rope", attn_sinks=True), "AttentionLabForCausalLM"),
    "linear": (dict(pos_encoding="none", attention="linear"), "AttentionLabForCausalLM"),
    "gpt2": (dict(pos_encoding="learned", bias=True), "GPT2LMHeadModel"),
    "neox": (dict(pos_encoding="rope"), "GPTNeoXForCausalLM"),
}


@pytest.fixture(scope="module")
def bpe_json() -> str:
    return Tokenizer.train_bpe([[TEXT] * 4], 300).to_str()


def variant(name: str, tokenizer_json: str) -> GPT:
    overrides, _ = VARIANTS[name]
    if overrides is not None:
        return tiny(tokenizer_json, seed=3, **overrides)
    cfg = compose(["experiment=shakespeare_cpu"]).model.gpt(vocab_size=Tokenizer.from_str(tokenizer_json).vocab_size)
    model = randomise(GPT(cfg), seed=3)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.25)
    return model


def sample_py_attention(model: GPT, tokenizer_json: str, tmp_path: Path, capsys, monkeypatch) -> tuple[np.ndarray, list]:
    """attention.npy and its token ids, as `sample.py --checkpoint ... --prompt TEXT --max-new-tokens 0` writes them."""
    if model.config.attn_sinks:  # a sink of 0 would hide a bug that drops it: give each head its own
        with torch.no_grad():
            for block in model.transformer.h:
                block.attn.sink.copy_(torch.linspace(-2, 2, block.attn.sink.numel()))
    ckpt = save_checkpoint(tmp_path / "run" / "checkpoints", 1, model, tokenizer_json, {"val_loss": 1.0})
    monkeypatch.setattr(sampling, "decoding_dtype", lambda name, device, *rest: torch.float32)
    out = tmp_path / "sample"
    rc = sample_mod.main(["--checkpoint", str(ckpt), "--prompt", TEXT, "--max-new-tokens", "0", "--out", str(out),
                          "--no-html", "--device", "cpu"])
    assert rc == 0, capsys.readouterr().err
    return np.load(out / "attention.npy"), json.loads((out / "tokens.json").read_text())["token_ids"]


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_export_returns_the_attention_sample_py_writes(tmp_path, capsys, monkeypatch, bpe_json, name):
    model = variant(name, bpe_json)
    expected, ids = sample_py_attention(model, bpe_json, tmp_path, capsys, monkeypatch)
    out = export_pretrained(model, tmp_path / "hf", bpe_json).path
    inputs = torch.tensor([ids])
    for implementation in ("eager", "sdpa"):
        theirs = transformers.AutoModelForCausalLM.from_pretrained(
            out, trust_remote_code=True, attn_implementation=implementation).eval()
        assert type(theirs).__name__ == VARIANTS[name][1]
        if VARIANTS[name][1] != "AttentionLabForCausalLM" and implementation == "sdpa":
            continue  # transformers' own models return no weights under sdpa: they keep what they have
        with torch.no_grad():
            got = theirs(inputs, output_attentions=True).attentions
        assert got is not None and len(got) == model.config.n_layer, (
            f"{name} ({implementation}): output_attentions=True returned {got!r}, not one tensor a layer")
        got = torch.stack([a[0] for a in got]).float().numpy()  # (L, nh, T, T)
        assert got.shape == expected.shape, f"{name}: {got.shape} != attention.npy's {expected.shape}"
        np.testing.assert_allclose(got, expected, atol=ATOL, rtol=0,
                                   err_msg=f"{name} ({implementation}): the export's attentions differ from "
                                           "sample.py's attention.npy for the same text")
        assert expected.max() > 0.5 and np.abs(np.diff(expected, axis=1)).max() > 0.1, (
            "heads this alike would make the comparison meaningless")


def test_eager_and_sdpa_give_the_same_logits_and_sdpa_is_the_default(tmp_path, bpe_json):
    model = variant("default", bpe_json)
    out = export_pretrained(model, tmp_path / "hf", bpe_json).path
    default = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    assert default.config._attn_implementation == "sdpa"
    eager = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True,
                                                              attn_implementation="eager").eval()
    idx = torch.randint(0, model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model(idx).logits
        a, b = default(idx).logits, eager(idx).logits
        assert default(idx).attentions is None, "weights computed though nobody asked for them"
    torch.testing.assert_close(a, ours, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(b, ours, atol=1e-5, rtol=1e-4)
    default.set_attn_implementation("eager")
    assert default.config._attn_implementation == "eager"
    with torch.no_grad():
        assert default(idx[:1], output_attentions=True).attentions[0].shape == (1, 4, 40, 40)


def test_generation_keeps_its_cache(tmp_path, bpe_json):
    """Each new token is one token through the model (the cache is passed under the name transformers uses)."""
    model = variant("gqa-window-alibi", bpe_json)
    out = export_pretrained(model, tmp_path / "hf", bpe_json).path
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    lengths = []
    theirs.register_forward_pre_hook(lambda mod, args, kwargs: lengths.append(kwargs["input_ids"].shape[1]),
                                     with_kwargs=True)
    theirs.generate(torch.tensor([[1, 2, 3, 4]]), max_new_tokens=5, do_sample=False)
    assert lengths == [4, 1, 1, 1, 1], f"tokens per forward call during generate: {lengths}"


def test_generate_returns_each_steps_attention(tmp_path, bpe_json):
    """`generate(..., output_attentions=True, return_dict_in_generate=True)` returns one tuple of per-layer weights a
    generated token: the prompt's (nh, T, T) first, then one row a step over the keys seen so far, rows summing to
    1 and equal to a plain forward's rows over the whole generated text."""
    model = variant("default", bpe_json)
    out = export_pretrained(model, tmp_path / "hf", bpe_json).path
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    prompt, new = torch.tensor([[1, 2, 3, 4, 5, 6]]), 3
    T, nh, n_layer = prompt.shape[1], model.config.n_head, model.config.n_layer
    with torch.no_grad():
        gen = theirs.generate(prompt, max_new_tokens=new, do_sample=False, output_attentions=True,
                              return_dict_in_generate=True)
        full = theirs(gen.sequences, output_attentions=True).attentions  # (1, nh, T+new, T+new) a layer
    steps = gen.attentions
    assert steps is not None and len(steps) == new and all(layers is not None for layers in steps), (
        f"generate(output_attentions=True, return_dict_in_generate=True) returned attentions {steps!r}, not "
        f"one tuple of per-layer weights for each of the {new} generated tokens")
    for i, layers in enumerate(steps):
        rows = T if i == 0 else 1
        assert len(layers) == n_layer, f"step {i}: {len(layers)} layers, not {n_layer}"
        for layer, a in enumerate(layers):
            assert a.shape == (1, nh, rows, T + i), f"step {i}, layer {layer}: {tuple(a.shape)}"
            torch.testing.assert_close(a.sum(-1), torch.ones(1, nh, rows), atol=1e-5, rtol=0)
            expected = full[layer][:, :, T + i - rows:T + i, :T + i]
            torch.testing.assert_close(a, expected, atol=ATOL, rtol=0,
                                       msg=f"step {i}, layer {layer}: not the forward's weights for those rows")


def test_bertviz_head_view_draws_an_exports_attention(tmp_path, bpe_json):
    head_view = pytest.importorskip("bertviz").head_view
    model = variant("default", bpe_json)
    out = export_pretrained(model, tmp_path / "hf", bpe_json).path
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    inputs = tokenizer("ROMEO: Speak, speak.", return_tensors="pt")
    attentions = theirs(**inputs, output_attentions=True).attentions
    tokens = tokenizer.convert_ids_to_tokens(inputs["input_ids"][0])
    html = head_view(attentions, tokens, html_action="return").data
    params = json.loads(re.search(r"const params = (\{.*?\}); // HACK", html, re.S).group(1))
    drawn = np.array(params["attention"][0]["attn"])  # (L, nh, T, T), what the page draws
    np.testing.assert_allclose(drawn, torch.stack([a[0] for a in attentions]).detach().numpy(), atol=1e-6)
    assert drawn.shape == (model.config.n_layer, model.config.n_head, len(tokens), len(tokens))


def docs_transformers_block() -> str:
    """The ```python block of docs/transformers.md's "Exporting a run", as a reader copies it (the README points
    there)."""
    docs = (REPO / "docs" / "transformers.md").read_text(encoding="utf-8")
    section = docs.split("## Exporting a run", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "docs/transformers.md's 'Exporting a run' should hold one ```python block"
    return blocks[0]


@pytest.mark.parametrize("name", ["default", "gpt2"])
def test_the_docs_snippet_runs_as_written_for_the_default_model(tmp_path, bpe_json, name):
    """Exported as `python -m attention_lab.export` writes it, into exported/; the snippet run in a fresh interpreter:
    it prints generated text and draws the attention (head_view fails on an empty tuple), and transformers warns of
    nothing deprecated. Also for a GPT-2 export, which returns weights only under attn_implementation="eager"."""
    model = variant(name, bpe_json) if name == "default" else tiny(bpe_json, seed=3, pos_encoding="learned",
                                                                   block_size=96)  # room for 50 new tokens
    export_pretrained(model, tmp_path / "exported", bpe_json)
    code = docs_transformers_block()
    assert 'from_pretrained("exported/"' in code and "output_attentions=True" in code
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"docs/transformers.md's snippet failed:\n{done.stderr[-3000:]}"
    assert "ROMEO:" in done.stdout, done.stdout
    for bad in ("deprecated", "seem to have been set", "custom code", "Warning"):
        assert bad not in done.stderr, f"docs/transformers.md's snippet printed {bad!r}:\n{done.stderr}"
