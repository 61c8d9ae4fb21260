"""What a built planned program holds in Python objects, and how many FX graphs.

In one process (libraries warmed on a tiny model first, then the full-size model and its
inputs, as ``bench/process_floor.py`` does): ``tracemalloc`` compares the Python memory after
``PlannedProgram.from_module`` (the export in its child, read back, planned) with the memory
before it, and prints the net growth by file (``--top`` lines), the ``GraphModule`` objects
alive with their node counts, and the keys of their nodes' ``meta``.

    .venv/bin/python bench/built_objects.py [--model gpt2] [--seq 128]
"""

from __future__ import annotations

import argparse
import collections
import gc
import tracemalloc

MIB = 2**20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--top", type=int, default=12)
    options = parser.parse_args()

    import torch

    from tensorarena.bench.exec_executions import build_execution, measured_model

    model, args, kwargs = measured_model("planned", options.model, batch=options.batch,
                                         seq=options.seq)
    gc.collect()
    tracemalloc.start(1)
    before = tracemalloc.take_snapshot()
    built = build_execution("planned", model, args, kwargs, training=False)
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    stats = after.compare_to(before, "filename")
    print(f"{options.model} {options.batch}x{options.seq}: the build holds "
          f"{sum(s.size_diff for s in stats) / MIB:.2f} MiB of Python objects")
    for stat in stats[:options.top]:
        print(f"{stat.size_diff / 1024:9.1f} KiB  {stat.traceback[0].filename}")
    modules = [o for o in gc.get_objects() if isinstance(o, torch.fx.GraphModule)]
    print("graph modules alive:", len(modules), [len(m.graph.nodes) for m in modules])
    keys: collections.Counter[str] = collections.Counter()
    for module in modules:
        for node in module.graph.nodes:
            keys.update(node.meta.keys())
    print("meta keys:", dict(keys.most_common()))
    del built
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
