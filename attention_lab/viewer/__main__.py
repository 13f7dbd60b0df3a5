"""`python -m attention_lab.viewer`: (re)build the attention page of a run or of a sample folder."""

import sys

from attention_lab.viewer.page import main


def rebuild(folder, checkpoint):
    """--checkpoint: the sample folder recomputed with the model (torch and the analyses load only for it)."""
    from attention_lab.viewer.report import rebuild_sample

    return rebuild_sample(folder, checkpoint)


sys.exit(main(rebuild=rebuild))
