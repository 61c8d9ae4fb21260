"""The exception tree of tensorarena, by domain.

Every error a user can cause has its own class, carries the numbers needed to act on it, and is
raised *before* any state changes: an allocator that raised is exactly as it was before the call.
Every error derives from ``TensorArenaError``, every warning from ``TensorArenaWarning`` (a
``UserWarning``). Indented: a subclass of the class above it; on the right, the other class it
also is: a built-in one (``except ValueError`` keeps working) or ours from another domain.
Each domain is a section of this module; a test holds this tree to the classes defined.

Input: bad arguments to any layer
    InvalidArgumentError          ValueError      an option out of its range or of a wrong type
      UnknownNameError                            a name nothing answers to: ``kind``, ``known``
      InvalidDtypeError           TypeError       a dtype raw memory cannot hold
      InvalidResourceError        TypeError       an object that is not a memory resource
    InvalidSizeError              ValueError      bad byte count or size string
    InvalidAlignmentError         ValueError      alignment not a positive power of two
    MissingDependencyError        ImportError     an optional extra is not installed
    UnsupportedError                              a route refused because it cannot be safe

Memory: resources, pools, arenas, adaptors, arrays
    OutOfMemoryError              MemoryError     no room: exhaustion, fragmentation or a limit
    InvalidAddressError           ValueError      an address this allocator never handed out
      DoubleFreeError                             an address already freed (or reset)
      SizeMismatchError                           freed with a size other than allocated
      DeviceMismatchError                         a block freed into another device's pool
    ResourceInUseError                            close()/reset() refused: blocks are live
    ResourceClosedError                           a request to a pool after its close()
    NotHostAccessibleError        TypeError       an array asked of memory the CPU cannot touch
    ConcurrentUseError                            a one-caller-at-a-time object entered twice
    ScopeEscapeError                              arrays outlived the scope that made them
    InvariantError                AssertionError  internal state found corrupt by a check
    MemoryCorruptionError                         bytes written where no live block is
      BufferOverflowError                         a red zone around a live block was written
      UseAfterFreeError                           a freed (poisoned) block was written
    LeakWarning                   (warning)       allocations still live at interpreter exit

Devices: GPUs, NUMA, streams, the compiled shim
    CudaError                     RuntimeError    a CUDA runtime call returned an error status
    DeviceUnavailableError        RuntimeError    no GPU a consumer library can reach
    NumaBindError                 OSError         the kernel refused to bind memory to a node
    ShimUnavailableError          ImportError     the compiled torch-allocator shim is not built
    AsyncWorkError                                work submitted to a stream raised
    StreamClosedError                             work submitted to a stream after its close()

Planning: problems and plans
    InvalidProblemError           ValueError      a malformed planning problem, CSV or graph
    InvalidPlanError                              a plan that breaks the problem's constraints
    InfeasibleError                               no plan fits the requested capacity
      PlanDoesNotFitError                         the best plan found is over the capacity
    ModelSkippedWarning           (warning)       a model-zoo architecture left out

Runtime: planned programs
    ShapeNotCoveredError          InvalidArgumentError  an input a program cannot serve
    ExportFailedError                             torch.export could not capture a model
      DataDependentError                          a branch or a size depends on input values
    ExportProcessError                            the cause of one raised by an export's child
    PlanVerificationError                         a planned program's outputs differ from eager
    NoGradWarning                 (warning)       an input requires grad, a call runs no_grad

Traces: recorded allocator traffic and its replays
    MalformedTraceError           ValueError      a trace file or event sequence that is wrong
      UnsafePickleError                           a snapshot pickle that asks to run code
    SystemAllocatorUnavailableError               a system allocator a replay cannot run here
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AsyncWorkError",
    "BufferOverflowError",
    "ConcurrentUseError",
    "CudaError",
    "DataDependentError",
    "DeviceMismatchError",
    "DeviceUnavailableError",
    "DoubleFreeError",
    "ExportFailedError",
    "ExportProcessError",
    "InfeasibleError",
    "InvalidAddressError",
    "InvalidAlignmentError",
    "InvalidArgumentError",
    "InvalidDtypeError",
    "InvalidPlanError",
    "InvalidProblemError",
    "InvalidResourceError",
    "InvalidSizeError",
    "InvariantError",
    "LeakWarning",
    "MalformedTraceError",
    "MemoryCorruptionError",
    "MissingDependencyError",
    "ModelSkippedWarning",
    "NoGradWarning",
    "NotHostAccessibleError",
    "NumaBindError",
    "OutOfMemoryError",
    "PlanDoesNotFitError",
    "PlanVerificationError",
    "ResourceClosedError",
    "ResourceInUseError",
    "ScopeEscapeError",
    "ShapeNotCoveredError",
    "ShimUnavailableError",
    "SizeMismatchError",
    "StreamClosedError",
    "SystemAllocatorUnavailableError",
    "TensorArenaError",
    "TensorArenaWarning",
    "UnknownNameError",
    "UnsafePickleError",
    "UnsupportedError",
    "UseAfterFreeError",
]


# ------------------------------------------------------------------------------------------------
# Bases
# ------------------------------------------------------------------------------------------------

class TensorArenaError(Exception):
    """Base class of every error raised by tensorarena."""


class TensorArenaWarning(UserWarning):
    """Base class of every warning issued by tensorarena."""


# ------------------------------------------------------------------------------------------------
# Input: bad arguments to any layer
# ------------------------------------------------------------------------------------------------

class InvalidArgumentError(TensorArenaError, ValueError):
    """An option that is out of its range or of the wrong type (a time limit, a growth policy,
    an array kind...); the message names the option, the value and what was expected."""


class UnknownNameError(InvalidArgumentError):
    """A name that nothing answers to: a placement strategy, a planner, a model-zoo architecture,
    a pinning backend, a NUMA node or CPU. ``kind`` says which (``"strategy"``, ``"planner"``,
    ``"architecture"``, ``"pinning backend"``, ``"NUMA node"``), ``name`` is what was given and
    ``known`` the names there are (empty where they cannot be listed); the message names both.

    One class for all of them: no caller told them apart, and one ``except`` (or ``kind``)
    serves a front end that reports any misspelt name the same way."""

    def __init__(self, message: str, *, kind: str, name: object,
                 known: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self.name = name
        self.known = known
        super().__init__(message)


class InvalidDtypeError(InvalidArgumentError, TypeError):
    """A dtype that raw memory cannot hold (Python objects, no size) or that is not a dtype."""


class InvalidResourceError(InvalidArgumentError, TypeError):
    """An object given where a memory resource was expected (an instance with ``allocate`` and
    ``deallocate``): a class instead of an instance, a number, a resource missing one of them.

    An :class:`~tensorarena.core.Arena` *is* a resource (address space only: a ``Pool`` can carve
    its range); where bytes are needed (arrays, the default resource) it is refused with
    :class:`NotHostAccessibleError` instead."""


class InvalidSizeError(TensorArenaError, ValueError):
    """A byte count that is not a positive int in range, or a size string that does not parse."""


class InvalidAlignmentError(TensorArenaError, ValueError):
    """An alignment that is not a positive power of two (or that the region cannot honour)."""


class MissingDependencyError(TensorArenaError, ImportError):
    """An optional dependency is needed for this feature; the message names the extra."""

    def __init__(self, module: str, extra: str, feature: str) -> None:
        self.module = module
        self.extra = extra
        super().__init__(
            f"{feature} needs the optional dependency {module!r}: "
            f"pip install 'tensorarena[{extra}]'"
        )


class UnsupportedError(TensorArenaError):
    """A route tensorarena refuses because it cannot be made safe (say why and what to use)."""


# ------------------------------------------------------------------------------------------------
# Memory: resources, pools, arenas, adaptors, arrays
# ------------------------------------------------------------------------------------------------

class OutOfMemoryError(TensorArenaError, MemoryError):
    """No extent can serve the request.

    ``is_fragmentation`` tells the two causes apart: enough free bytes in total but no single free
    extent large enough (fragmentation), or too few free bytes altogether (exhaustion). ``limit``
    is set when a configured cap, not the hardware, refused the request.

    The message is written when the error is shown, not when it is raised: a pool that tries its
    arenas in turn catches one of these per arena that cannot serve a request, and formatting six
    sizes each time made a fragmented first arena cost several whole allocations.
    """

    def __init__(
        self,
        requested: int,
        *,
        free: int,
        largest_free: int,
        capacity: int,
        limit: int | None = None,
        allocated: int | None = None,
        reserved: int | None = None,
        detail: str = "",
    ) -> None:
        self.requested = requested
        self.free = free
        self.largest_free = largest_free
        self.capacity = capacity
        self.limit = limit
        self.allocated = allocated
        self.reserved = reserved
        self.detail = detail
        super().__init__(requested)

    def __str__(self) -> str:
        return self._message(self.detail)

    @property
    def is_fragmentation(self) -> bool:
        """True when the free bytes would suffice but no single extent is large enough."""
        return self.free >= self.requested > self.largest_free

    def _message(self, detail: str) -> str:
        from tensorarena.sizes import format_size

        if self.limit is not None and self.requested + (self.allocated or 0) > self.limit:
            cause = f"over the limit of {format_size(self.limit)}"
        elif self.is_fragmentation:
            cause = (
                "fragmentation: enough free bytes in total, but no free extent is large enough"
            )
        else:
            cause = "exhaustion: not enough free bytes"
        parts = [
            f"cannot allocate {format_size(self.requested)} ({self.requested} bytes): {cause}",
            f"free {format_size(self.free)}, largest free extent {format_size(self.largest_free)}, "
            f"capacity {format_size(self.capacity)}",
        ]
        if self.allocated is not None:
            parts.append(f"allocated {format_size(self.allocated)}")
        if self.reserved is not None:
            parts.append(f"reserved {format_size(self.reserved)}")
        if detail:
            parts.append(detail)
        return "; ".join(parts)


class InvalidAddressError(TensorArenaError, ValueError):
    """An address that this allocator did not hand out, or that is not live."""

    def __init__(self, message: str, *, address: int) -> None:
        self.address = address
        super().__init__(message)


class DoubleFreeError(InvalidAddressError):
    """An address freed twice, or freed after ``reset()`` already released it."""


class SizeMismatchError(InvalidAddressError):
    """A deallocation whose byte count differs from the one the block was allocated with."""

    def __init__(self, message: str, *, address: int, given: int, allocated: int) -> None:
        self.given = given
        self.allocated = allocated
        super().__init__(message, address=address)


class DeviceMismatchError(InvalidAddressError):
    """A block freed into the pool of a device other than the one it was allocated on
    (``allocated_on`` and ``freed_on`` name the two devices); nothing changed."""

    def __init__(self, message: str, *, address: int, allocated_on: int, freed_on: int) -> None:
        self.allocated_on = allocated_on
        self.freed_on = freed_on
        super().__init__(message, address=address)


class ResourceInUseError(TensorArenaError):
    """An operation that would unmap or re-hand-out bytes that live blocks still hold
    (``close()``/``reset()`` of a pool with live blocks, say) was refused; nothing changed.

    ``live_blocks`` and ``live_bytes`` say what is still held.
    """

    def __init__(self, message: str, *, live_blocks: int, live_bytes: int) -> None:
        self.live_blocks = live_blocks
        self.live_bytes = live_bytes
        super().__init__(message)


class ResourceClosedError(TensorArenaError):
    """An allocation from a resource after its ``close()``: it gives its memory back and takes
    no new requests (frees of blocks still live are accepted)."""


class NotHostAccessibleError(TensorArenaError, TypeError):
    """An array (or any CPU access) was asked of a resource whose addresses the CPU cannot touch:
    device memory, or bookkeeping / address space only (``VirtualMemory``, a bare ``Arena``)."""


class ConcurrentUseError(TensorArenaError):
    """An object that serves one caller at a time (a planned program and its one workspace,
    say) was entered by a second caller while the first was inside it; the second call was
    refused before changing anything."""


class ScopeEscapeError(TensorArenaError):
    """Arrays made inside a :func:`scope` were still referenced when it ended.

    Their memory was kept alive (not freed under a live reference); ``escaped`` describes them.
    """

    def __init__(self, escaped: list[str], nbytes: int) -> None:
        self.escaped = escaped
        self.nbytes = nbytes
        from tensorarena.sizes import format_size

        shown = "; ".join(escaped[:5]) + ("; ..." if len(escaped) > 5 else "")
        super().__init__(
            f"{len(escaped)} array(s) made in the scope ({format_size(nbytes)}) are still "
            f"referenced after it ended, so their memory was kept alive: {shown}. "
            "Delete the names (del a) before the block ends, or copy what you keep (np.array(a))"
        )


class InvariantError(TensorArenaError, AssertionError):
    """A debug check found an allocator's state inconsistent (see :mod:`tensorarena.debug`).

    Not a user error: a bug in tensorarena, or memory corrupted from outside. Raised by explicit
    checks, so it does not vanish under ``python -O`` as ``assert`` would.
    """


class MemoryCorruptionError(TensorArenaError):
    """A debugging adaptor found bytes written where the program had no live block: a red zone
    around a block (:class:`BufferOverflowError`) or a freed block (:class:`UseAfterFreeError`).

    Like every error here, raised before the call that found it changed anything: the damaged
    pattern is written back (so each corruption is reported once) and the call can be repeated
    to carry it out (a free then frees). ``address`` and ``nbytes`` name the block as its user
    saw it, ``offset`` the first corrupted byte relative to the block's start (negative before
    it), ``corrupted`` how many bytes differ from the recorded ``pattern``, and ``site`` where
    the block was allocated (a formatted stack; empty when stacks were off).
    """

    def __init__(
        self,
        message: str,
        *,
        address: int,
        nbytes: int,
        offset: int,
        corrupted: int,
        pattern: int,
        site: str = "",
    ) -> None:
        self.address = address
        self.nbytes = nbytes
        self.offset = offset
        self.corrupted = corrupted
        self.pattern = pattern
        self.site = site
        super().__init__(message)


class BufferOverflowError(MemoryCorruptionError):
    """A canary byte next to a live block was overwritten. ``side`` is ``"overflow"`` (written
    past the end: ``offset >= nbytes``) or ``"underflow"`` (before the start: ``offset < 0``)."""

    def __init__(self, message: str, *, side: str, **fields: Any) -> None:
        self.side = side
        super().__init__(message, **fields)


class UseAfterFreeError(MemoryCorruptionError):
    """A freed block's poison was overwritten while it waited in quarantine: something wrote
    through a pointer (an array, a view) after the block was freed. ``freed_at`` is where it
    was freed; ``site`` where it was allocated."""

    def __init__(self, message: str, *, freed_at: str = "", **fields: Any) -> None:
        self.freed_at = freed_at
        super().__init__(message, **fields)


class LeakWarning(TensorArenaWarning):
    """Allocations were still live when the interpreter exited (a ``Tracking`` adaptor made
    with ``report_at_exit=True``); the message is its leak report, grouped by site."""


# ------------------------------------------------------------------------------------------------
# Devices: GPUs, NUMA, streams, the compiled shim
# ------------------------------------------------------------------------------------------------

class CudaError(TensorArenaError, RuntimeError):
    """A CUDA runtime call returned an error status (other than running out of memory, which is
    an :class:`OutOfMemoryError`). ``status`` is the numeric ``cudaError_t``, ``name`` its name
    and ``call`` the runtime function that returned it."""

    def __init__(self, call: str, status: int, name: str) -> None:
        self.call = call
        self.status = status
        self.name = name
        super().__init__(f"{call} failed: {name} (cudaError_t {status})")


class DeviceUnavailableError(TensorArenaError, RuntimeError):
    """A GPU was needed but none can be reached: a CPU-only build of the consumer library
    (``torch`` without CUDA, say), no driver, or a device index the machine does not have."""


class NumaBindError(TensorArenaError, OSError):
    """The kernel refused to bind memory to a node (``mbind`` failed); ``errno`` says why."""


class ShimUnavailableError(TensorArenaError, ImportError):
    """PyTorch's pluggable allocator needs a shared library, and the small shim tensorarena
    compiles for it (with a C compiler, at install or with ``build_shim()``) is not built here."""


class AsyncWorkError(TensorArenaError):
    """Work submitted to a stream raised; the stream ran on, and ``synchronize()`` reports it.

    ``errors`` holds every exception raised since the last report (the first is the cause).
    """

    def __init__(self, message: str, *, errors: list[BaseException]) -> None:
        self.errors = errors
        super().__init__(message)


class StreamClosedError(TensorArenaError):
    """Work submitted to a stream after its ``close()``."""


# ------------------------------------------------------------------------------------------------
# Planning: problems and plans
# ------------------------------------------------------------------------------------------------

def _located(message: str, line: int | None, column: str | None) -> str:
    """``message`` prefixed with ``line N, column 'name': `` where the fault has a place."""
    if line is None:
        return message
    return f"line {line}" + (f", column {column!r}" if column else "") + ": " + message


class InvalidProblemError(TensorArenaError, ValueError):
    """A malformed planning problem: bad CSV, bad lifetime, bad size, or an unusable graph.

    ``line`` and ``column`` locate the fault in a file when there is one.
    """

    def __init__(self, message: str, *, line: int | None = None, column: str | None = None) -> None:
        self.line = line
        self.column = column
        super().__init__(_located(message, line, column))


class InvalidPlanError(TensorArenaError):
    """A plan that places two time-overlapping buffers in overlapping bytes, misaligns one,
    or exceeds the capacity."""


class InfeasibleError(TensorArenaError):
    """No plan was found that fits the requested capacity (within the time allowed)."""


class PlanDoesNotFitError(InfeasibleError):
    """The best plan found is higher than the capacity asked for.

    ``plan`` is that best plan (a :class:`~tensorarena.planning.Plan`); ``height``,
    ``lower_bound`` and ``planner`` are its numbers, carried here so that this module needs
    nothing from the layers above it. ``proven`` is True when the exact search showed that no
    plan fits, False when it merely ran out of time (or was not run).
    """

    def __init__(
        self,
        plan: Any,
        capacity: int,
        *,
        height: int,
        lower_bound: int,
        planner: str,
        proven: bool,
    ) -> None:
        self.plan = plan
        self.capacity = capacity
        self.height = height
        self.lower_bound = lower_bound
        self.planner = planner
        self.proven = proven
        how = "no plan fits" if proven else "no plan found that fits"
        super().__init__(
            f"{how} in capacity {capacity}: the best plan ({planner}) needs {height} "
            f"bytes, the lower bound is {lower_bound}"
        )


class ModelSkippedWarning(TensorArenaWarning):
    """A model-zoo architecture could not be built or traced here and was left out."""


# ------------------------------------------------------------------------------------------------
# Runtime: planned programs
# ------------------------------------------------------------------------------------------------

class ShapeNotCoveredError(InvalidArgumentError):
    """An input a planned program does not cover: a static dimension with another size, a
    dynamic one outside its range or above the declared maximum, a tensor of another dtype or
    on another device, a non-tensor argument (an int, a flag, a string) other than the one
    its graph was built with. ``dim`` names it (``"input_ids.shape[1]"``, ``"x"``, ``"n"``),
    ``got`` is what was given, ``expected`` what was allowed."""

    def __init__(self, message: str, *, dim: str, got: Any, expected: Any) -> None:
        self.dim = dim
        self.got = got
        self.expected = expected
        super().__init__(message)


class ExportFailedError(TensorArenaError):
    """``torch.export`` could not capture the model; the message says what to try and the
    ``__cause__`` is torch's own error."""


