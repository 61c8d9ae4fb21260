"""Real bytes over a resource's addresses: every live block holds its own pattern, checked.

A block that shares a byte with another live block is caught the moment either is written:
each allocation fills its block with a value no other live block has, and :meth:`check` reads
every live block back.
"""

from __future__ import annotations

import ctypes
import itertools

import numpy as np

from tensorarena.learned import LearnedPlans


def view(address: int, nbytes: int) -> np.ndarray:
    """The bytes at ``address`` as a writable uint8 array (no copy)."""
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))


class Bytes:
    """Allocations through ``plans`` whose bytes are written and checked."""

    def __init__(self, plans: LearnedPlans) -> None:
        self.plans = plans
        self.live: dict[int, tuple[int, int]] = {}  # address -> (nbytes, pattern)
        self._patterns = itertools.count(1)

    def alloc(self, nbytes: int, alignment: int = 256) -> int:
        address = self.plans.allocate(nbytes, alignment)
        assert address % alignment == 0
        pattern = next(self._patterns) % 251 + 1
        view(address, nbytes)[:] = pattern
        self.live[address] = (nbytes, pattern)
        self.check()
        return address

    def free(self, address: int) -> None:
        nbytes, pattern = self.live.pop(address)
        assert (view(address, nbytes) == pattern).all(), "a live block was overwritten"
        self.plans.deallocate(address, nbytes)

    def check(self) -> None:
        for address, (nbytes, pattern) in self.live.items():
            assert (view(address, nbytes) == pattern).all(), f"block {address:#x} was aliased"
        self.plans._check_invariants()

    def run(self, program: list[tuple[str, int]]) -> list[int]:
        """Run ``program``: ("a", nbytes) allocates (numbered in order), ("f", k) frees the
        k-th allocation of this run; return the addresses."""
        addresses: list[int] = []
        for op, value in program:
            if op == "a":
                addresses.append(self.alloc(value))
            else:
                self.free(addresses[value])
        self.check()
        return addresses
