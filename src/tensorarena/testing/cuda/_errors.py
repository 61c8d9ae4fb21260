"""The status codes, enums and small structs of the simulated runtime, named as the bindings name
them (``cuda.bindings.runtime``), so the checked wrapper reads the simulator as it reads CUDA."""

from __future__ import annotations

import enum
from typing import Any

__all__ = ["Failure", "cudaError_t", "cudaMemLocation", "cudaMemLocationType",
           "cudaMemcpyKind", "cudaMemoryAdvise"]


class cudaError_t(enum.IntEnum):
    """The ``cudaError_t`` values the simulator returns."""

    cudaSuccess = 0
    cudaErrorInvalidValue = 1
    cudaErrorMemoryAllocation = 2
    cudaErrorInsufficientDriver = 35
    cudaErrorNoDevice = 100
    cudaErrorInvalidDevice = 101
    cudaErrorInvalidResourceHandle = 400
    cudaErrorNotReady = 600
    cudaErrorIllegalAddress = 700
    cudaErrorHostMemoryAlreadyRegistered = 712
    cudaErrorHostMemoryNotRegistered = 713


class cudaMemcpyKind(enum.IntEnum):
    """Only the kind unified addressing needs."""

    cudaMemcpyDefault = 4


class cudaMemoryAdvise(enum.IntEnum):
    """``cudaMemAdvise``'s advice."""

    cudaMemAdviseSetReadMostly = 1
    cudaMemAdviseUnsetReadMostly = 2
    cudaMemAdviseSetPreferredLocation = 3
    cudaMemAdviseUnsetPreferredLocation = 4
    cudaMemAdviseSetAccessedBy = 5
    cudaMemAdviseUnsetAccessedBy = 6


class cudaMemLocationType(enum.IntEnum):
    """Where a ``cudaMemLocation`` points."""

    cudaMemLocationTypeDevice = 1
    cudaMemLocationTypeHost = 2


class cudaMemLocation:
    """The location struct of CUDA 12.2+ (``*_v2``) and 13 hints."""

    def __init__(self) -> None:
        self.type: Any = 0
        self.id = 0


class Failure(Exception):
    """Raised inside the simulator to return ``status`` from the call being made."""

    def __init__(self, status: cudaError_t) -> None:
        super().__init__(status.name)
        self.status = status
