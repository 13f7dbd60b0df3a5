import sys

from attention_lab.claims.cli import main

sys.exit(main())
