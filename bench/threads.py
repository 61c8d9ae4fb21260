"""Allocation throughput across threads: ThreadSafe(Pool) vs ThreadCached(ThreadSafe(Pool)).

Same as ``tensorarena bench threads`` (options: ``--json``, ``--quick``, ``--threads``, ``--ops``,
``--repeats``, ``--strategy``, ``--seed``); the numbers are recorded in ``bench/RESULTS.md``.
"""

import sys

from tensorarena.bench.threads import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
