"""`python -m attention_lab.evaluate`: bits/byte of a run on the whole held-out split (the code: attention_lab/training/evaluate.py)."""

import sys

from attention_lab.training.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
