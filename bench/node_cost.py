"""What one exact-search node costs, against the work units it is charged.

For each problem CSV, the decision search at its peak of live bytes runs for a fixed number of
nodes on NumPy's engine (the one large problems always take), and the script prints the
problem's buffers, time sections and (section, member) pairs, the work units a node is charged
(:func:`~tensorarena.planning.exact_work.node_work`) and the microseconds a node took, and
nanoseconds per work unit: what the default work budget's choice rests on.

    python bench/node_cost.py FILE[:NODES] ...   (default 2,000 nodes each)

A benchmark: it asserts nothing, and its times depend on the machine and its load.
"""

from __future__ import annotations

import os
import platform
import sys
import time

from tensorarena.planning.csv_io import read_problem
from tensorarena.planning.exact_search import Solver
from tensorarena.planning.exact_sections import build_sections
from tensorarena.planning.exact_work import node_work


def main() -> None:
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.1f}, engine numpy")
    print("| problem | buffers | sections | pairs | work/node | nodes | us/node | ns/unit |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for arg in sys.argv[1:]:
        path, _, count = arg.partition(":")
        sections = build_sections(read_problem(path).buffers)
        pairs = int((sections.last - sections.first).sum())
        unit = node_work(sections)
        started = time.perf_counter()
        found = Solver(engine="numpy").solve(sections, int(sections.total.max()),
                                             node_limit=int(count or 2000))
        seconds = time.perf_counter() - started
        per_node = seconds / max(found.nodes, 1)
        print(f"| {os.path.basename(path)} | {len(sections)} | {sections.n_sections} | {pairs} | "
              f"{unit} | {found.nodes} | {per_node * 1e6:.0f} | {per_node / unit * 1e9:.1f} |",
              flush=True)


if __name__ == "__main__":
    main()
