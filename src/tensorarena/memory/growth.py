"""Growth policies: how big the next arena of a :class:`~tensorarena.memory.pool.Pool` should be.

A policy is a small frozen object with one method, ``next_size(request, reserved)``: given the
bytes the pool must fit (the request rounded up to its alignment) and the bytes the pool already
holds from its upstream, return the size of the next arena, or ``None`` to refuse to grow.

The pool clamps the answer to its ``maximum_size`` and never asks for less than the request, so
a policy only expresses a preference; every policy here returns at least ``request``, which is
how "a request larger than an arena gets its own arena" falls out. The policies are the ones
real runtimes ship:

- :class:`Fixed` — the initial arena is all there is (a static budget, TensorFlow Lite style).
- :class:`SameAsRequested` — each new arena is exactly the request (ONNX Runtime's
  ``kSameAsRequested``): no over-allocation, many small arenas.
- :class:`NextPowerOfTwo` — the next arena is the smallest power of two above everything held
  so far (and at least the request rounded up to a power of two), so from a power-of-two initial
  arena the sizes go 1, 2, 4, 8… as ONNX Runtime's default ``kNextPowerOfTwo`` doubles its region
  size at each extension: few upstream calls, up to 2× over-reservation.
- :class:`Doubling` — the next arena is as large as everything held so far (the pool doubles,
  as RMM's pool grows by its current size), but never larger than ``maximum``: after that,
  growth is linear in ``maximum``-sized steps. (RMM caps the pool's total instead; here that is
  ``Pool(maximum_size=...)``, which composes with every policy.)
- :class:`Segments` — PyTorch's caching allocator's answer, the default resource's: a large
  request (``threshold`` bytes or more) gets an arena of its own, rounded up to ``granularity``
  (2 MiB: one huge page), so a block of a known size, a planned program's arena, costs at most
  one granule of slack; smaller requests share arenas of ``small`` bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

from tensorarena.errors import InvalidSizeError
from tensorarena.sizes import Size, parse_size

__all__ = ["Doubling", "Fixed", "GrowthPolicy", "NextPowerOfTwo", "SameAsRequested", "Segments"]


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
    """The next arena is the smallest power of two above ``reserved`` and not below the request:
    each arena doubles the last, as in ONNX Runtime's BFC arena by default."""

    def next_size(self, request: int, reserved: int) -> int | None:
        return max(1 << reserved.bit_length() if reserved else 0, 1 << (request - 1).bit_length())


@dataclass(frozen=True, slots=True, init=False)
class Doubling:
    """The next arena matches everything held so far (the pool doubles), capped at ``maximum``
    bytes per arena; a request above the cap still gets an arena of its own size."""

    maximum: int

    def __init__(self, maximum: Size = "1GiB") -> None:
        object.__setattr__(self, "maximum", parse_size(maximum, name="maximum"))

    def next_size(self, request: int, reserved: int) -> int | None:
        return max(request, min(reserved, self.maximum))


@dataclass(frozen=True, slots=True, init=False)
class Segments:
    """A request of ``threshold`` bytes or more gets an arena of its own, the request rounded up
    to ``granularity``; a smaller one gets an arena of ``small`` bytes, which later small requests
    share. As PyTorch's CUDA caching allocator sizes its segments (2 MiB for small blocks, large
    ones rounded up to 2 MiB): nothing large is over-reserved by a power of two, and an arena
    holding one large block is empty, so ``trim()`` gives it back, as soon as that block is;
    and an empty arena too small for a request that makes the pool grow is given back then (a
    block that grew replaces its old arena)."""

    threshold: int
    granularity: int
    small: int
    #: the pool gives back its empty arenas too small for a request that makes it grow: a
    #: large block that grew replaces its old arena instead of being added beside it
    release_outgrown: ClassVar[bool] = True

    def __init__(self, threshold: Size = "1MiB", granularity: Size = "2MiB",
                 small: Size = "8MiB") -> None:
        threshold = parse_size(threshold, name="threshold")
        granularity = parse_size(granularity, name="granularity")
        small = parse_size(small, name="small")
        if small < threshold:
            raise InvalidSizeError(
                f"small arenas ({small} bytes) must hold every small request, which can be "
                f"up to threshold={threshold} bytes"
            )
        object.__setattr__(self, "threshold", threshold)
        object.__setattr__(self, "granularity", granularity)
        object.__setattr__(self, "small", small)

    def next_size(self, request: int, reserved: int) -> int | None:
        if request < self.threshold:
            return self.small
        return -(-request // self.granularity) * self.granularity
