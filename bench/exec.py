"""Planned execution benchmark: the same as ``tensorarena bench exec`` (see its ``--help``).

Run from the repository: ``python bench/exec.py [--model gpt2] [--training] [--json]``.
"""

from __future__ import annotations

import sys

from tensorarena.bench.exec import main

if __name__ == "__main__":
    sys.exit(main())
