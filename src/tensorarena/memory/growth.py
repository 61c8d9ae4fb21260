"""Growth policies: how big the next arena of a :class:`~tensorarena.memory.pool.Pool` should be.

A policy is a small frozen object with one method, ``next_size(request, reserved)``: given the
bytes the pool must fit (the request rounded up to its alignment) and the bytes the pool already
holds from its upstream, return the size of the next arena, or ``None`` to refuse to grow.

The pool clamps the answer to its ``maximum_size`` and never asks for less than the request, so
a policy only expresses a preference; every policy here returns at least ``request``, which is
how "a request larger than an arena gets its own arena" falls out. The four policies are the
ones real runtimes ship:

- :class:`Fixed` — the initial arena is all there is (a static budget, TensorFlow Lite style).
- :class:`SameAsRequested` — each new arena is exactly the request (ONNX Runtime's
  ``kSameAsRequested``): no over-allocation, many small arenas.
- :class:`NextPowerOfTwo` — the next arena is the power of two at least as large as both the
  request and everything held so far, so arena sizes go 1, 1, 2, 4, 8… (ONNX Runtime's default
  ``kNextPowerOfTwo``): few upstream calls, up to 2× over-reservation.
- :class:`Doubling` — the next arena is as large as everything held so far (the pool doubles),
  but never larger than ``maximum`` (RMM's pool grows by its current size up to a cap): after the
  cap, growth is linear in ``maximum``-sized steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from tensorarena.sizes import Size, parse_size

__all__ = ["Doubling", "Fixed", "GrowthPolicy", "NextPowerOfTwo", "SameAsRequested"]


@runtime_checkable
class GrowthPolicy(Protocol):
    """Chooses the size of a pool's next arena."""

    def next_size(self, request: int, reserved: int) -> int | None:
        """Bytes for the next arena that must hold ``request`` bytes; ``None`` means do not grow.

        ``reserved`` is what the pool already holds from its upstream (0 before the first arena).
        """
        ...


@dataclass(frozen=True, slots=True)
class Fixed:
    """Never grow: only the pool's initial arena serves requests (or one arena of the first
    request's size when the pool was made with ``initial_size=0``)."""

    def next_size(self, request: int, reserved: int) -> int | None:
        return request if reserved == 0 else None


@dataclass(frozen=True, slots=True)
class SameAsRequested:
    """Each new arena is exactly as large as the request that needed it."""

    def next_size(self, request: int, reserved: int) -> int | None:
        return request


@dataclass(frozen=True, slots=True)
class NextPowerOfTwo:
    """The next arena is the smallest power of two ≥ max(request, reserved): the total held
    roughly doubles with each growth, as ONNX Runtime's BFC arena does by default."""

    def next_size(self, request: int, reserved: int) -> int | None:
        wanted = max(request, reserved)
        return 1 << (wanted - 1).bit_length()


@dataclass(frozen=True, slots=True, init=False)
class Doubling:
    """The next arena matches everything held so far (the pool doubles), capped at ``maximum``
    bytes per arena; a request above the cap still gets an arena of its own size."""

    maximum: int

    def __init__(self, maximum: Size = "1GiB") -> None:
        object.__setattr__(self, "maximum", parse_size(maximum, name="maximum"))

    def next_size(self, request: int, reserved: int) -> int | None:
        return max(request, min(reserved, self.maximum))
