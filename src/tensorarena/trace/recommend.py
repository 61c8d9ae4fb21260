"""Which configuration should serve this workload? Replay them all and rank them.

:func:`recommend` replays a trace on every strategy × growth policy (``fixed`` at its smallest
arena), then puts a :class:`~tensorarena.adaptors.ThreadCached` front on the best of them, and
ranks: configurations that failed an allocation are out; among the rest, those whose peak
footprint is within ``tolerance`` (default ``0.02``, a fiftieth) of the best footprint are ranked by
speed and the fastest is recommended — footprint first, because a trace's footprint decides whether
a model fits at all, while nanoseconds per call rarely decide anything once within a few percent.
The baselines (``pytorch_like``, the system allocators) are replayed for comparison and ranked with
the rest, but never recommended: they are not configurations of this library. ``learned`` (plans
learned from the trace's repeating steps, :class:`~tensorarena.learned.LearnedPlans`) is ranked
and may be recommended like the pools.

``fixed`` deserves a warning the report gives: its arena is sized from this very trace, so it is
the right answer only when the workload repeats (a training step, a fixed-shape server). Each
result also carries the footprint when the trace ended: what a long-running server keeps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tensorarena.core.registry import STRATEGIES
from tensorarena.errors import SystemAllocatorUnavailableError
from tensorarena.trace._text import Source
from tensorarena.trace.configs import (
    BASELINES,
    GROWTH_POLICIES,
    LEARNED,
    Configuration,
    configuration,
    read_all,
    smallest_fixed_arena,
)
from tensorarena.trace.model import Event, Trace
from tensorarena.trace.replay import ReplayResult

__all__ = ["Ranked", "Recommendation", "recommend"]

#: The kinds of configuration this library offers: the ones that may be recommended.
_OURS = ("pool", "learned")


@dataclass(frozen=True, slots=True)
class Ranked:
    """One configuration and what its replay measured."""

    configuration: Configuration
    result: ReplayResult

    @property
    def footprint(self) -> float:
        """Peak footprint ratio (``inf`` when unknown)."""
        ratio = self.result.footprint_ratio
        return float("inf") if ratio is None else ratio

    @property
    def usable(self) -> bool:
        """Served every allocation and measured its footprint."""
        return not self.result.failures and self.result.footprint_ratio is not None


@dataclass(frozen=True, slots=True)
class Recommendation:
    """The ranking, best first; ``best`` is the configuration to use (``None`` when no pool
    configuration served the trace); ``skipped`` says which baselines could not run, and why."""

    best: Ranked | None
    ranking: tuple[Ranked, ...]
    skipped: dict[str, str] = field(default_factory=dict)
    tolerance: float = 0.02

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the recommendation and every configuration's numbers."""
        return {
            "recommended": None if self.best is None else {
                "configuration": self.best.configuration.name,
                "code": self.best.configuration.code(), **self.best.result.as_dict()},
            "ranking": [{"configuration": r.configuration.name, "baseline":
                         r.configuration.kind not in _OURS, **r.result.as_dict()}
                        for r in self.ranking],
            "skipped": dict(self.skipped),
            "tolerance": self.tolerance,
        }


def _rank(entries: Sequence[Ranked], tolerance: float) -> tuple[Ranked | None, list[Ranked]]:
    usable = [e for e in entries if e.usable]
    if not usable:
        return None, sorted(entries, key=lambda e: (e.result.failures, e.footprint))
    floor = min(e.footprint for e in usable)
    close = sorted((e for e in usable if e.footprint <= floor * (1 + tolerance)),
                   key=lambda e: e.result.ns_per_op)
    rest = sorted((e for e in entries if e not in close),
                  key=lambda e: (not e.usable, e.footprint, e.result.ns_per_op))
    ranking = close + rest
    best = next((e for e in ranking if e.usable and e.configuration.kind in _OURS), None)
    return best, ranking


def recommend(source: Trace | Source | Iterable[Event], *,
              strategies: Sequence[str] | None = None, growths: Sequence[str] | None = None,
              baselines: Sequence[str] = BASELINES, learned: bool = True,
              tolerance: float = 0.02,
              report: Callable[[str], object] | None = None) -> Recommendation:
    """Replay ``source`` on every configuration and rank them (see the module docstring).

    ``report`` (optional) is called with each configuration's name before it runs (a progress
    line for the command line). ``learned=False`` leaves ``learned`` out.
    """
    trace = read_all(source)
    strategies = list(STRATEGIES) if strategies is None else list(strategies)
    growths = list(GROWTH_POLICIES) if growths is None else list(growths)
    entries: list[Ranked] = []
    skipped: dict[str, str] = {}

    def run(config: Configuration) -> None:
        if report is not None:
            report(config.name)
        if config.growth == "fixed":
            capacity, result = smallest_fixed_arena(trace, config)
            config = replace(config, initial_size=capacity)
            entries.append(Ranked(config, result))
        else:
            entries.append(Ranked(config, config.run(trace)))

    for strategy in strategies:
        for growth in growths:
            run(configuration(f"{strategy}/{growth}"))
    if learned:
        run(configuration(LEARNED))
    best, _ = _rank(entries, tolerance)
    if best is not None and best.configuration.kind == "pool":
        front = replace(best.configuration, name=f"thread_cached/{best.configuration.name}",
                        thread_cached=True, initial_size=0)
        run(front)
    for name in baselines:
        try:
            run(configuration(name))
        except SystemAllocatorUnavailableError as reason:
            skipped[name] = str(reason)
    best, ranking = _rank(entries, tolerance)
    return Recommendation(best, tuple(ranking), skipped, tolerance)
