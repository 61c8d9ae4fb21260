"""Pooled arrays vs np.empty: allocate, first-touch and free at 64 KiB, 1 MiB, 16 MiB, 64 MiB.

Same as ``tensorarena bench reuse`` (options: ``--json``, ``--quick``); the numbers are recorded
in ``bench/RESULTS.md`` under "Pooled arrays (bench reuse)".
"""

import sys

from tensorarena.bench.reuse import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
