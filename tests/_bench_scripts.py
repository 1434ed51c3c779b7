"""Running a ``bench/`` script as a user does (a separate process), for the tests of the
reports and tools there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_bench_script(name: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python bench/<name>.py args...`` from the checkout, output captured as text."""
    return subprocess.run([sys.executable, str(REPO / "bench" / f"{name}.py"), *map(str, args)],
                          capture_output=True, text=True, env=env, cwd=REPO)
