"""``python -m helion_kernels``: the CLI. The guard matters: Helion's autotuner spawns
benchmark subprocesses that re-import ``__main__``."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
