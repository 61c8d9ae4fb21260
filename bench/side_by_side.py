"""Two builds of tensorarena, one benchmark, side by side in one run: the ratio after / before.

Runs ``python -m tensorarena bench NAME --json`` with ``PYTHONPATH`` pointing at each source
tree in turn, alternating the trees round after round so that a loaded machine slows both
alike, and prints the median of every number the benchmark reports for each tree and their
ratio. Numbers are compared, never remembered.

Usage (a tree is a checkout's ``src`` folder; ``git worktree add /tmp/base <commit>`` makes one)::

    python bench/side_by_side.py --before /tmp/base/src --after src alloc reuse --rounds 5

A benchmark, not a test: it asserts nothing. It reads only the given trees, no shared data.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

#: benchmark -> extra arguments (full runs; --quick is for tests)
BENCHMARKS: dict[str, list[str]] = {
    "alloc": [],
    "reuse": ["--owners"],
    "threads": [],
}


def _numbers(document: object, prefix: str = "") -> Iterator[tuple[str, float]]:
    """Every number in a JSON document, by its dotted path."""
    if isinstance(document, dict):
        for key, value in document.items():
            yield from _numbers(value, f"{prefix}{key}.")
    elif isinstance(document, int | float) and not isinstance(document, bool):
        yield prefix.rstrip("."), float(document)


def _run(tree: Path, name: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree.resolve()), "TENSORARENA_DEBUG": "0"}
    command = [sys.executable, "-m", "tensorarena", "bench", name, "--json", *BENCHMARKS[name]]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: bench {name} failed:\n{done.stderr[-2000:]}")
    return dict(_numbers(json.loads(done.stdout)))


def compare(before: Path, after: Path, name: str, rounds: int) -> dict[str, tuple[float, float]]:
    """``{metric: (median before, median after)}`` over ``rounds`` alternating runs."""
    runs: dict[Path, list[dict[str, float]]] = {before: [], after: []}
    for round_number in range(rounds):
        order = (before, after) if round_number % 2 == 0 else (after, before)
        for tree in order:
            runs[tree].append(_run(tree, name))
    metrics = sorted(set(runs[before][0]) & set(runs[after][0]))
    return {
        metric: (
            statistics.median(run[metric] for run in runs[before]),
            statistics.median(run[metric] for run in runs[after]),
        )
        for metric in metrics
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="source tree of the baseline")
    parser.add_argument("--after", type=Path, required=True, help="source tree to compare")
    parser.add_argument("--rounds", type=int, default=5, help="runs per tree (median)")
    parser.add_argument("benchmarks", nargs="+", choices=sorted(BENCHMARKS))
    args = parser.parse_args(argv)
    for tree in (args.before, args.after):
        if not (tree / "tensorarena" / "__init__.py").is_file():
            parser.error(f"{tree} is not a source tree (no tensorarena/__init__.py in it)")
    print(f"# side by side: before={args.before} after={args.after}, median of {args.rounds}")
    for name in args.benchmarks:
        print(f"\n## bench {name}\n")
        print(f"| {'metric':<48} | {'before':>12} | {'after':>12} | {'after/before':>12} |")
        print(f"|{'-' * 50}|{'-' * 14}:|{'-' * 14}:|{'-' * 14}:|")
        for metric, (old, new) in compare(args.before, args.after, name, args.rounds).items():
            ratio = f"{new / old:.3f}" if old else "-"
            print(f"| {metric:<48} | {old:>12.4g} | {new:>12.4g} | {ratio:>12} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
