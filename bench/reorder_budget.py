"""What ends :func:`tensorarena.planning.reorder` at its defaults: the budget or the clock.

On random DAGs (each node makes one buffer used by one to three later nodes; the tests' graphs),
every graph is reordered twice, under the default ``plan_time_limit`` (2 s) and under 30 s
(which the plans' budgets never reach), and the script prints what ended the search over orders
(and its steps), what ended the plan that picked the order (its nodes and work units), the
seconds, and whether both runs chose the same order and plan. ``--no-plan-budget`` gives the
plans :func:`~tensorarena.planning.plan`'s default budgets instead of reorder's own (what they
ran under before reorder had its own), which the clock reaches first.

    python bench/reorder_budget.py [--sizes 60,300] [--seeds 0-8] [--no-plan-budget]

A benchmark: it asserts nothing, and its seconds depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from tensorarena.planning.budget import DEFAULT_NODE_LIMIT, DEFAULT_WORK_LIMIT
from tensorarena.planning.random_graphs import random_op_graph as random_graph
from tensorarena.planning.reorder import reorder


def _seeds(text: str) -> list[int]:
    low, _, high = text.partition("-")
    return list(range(int(low), int(high or low) + 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="60", help="graph sizes in nodes (default 60)")
    parser.add_argument("--seeds", default="0-8", help="seeds, as 0-8 (default)")
    parser.add_argument("--no-plan-budget", action="store_true",
                        help="plans on plan()'s default budgets (as before reorder had its own)")
    args = parser.parse_args()
    budgets = {"plan_node_limit": DEFAULT_NODE_LIMIT,
               "plan_work_limit": DEFAULT_WORK_LIMIT} if args.no_plan_budget else {}
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.1f}, plan budgets {'plan()' if budgets else 'reorder'}'s")
    print("| graph | search: ended by, steps | plan: height, ended by, nodes, work | seconds "
          "(2 s, 30 s plan time limits) | same answer |")
    print("|---|---|---|---|---|")
    for n in (int(s) for s in args.sizes.split(",")):
        for seed in _seeds(args.seeds):
            graph = random_graph(seed, n)
            runs, seconds = [], []
            for plan_time_limit in (2.0, 30.0):
                started = time.perf_counter()
                runs.append(reorder(graph, plan_time_limit=plan_time_limit, **budgets))
                seconds.append(time.perf_counter() - started)
            first, second = runs
            statistics = first.plan.statistics
            assert statistics is not None
            same = (first.schedule.order == second.schedule.order
                    and first.plan.offsets == second.plan.offsets)
            print(f"| {n}/{seed} | {first.schedule.stopped_by.value}, {first.schedule.steps} | "
                  f"{first.plan.height}, {statistics.stopped_by.value}, {statistics.nodes}, "
                  f"{statistics.work} | "
                  f"{seconds[0]:.1f}, {seconds[1]:.1f} | {'yes' if same else 'NO'} |",
                  flush=True)


if __name__ == "__main__":
    main()
