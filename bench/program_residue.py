"""What a planned program leaves in the process's Python memory once deleted, cycle by cycle.

In one process (libraries warmed on a tiny model, then the full-size model and its inputs, as
``bench/process_floor.py`` does), ``--cycles`` times: build a ``PlannedProgram``, call it
``--calls`` times, ``del`` it, ``tensorarena.empty_cache()``. ``tracemalloc`` (``--frames``
deep) compares the Python memory after each cycle with the memory before it and prints the net
growth, whether the program object survived (a weak reference), and the ``--top`` allocation
sites still holding memory. The first cycle pays one-time costs (imports, torch's operator
tables); a later cycle that leaves memory is a leak.

    .venv/bin/python bench/program_residue.py [--model gpt2] [--seq 128] [--cycles 2]
"""

from __future__ import annotations

import argparse
import gc
import sys
import tracemalloc
import weakref

KIB = 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--cycles", type=int, default=2)
    parser.add_argument("--calls", type=int, default=2)
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--top", type=int, default=8)
    options = parser.parse_args()

    import torch

    import tensorarena
    from tensorarena.bench.exec_executions import build_execution, measured_model

    model, args, kwargs = measured_model("planned", options.model, batch=options.batch,
                                         seq=options.seq)
    print(f"{options.model} {options.batch}x{options.seq} (base size), one thread, Python "
          f"{sys.version.split()[0]}, torch {torch.__version__}")
    gc.collect()
    tracemalloc.start(options.frames)
    own = [tracemalloc.Filter(False, tracemalloc.__file__)]  # the snapshots' own memory
    for cycle in range(1, options.cycles + 1):
        before = tracemalloc.take_snapshot().filter_traces(own)
        built = build_execution("planned", model, args, kwargs, training=False)
        for _ in range(options.calls):
            out = built.call()
            del out
            built.drop()
        program = weakref.ref(built.program)
        del built
        tensorarena.empty_cache()
        gc.collect()
        after = tracemalloc.take_snapshot().filter_traces(own)
        stats = after.compare_to(before, "traceback")
        del before, after
        net = sum(stat.size_diff for stat in stats)
        blocks = sum(stat.count_diff for stat in stats)
        print(f"\ncycle {cycle}: {net / KIB:+.1f} KiB in {blocks:+d} blocks stayed; program "
              f"{'alive' if program() is not None else 'gone'}")
        for stat in stats[:options.top]:
            frames = [f"{frame.filename.split('site-packages/')[-1].split('src/')[-1]}:"
                      f"{frame.lineno}" for frame in stat.traceback[-4:]]
            print(f"  {stat.size_diff / KIB:+8.1f} KiB {stat.count_diff:+6d}  "
                  f"{' < '.join(reversed(frames))}")
    tracemalloc.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
