"""The static planning problem as plain data: buffers with lifetimes and sizes, and plans.

Lifetimes are half-open, ``[start, end)``, stated here once for the whole package: a buffer is live
at times ``start, start + 1, ..., end - 1``, so one that ends at ``t`` may share bytes with one that
starts at ``t``. Two buffers *conflict* when ``a.start < b.end and b.start < a.end``.

A buffer may be *pinned*: ``Buffer(..., offset=o)`` fixes its offset, as minimalloc's optional
``offset`` does (weights or I/O at a known address). Every plan keeps it there; the problem
refuses pins that could never hold (negative, misaligned, above the capacity, or clashing with
another pin).

A plan gives every buffer a byte offset in one arena; its *height* is ``max(offset + nbytes)``, the
arena size it needs. The *lower bound* of a problem is the peak of live bytes over time: no plan
can be lower. What a planner measured while planning travels with its plan as a frozen
:class:`PlanStatistics` record.

Reprs summarise (a real problem has tens of thousands of buffers): name, buffer count, lower
bound; a plan adds its height, planner and whether it is proven optimal.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tensorarena.errors import InvalidArgumentError, InvalidPlanError, InvalidProblemError
from tensorarena.planning.budget import StopReason
from tensorarena.sizes import check_alignment

__all__ = ["Buffer", "Plan", "PlanStatistics", "Problem", "check_pins_fit", "lower_bound"]


@dataclass(frozen=True, slots=True)
class Buffer:
    """One buffer to place: live during ``[start, end)``, ``nbytes`` long, aligned offset.

    ``offset``, when given, pins the buffer there: every plan must keep it at that offset.
    """

    id: str
    start: int
    end: int
    nbytes: int
    alignment: int = 1
    offset: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.id, str):
            raise InvalidProblemError(
                f"buffer id must be a str, got {type(self.id).__name__} {self.id!r}", column="id"
            )
        for name in ("start", "end", "nbytes", "alignment"):
            value = getattr(self, name)
            if type(value) is not int:
                raise InvalidProblemError(
                    f"buffer {self.id!r}: {name} must be an int, got {value!r}", column=name
                )
        if self.end <= self.start:
            raise InvalidProblemError(
                f"buffer {self.id!r}: end ({self.end}) must be after start ({self.start}); "
                "lifetimes are half-open [start, end)",
                column="upper",
            )
        if self.nbytes < 0:
            raise InvalidProblemError(
                f"buffer {self.id!r}: size must be non-negative, got {self.nbytes}", column="size"
            )
        if self.alignment <= 0 or self.alignment & (self.alignment - 1):
            raise InvalidProblemError(
                f"buffer {self.id!r}: alignment must be a positive power of two, "
                f"got {self.alignment}",
                column="alignment",
            )
        if self.offset is not None:
            if type(self.offset) is not int:
                raise InvalidProblemError(
                    f"buffer {self.id!r}: a pinned offset must be an int, got {self.offset!r}",
                    column="offset",
                )
            if self.offset < 0:
                raise InvalidProblemError(
                    f"buffer {self.id!r}: pinned offset {self.offset} is negative",
                    column="offset",
                )
            if self.offset % self.alignment:
                raise InvalidProblemError(
                    f"buffer {self.id!r}: pinned offset {self.offset} is not a multiple of its "
                    f"alignment {self.alignment}",
                    column="offset",
                )

    @property
    def pinned(self) -> bool:
        """True if the buffer's offset is fixed (``offset`` is not None)."""
        return self.offset is not None

    def overlaps_in_time(self, other: Buffer) -> bool:
        """True if the two lifetimes intersect (half-open)."""
        return self.start < other.end and other.start < self.end


