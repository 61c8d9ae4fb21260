"""Random operator graphs, for tests and benchmarks of the order search (:mod:`.reorder`)."""

from __future__ import annotations

import random

from tensorarena.planning.op_graph import OpGraph

__all__ = ["random_op_graph"]


def random_op_graph(seed: int, n: int) -> OpGraph:
    """A random DAG of ``n`` nodes: each makes one buffer (16 to 144 bytes), used by one to
    three later nodes; the last node is the output. The same ``seed`` gives the same graph."""
    rng = random.Random(seed)
    preds: list[set[int]] = [set() for _ in range(n)]
    uses: list[list[int]] = [[] for _ in range(n)]
    for b in range(n - 1):
        for u in rng.sample(range(b + 1, n), min(n - 1 - b, rng.randint(1, 3))):
            preds[u].add(b)
            uses[u].append(b)
    return OpGraph(
        names=tuple(f"n{v}" for v in range(n)),
        preds=tuple(tuple(sorted(p)) for p in preds),
        produces=tuple((v,) for v in range(n)),
        uses=tuple(tuple(sorted(u)) for u in uses),
        buffer_ids=tuple(f"b{v}" for v in range(n)),
        sizes=tuple(rng.randint(1, 9) * 16 for _ in range(n)),
        outputs=frozenset({n - 1}),
    )
