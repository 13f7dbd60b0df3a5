"""Benchmarks that print markdown tables: `python -m bench.run [--quick] [--only NAME] [--out FILE]`.

    common.py       machine description, interleaved timing, tables (markdown + JSON)
    peak.py         the matmul peak as a table (attention_lab/runtime/flops.py measures it, for the trainer too)
    train_step.py   forward + backward + AdamW tokens/s and MFU, ours vs transformers.GPT2LMHeadModel
    generation.py   decoding tokens/s with and without KV cache, ours vs Hugging Face `generate`
    attention.py    one attention layer, `math` vs `sdpa` backend: time and peak memory as T grows
    data_prep.py    MB/s of corpus text turned into token files
    run.py          the command line: runs the benchmarks, prints the tables, writes the JSON

These are scripts, not tests: tests/test_bench.py only checks that each runs at the --quick setting.
"""