@dataclass(frozen=True, slots=True, repr=False)
class Problem:
    """A list of buffers to place in one arena, optionally with a capacity to fit in."""

    buffers: tuple[Buffer, ...]
    capacity: int | None = None
    name: str = ""

    def __init__(
        self, buffers: Iterable[Buffer], *, capacity: int | None = None, name: str = ""
    ) -> None:
        # Not a try around tuple(): that would also swallow a TypeError raised while a
        # generator makes the buffers, and blame the wrong thing.
        if not isinstance(buffers, Iterable):
            raise InvalidProblemError(
                f"buffers must be an iterable of Buffer, got {type(buffers).__name__}"
            )
        buffers = tuple(buffers)
        seen: set[str] = set()
        for buffer in buffers:
            if not isinstance(buffer, Buffer):
                raise InvalidProblemError(
                    f"buffers must be Buffer objects, got {type(buffer).__name__} {buffer!r:.60}"
                )
            if buffer.id in seen:
                raise InvalidProblemError(f"duplicate buffer id {buffer.id!r}", column="id")
            seen.add(buffer.id)
        if capacity is not None and (type(capacity) is not int or capacity < 0):
            raise InvalidProblemError(f"capacity must be a non-negative int, got {capacity!r}")
        if not isinstance(name, str):
            raise InvalidProblemError(f"name must be a str, got {type(name).__name__}")
        _check_pins(buffers)
        object.__setattr__(self, "buffers", buffers)
        object.__setattr__(self, "capacity", capacity)
        object.__setattr__(self, "name", name)
        check_pins_fit(self, capacity)

    def __len__(self) -> int:
        return len(self.buffers)

    def __repr__(self) -> str:
        capacity = "" if self.capacity is None else f", capacity={self.capacity}"
        return (
            f"Problem(name={self.name!r}, buffers={len(self.buffers)}, "
            f"lower_bound={self.lower_bound()}{capacity})"
        )

    def lower_bound(self) -> int:
        """The peak of live bytes over time; see :func:`lower_bound`."""
        return lower_bound(self.buffers)

    @property
    def pinned(self) -> bool:
        """True if some buffer is pinned to a fixed offset."""
        return any(b.offset is not None for b in self.buffers)

    def with_alignment(self, alignment: int) -> Problem:
        """A copy where every buffer's alignment is at least ``alignment``.

        A pinned offset that is not a multiple of the new alignment raises
        :class:`InvalidProblemError`: the pin and the alignment cannot both hold.
        """
        alignment = check_alignment(alignment)
        return Problem(
            (
                Buffer(b.id, b.start, b.end, b.nbytes, max(b.alignment, alignment), b.offset)
                for b in self.buffers
            ),
            capacity=self.capacity,
            name=self.name,
        )


def check_pins_fit(problem: Problem, capacity: int | None) -> None:
    """Raise :class:`InvalidProblemError` if a pinned buffer reaches past ``capacity``."""
    if capacity is None:
        return
    for b in problem.buffers:
        if b.offset is not None and b.offset + b.nbytes > capacity:
            raise InvalidProblemError(
                f"buffer {b.id!r}: pinned at [{b.offset}, {b.offset + b.nbytes}), past the "
                f"capacity {capacity}",
                column="offset",
            )


def _check_pins(buffers: tuple[Buffer, ...]) -> None:
    """Refuse two pins that share bytes while both are live: no plan could keep both."""
    # A zero-byte pin is a point and follows validate()'s rule: it clashes with a pin strictly
    # around it; the overlap test below says exactly that for points too.
    pinned = sorted((b for b in buffers if b.offset is not None),
                    key=lambda b: (b.start, b.id))
    # Pins are few (weights, I/O, a repair window's edges): a pairwise check over the pins
    # live at once is simple and cheap enough.
    live: list[Buffer] = []
    for b in pinned:
        live = [a for a in live if a.end > b.start]
        for a in live:
            assert a.offset is not None and b.offset is not None
            if a.offset < b.offset + b.nbytes and b.offset < a.offset + a.nbytes:
                raise InvalidProblemError(
                    f"pinned buffers {a.id!r} [{a.start}, {a.end}) at [{a.offset}, "
                    f"{a.offset + a.nbytes}) and {b.id!r} [{b.start}, {b.end}) at "
                    f"[{b.offset}, {b.offset + b.nbytes}) overlap in time and space",
                    column="offset",
                )
        live.append(b)


