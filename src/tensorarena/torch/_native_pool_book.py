"""A :class:`~tensorarena.torch.NativePool`'s bookkeeping in Python, for where torch's CPU
shim cannot be built: the same rules as ``_torch_cpu_native_pool.cpp`` (64-byte granules,
best or first fit over address-ordered free extents, coalesced on free), the same calls and
results, so the pool behaves alike either way (only slower, and no route takes from it natively).
"""

from __future__ import annotations

import bisect
import threading

__all__ = ["FOREIGN", "FREED", "GRANULE", "INTERIOR", "NOT_LIVE", "ROUTED", "SIZE_MISMATCH",
           "PythonBook"]

#: Every extent starts and ends on a multiple of this (torch's CPU alignment).
GRANULE = 64
#: ``deallocate``'s status codes, as the C++ side returns them.
FREED, NOT_LIVE, FOREIGN, SIZE_MISMATCH, INTERIOR, ROUTED = 0, 1, 2, 3, 4, 5


def _round_up(value: int, to: int) -> int:
    return (value + to - 1) & -to


class PythonBook:
    """One arena ``[base, base + capacity)``'s free extents and live blocks."""

    def __init__(self, base: int, capacity: int, first_fit: bool) -> None:
        self._lock = threading.Lock()
        self._base, self._capacity, self._first_fit = base, capacity, first_fit
        self._starts = [base]  # free extents' starts, ascending
        self._lengths = {base: capacity}
        self._live: dict[int, tuple[int, int]] = {}  # address -> (requested, reserved)
        self._closed = False
        # blocks, requested, reserved: [current, peak, total] each; ooms; served (always 0)
        self._counts = [[0, 0, 0], [0, 0, 0], [0, 0, 0]]
        self._ooms = 0

    def _add_free(self, start: int, length: int) -> None:
        starts, lengths = self._starts, self._lengths
        index = bisect.bisect_left(starts, start)
        if index < len(starts) and starts[index] == start + length:
            length += lengths.pop(starts.pop(index))
        if index > 0 and starts[index - 1] + lengths[starts[index - 1]] == start:
            start = starts[index - 1]
            lengths[start] += length
            return
        starts.insert(index, start)
        lengths[start] = length

    def allocate(self, nbytes: int, alignment: int) -> int | None:
        """The address of a block, or ``None`` where no extent holds it."""
        with self._lock:
            if self._closed:
                return None
            size, align = _round_up(max(nbytes, 1), GRANULE), max(alignment, GRANULE)
            found: tuple[int, int, int] | None = None  # (length, start, at)
            if nbytes <= self._capacity:
                for start in self._starts:
                    length = self._lengths[start]
                    at = _round_up(start, align)
                    if at - start <= length and length - (at - start) >= size and (
                            found is None or length < found[0]):
                        found = (length, start, at)
                        if self._first_fit:
                            break
            if found is None:
                self._ooms += 1
                return None
            length, start, at = found
            self._starts.remove(start)
            del self._lengths[start]
            if at > start:
                self._add_free(start, at - start)
            if at + size < start + length:
                self._add_free(at + size, start + length - at - size)
            self._live[at] = (nbytes, size)
            for count, value in zip(self._counts, (1, nbytes, size), strict=True):
                count[0] += value
                count[2] += value
                count[1] = max(count[1], count[0])
            return at

    def deallocate(self, address: int, nbytes: int) -> int:
        """Free the block at ``address`` (requested with ``nbytes``); a status code."""
        with self._lock:
            block = self._live.get(address)
            if block is None:
                if not self._base <= address < self._base + self._capacity:
                    return FOREIGN
                index = bisect.bisect_right(self._starts, address) - 1
                if index >= 0 and address < self._starts[index] + self._lengths[
                        self._starts[index]]:
                    return NOT_LIVE
                return INTERIOR
            if block[0] != nbytes:
                return SIZE_MISMATCH
            del self._live[address]
            for count, value in zip(self._counts, (1, *block), strict=True):
                count[0] -= value
            self._add_free(address, block[1])
            return FREED

    def size_of(self, address: int) -> int | None:
        """A live block's requested size, or ``None``."""
        block = self._live.get(address)
        return None if block is None else block[0]

    def statistics(self) -> tuple[int, ...]:
        """The C++ side's counters, in its order."""
        with self._lock:
            lengths = self._lengths.values()
            return (*self._counts[0], *self._counts[1], *self._counts[2], sum(lengths),
                    max(lengths, default=0), len(lengths), self._ooms, 0)

    def blocks(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """Live blocks ``(address, requested)`` and free extents ``(start, length)``."""
        with self._lock:
            return (sorted((a, b[0]) for a, b in self._live.items()),
                    [(s, self._lengths[s]) for s in self._starts])

    def close(self) -> int:
        """Take nothing more; the live blocks."""
        with self._lock:
            self._closed = True
            return self._counts[0][0]

    def reset_peaks(self) -> None:
        """Peaks to their current values."""
        with self._lock:
            for count in self._counts:
                count[1] = count[0]
