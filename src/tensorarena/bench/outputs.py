"""``tensorarena bench outputs``: the latency of one model planned with each output placement,
calls interleaved (medians, ms).

``outputs="fresh"`` (torch allocates the outputs at each call) against ``outputs="handover"``
(outputs planned in a tail of the arena handed to the caller), the two programs called in turn so
that machine load falls on both alike. Tiny configs, one thread. A benchmark, not a test: it
asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

__all__ = ["DEFAULT_MODELS", "PLACEMENTS", "configure", "interleaved", "run"]

PLACEMENTS = ("fresh", "handover")
DEFAULT_MODELS = ("gpt2", "bert", "resnet", "t5", "whisper-encoder")


def interleaved(name: str, calls: int) -> dict[str, float]:
    """Median milliseconds of a call for each placement of ``name``'s tiny model."""
    from tensorarena.planning.models import build_model
    from tensorarena.runtime import PlannedProgram

    model, (args, kwargs) = build_model(name, size="tiny")
    model.eval()
    programs = {o: PlannedProgram.from_module(model, args, kwargs, outputs=o) for o in PLACEMENTS}
    for program in programs.values():
        for _ in range(3):  # records kernels, plans, warms
            program(*args, **kwargs)
    seconds: dict[str, list[float]] = {o: [] for o in PLACEMENTS}
    for _ in range(calls):
        for placement, program in programs.items():
            start = time.perf_counter()
            program(*args, **kwargs)
            seconds[placement].append(time.perf_counter() - start)
    return {o: statistics.median(s) * 1e3 for o, s in seconds.items()}


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's options to ``parser``."""
    parser.add_argument("--json", action="store_true", help="print one JSON object, no table")
    parser.add_argument("--calls", type=int, default=60, help="timed calls of each (default 60)")
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help=f"comma-separated tiny models (default {','.join(DEFAULT_MODELS)})")


def run(args: argparse.Namespace) -> int:
    """Time every model and print the table (or one JSON object); return 0."""
    import torch

    from tensorarena.errors import UnknownNameError
    from tensorarena.planning.models import ARCHITECTURES

    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in ARCHITECTURES]
    if unknown:
        raise UnknownNameError(f"unknown architecture(s) {', '.join(map(repr, unknown))}; "
                               f"known: {', '.join(ARCHITECTURES)}", kind="architecture",
                               name=unknown[0], known=tuple(ARCHITECTURES))
    torch.set_num_threads(1)
    results = {name: interleaved(name, args.calls) for name in names}
    if args.json:
        print(json.dumps({"calls": args.calls, "models": results}))
        return 0
    print("| model | fresh ms | handover ms | handover/fresh |")
    print("|---|---:|---:|---:|")
    for name, ms in results.items():
        print(f"| {name} | {ms['fresh']:.3f} | {ms['handover']:.3f} | "
              f"{ms['handover'] / ms['fresh']:.3f} |")
    return 0
