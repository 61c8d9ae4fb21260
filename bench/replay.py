"""Replay every shipped trace on every strategy and baseline; replay throughput and streaming.

Same as ``tensorarena bench replay`` (options: ``--json``, ``--quick``); the numbers are recorded
in ``bench/RESULTS.md`` (section "Allocation traces").
"""

import sys

from tensorarena.bench.replay import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
