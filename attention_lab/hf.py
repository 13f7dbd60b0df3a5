"""GPT-2 weights to and from Hugging Face's file layout: the file and network side of model/convert.py.

    load_gpt2("gpt2")            hub id: fetches config.json + model*.safetensors into the hub cache, then loads
    load_gpt2("path/to/dir")     a local directory with config.json and model.safetensors (or pytorch_model.bin)
    export_gpt2(model, "dir")    config.json + model.safetensors that transformers.GPT2LMHeadModel.from_pretrained reads

Neither needs `transformers`; the mapping of names and shapes lives in model/convert.py.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from model import GPT
from model.convert import config_from_hf, hf_config_from, state_dict_from_hf, state_dict_to_hf

CONFIG = "config.json"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"  # sharded checkpoints list their shards here
TORCH_BIN = "pytorch_model.bin"
# the files _read_weights reads, at the repo's top level only ("*.safetensors" would also match sub-folders)
HUB_PATTERNS = [CONFIG, "model*.safetensors", SAFETENSORS_INDEX]


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
            + f" from the Hugging Face hub ({type(e).__name__}: {e}). "
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
        "Check the path, or save the model with save_pretrained() / export_gpt2() first "
        "(from the hub only safetensors weights are fetched)."
    )


def load_gpt2(name_or_path: str | os.PathLike, *, revision: str | None = None) -> GPT:
    """A GPT-2 checkpoint (local directory or hub id) -> our GPT with its weights, in eval mode, on the CPU."""
    name = os.path.expanduser(os.fspath(name_or_path))
    if os.path.isdir(name):
        directory = Path(name)
    elif _looks_like_path(name):
        problem = f"{name} is a file, not a directory" if os.path.exists(name) else f"no such directory: {name}"
        raise FileNotFoundError(
            f"{problem}. Check the path: load_gpt2 wants a directory holding {CONFIG} and "
            f"{SAFETENSORS} (as written by save_pretrained or export_gpt2), or a hub id such as 'gpt2'."
        )
    else:
        directory = _download(name, revision)

    if not (directory / CONFIG).is_file():
        raise FileNotFoundError(
            f"{directory} has no {CONFIG}. Check the path: it should be the directory that save_pretrained() "
            "or export_gpt2() wrote."
        )
    hf_config = json.loads((directory / CONFIG).read_text(encoding="utf-8"))
    if hf_config.get("model_type", "gpt2") != "gpt2":
        raise ValueError(f"{directory / CONFIG} describes a {hf_config['model_type']!r} model; only gpt2 loads")
    cfg = config_from_hf(hf_config)
    model = GPT(cfg)
    model.load_state_dict(state_dict_from_hf(_read_weights(directory), cfg), strict=True)
    return model.eval()


def export_gpt2(model: GPT, out_dir: str | os.PathLike, *, tokenizer_json: str | None = None) -> Path:
    """Write `model` as a Hugging Face GPT-2 checkpoint in out_dir; returns out_dir.

    Files: config.json, model.safetensors (metadata format=pt) and, if given, tokenizer.json. Each file is
    written to a temporary name and renamed into place, so a killed export never leaves a half-written file.
    Raises ValueError for a model GPT-2 cannot express (e.g. pos_encoding other than "learned").
    """
    cfg = model.config
    hf_config = hf_config_from(cfg)  # raises ValueError first, before anything is written
    hf_config.update(
        # our model knows no tokenizer, so it names no special tokens (GPT2Config's default 50256 may not exist)
        bos_token_id=None,
        eos_token_id=None,
        dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
    )
    sd = {k: v.cpu() for k, v in state_dict_to_hf(model.state_dict(), cfg).items()}
    if cfg.tie_embeddings:
        # transformers stores a tied head once, under the embedding's name, and re-ties it on load
        del sd["lm_head.weight"]

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out, prefix=".export.", suffix=".tmp"))
    try:
        save_file(sd, tmp / SAFETENSORS, metadata={"format": "pt"})
        (tmp / CONFIG).write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        names = [SAFETENSORS, CONFIG]
        if tokenizer_json is not None:
            (tmp / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
            names.append("tokenizer.json")
        for name in names:
            os.replace(tmp / name, out / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
