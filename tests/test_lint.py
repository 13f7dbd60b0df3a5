"""The code passes `ruff check` (ruff.toml: syntax errors, pyflakes' unused or undefined names, sorted imports).

An unused import or variable is often the trace of a value computed and then forgotten; ruff names it in a second.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_ruff_check_passes():
    pytest.importorskip("ruff", reason="ruff comes with the test extras: pip install -e '.[test]'")
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"ruff check found problems (`ruff check --fix .` mends most):\n{proc.stdout}{proc.stderr}"
