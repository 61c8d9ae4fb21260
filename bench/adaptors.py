"""What each debugging adaptor costs: ns per allocate+deallocate pair with and without it.

Same as ``tensorarena bench adaptors`` (options: ``--json``, ``--quick``, ``--stacks``); the
numbers are recorded in ``bench/RESULTS.md`` (section "Debugging adaptors").
"""

import sys

from tensorarena.bench.adaptors import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
