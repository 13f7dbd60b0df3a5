"""`python -m attention_lab.export`: a run's checkpoint as a folder transformers loads (the code: attention_lab/interop/export.py)."""

import sys

from attention_lab.interop.export import main

if __name__ == "__main__":
    sys.exit(main())
