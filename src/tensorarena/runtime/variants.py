"""A module's program exported again for each new value of its non-tensor arguments.

``torch.export`` bakes an int, a flag or a string argument into the graph, so a program built
from a module with ``n=3`` cannot serve ``n=5``. Where the program still has the module
(:meth:`PlannedProgram.from_module <tensorarena.runtime.PlannedProgram.from_module>`), a call
with other values exports the module again with them and plans that graph as a program of its
own, as a new input shape gets a plan of its own: :class:`Variants` keeps them by the call's
values (with their types: ``1``, ``1.0`` and ``True`` are three programs), up to ``limit``,
least recently used first out, all in the first program's workspace (one block, one lock).
A program built from an ``ExportedProgram`` has no module to export again: it refuses other
values (:class:`~tensorarena.errors.ShapeNotCoveredError`).

An export takes seconds: a value that changes at every call belongs in a tensor (or an int
marked dynamic, ``torch.export.Dim.DYNAMIC``), which one graph serves.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from tensorarena.runtime.arguments import CallLayout
from tensorarena.runtime.graph_sources import export_module

__all__ = ["Variants", "exported_again"]


class Variants:
    """Programs for other baked values than the first program's: ``build(args, kwargs)``
    exports and plans one for the values of a call."""

    def __init__(self, build: Callable[[tuple[Any, ...], dict[str, Any]], Any],
                 layout: CallLayout, *, limit: int) -> None:
        self._build = build
        self._layout = layout
        self._limit = limit
        self._programs: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._programs)

    def program_for(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any | None:
        """The program for the values of this call (exported and planned now if new), or None
        where they cannot key one (an unhashable value): the caller then refuses them."""
        key = self._layout.baked.key(self._layout.leaves(args, kwargs))
        try:
            hash(key)
        except TypeError:
            return None
        with self._lock:
            program = self._programs.get(key)
            if program is None:
                program = self._build(args, kwargs)
                self._programs[key] = program
                while len(self._programs) > self._limit:
                    self._programs.popitem(last=False)
            else:
                self._programs.move_to_end(key)
            return program


def exported_again(model: Any, from_exported: Callable[..., Any], layout: CallLayout,
                   options: Mapping[str, Any], workspace: Any, *, dynamic_shapes: Any,
                   strict: bool, isolated: bool | None = None) -> Variants:
    """The variants of a program exported from ``model`` with ``options``: each new set of
    values exported again and planned by ``from_exported`` in ``workspace``, whose resource
    and lock they share instead of making their own."""
    shared = {k: v for k, v in options.items()
              if k not in ("resource", "workspace", "concurrency")}

    def build(call_args: tuple[Any, ...], call_kwargs: dict[str, Any]) -> Any:
        again = export_module(model, call_args, call_kwargs, dynamic_shapes=dynamic_shapes,
                              strict=strict, isolated=isolated)
        return from_exported(again, workspace=workspace, **shared)

    return Variants(build, layout, limit=options.get("max_plans", 8))
