"""The plan CLI on minimalloc's challenging suite: two source trees (and minimalloc) side by side.

For every instance, ``python -m tensorarena plan FILE --json`` runs once under each source tree
(``PYTHONPATH``), alternating tree by tree and instance by instance in one run so that a loaded
machine slows every column alike, at default settings: at the capacity in the file name (the
decision question, minimalloc's) and, with ``--minimise``, without one (the lowest height).
``--runs 2`` runs everything twice and says whether the answers (heights, and the nodes where
the tree reports them) came out the same: budgets in work units should make them so.
``--minimalloc PATH`` adds google/minimalloc's CLI built from its repository, timed the same
way (``--validate``: its height and its own solve time come from its log) with each tree's time
over its time per instance and in total; without it, or where PATH is no executable file, that
column is skipped, saying so. Without ``--after`` only one tree runs. Each cell gives the wall
time and the CPU time (user + system of the process: what load moves least). A tree holding
mypyc's extension modules next to its sources (a ``make``-built checkout's ``src``) runs the
compiled build; a fresh worktree's ``src`` the pure one. Where ``PYTHONDONTWRITEBYTECODE`` is
set every run compiles the package's modules again (the header says so);
``--bytecode-cache DIR`` keeps them compiled, as an installed package has them.

    python bench/solver_budget.py --before /tmp/base/src [--after src] [--only D,J] [--minimise]
        [--runs 2] [--minimalloc /path/to/minimalloc] [--data DIR] [--bytecode-cache DIR]

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
import re
import resource
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


def _timed(command: list[str], env: dict[str, str] | None = None) -> tuple[Any, float, float]:
    """Run ``command``; return what ``subprocess.run`` gave, its wall and its CPU seconds (user
    and system, from the children's resource usage: less moved by the machine's load)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - started
    now = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = now.ru_utime - used.ru_utime + now.ru_stime - used.ru_stime
    return done, wall, cpu


def _ours(tree: Path, csv: Path, capacity: str | None, cache: Path | None) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree.resolve()), "TENSORARENA_DEBUG": "0"}
    if cache is not None:  # as an installed package: its modules compiled once, not every run
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(cache.resolve())
    command = [sys.executable, "-m", "tensorarena", "plan", str(csv), "--json", "--quiet"]
    if capacity is not None:
        command += ["--capacity", capacity]
    done, wall, cpu = _timed(command, env)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{tree}: plan {csv.name} failed:\n{done.stderr[-2000:]}")
    summary = json.loads(done.stdout)
    return {"wall": wall, "cpu": cpu, "height": summary["height"], "fits": summary["feasible"],
            "nodes": summary.get("nodes"), "stopped_by": summary.get("stopped_by", "?")}


def _minimalloc(binary: Path, csv: Path, capacity: str) -> dict[str, Any]:
    command = [str(binary), f"--input={csv}", f"--capacity={capacity}", "--output=/dev/null",
               "--validate"]
    done, wall, cpu = _timed(command)
    log = done.stdout + done.stderr
    height = re.search(r"Validation PASS, height (\d+)", log)
    solve = re.search(r"Elapsed time ([0-9.]+)s", log)
    return {"wall": wall, "cpu": cpu, "fits": done.returncode == 0 and height is not None,
            "exit": done.returncode, "said": log.strip().splitlines()[-1:] or [""],
            "height": int(height.group(1)) if height else None,
            "solve": float(solve.group(1)) if solve else None}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _minimalloc_binary(path: Path | None) -> Path | None:
    if path is None:
        print("minimalloc: skipped (no --minimalloc PATH given)")
        return None
    if not path.is_file() or not os.access(path, os.X_OK):
        print(f"minimalloc: skipped ({path} is no executable file; build its CLI first)")
        return None
    return path


def _theirs(result: dict[str, Any]) -> str:
    if not result["fits"]:
        return f"NO FIT (exit {result['exit']}: {result['said'][0][:60]}) {result['wall']:.2f}s"
    solve = "" if result["solve"] is None else f", solve {result['solve']:.2f}s"
    return f"{result['height']} {result['wall']:.2f}s (cpu {result['cpu']:.2f}s{solve})"


