"""store: what a run folder holds. Every path of it, named once (layout.py); one trainer per folder (runlock.py);
checkpoints written atomically and found by pointer (checkpoint.py); console, metrics.jsonl, TensorBoard and
provenance (logger.py).

May import: model/, data/ (atomic files, the tokenizer), runtime/. Never interp/: storing is not drawing.
"""
