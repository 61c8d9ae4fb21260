"""Latency of one model planned with each output placement, calls interleaved (medians, ms).

``outputs="fresh"`` (torch allocates the outputs at each call) against ``outputs="handover"``
(outputs planned in a tail of the arena handed to the caller), the two programs called in turn so
that machine load falls on both alike. Tiny configs, one thread.

Run from the repository: ``python bench/outputs_latency.py [CALLS] [MODEL ...]``
(default 60 calls of gpt2 bert resnet t5 whisper-encoder).
"""

from __future__ import annotations

import statistics
import sys
import time

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


def main(argv: list[str]) -> int:
    import torch

    torch.set_num_threads(1)
    calls = int(argv[0]) if argv else 60
    names = argv[1:] or list(DEFAULT_MODELS)
    print("| model | fresh ms | handover ms | handover/fresh |")
    print("|---|---:|---:|---:|")
    for name in names:
        ms = interleaved(name, calls)
        print(f"| {name} | {ms['fresh']:.3f} | {ms['handover']:.3f} | "
              f"{ms['handover'] / ms['fresh']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
