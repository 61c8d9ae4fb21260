"""What :func:`~tensorarena.planning.plan` runs when asked to ``repair``: the band step, then the
windows.

The band step (:mod:`~tensorarena.planning.band_repair`) goes first: on the large traces it was
made for it is a few seconds where the windows (:mod:`~tensorarena.planning.repair`) spend
their whole budget and lower nothing (pangu_2.6B, ``bench/RESULTS.md``), and when it brings the
plan within the gap the windows are not run. Each has its own budget, so the answer depends on
the input alone; the time limit is an outer bound on both.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

from tensorarena.planning.band_repair import band_repair
from tensorarena.planning.bounds import aligned_lower_bound, good_enough
from tensorarena.planning.budget import StopReason
from tensorarena.planning.problem import Plan, Problem
from tensorarena.planning.repair import repair

__all__ = ["repaired_plan"]


def repaired_plan(problem: Problem, plan: Plan, *, time_limit: float = math.inf,
                  alignment: int | None = None, gap: float = 0.0) -> Plan:
    """``plan`` after :func:`band_repair` and then, unless that brought it within ``gap`` of
    the bound, windowed :func:`~tensorarena.planning.repair.repair`, each on its default
    budget, with ``plan``'s statistics counting their nodes and work too (what
    :func:`~tensorarena.planning.plan` returns when asked to ``repair``)."""
    started = time.perf_counter()
    bound = aligned_lower_bound(problem, alignment)
    results = [band_repair(problem, plan, time_limit=time_limit, alignment=alignment, gap=gap)]
    found = results[0].plan
    if not good_enough(found.height, bound, gap):
        left = max(0.0, time_limit - (time.perf_counter() - started))
        results.append(repair(problem, found, time_limit=left, alignment=alignment))
        found = results[-1].plan
    statistics = plan.statistics
    if statistics is not None:
        stopped = statistics.stopped_by
        if found.height <= bound:
            stopped = StopReason.PROVEN
        elif stopped is not StopReason.PROVEN and good_enough(found.height, bound, gap):
            stopped = StopReason.GOOD_ENOUGH
        elif stopped is not StopReason.PROVEN and any(
                r.stopped_by is StopReason.TIME_LIMIT for r in results):
            stopped = StopReason.TIME_LIMIT
        statistics = replace(statistics, nodes=statistics.nodes + sum(r.nodes for r in results),
                             work=statistics.work + sum(r.work for r in results),
                             stopped_by=stopped)
    optimal = plan.optimal or found.height <= bound
    return Plan(problem, found.offsets, planner=found.planner, optimal=optimal,
                statistics=statistics)
