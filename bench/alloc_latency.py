"""Allocation latency, footprint and fragmentation of every placement strategy.

Same as ``tensorarena bench alloc`` (options: ``--json``, ``--quick``, ``--ops``, ``--repeats``,
``--seed``, ``--strategies``); the numbers are recorded in ``bench/RESULTS.md``.
"""

import sys

from tensorarena.bench.alloc import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
