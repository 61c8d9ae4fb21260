"""Named configurations to replay a trace on: our pools, PyTorch's policy, the system's malloc.

A :class:`Configuration` is plain data with a name the command line takes:

* a placement strategy (``best_fit``, ``tlsf``, ... — :data:`tensorarena.core.STRATEGIES`) in a
  :class:`~tensorarena.memory.Pool` over :class:`~tensorarena.memory.VirtualMemory`, with a
  growth policy (``fixed``, ``same_as_requested``, ``next_power_of_two`` — the pool's default —
  or ``doubling``), optionally behind a :class:`~tensorarena.adaptors.ThreadCached` front. The
  pool starts empty (``initial_size=0``) and unlocked (a replay is one thread), except ``fixed``,
  which has one arena and never grows: its size is the smallest with which the trace replays
  without a failure, found by bisection (:func:`smallest_fixed_arena`; about a dozen replays);
* ``pytorch_like`` — :class:`~tensorarena.trace.PyTorchLike` over VirtualMemory, streams kept
  apart as PyTorch keeps them;
* ``glibc``, ``jemalloc``, ``mimalloc`` — the system allocators, each in a child process
  (:mod:`tensorarena.trace.system`);
* ``learned`` — :class:`~tensorarena.learned.LearnedPlans` over VirtualMemory, finding the
  trace's steps itself (``detect_steps=True``): its result also carries the footprint of the
  steps it served from a plan (``steady_footprint_ratio``).

Names: a strategy alone (``best_fit``) uses the growth given to :func:`configuration` (default
``next_power_of_two``); ``best_fit/doubling`` names both; a ``thread_cached/`` prefix adds the
front.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from tensorarena.adaptors.thread_cached import ThreadCached
from tensorarena.core.registry import STRATEGIES
from tensorarena.errors import InvalidArgumentError
from tensorarena.learned.learned_plans import LearnedPlans
from tensorarena.memory.growth import Doubling, Fixed, GrowthPolicy, NextPowerOfTwo, SameAsRequested
from tensorarena.memory.pool import Pool
from tensorarena.memory.resource import MemoryResource
from tensorarena.memory.virtual import VirtualMemory
from tensorarena.trace._text import Source
from tensorarena.trace.formats import read_all
from tensorarena.trace.model import Event, Trace
from tensorarena.trace.pytorch_like import PyTorchLike
from tensorarena.trace.replay import ReplayResult, replay
from tensorarena.trace.system import SYSTEM_ALLOCATORS, replay_system

__all__ = [
    "BASELINES",
    "DEFAULT_GROWTH",
    "GROWTH_POLICIES",
    "LEARNED",
    "Configuration",
    "configuration",
    "read_all",
    "smallest_fixed_arena",
]

#: Growth policies by name, as ``--growth`` takes them.
GROWTH_POLICIES: dict[str, GrowthPolicy] = {
    "fixed": Fixed(),
    "same_as_requested": SameAsRequested(),
    "next_power_of_two": NextPowerOfTwo(),
    "doubling": Doubling("1GiB"),
}
_GROWTH_CODE = {"fixed": "Fixed()", "same_as_requested": "SameAsRequested()",
                "next_power_of_two": "NextPowerOfTwo()", "doubling": 'Doubling("1GiB")'}
#: The pool's own default.
DEFAULT_GROWTH = "next_power_of_two"
#: Everything that is not one of our pools.
BASELINES = ("pytorch_like", *SYSTEM_ALLOCATORS)
#: Plans learned from the trace's first steps (not in ``all``: name it, as in ``all,learned``).
LEARNED = "learned"
_FIXED_PRECISION = 1.002  # bisection stops when the bounds are within 0.2 %


@dataclass(frozen=True, slots=True)
class Configuration:
    """One way to serve a trace (see the module docstring)."""

    name: str
    kind: str  #: "pool", "learned", "pytorch_like" or "system"
    strategy: str | None = None
    growth: str | None = None
    thread_cached: bool = False
    initial_size: int = 0  #: the arena of a ``fixed`` pool (0: find the smallest)

    def make(self) -> MemoryResource:
        """A fresh resource (pools and pytorch_like; the system allocators run in a child)."""
        if self.kind == "pytorch_like":
            return PyTorchLike(VirtualMemory())
        if self.kind == "learned":
            return LearnedPlans(VirtualMemory(), detect_steps=True)
        if self.kind != "pool" or self.strategy is None or self.growth is None:
            raise InvalidArgumentError(f"{self.name} is not made in this process")
        pool = Pool(VirtualMemory(), strategy=self.strategy,
                    growth=GROWTH_POLICIES[self.growth], initial_size=self.initial_size,
                    thread_safe=False)
        return ThreadCached(pool) if self.thread_cached else pool

    def code(self) -> str:
        """How to build it, as Python (with ``upstream`` for the memory to serve)."""
        if self.kind == "pytorch_like":
            return "tensorarena.trace.PyTorchLike(upstream)"
        if self.kind == "learned":
            return "tensorarena.LearnedPlans(upstream) with step() between steps"
        if self.kind == "system":
            return f"{self.name}'s malloc (LD_PRELOAD)" if self.name != "glibc" else "malloc"
        initial = f", initial_size={self.initial_size}"
        pool = (f'Pool(upstream, strategy="{self.strategy}", '
                f"growth={_GROWTH_CODE[self.growth or DEFAULT_GROWTH]}{initial})")
        return f"ThreadCached({pool})" if self.thread_cached else pool

    def run(self, source: Trace | Source | Iterable[Event], *, progress: bool = False
            ) -> ReplayResult:
        """Replay ``source`` on this configuration (``fixed``: at its smallest arena)."""
        if self.kind == "system":
            return replay_system(source, self.name)
        if self.growth == "fixed" and not self.initial_size:
            return smallest_fixed_arena(source, self)[1]
        if self.kind == "learned":
            learned = LearnedPlans(VirtualMemory(), detect_steps=True)
            result = replay(source, learned, name=self.name, progress=progress)
            return replace(result,
                           steady_reserved_bytes=learned.report().steady_peak_reserved_bytes)
        return replay(source, self.make(), name=self.name,
                      streams=self.kind == "pytorch_like", progress=progress)


def configuration(name: str, *, growth: str | None = None) -> Configuration:
    """The configuration called ``name`` (see the module docstring); ``growth`` applies to a
    bare strategy name. Unknown names raise :class:`~tensorarena.errors.InvalidArgumentError`
    listing the known ones."""
    if growth is not None and growth not in GROWTH_POLICIES:
        raise InvalidArgumentError(f"unknown growth policy {growth!r}; expected one of "
                                   f"{', '.join(GROWTH_POLICIES)}")
    if name == "pytorch_like":
        return Configuration(name, "pytorch_like")
    if name == LEARNED:
        return Configuration(name, "learned")
    if name in SYSTEM_ALLOCATORS:
        return Configuration(name, "system")
    parts = name.split("/")
    cached = parts[0] == "thread_cached"
    if cached:
        parts = parts[1:]
    strategy = parts[0] if parts else ""
    chosen = parts[1] if len(parts) == 2 else growth or DEFAULT_GROWTH
    if strategy not in STRATEGIES or len(parts) > 2 or chosen not in GROWTH_POLICIES:
        raise InvalidArgumentError(
            f"unknown configuration {name!r}; expected a strategy ({', '.join(STRATEGIES)}), "
            f"optionally /GROWTH ({', '.join(GROWTH_POLICIES)}) and a thread_cached/ prefix, "
            f"{LEARNED}, or a baseline ({', '.join(BASELINES)})")
    return Configuration(name, "pool", strategy, chosen, cached)


def smallest_fixed_arena(source: Trace | Source | Iterable[Event], config: Configuration
                         ) -> tuple[int, ReplayResult]:
    """The smallest single arena with which ``config``'s strategy replays ``source`` without a
    failure (bisection from the peak of live bytes), and that replay's result."""
    trace = read_all(source)
    fixed = replace(config, growth="fixed")
    low = max(trace.summary().peak_live_bytes, 1)
    high = low * 2

    def attempt(capacity: int) -> ReplayResult:
        return replay(trace, replace(fixed, initial_size=capacity).make(), name=config.name)

    best = attempt(high)
    while best.failures:  # a strategy that needs more than twice the peak (buddy, say)
        low, high = high, high * 2
        best = attempt(high)
    probe = attempt(low)
    if not probe.failures:
        return low, probe
    while high > low * _FIXED_PRECISION and high - low > 4096:
        middle = (low + high) // 2
        result = attempt(middle)
        if result.failures:
            low = middle
        else:
            high, best = middle, result
    return high, best
