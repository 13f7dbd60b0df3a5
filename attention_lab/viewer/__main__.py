"""`python -m attention_lab.viewer`: (re)build the attention page of a run or of a sample folder."""

import sys

from attention_lab.viewer.page import main
from attention_lab.viewer.report import rebuild_sample

sys.exit(main(rebuild=rebuild_sample))
