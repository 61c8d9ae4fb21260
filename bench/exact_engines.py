"""The exact search's two engines side by side on minimalloc's challenging suite: nodes and µs/node.

Each instance is posed at the capacity in its file name (2^20), as minimalloc's decision question,
and solved by NumPy's node (``exact_node.Search``) and by the list node (``exact_lists.ListSearch``,
compiled by mypyc in the compiled build, interpreted in the pure one: the header says which), the
two alternating instance by instance so that the machine's load hits both alike. Both must visit
the same nodes and find the same offsets (the table says "same" or "DIFFER"); every plan passes
the validator. Times are CPU seconds of this process (``time.process_time``: less at the mercy of
other processes than the wall clock) and wall seconds.

    .venv/bin/python bench/exact_engines.py [--data DIR] [--only B,C,K] [--engines numpy,lists]

The data folder is ``--data DIR`` or ``$TENSORARENA_DATA``, the folder holding
``minimalloc/challenging/``. Without it the run is skipped, saying so. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time

from tensorarena.bench.plan import DATA_ENV, data_folder
from tensorarena.planning.csv_io import capacity_from_name, read_problem
from tensorarena.planning.exact_lists import compiled
from tensorarena.planning.exact_params import Status
from tensorarena.planning.exact_search import ENGINES, Solver
from tensorarena.planning.exact_sections import build_sections
from tensorarena.planning.problem import Plan
from tensorarena.planning.validate import validate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", metavar="DIR", help=f"default: ${DATA_ENV}")
    parser.add_argument("--only", default="", help="comma-separated instance names, e.g. B,C,K")
    parser.add_argument("--engines", default=",".join(ENGINES), help="engines to run, in order")
    args = parser.parse_args(argv)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if not engines or set(engines) - set(ENGINES):
        parser.error(f"--engines: some of {', '.join(ENGINES)}")
    data = data_folder(args.data)
    if data is None:
        print(f"skipped: no benchmark data (pass --data DIR or set {DATA_ENV})")
        return 0
    folder = data / "minimalloc" / "challenging"
    if not folder.is_dir():
        folder = data
    wanted = {name.strip() for name in args.only.split(",") if name.strip()}
    files = [f for f in sorted(folder.glob("*.csv"))
             if not wanted or f.name.split(".")[0] in wanted]
    if not files:
        print(f"skipped: no matching *.csv files in {folder}")
        return 0
    lists_build = "compiled" if compiled() else "interpreted"
    print(f"exact search, decision at the file's capacity; list engine {lists_build}; Python "
          f"{platform.python_version()} on {platform.machine()} "
          f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")
    columns = "".join(f"  {e + ' cpu s':>13} {'wall s':>7} {'µs/node':>8}" for e in engines)
    print(f"{'inst':<5} {'buffers':>7} {'status':>9} {'nodes':>8}{columns}  same")
    totals = dict.fromkeys(engines, 0.0)
    for path in files:
        problem = read_problem(path)
        capacity = capacity_from_name(path.name)
        assert capacity is not None, path.name
        sections = build_sections(problem.buffers)
        row = []
        answers = []
        for engine in engines:
            cpu, wall = time.process_time(), time.perf_counter()
            found = Solver(engine=engine).solve(sections, capacity)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            totals[engine] += cpu
            if found.status is Status.FOUND:
                assert found.offsets is not None
                full = [0] * len(problem)
                for k, index in enumerate(sections.members):
                    full[index] = int(found.offsets[k])
                validate(problem, Plan(problem, tuple(full)), capacity=capacity)
            offsets = None if found.offsets is None else found.offsets.tolist()
            answers.append((found.status, found.nodes, offsets))
            row.append(f"  {cpu:13.2f} {wall:7.2f} {cpu / max(found.nodes, 1) * 1e6:8.1f}")
        same = "same" if all(a == answers[0] for a in answers) else "DIFFER"
        status, nodes, _ = answers[0]
        print(f"{path.name.split('.')[0]:<5} {len(problem):>7} {status.name.lower():>9} "
              f"{nodes:>8}{''.join(row)}  {same}", flush=True)
    print("total cpu s: " + ", ".join(f"{e} {totals[e]:.2f}" for e in engines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