def _cell(result: dict[str, Any]) -> str:
    nodes = "" if result["nodes"] is None else f" {result['nodes']}n"
    fit = "" if result["fits"] else " NO FIT"
    return (f"{result['height']}{fit}{nodes} {result['stopped_by']} {result['wall']:.2f}s "
            f"(cpu {result['cpu']:.2f}s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="source tree of the baseline")
    parser.add_argument("--after", type=Path, help="source tree to compare (optional)")
    parser.add_argument("--data", metavar="DIR", help="folder holding minimalloc/challenging/")
    parser.add_argument("--only", default="", help="comma-separated instances, e.g. D,J")
    parser.add_argument("--minimise", action="store_true",
                        help="without a capacity (the lowest height) instead of at 2^20")
    parser.add_argument("--runs", type=int, default=1, help="run everything this many times")
    parser.add_argument("--minimalloc", type=Path, help="google/minimalloc's CLI binary")
    parser.add_argument("--bytecode-cache", type=Path, metavar="DIR",
                        help="keep the trees' compiled bytecode under DIR (PYTHONPYCACHEPREFIX), "
                        "as an installed package has it, even where PYTHONDONTWRITEBYTECODE is set")
    args = parser.parse_args(argv)
    folder = _data(args.data)
    if folder is None or not folder.is_dir():
        print(f"skipped: no {CHALLENGING} folder (--data DIR or $TENSORARENA_DATA)")
        return 0
    binary = _minimalloc_binary(args.minimalloc)
    if binary and args.minimise:
        print("minimalloc: answers the decision at the capacity in the file name, not minimised")
    trees = {"before": args.before, **({"after": args.after} if args.after else {})}
    wanted = {name.strip() for name in args.only.split(",") if name.strip()}
    files = sorted(p for p in folder.glob("*.csv") if not wanted or p.name.split(".")[0] in wanted)
    # Without a bytecode cache every run compiles the package's modules again (start-up).
    cache = ("off" if os.environ.get("PYTHONDONTWRITEBYTECODE") and args.bytecode_cache is None
             else "on")
    print(f"# {platform.node()} {_cpu_model()}, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.1f}, Python {platform.python_version()}, "
          f"bytecode cache {cache}, "
          f"{'minimised' if args.minimise else 'decision at the capacity in the file name'}")
    header = "| instance | run | " + " | ".join(trees)
    if "after" in trees:
        header += " | after/before time"
    if binary:
        header += " | minimalloc | " + " | ".join(f"{tree}/minimalloc wall (cpu)" for tree in trees)
    print(header + " |")
    print("|---" * (header.count("|")) + "|")
    answers: dict[tuple[str, str], set[tuple[Any, Any]]] = {}
    for run in range(1, args.runs + 1):
        totals: dict[str, float] = {}
        cpus: dict[str, float] = {}
        fits: dict[str, int] = {}
        for csv in files:
            name, capacity = csv.name.split(".")[0], csv.name.split(".")[1]
            asked = None if args.minimise else capacity
            results = {tree: _ours(path, csv, asked, args.bytecode_cache)
                       for tree, path in trees.items()}
            for tree, result in results.items():
                answers.setdefault((name, tree), set()).add((result["height"], result["nodes"]))
            row = f"| {name} | {run} | " + " | ".join(_cell(r) for r in results.values())
            if "after" in results:
                row += f" | {results['after']['wall'] / results['before']['wall']:.2f}"
            if binary:
                theirs = _minimalloc(binary, csv, capacity)
                results["minimalloc"] = theirs
                row += f" | {_theirs(theirs)} | " + " | ".join(
                    f"{results[tree]['wall'] / theirs['wall']:.2f} "
                    f"({results[tree]['cpu'] / max(theirs['cpu'], 1e-9):.2f})" for tree in trees)
            for column, result in results.items():
                totals[column] = totals.get(column, 0.0) + result["wall"]
                cpus[column] = cpus.get(column, 0.0) + result["cpu"]
                fits[column] = fits.get(column, 0) + bool(result["fits"])
            print(row + " |", flush=True)
        line = f"run {run} totals: " + ", ".join(
            f"{column} {seconds:.1f}s, cpu {cpus[column]:.1f}s ({fits[column]}/{len(files)} fit)"
            for column, seconds in totals.items())
        if "minimalloc" in totals:
            line += "; " + ", ".join(
                f"{tree}/minimalloc {totals[tree] / totals['minimalloc']:.2f}x wall, "
                f"{cpus[tree] / cpus['minimalloc']:.2f}x cpu" for tree in trees)
        print(line, flush=True)
    if args.runs > 1:
        for tree in trees:
            differ = sorted(name for (name, t), seen in answers.items() if t == tree
                            and len(seen) > 1)
            print(f"{tree}: the same answers on every run: "
                  + ("yes" if not differ else f"no, {', '.join(differ)} differed"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
