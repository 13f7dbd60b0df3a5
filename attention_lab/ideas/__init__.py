"""Each idea of the tutorials seen in a run you trained (../shared/tutorials/ lists them):

    python -m attention_lab.ideas --list
    python -m attention_lab.ideas NAME [RUN] [--text "..."] [--out DIR]

NAME is one of lookup, scale, meaning, positions, rnn, mask, residual, warmup. RUN defaults to the run sample.py
opens (the latest run of the default preset). Each prints a few numbers in plain words and writes one figure,
<run>/ideas/NAME.png (or DIR/NAME.png).

    cli.py        the command: the run opened, the text encoded, one function per idea, the figure written
    published.py  the claims' published numbers read back from docs/claims.md (positions, recall)

The measurements are attention_lab/interp/ideas.py (pure, from one recorded forward pass), the figures
attention_lab/viewer/ideas.py. May import model, data, runtime, store, interp, viewer, training.
"""
