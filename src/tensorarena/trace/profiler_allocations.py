"""The allocations a ``torch.profiler`` run saw, read from its event tree: the one walk of it.

With ``profile_memory=True`` every call into a device allocator is a leaf of the profiler's event
tree, carrying the pointer, the signed size (negative for a free), the allocator's running total
and the device. :func:`profiler_allocations` walks the tree once, in pre-order (the order the
calls were made in), and gives each allocation with the op it was made in (its parent event) and
its *scope*: the innermost enclosing range whose name starts with a chosen prefix
(``torch.profiler.record_function`` ranges, as the planned runtime puts around each node).
:func:`~tensorarena.trace.record_torch` and the runtime's measurements both read it.

With ``stack_depth`` (a profile run with ``with_stack=True``), each allocation also gets the Python
stack it was made from, innermost first: the caller frame (file, line, function) of each Python
call event above it, as PyTorch's ``record_memory_history(stacks="python")`` gives. Frames are
interned (one tuple per distinct frame), so a loop's million allocations share them.

The walk keeps its own stack instead of recursing: a deep model's tree does not reach Python's
recursion limit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["ProfiledAllocation", "ProfilerAllocations", "profiler_allocations"]


@dataclass(frozen=True, slots=True)
class ProfiledAllocation:
    """One allocator call: ``nbytes`` is negative for a free, ``total_bytes`` the allocator's
    running total after it, ``device`` the device type (``"cpu"``, ``"cuda"``), ``op`` the name
    of the event it was made in (``""`` at the top), ``scope`` the name of the innermost
    enclosing scope range (``""`` outside every one)."""

    time_ns: int
    address: int
    nbytes: int
    total_bytes: int
    device: str
    op: str
    scope: str
    stack: tuple[tuple[str, int, str], ...] = ()  #: innermost first; () without stacks


@dataclass(frozen=True, slots=True)
class ProfilerAllocations:
    """What :func:`profiler_allocations` read: the allocations and the scope ranges as
    ``(name, start_ns, end_ns)``, both in the tree's pre-order."""

    allocations: tuple[ProfiledAllocation, ...]
    scopes: tuple[tuple[str, int, int], ...]


def _python_stack(event: Any, depth: int, python: tuple[Any, ...],
                  frames: dict[tuple[str, int, str], tuple[str, int, str]],
                  keep: Callable[[str], bool]) -> tuple[tuple[str, int, str], ...]:
    """Up to ``depth`` caller frames of the Python call events above ``event``."""
    stack: list[tuple[str, int, str]] = []
    parent = event.parent
    while parent is not None and len(stack) < depth:
        if parent.tag in python:
            caller = parent.extra_fields.caller
            frame = (str(caller.file_name), int(caller.line_number), str(caller.function_name))
            if keep(frame[0]):
                stack.append(frames.setdefault(frame, frame))
        parent = parent.parent
    return tuple(stack)


def profiler_allocations(profile: Any, *, scope_prefix: str | None = None,
                         stack_depth: int = 0,
                         keep_frame: Callable[[str], bool] = lambda filename: True
                         ) -> ProfilerAllocations:
    """The allocations of a finished ``torch.profiler.profile`` (run with
    ``profile_memory=True``) and, with ``scope_prefix``, the ranges named with it; with
    ``stack_depth``, up to that many Python frames each (of the files ``keep_frame`` keeps)."""
    from torch._C._profiler import _EventType

    python = (_EventType.PyCall, _EventType.PyCCall)
    frames: dict[tuple[str, int, str], tuple[str, int, str]] = {}

    allocations: list[ProfiledAllocation] = []
    scopes: list[tuple[str, int, int]] = []
    roots = profile.profiler.kineto_results.experimental_event_tree()
    stack: list[tuple[Any, str]] = [(root, "") for root in reversed(roots)]
    while stack:
        event, scope = stack.pop()
        if event.tag == _EventType.Allocation:
            fields = event.extra_fields
            parent = event.parent
            allocations.append(ProfiledAllocation(
                event.start_time_ns, int(fields.ptr), int(fields.alloc_size),
                int(fields.total_allocated), fields.device.type,
                str(parent.name) if parent is not None else "", scope,
                _python_stack(event, stack_depth, python, frames, keep_frame)
                if stack_depth else ()))
            continue
        if scope_prefix is not None:
            name = str(event.name)
            if name.startswith(scope_prefix):
                scope = name
                scopes.append((name, event.start_time_ns, event.end_time_ns))
        stack.extend((child, scope) for child in reversed(event.children))
    return ProfilerAllocations(tuple(allocations), tuple(scopes))
