"""interp: what the heads do, measured. The role table and the role scores (roles.py), the repeated-tokens probe,
ablation, loss by position and phase changes (heads.py), attention capture (capture.py), figures (figures.py).
Pure functions of a model and its inputs: no files, no printing.

May import: model/, data/, runtime/. Never store/ or training/.
"""
