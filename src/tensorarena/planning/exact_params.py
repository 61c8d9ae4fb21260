"""The exact solver's parameters, one named switch per technique, and the shape of its answer.

After minimalloc's ``SolverParams`` (``solver.h``): every pruning or ordering technique of the
search (:mod:`~tensorarena.planning.exact_search`) is a boolean that can be turned off, so a
benchmark can measure what each one buys and the tests can run every combination through the
validator. The defaults are the solver as it should be used; turning a switch off never changes
an answer (found, or proven infeasible), only how many nodes it takes.

Two of the prunings rest on the canonical order (every later buffer sits at or above the
current one): with ``canonical_only=False`` the search enumerates every order, and
``section_inference`` and ``check_dominance`` have nothing to stand on, so they act only with
``canonical_only=True``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields

import numpy as np
import numpy.typing as npt

from tensorarena.errors import InvalidArgumentError
from tensorarena.planning.exact_sections import PREORDERS

__all__ = ["Decision", "SolverParams", "Status"]

IntArray = npt.NDArray[np.int64]


class Status(enum.Enum):
    """How one decision search ended."""

    FOUND = "found"  #: every buffer placed below the capacity
    EXHAUSTED = "exhausted"  #: the whole search space was refuted: no plan fits (a proof)
    STOPPED = "stopped"  #: the time or node budget ran out first: unknown


@dataclass(frozen=True, slots=True)
class SolverParams:
    """Which techniques the exact search uses (minimalloc's names where it has them)."""

    #: place buffers in non-decreasing (offset, preorder rank) order, so that every compact plan
    #: is enumerated once (minimalloc's ``canonical_only``)
    canonical_only: bool = True
    #: in every time section the unplaced live bytes must fit between the current offset and
    #: the capacity; one maximum over the window checks every candidate at once
    section_inference: bool = True
    #: no unplaced buffer can go below the lowest offset any unplaced buffer of its section can
    #: reach, so each section's unplaced bytes must fit above that floor
    unallocated_floor: bool = True
    #: never place a buffer at or above the lowest top an unplaced buffer could reach: that one
    #: would fit underneath, so the plan would not be compact (``check_dominance``)
    check_dominance: bool = True
    #: when the last buffer spanning a section boundary is placed, solve the two sides one
    #: after the other (``dynamic_decomposition``)
    dynamic_decomposition: bool = True
    #: a window split off mid-search sorts its buffers afresh, with the preorder's "T" counting
    #: only the bytes still unplaced (minimalloc's sub-problems do; ours alone fits H and I)
    window_preordering: bool = True
    #: sort buffers by the static preorders (round robin, doubling budgets); off: input order
    static_preordering: bool = True
    #: remember failed states (unplaced buffers and their lowest offsets) and skip them when
    #: reached again through another order of placements
    remember_failures: bool = True
    #: a failure the canonical order did not restrict is a true nogood: it also refutes every
    #: state with the same unplaced buffers and lowest offsets at least as high
    nogoods: bool = True
    #: the static preorders tried in turn: letters W (lifetime width), A (area), T (largest live
    #: total among the buffer's sections), Z (size), L (sections spanned); larger first
    preorders: tuple[str, ...] = PREORDERS

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if field.name == "preorders":
                if (not isinstance(value, tuple) or not value
                        or not all(isinstance(h, str) and h and set(h) <= set("WATZL")
                                   for h in value)):
                    raise InvalidArgumentError(
                        f"preorders must be a non-empty tuple of strings of the letters W, A, "
                        f"T, Z, L, got {value!r}"
                    )
            elif not isinstance(value, bool):
                raise InvalidArgumentError(f"{field.name} must be a bool, got {value!r}")

    @classmethod
    def switches(cls) -> tuple[str, ...]:
        """The names of the boolean switches, in declaration order."""
        return tuple(f.name for f in fields(cls) if f.name != "preorders")


class Decision:
    """Outcome of one decision search: a :class:`Status`, the offsets if FOUND, the nodes, and
    for STOPPED whether the clock (not the node budget) stopped it."""

    __slots__ = ("nodes", "offsets", "status", "timed_out")

    def __init__(self, status: Status, offsets: IntArray | None, nodes: int, *,
                 timed_out: bool = False) -> None:
        self.status = status
        self.offsets = offsets  #: one offset per searched buffer when FOUND
        self.nodes = nodes
        self.timed_out = timed_out  #: STOPPED by the deadline, not by the node budget

    def __repr__(self) -> str:
        late = ", timed out" if self.timed_out else ""
        return f"Decision({self.status.name}, nodes={self.nodes}{late})"
