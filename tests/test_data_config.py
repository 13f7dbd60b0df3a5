"""DataConfig: validation names the field and the allowed values; every configs/data/*.yaml fits the schema."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from data.config import SHAKESPEARE_VAL_DOCS, DataConfig

DATA_CONFIGS = Path(__file__).resolve().parent.parent / "configs" / "data"


@pytest.mark.parametrize("kwargs, match", [
    ({"source": "gutenberg"}, r"data\.source='gutenberg' is not one of shakespeare, hub, text"),
    ({"tokenizer": "wordpiece"}, r"data\.tokenizer='wordpiece' is not one of bpe, char, file"),
    ({"vocab_size": 100}, r"data\.vocab_size=100 .* at least 257"),
    ({"val_fraction": 0.0}, r"data\.val_fraction"),
    ({"val_fraction": 1.0}, r"data\.val_fraction"),
    ({"num_proc": 0}, r"data\.num_proc"),
    ({"name": "a/b"}, r"data\.name"),
    ({"name": ""}, r"data\.name"),
    ({"source": "hub"}, r"data\.path is required for source=hub"),
    ({"source": "hub", "path": "x/y", "streaming": True}, r"data\.max_train_docs"),
    ({"source": "hub", "path": "x/y", "max_val_docs": 0}, r"data\.max_val_docs"),
    ({"source": "hub", "path": "x/y", "val_docs": ["a"]}, r"data\.val_docs"),
    ({"source": "hub", "path": "x/y", "val_split": "train"}, r"data\.val_split must differ"),
    ({"source": "text", "val_split": "validation"}, r"data\.val_split is for source=hub"),
    ({"path": "parquet"}, r"data\.path.* are for source=hub"),
    ({"tokenizer": "file"}, r"data\.tokenizer_file"),
])
def test_invalid_settings_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DataConfig(**kwargs)


def test_defaults_are_valid_and_hold_out_the_default_plays():
    cfg = DataConfig()
    assert (cfg.source, cfg.tokenizer, cfg.cache_dir) == ("shakespeare", "bpe", "cache/data"), cfg
    assert cfg.resolved_val_docs == list(SHAKESPEARE_VAL_DOCS), "Shakespeare without val_docs holds out its default"
    assert DataConfig(source="text", files=["a.txt"]).resolved_val_docs == [], "other sources use val_fraction"


@pytest.mark.parametrize("path", sorted(DATA_CONFIGS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_data_yaml_fits_the_structured_schema(path):
    """As the entry point composes them: schema defaults, then the file; unknown keys or bad types fail."""
    assert not path.read_text().lstrip().startswith("# @package"), f"{path.name}: no @package header wanted"
    merged = OmegaConf.merge(OmegaConf.structured(DataConfig), OmegaConf.load(path))
    cfg = OmegaConf.to_object(merged)
    assert isinstance(cfg, DataConfig), f"{path.name} did not produce a DataConfig"
    assert cfg.name, f"{path.name} must set a name (the cache directory label)"


def test_expected_data_configs_exist():
    names = {p.stem for p in DATA_CONFIGS.glob("*.yaml")}
    expected = {"shakespeare", "shakespeare_char", "tinystories", "wikitext103", "text"}
    assert expected <= names, f"missing configs/data/: {sorted(expected - names)}"


def test_shakespeare_yaml_lists_the_default_plays():
    cfg = OmegaConf.load(DATA_CONFIGS / "shakespeare.yaml")
    assert list(cfg.val_docs) == list(SHAKESPEARE_VAL_DOCS), "shakespeare.yaml and SHAKESPEARE_VAL_DOCS disagree"
