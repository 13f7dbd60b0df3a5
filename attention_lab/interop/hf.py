"""Hugging Face folders: the file and network side of attention_lab/interop/convert.py.

    export_pretrained(model, "out", tokenizer_json)   a folder AutoModelForCausalLM / AutoTokenizer / pipeline load:
        learned, sinusoidal, no positions -> GPT2LMHeadModel; rope -> GPTNeoXForCausalLM; anything else (ALiBi,
        QK-norm, soft-capped logits, value residual) -> our own code in the folder (trust_remote_code=True)
    load_pretrained("out")                            such a folder (or a hub id) -> our GPT, exactly what was exported
    load_gpt2("gpt2")                                 a GPT-2 checkpoint: hub id or local folder
    export_gpt2(model, "out")                         export_pretrained, refusing anything but GPT-2

Exporting needs no `transformers`; loading the result does. The mapping of names and shapes lives in
attention_lab/interop/convert.py; the remote code in attention_lab/interop/remote_code/.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import tokenizers
import torch
from safetensors.torch import load_file, save_file

from attention_lab.interop.convert import (
    HINT_KEY,
    IGNORED_SUFFIXES,
    ExportPlan,
    bigcode_config_from,
    config_from_bigcode,
    config_from_hf,
    config_from_neox,
    gpt2_key,
    gpt2_variant,
    hf_config_from,
    neox_config_from,
    neox_variant,
    plan_export,
    state_dict_from_hf,
    state_dict_from_neox,
    state_dict_to_bigcode,
    state_dict_to_hf,
    state_dict_to_neox,
)
from data.files import make_temp_dir, publish_dir
from data.tokenizer import EOT, UNK, Tokenizer
from model import GPT, GPTConfig, has_attention

CONFIG = "config.json"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"  # sharded checkpoints list their shards here
TORCH_BIN = "pytorch_model.bin"
TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
GENERATION_CONFIG = "generation_config.json"
# the files _read_weights reads, at the repo's top level only ("*.safetensors" would also match sub-folders)
HUB_PATTERNS = [CONFIG, "model*.safetensors", SAFETENSORS_INDEX, TOKENIZER]

REMOTE_CODE_DIR = Path(__file__).parent / "remote_code"
REMOTE_FILES = ("configuration_attention_lab.py", "modeling_attention_lab.py")
AUTO_MAP = {
    "AutoConfig": "configuration_attention_lab.AttentionLabConfig",
    "AutoModelForCausalLM": "modeling_attention_lab.AttentionLabForCausalLM",
}
MODEL_TYPES = ("gpt2", "gpt_neox", "gpt_bigcode", "attention_lab")


# ----------------------------------------------------------------------------------------------------- loading


def _looks_like_path(name: str) -> bool:
    """A hub id is "name" or "owner/name"; anything else the user typed is meant as a local path."""
    return (
        os.path.isabs(name)
        or name.startswith((".", "~"))
        or name.count("/") > 1
        or (os.sep != "/" and os.sep in name)
        or os.path.exists(name)
    )


def _download(repo_id: str, revision: str | None) -> Path:
    # imported here so that loading a local directory never touches huggingface_hub's network setup
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=HUB_PATTERNS))
    except HFValidationError as e:
        raise FileNotFoundError(
            f"{repo_id!r} is neither a local directory nor a valid Hugging Face hub id ({e}). "
            "Check the path (a directory holding config.json and model.safetensors) or the repo id (e.g. 'gpt2')."
        ) from e
    except Exception as e:  # noqa: BLE001 - offline, not found, gated, HTTP: all mean "could not fetch"
        raise OSError(
            f"could not fetch {repo_id!r}"
            + (f" at revision {revision!r}" if revision else "")
            + f" from the Hugging Face hub ({type(e).__name__}: {' '.join(str(e).split())}). "
            "Check the repo id and revision, that you are online and that HF_HUB_OFFLINE is unset or 0 "
            "(with HF_HUB_OFFLINE=1 only repos already in the local cache load), "
            "or pass a local directory holding config.json and model.safetensors."
        ) from e


def _read_weights(directory: Path) -> dict[str, torch.Tensor]:
    if (directory / SAFETENSORS).is_file():
        return load_file(directory / SAFETENSORS)
    if (directory / SAFETENSORS_INDEX).is_file():
        shards = sorted(set(json.loads((directory / SAFETENSORS_INDEX).read_text())["weight_map"].values()))
        sd: dict[str, torch.Tensor] = {}
        for shard in shards:
            sd.update(load_file(directory / shard))
        return sd
    if (directory / TORCH_BIN).is_file():
        return torch.load(directory / TORCH_BIN, map_location="cpu", weights_only=True)
    raise FileNotFoundError(
        f"{directory} has no weights: expected {SAFETENSORS}, {SAFETENSORS_INDEX} or {TORCH_BIN}. "
        "Check the path, or save the model with save_pretrained() / export_pretrained() first "
        "(from the hub only safetensors weights are fetched)."
    )


def _resolve(name_or_path: str | os.PathLike, revision: str | None, what: str) -> Path:
    name = os.path.expanduser(os.fspath(name_or_path))
    if os.path.isdir(name):
        directory = Path(name)
    elif _looks_like_path(name):
        problem = f"{name} is a file, not a directory" if os.path.exists(name) else f"no such directory: {name}"
        raise FileNotFoundError(
            f"{problem}. Check the path: {what} wants a directory holding {CONFIG} and "
            f"{SAFETENSORS} (as written by save_pretrained or export_pretrained), or a hub id such as 'gpt2'."
        )
    else:
        directory = _download(name, revision)
    if not (directory / CONFIG).is_file():
        raise FileNotFoundError(
            f"{directory} has no {CONFIG}. Check the path: it should be the directory that save_pretrained() "
            "or export_pretrained() wrote."
        )
    return directory


def config_and_state_dict(hf_config: dict, hf_sd: dict[str, torch.Tensor], where: Path) -> tuple[GPTConfig, dict]:
    """A Hugging Face config.json and its weights -> our GPTConfig and state dict."""
    model_type = hf_config.get("model_type", "gpt2")
    hint = hf_config.get(HINT_KEY)
    if model_type == "gpt2":
        cfg = gpt2_variant(hf_sd, config_from_hf(hf_config), hint)
        return cfg, state_dict_from_hf(hf_sd, cfg)
    if model_type == "gpt_neox":
        cfg = neox_variant(hf_sd, config_from_neox(hf_config), hint)
        return cfg, state_dict_from_neox(hf_sd, cfg)
    if model_type == "gpt_bigcode":  # our names and layout: the GPT-2 variant rules, no transposes
        cfg = gpt2_variant(hf_sd, config_from_bigcode(hf_config), hint)
        sd = {gpt2_key(k): v for k, v in hf_sd.items() if not k.endswith(IGNORED_SUFFIXES)}
        if not cfg.bias:  # the zero biases the export added
            sd = {k: v for k, v in sd.items() if not k.endswith(".bias")}
        if "lm_head.weight" not in sd and cfg.tie_embeddings:
            sd["lm_head.weight"] = sd["transformer.wte.weight"]
        if cfg.pos_encoding != "learned":
            sd.pop("transformer.wpe.weight", None)
        return cfg, sd
    if model_type == "attention_lab":
        names = [f.name for f in dataclasses.fields(GPTConfig)]
        unknown = sorted(set(hint or {}) - set(names))
        if unknown:
            raise ValueError(
                f"{where / CONFIG} was exported by a newer attention-lab: this version does not know the model "
                f"field(s) {', '.join(unknown)}. Update attention-lab, or load the folder with transformers "
                "(trust_remote_code=True)."
            )
        cfg = GPTConfig.from_dict({n: hf_config[n] for n in names if n in hf_config})
        sd = dict(hf_sd)
        if "lm_head.weight" not in sd and cfg.tie_embeddings:
            sd["lm_head.weight"] = sd["transformer.wte.weight"]
        return cfg, sd
    raise ValueError(
        f"{where / CONFIG} describes a {model_type!r} model; only {', '.join(MODEL_TYPES)} folders load "
        "(what attention_lab.interop.export writes, and GPT-2 checkpoints)"
    )


def load_pretrained(name_or_path: str | os.PathLike, *, revision: str | None = None) -> GPT:
    """A folder written by export_pretrained (GPT-2, GPT-NeoX or remote-code), or a GPT-2 checkpoint (local
    directory or hub id) -> our GPT with its weights, in eval mode, on the CPU. A round trip is exact."""
    directory = _resolve(name_or_path, revision, "load_pretrained")
    hf_config = json.loads((directory / CONFIG).read_text(encoding="utf-8"))
    cfg, sd = config_and_state_dict(hf_config, _read_weights(directory), directory)
    model = GPT(cfg)
    model.load_state_dict(sd, strict=True)
    return model.eval()


def load_with_tokenizer(name_or_path: str | os.PathLike, *, revision: str | None = None) -> tuple[GPT, Tokenizer]:
    """As load_pretrained, and the folder's tokenizer.json as our Tokenizer (sample.py --model): a GPT-2 or
    GPT-NeoX checkpoint (a hub id such as 'gpt2', or a local folder, this project's exports included)."""
    directory = _resolve(name_or_path, revision, "sample.py --model")
    if not (directory / TOKENIZER).is_file():
        raise FileNotFoundError(f"{directory} has no {TOKENIZER}: sample.py needs the model's own tokenizer "
                                "(save it beside the weights with tokenizer.save_pretrained)")
    hf_config = json.loads((directory / CONFIG).read_text(encoding="utf-8"))
    cfg, sd = config_and_state_dict(hf_config, _read_weights(directory), directory)
    model = GPT(cfg)
    model.load_state_dict(sd, strict=True)
    return model.eval(), Tokenizer.from_file(directory / TOKENIZER)


def load_gpt2(name_or_path: str | os.PathLike, *, revision: str | None = None) -> GPT:
    """A GPT-2 checkpoint (local directory or hub id) -> our GPT with its weights, in eval mode, on the CPU."""
    directory = _resolve(name_or_path, revision, "load_gpt2")
    hf_config = json.loads((directory / CONFIG).read_text(encoding="utf-8"))
    if hf_config.get("model_type", "gpt2") != "gpt2":
        raise ValueError(
            f"{directory / CONFIG} describes a {hf_config['model_type']!r} model; only gpt2 loads here "
            "(load_pretrained reads every folder attention_lab.interop.export writes)"
        )
    cfg, sd = config_and_state_dict(hf_config, _read_weights(directory), directory)
    model = GPT(cfg)
    model.load_state_dict(sd, strict=True)
    return model.eval()


# ----------------------------------------------------------------------------------------------------- export


@dataclass
class Exported:
    path: Path
    plan: ExportPlan
    files: list[str]


def remote_code_fields() -> tuple[str, ...]:
    """The GPTConfig fields the shipped remote code implements (read from its source: no transformers needed)."""
    source = (REMOTE_CODE_DIR / REMOTE_FILES[0]).read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "FIELDS" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise RuntimeError(f"{REMOTE_CODE_DIR / REMOTE_FILES[0]} defines no FIELDS")


def hf_export_config(cfg: GPTConfig, plan: ExportPlan, eot_id: int | None, dtype: torch.dtype) -> dict:
    """config.json for `plan`: the architecture's own fields, token ids, dtype and our config under HINT_KEY."""
    if plan.target == "gpt2":
        hf = hf_config_from(cfg)
    elif plan.target == "gpt_bigcode":
        hf = bigcode_config_from(cfg)
    elif plan.target == "gpt_neox":
        hf = neox_config_from(cfg)
    else:
        missing = sorted({f.name for f in dataclasses.fields(cfg)} - set(remote_code_fields()))
        if missing:
            raise ValueError(
                f"cannot export: the remote code ({REMOTE_CODE_DIR}) does not implement GPTConfig field(s) "
                f"{', '.join(missing)}; add them there (and to FIELDS) first"
            )
        hf = dict(
            cfg.to_dict(),
            model_type="attention_lab",
            architectures=["AttentionLabForCausalLM"],
            auto_map=dict(AUTO_MAP),
            tie_word_embeddings=cfg.tie_embeddings,
            use_cache=True,
        )
    name = str(dtype).removeprefix("torch.")
    hf.update(bos_token_id=eot_id, eos_token_id=eot_id, dtype=name, torch_dtype=name)  # torch_dtype: 4.x's name
    hf[HINT_KEY] = cfg.to_dict()
    return hf


def hf_state_dict(model: GPT, plan: ExportPlan) -> dict[str, torch.Tensor]:
    """The weights under the target's names, each tensor once (a tied head is re-tied by transformers on load)."""
    cfg = model.config
    sd = model.state_dict()
    if plan.target == "gpt2":
        out = state_dict_to_hf(sd, cfg)
        head = "lm_head.weight"
    elif plan.target == "gpt_bigcode":
        out = state_dict_to_bigcode(sd, cfg)
        head = "lm_head.weight"
    elif plan.target == "gpt_neox":
        out = state_dict_to_neox(sd, cfg)
        head = "embed_out.weight"
    else:
        out = {k: v.detach().clone().contiguous() for k, v in sd.items()}
        head = "lm_head.weight"
    if cfg.tie_embeddings:
        del out[head]
    return {k: v.cpu() for k, v in out.items()}


def tokenizer_files(tokenizer_json: str, block_size: int) -> dict[str, str]:
    """tokenizer.json and tokenizer_config.json such that AutoTokenizer encodes exactly as our Tokenizer does.

    Ours encodes without special-token templates (add_special_tokens=False); transformers' tokenizer calls add them
    by default. A post-processor that adds tokens (a file tokenizer may bring one) is therefore left out.
    """
    tok = Tokenizer.from_str(tokenizer_json)
    raw = tokenizers.Tokenizer.from_str(tokenizer_json)
    probe = "Hello world.\nA probe: 123"
    if raw.encode(probe, add_special_tokens=True).ids != raw.encode(probe, add_special_tokens=False).ids:
        spec = json.loads(tokenizer_json)
        spec["post_processor"] = None
        tokenizer_json = json.dumps(spec, ensure_ascii=False)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": block_size,
        "clean_up_tokenization_spaces": False,  # decode gives back the text, spaces before punctuation included
        "bos_token": EOT,
        "eos_token": EOT,
        "add_bos_token": False,
        "add_eos_token": False,
    }
    if tok.unk_id is not None:
        config["unk_token"] = UNK
    return {
        TOKENIZER: tokenizer_json,
        TOKENIZER_CONFIG: json.dumps(config, indent=2, sort_keys=True) + "\n",
    }


