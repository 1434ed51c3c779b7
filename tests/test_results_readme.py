"""The results documents are generated from the committed CSVs, never edited by hand: the
README's headline block and bench/results/README.md must match what the script writes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_generated_results_are_up_to_date():
    run = subprocess.run([sys.executable, str(REPO / "bench" / "results_readme.py"), "--check"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_readme_is_short():
    assert len((REPO / "README.md").read_text().splitlines()) <= 200
