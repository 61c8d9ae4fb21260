"""The plan CLI on minimalloc's challenging suite: two source trees (and minimalloc) side by side.

For every instance, ``python -m tensorarena plan FILE --json`` runs once under each source tree
(``PYTHONPATH``), alternating tree by tree and instance by instance in one run so that a loaded
machine slows every column alike, at default settings: at the capacity in the file name (the
decision question, minimalloc's) and, with ``--minimise``, without one (the lowest height).
``--runs 2`` runs everything twice and says whether the answers (heights, and the nodes where
the tree reports them) came out the same: budgets in work units should make them so.
``--minimalloc PATH`` adds google/minimalloc's CLI built from its repository, timed the same
way; without it that column is skipped, saying so.

    python bench/solver_budget.py --before /tmp/base/src --after src [--only D,J] [--minimise]
        [--runs 2] [--minimalloc /path/to/minimalloc] [--data DIR]

A source tree is a checkout's ``src`` folder; ``git archive <commit> src | tar -x -C /tmp/base``
makes one without touching any worktree. The data folder is ``--data DIR`` or
``$TENSORARENA_DATA`` (holding ``minimalloc/challenging/``). A benchmark: it asserts nothing,
and its times depend on the machine and on what else runs; the heights and nodes should not.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CHALLENGING = "minimalloc/challenging"


def _data(folder: str | None) -> Path | None:
    root = folder or os.environ.get("TENSORARENA_DATA")
    if not root:
        return None
    path = Path(root)
    return path if path.name == "challenging" else path / CHALLENGING


def _ours(tree: Path, csv: Path, capacity: str | None) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree.resolve()), "TENSORARENA_DEBUG": "0"}
    command = [sys.executable, "-m", "tensorarena", "plan", str(csv), "--json", "--quiet"]
    if capacity is not None:
        command += ["--capacity", capacity]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise SystemExit(f"{tree}: plan {csv.name} failed:\n{done.stderr[-2000:]}")
    summary = json.loads(done.stdout)
    return {"wall": wall, "height": summary["height"], "fits": summary["feasible"],
            "nodes": summary.get("nodes"), "stopped_by": summary.get("stopped_by", "?")}


def _minimalloc(binary: Path, csv: Path, capacity: str) -> dict[str, Any]:
    command = [str(binary), f"--input={csv}", f"--capacity={capacity}", "--output=/dev/null"]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    return {"wall": time.perf_counter() - started, "fits": done.returncode == 0}


def _cell(result: dict[str, Any]) -> str:
    nodes = "" if result["nodes"] is None else f" {result['nodes']}n"
    fit = "" if result["fits"] else " NO FIT"
    return f"{result['height']}{fit}{nodes} {result['stopped_by']} {result['wall']:.1f}s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="source tree of the baseline")
    parser.add_argument("--after", type=Path, required=True, help="source tree to compare")
    parser.add_argument("--data", metavar="DIR", help="folder holding minimalloc/challenging/")
    parser.add_argument("--only", default="", help="comma-separated instances, e.g. D,J")
    parser.add_argument("--minimise", action="store_true",
                        help="without a capacity (the lowest height) instead of at 2^20")
    parser.add_argument("--runs", type=int, default=1, help="run everything this many times")
    parser.add_argument("--minimalloc", type=Path, help="google/minimalloc's CLI binary")
    args = parser.parse_args(argv)
    folder = _data(args.data)
    if folder is None or not folder.is_dir():
        print(f"skipped: no {CHALLENGING} folder (--data DIR or $TENSORARENA_DATA)")
        return 0
    if args.minimalloc is None:
        print("minimalloc: skipped (no --minimalloc PATH given)")
    wanted = {name.strip() for name in args.only.split(",") if name.strip()}
    files = sorted(p for p in folder.glob("*.csv") if not wanted or p.name.split(".")[0] in wanted)
    print(f"# {platform.node()} {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}, "
          f"{'minimised' if args.minimise else 'decision at the capacity in the file name'}")
    print("| instance | run | before | after | after/before time |"
          + (" minimalloc |" if args.minimalloc else ""))
    print("|---|---|---|---|---|" + ("---|" if args.minimalloc else ""))
    answers: dict[tuple[str, str], set[tuple[Any, Any]]] = {}
    for run in range(1, args.runs + 1):
        for csv in files:
            name, capacity = csv.name.split(".")[0], csv.name.split(".")[1]
            asked = None if args.minimise else capacity
            before = _ours(args.before, csv, asked)
            after = _ours(args.after, csv, asked)
            for tree, result in (("before", before), ("after", after)):
                answers.setdefault((name, tree), set()).add((result["height"], result["nodes"]))
            row = (f"| {name} | {run} | {_cell(before)} | {_cell(after)} | "
                   f"{after['wall'] / before['wall']:.2f} |")
            if args.minimalloc:
                theirs = _minimalloc(args.minimalloc, csv, capacity)
                row += f" {'fits' if theirs['fits'] else 'NO FIT'} {theirs['wall']:.1f}s |"
            print(row, flush=True)
    if args.runs > 1:
        for tree in ("before", "after"):
            differ = sorted(name for (name, t), seen in answers.items() if t == tree
                            and len(seen) > 1)
            print(f"{tree}: the same answers on every run: "
                  + ("yes" if not differ else f"no, {', '.join(differ)} differed"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