@dataclass(frozen=True, slots=True)
class PlanStatistics:
    """What a planner measured while making a plan (:attr:`Plan.statistics`)."""

    seconds: float  #: wall time the planner took (for :func:`~tensorarena.planning.plan`: all)
    lower_bound: int  #: the problem's lower bound, the peak of live bytes
    nodes: int = 0  #: nodes the exact search visited; 0 when no search ran
    #: ``auto`` skipped the search: too many overlapping pairs for the time limit
    exact_skipped: bool = False
    #: the best lower bound the planner knows: at least ``lower_bound``, raised by alignment
    #: padding (:func:`~tensorarena.planning.bounds.aligned_lower_bound`) and by every capacity
    #: the exact search proved infeasible; 0 when the planner did not compute one
    bound: int = 0
    #: what ended the search: proof, good enough, the node budget, the time limit, or no search
    stopped_by: StopReason = StopReason.NOT_RUN
    node_limit: int | None = None  #: the node budget it ran under (``nodes`` is what it used)
    time_limit: float = float("inf")  #: the outer bound in seconds (``seconds`` is what it used)
    #: work units the exact search used: its nodes, each weighed by the problem's size
    #: (:func:`~tensorarena.planning.exact_work.node_work`)
    work: int = 0
    work_limit: int | None = None  #: the work budget it ran under (``None``: none)


@dataclass(frozen=True, slots=True, repr=False)
class Plan:
    """Offsets for a problem's buffers, in the order of ``problem.buffers``.

    ``statistics`` is what the planner that made the plan measured; ``None`` for a plan that no
    planner made (written by hand, read from a file).
    """

    problem: Problem
    offsets: tuple[int, ...]
    planner: str = ""
    optimal: bool = False  #: the planner proved that no lower height exists
    statistics: PlanStatistics | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.problem, Problem):
            raise InvalidArgumentError(
                f"a plan's problem must be a Problem, got {type(self.problem).__name__}"
            )
        try:
            offsets = tuple(self.offsets)
        except TypeError:
            raise InvalidPlanError(
                f"offsets must be a sequence of ints, got {type(self.offsets).__name__}"
            ) from None
        object.__setattr__(self, "offsets", offsets)
        if len(offsets) != len(self.problem.buffers):
            raise InvalidPlanError(
                f"plan has {len(offsets)} offsets for {len(self.problem.buffers)} buffers"
            )

    def __repr__(self) -> str:
        return (
            f"Plan(problem={self.problem.name!r}, buffers={len(self.offsets)}, "
            f"height={self.height}, lower_bound={self.problem.lower_bound()}, "
            f"planner={self.planner!r}, optimal={self.optimal})"
        )

    @property
    def height(self) -> int:
        """Arena size the plan needs: ``max(offset + nbytes)``, 0 for an empty problem."""
        return max(
            (o + b.nbytes for o, b in zip(self.offsets, self.problem.buffers, strict=True)),
            default=0,
        )

    def offset_of(self, buffer_id: str) -> int:
        """The offset given to the buffer with this id (:class:`KeyError` if there is none)."""
        for offset, buffer in zip(self.offsets, self.problem.buffers, strict=True):
            if buffer.id == buffer_id:
                return offset
        raise KeyError(buffer_id)

    def as_dict(self) -> dict[str, int]:
        """Buffer id → offset."""
        return {b.id: o for o, b in zip(self.offsets, self.problem.buffers, strict=True)}


def lower_bound(buffers: Sequence[Buffer] | Problem) -> int:
    """Peak of live bytes over time (deaths before births at equal times): no plan is lower."""
    if isinstance(buffers, Problem):
        buffers = buffers.buffers
    elif not isinstance(buffers, Sequence) or not all(isinstance(b, Buffer) for b in buffers):
        raise InvalidArgumentError(
            f"lower_bound() takes a Problem or a sequence of Buffer, got {type(buffers).__name__}"
        )
    # (time, delta): at equal times the negative deltas (deaths) sort first.
    events = sorted(
        [(b.start, b.nbytes) for b in buffers] + [(b.end, -b.nbytes) for b in buffers],
        key=lambda event: (event[0], event[1]),
    )
    live = peak = 0
    for _, delta in events:
        live += delta
        if live > peak:
            peak = live
    return peak
