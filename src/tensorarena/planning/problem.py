"""The static planning problem as plain data: buffers with lifetimes and sizes, and plans.

Lifetimes are half-open, ``[start, end)``, stated here once for the whole package: a buffer is live
at times ``start, start + 1, ..., end - 1``, so one that ends at ``t`` may share bytes with one that
starts at ``t``. Two buffers *conflict* when ``a.start < b.end and b.start < a.end``.

A plan gives every buffer a byte offset in one arena; its *height* is ``max(offset + nbytes)``, the
arena size it needs. The *lower bound* of a problem is the peak of live bytes over time: no plan
can be lower.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tensorarena.errors import InvalidProblemError

__all__ = ["Buffer", "Plan", "Problem", "lower_bound"]


@dataclass(frozen=True, slots=True)
class Buffer:
    """One buffer to place: live during ``[start, end)``, ``nbytes`` long, aligned offset."""

    id: str
    start: int
    end: int
    nbytes: int
    alignment: int = 1

    def __post_init__(self) -> None:
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

    def overlaps_in_time(self, other: Buffer) -> bool:
        """True if the two lifetimes intersect (half-open)."""
        return self.start < other.end and other.start < self.end


@dataclass(frozen=True, slots=True)
class Problem:
    """A list of buffers to place in one arena, optionally with a capacity to fit in."""

    buffers: tuple[Buffer, ...]
    capacity: int | None = None
    name: str = ""

    def __init__(
        self, buffers: Iterable[Buffer], *, capacity: int | None = None, name: str = ""
    ) -> None:
        buffers = tuple(buffers)
        seen: set[str] = set()
        for buffer in buffers:
            if buffer.id in seen:
                raise InvalidProblemError(f"duplicate buffer id {buffer.id!r}", column="id")
            seen.add(buffer.id)
        if capacity is not None and (type(capacity) is not int or capacity < 0):
            raise InvalidProblemError(f"capacity must be a non-negative int, got {capacity!r}")
        object.__setattr__(self, "buffers", buffers)
        object.__setattr__(self, "capacity", capacity)
        object.__setattr__(self, "name", name)

    def __len__(self) -> int:
        return len(self.buffers)

    def lower_bound(self) -> int:
        """The peak of live bytes over time; see :func:`lower_bound`."""
        return lower_bound(self.buffers)

    def with_alignment(self, alignment: int) -> Problem:
        """A copy where every buffer's alignment is at least ``alignment``."""
        return Problem(
            (
                Buffer(b.id, b.start, b.end, b.nbytes, max(b.alignment, alignment))
                for b in self.buffers
            ),
            capacity=self.capacity,
            name=self.name,
        )


@dataclass(frozen=True, slots=True)
class Plan:
    """Offsets for a problem's buffers, in the order of ``problem.buffers``."""

    problem: Problem
    offsets: tuple[int, ...]
    planner: str = ""
    optimal: bool = False  #: the planner proved that no lower height exists
    stats: dict[str, float] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if len(self.offsets) != len(self.problem.buffers):
            raise ValueError(
                f"plan has {len(self.offsets)} offsets for {len(self.problem.buffers)} buffers"
            )

    @property
    def height(self) -> int:
        """Arena size the plan needs: ``max(offset + nbytes)``, 0 for an empty problem."""
        return max(
            (o + b.nbytes for o, b in zip(self.offsets, self.problem.buffers, strict=True)),
            default=0,
        )

    def offset_of(self, buffer_id: str) -> int:
        """The offset given to the buffer with this id."""
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
