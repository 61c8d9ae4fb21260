"""Small seeded problems whose exact search takes a real, known number of nodes."""

from __future__ import annotations

import random

from tensorarena.planning.problem import Buffer, Problem


def aligned_instance(seed: int, n: int, *, shortest: int = 2) -> Problem:
    """Mixed alignments put the optimum above the lower bound: proving it takes a real search.
    Lifetimes last ``shortest`` to 6 ticks."""
    rng = random.Random(seed)
    buffers = []
    for k in range(n):
        start = rng.randrange(8)
        size, alignment = rng.choice((3, 5, 6, 7)), rng.choice((1, 4, 8))
        buffers.append(Buffer(f"b{k}", start, start + rng.randint(shortest, 6), size, alignment))
    return Problem(buffers)


#: Optimum 37 above the lower bound 33: proven in 3236 nodes; 36 is proven infeasible in 1193.
#: The counts are the search's own and the same on any machine (tests re-derive them).
BUDGETED = aligned_instance(6, 12)
