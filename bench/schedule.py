"""Memory-aware reordering benchmark, as ``tensorarena bench schedule`` (see its ``--help``).

Run from the repository: ``python bench/schedule.py [--size tiny] [--json]``.
"""

from __future__ import annotations

import sys

from tensorarena.bench.schedule import main

if __name__ == "__main__":
    sys.exit(main())
