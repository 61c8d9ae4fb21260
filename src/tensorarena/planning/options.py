"""The planning API's options, each checked by one function at the public edge.

Every entry point (:func:`~tensorarena.planning.plan`, :func:`~tensorarena.planning.solve_exact`,
the heuristics, :func:`~tensorarena.planning.validate`) normalises what a caller passes here, so
one wrong value gets the same :class:`~tensorarena.errors.TensorArenaError` and message whichever
function it went to, and everything below works on exact ints and floats. Sizes go through
:func:`tensorarena.sizes.parse_size`, the one size parser: ``capacity="1MiB"`` works as it does
for a pool.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real

from tensorarena.errors import InvalidArgumentError, InvalidProblemError
from tensorarena.planning.bounds import DEFAULT_GAP
from tensorarena.planning.budget import DEFAULT_NODE_LIMIT, DEFAULT_WORK_LIMIT
from tensorarena.planning.exact_params import SolverParams
from tensorarena.planning.problem import Problem
from tensorarena.planning.progress import ProgressCallback
from tensorarena.sizes import Size, parse_size

__all__ = ["DEFAULT_TIME_LIMIT", "PlanOptions", "check_capacity", "check_gap", "check_int64",
           "check_node_limit", "check_problem", "check_progress", "check_time_limit"]

# Offsets and heights are computed in int64 (NumPy); problems whose total bytes or times could
# overflow it are refused rather than planned with silently wrapped numbers.
INT64_SAFE = 1 << 62


def check_problem(problem: object) -> Problem:
    """``problem`` itself if it is a :class:`Problem`, else :class:`InvalidArgumentError`."""
    if not isinstance(problem, Problem):
        hint = " (read a CSV with read_problem(path))" if isinstance(problem, str) else ""
        raise InvalidArgumentError(
            f"expected a Problem, got {type(problem).__name__} {problem!r:.60}{hint}"
        )
    return problem


def check_capacity(capacity: Size | None, *, name: str = "capacity") -> int | None:
    """``None``, or the capacity as bytes (an int or a size string such as ``"1MiB"``)."""
    return None if capacity is None else parse_size(capacity, name=name, allow_zero=True)


def check_time_limit(time_limit: object, *, name: str = "time_limit") -> float:
    """Seconds as a float: a non-negative real number; ``inf`` means no limit."""
    if isinstance(time_limit, bool) or not isinstance(time_limit, Real):
        raise InvalidArgumentError(
            f"{name} must be a number of seconds, got {type(time_limit).__name__} {time_limit!r}"
        )
    seconds = float(time_limit)
    if math.isnan(seconds) or seconds < 0:
        raise InvalidArgumentError(
            f"{name} must be a non-negative number of seconds (inf: no limit), got {time_limit!r}"
        )
    return seconds


def check_gap(gap: object, *, name: str = "gap") -> float:
    """A relative gap as a float: a finite non-negative real number (0: prove optimality)."""
    if isinstance(gap, bool) or not isinstance(gap, Real):
        raise InvalidArgumentError(
            f"{name} must be a non-negative number (0.01 is 1 %), got {type(gap).__name__} {gap!r}"
        )
    value = float(gap)
    if not math.isfinite(value) or value < 0:
        raise InvalidArgumentError(
            f"{name} must be a finite non-negative number (0.01 is 1 %), got {gap!r}"
        )
    return value


def check_progress(progress: object) -> None:
    """``None`` or something callable with one argument (a progress record)."""
    if progress is not None and not callable(progress):
        raise InvalidArgumentError(
            f"progress must be a callable or None, got {type(progress).__name__} {progress!r:.60}"
        )


def check_node_limit(node_limit: object, *, name: str = "node_limit") -> int | None:
    """``None`` (no limit) or a non-negative int."""
    if node_limit is None:
        return None
    if type(node_limit) is not int or node_limit < 0:
        raise InvalidArgumentError(f"{name} must be a non-negative int or None, got {node_limit!r}")
    return node_limit


def check_int64(problem: Problem, alignment: int = 1) -> None:
    """Refuse a problem whose bytes (with alignment padding) or times could overflow int64."""
    total = sum(b.nbytes + max(b.alignment, alignment) for b in problem.buffers)
    if total >= INT64_SAFE or any(
        abs(b.start) >= INT64_SAFE or abs(b.end) >= INT64_SAFE for b in problem.buffers
    ):
        raise InvalidProblemError(
            f"problem {problem.name!r} is too large for the planners: sizes sum to {total} "
            f"bytes (the limit is {INT64_SAFE}), or a time is beyond ±{INT64_SAFE}"
        )


#: The outer bound in seconds by default (``auto`` and ``exact``): well above what the default
#: node budget takes on a loaded machine (250,000 nodes of 200-450 buffers: 17-120 s on a shared
#: 2-core VM), so that the budget, not the clock, ends the search.
DEFAULT_TIME_LIMIT = 300.0


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """What :func:`~tensorarena.planning.plan` passes to a named planner, every value checked."""

    capacity: int | None = None  #: the arena size the plan must fit
    time_limit: float = DEFAULT_TIME_LIMIT  #: seconds for it all, an outer bound
    node_limit: int | None = DEFAULT_NODE_LIMIT  #: the exact search's budget (None: none)
    #: the exact search's budget in work units, nodes weighed by size (None: none)
    work_limit: int | None = DEFAULT_WORK_LIMIT
    alignment: int | None = None  #: every offset a multiple of at least this
    gap: float = DEFAULT_GAP  #: relative gap to the bound that is good enough
    minimize: bool = False  #: with a capacity, lower the plan after it fits
    progress: ProgressCallback | None = None  #: where :class:`Progress` reports go
    params: SolverParams | None = None  #: the exact search's techniques (None: all on)

    @property
    def decision(self) -> bool:
        """True when the question is "does it fit the capacity?", not "how low can it go?"."""
        return self.capacity is not None and not self.minimize