class DataDependentError(ExportFailedError):
    """A branch or a tensor's size in the model depends on the values in its inputs, not only
    on their shapes (``if x.sum() > 0``, ``int(x.max())``, ``x[x > 0]``, ``torch.nonzero``):
    export cannot follow the branch, and a plan made before the call cannot size the tensor.
    ``where`` is the model's line (``model.py:12 in forward``) or the graph node, where known."""

    def __init__(self, message: str, *, where: str = "") -> None:
        self.where = where
        super().__init__(message)


class ExportProcessError(TensorArenaError):
    """The ``__cause__`` of an :class:`ExportFailedError` raised where the export ran in a child
    process: torch's error and the frames it kept, as text (the objects stay in the child)."""


class PlanVerificationError(TensorArenaError):
    """A planned program's verification found outputs that differ from the unplanned graph's,
    or a slot whose layout an op changed: a lifetime computed too short, or an unsafe alias."""


class NoGradWarning(TensorArenaWarning):
    """An input of a planned program requires grad, but its calls run under ``no_grad``: the
    outputs carry no autograd history. Said once per program; for gradients use
    ``TrainingStep`` or ``torch.compile(model, backend="tensorarena")``."""


# ------------------------------------------------------------------------------------------------
# Traces: recorded allocator traffic and its replays
# ------------------------------------------------------------------------------------------------

class MalformedTraceError(TensorArenaError, ValueError):
    """A trace that cannot be read or does not make sense: a bad file, a bad field, a free of an
    allocation that is not live, a pickle that asks to run code.

    ``line`` (1-based, in the file; for events given in memory, the 1-based event number) and
    ``column`` (the field's name) locate the fault where there is one.
    """

    def __init__(self, message: str, *, line: int | None = None, column: str | None = None) -> None:
        self.line = line
        self.column = column
        super().__init__(_located(message, line, column))


class UnsafePickleError(MalformedTraceError):
    """A pickle that asks for a Python object other than plain data (a class, a function):
    not a memory snapshot, or crafted to run code. Nothing from it was run."""


class SystemAllocatorUnavailableError(TensorArenaError):
    """A system allocator (glibc, jemalloc, mimalloc) a replay was asked to compare cannot run
    here: unknown, not installed, or its replay failed; the message says why (and what to
    install)."""
