"""interp: what the heads do, measured. The role table and the role scores (roles.py), the repeated-tokens probe,
ablation, loss by position and phase changes (heads.py), attention capture (capture.py), one head's computation
step by step (inside.py), what a head looks for and writes from its weights alone: QK and OV circuits and the
copying score (circuits.py), the logit lens (lens.py), figures (figures.py).
Pure functions of a model and its inputs: no files, no printing.

May import: model/, data/, runtime/. Never store/ or training/.
"""
