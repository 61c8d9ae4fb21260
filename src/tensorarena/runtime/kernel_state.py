"""Where a shape stands with its kernels' own allocations: :class:`KernelNote`.

The program decides once whether the shim (:mod:`~tensorarena.runtime.kernel_arena`) serves its
shapes; each shape then goes from :attr:`KernelState.TO_RECORD` to :attr:`KernelState.ON` at its
first call (:mod:`~tensorarena.runtime.kernel_recording`). Control flow reads the state, an
enum; the words (why it is off, which policy planned the allocations) are for the report only,
``str(note)``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from tensorarena.runtime import kernel_arena

__all__ = ["KERNEL_OFF", "KernelNote", "KernelState", "kernel_note"]


class KernelState(enum.Enum):
    """A shape's kernel allocations: not served, to be recorded at its next call, or served."""

    OFF = "off"
    UNAVAILABLE = "unavailable"  #: wanted, but the shim cannot be built here
    TO_RECORD = "to record"
    #: recorded, then the program chose another order: the shape is retired, never run again
    RETIRED = "recorded; the program then changed order"
    ON = "on"


@dataclass(frozen=True)
class KernelNote:
    """A :class:`KernelState` and what the report says of it: why off or unavailable, or the
    policy that planned the allocations (``"all"``, ``"idle"``, ``"lower peak: all"``, ...)."""

    state: KernelState
    detail: str = ""

    def __str__(self) -> str:
        if not self.detail:
            return self.state.value
        if self.state is KernelState.ON:
            return f"{self.state.value} ({self.detail})"
        return f"{self.state.value}: {self.detail}"


#: Kernels' allocations not served, for no reason worth saying (the option is off).
KERNEL_OFF = KernelNote(KernelState.OFF)


def kernel_note(wanted: bool, device: str, max_shapes: bool) -> KernelNote:
    """A new shape's state: to be recorded where the shim serves this program, else why not."""
    if not wanted:
        return KERNEL_OFF
    if device != "cpu":
        return KernelNote(KernelState.OFF,
                          f"the arena is on {device} (the shim serves torch's CPU allocator)")
    if max_shapes:
        return KernelNote(KernelState.OFF,
                          "not with max_shapes (smaller shapes' kernels allocate other sizes)")
    reason = kernel_arena.unavailable()  # looked up at the call: tests replace it
    return KernelNote(KernelState.UNAVAILABLE, reason) if reason else KernelNote(
        KernelState.TO_RECORD)
