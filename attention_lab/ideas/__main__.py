"""`python -m attention_lab.ideas NAME [RUN]`: one idea of the tutorials on a run you trained (attention_lab/ideas/cli.py)."""

import sys

from attention_lab.ideas.cli import main

if __name__ == "__main__":
    sys.exit(main())
