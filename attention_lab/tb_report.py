"""`python -m attention_lab.tb_report`: a run's head-role timeline, read back from TensorBoard (the code: attention_lab/viewer/timeline.py)."""

import sys

from attention_lab.viewer.timeline import main

if __name__ == "__main__":
    sys.exit(main())