def is_export(directory: Path) -> bool:
    try:
        return HINT_KEY in json.loads((directory / CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return False


def learner_attention_spec(model: GPT) -> str | None:
    """The learner's attention `model` runs in place of the built-in ("file.py:name", plugged in by
    attention_lab/exercises/learner.py for model.attn_impl), or None."""
    fn = next((m.attn_fn for m in model.modules() if getattr(m, "attn_fn", None) is not None), None)
    return None if fn is None else str(getattr(fn, "spec", fn))


def refuse_learner_attention(spec: str | None) -> None:
    """ValueError for a model whose attention is a learner's function (spec: model.attn_impl): every exported
    architecture computes the built-in attention, so the export would compute another function with these weights."""
    if spec:
        raise ValueError(
            f"cannot export: this model's attention is a learner's function (model.attn_impl={spec}), and every "
            "exported architecture (GPT-2, GPT-NeoX, GPTBigCode, attention-lab's remote code) computes the built-in "
            "attention, so the export would compute something else with these weights. To export, train without "
            "model.attn_impl; to compare this run, use this project's tools (sample.py --run, python -m "
            "attention_lab.evaluate, python -m attention_lab.lab)"
        )


def export_pretrained(
    model: GPT,
    out_dir: str | os.PathLike,
    tokenizer_json: str | None = None,
    *,
    remote_code: bool = False,
    target: str | None = None,
) -> Exported:
    """Write `model` (and its tokenizer) as a folder transformers loads; returns where and as what.

    remote_code: ship our own code even where GPT-2 / GPT-NeoX would do. target: refuse anything but this
    ("gpt2", "gpt_neox", "remote"). The folder is built beside out_dir and renamed into place, so a killed export
    leaves no half-written folder; an earlier export in out_dir is replaced, any other non-empty folder refused.
    Raises ValueError, before writing anything, for a model it cannot export (a learner's attention included).
    """
    cfg = model.config
    if not has_attention(cfg):
        raise ValueError("LSTM runs cannot be exported to transformers: an export maps the GPT's blocks onto GPT-2, "
                         "GPT-NeoX or our attention code, and model.arch=lstm has none of them. Score the run with "
                         "python -m attention_lab.evaluate and sample it with sample.py --run")
    refuse_learner_attention(learner_attention_spec(model))
    plan = plan_export(cfg, remote_code)
    if target is not None and plan.target != target:
        why = "; ".join(plan.reasons) if plan.reasons else f"pos_encoding={cfg.pos_encoding!r} maps to {plan.target}"
        raise ValueError(f"cannot export to {dict(gpt2='GPT-2', gpt_neox='GPT-NeoX').get(target, target)}: {why}")
    tokenizer = None
    if tokenizer_json is not None:
        try:
            tokenizer = Tokenizer.from_str(tokenizer_json)
        except Exception as e:  # noqa: BLE001 - the tokenizers library raises plain Exception for bad JSON
            raise ValueError(f"the tokenizer JSON cannot be read as a tokenizer ({e})") from e
    if tokenizer is not None and tokenizer.vocab_size > cfg.vocab_size:
        raise ValueError(
            f"the tokenizer has {tokenizer.vocab_size} tokens but the model only {cfg.vocab_size}: "
            "it belongs to another model"
        )
    eot_id = tokenizer.eot_id if tokenizer is not None else None
    dtype = next(model.parameters()).dtype
    hf_config = hf_export_config(cfg, plan, eot_id, dtype)  # raises ValueError before anything is written
    texts = {CONFIG: json.dumps(hf_config, indent=2, sort_keys=True) + "\n"}
    if tokenizer_json is not None:
        texts |= tokenizer_files(tokenizer_json, cfg.block_size)
        # stop at the end of a document. No max_length: transformers 5 warns when a caller's max_new_tokens meets
        # it; the tokenizer's model_max_length and the model's own refusal past block_size say where the context ends
        generation = {"bos_token_id": eot_id, "eos_token_id": eot_id, "pad_token_id": eot_id}
        texts[GENERATION_CONFIG] = json.dumps(generation, indent=2, sort_keys=True) + "\n"
    sd = hf_state_dict(model, plan)

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} is a file; give a folder to export into")
    if out.is_dir() and any(out.iterdir()) and not is_export(out):
        raise ValueError(
            f"{out} already holds files that are not an attention-lab export; export into a new or empty folder"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = make_temp_dir(out.parent, prefix=f".{out.name}.export.")
    old = None
    try:
        save_file(sd, tmp / SAFETENSORS, metadata={"format": "pt"})
        for name, text in texts.items():
            (tmp / name).write_text(text, encoding="utf-8")
        if plan.target == "remote":
            for name in REMOTE_FILES:
                shutil.copyfile(REMOTE_CODE_DIR / name, tmp / name)
        files = sorted(p.name for p in tmp.iterdir())
        if out.exists():
            old = make_temp_dir(out.parent, prefix=f".{out.name}.old.")
            os.replace(out, old / "previous")
        publish_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not out.exists() and (old / "previous").exists():
            os.replace(old / "previous", out)  # put the earlier export back
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return Exported(out, plan, files)


def export_gpt2(model: GPT, out_dir: str | os.PathLike, *, tokenizer_json: str | None = None) -> Path:
    """export_pretrained for GPT-2 only: ValueError for a model GPT2LMHeadModel cannot compute exactly."""
    return export_pretrained(model, out_dir, tokenizer_json, target="gpt2").path
