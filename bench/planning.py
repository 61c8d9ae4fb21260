"""Static planning benchmark: the same as ``tensorarena bench plan`` (see its ``--help``).

Run from the repository: ``python bench/planning.py [--quick] [--suite idealloc] [--json]``.
"""

from __future__ import annotations

import sys

from tensorarena.bench.plan import main

if __name__ == "__main__":
    sys.exit(main())
