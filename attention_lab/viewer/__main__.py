"""`python -m attention_lab.viewer`: (re)build the attention page of a run or of a sample folder."""

import sys

from attention_lab.viewer.page import main

sys.exit(main())
