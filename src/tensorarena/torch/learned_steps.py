"""``learned()``: an eager PyTorch loop served by plans learned from its first step.

::

    with tensorarena.torch.learned() as steps:
        for batch in batches:
            with steps.step():                  # a step: a marker before and after it
                loss = model(batch).loss; loss.backward(); optimizer.step()
                optimizer.zero_grad()
        print(steps.report())                   # served, fell back (why), steady reserved bytes

``learned()`` is :func:`~tensorarena.torch.use` over a :class:`~tensorarena.learned.LearnedPlans`
made for the loop: the first step is recorded and planned, the later ones are served from one
planned arena (the rules, and why nothing live is ever aliased: :mod:`tensorarena.learned`).
A step that repeats its plan is served by the route in C++, with no Python call per allocation
(:mod:`tensorarena.learned.native_serving`; ``native=False`` turns it off).
``steps.step()`` is a marker when called (the step before it ends there), and as a context it
also marks the end of its body: a body that raises ends its step as failed (nothing is learned
from it) and the exception goes on.

Leaving the ``with`` (or :meth:`LearnedSteps.close`) uninstalls the route and closes the plans:
they take no new requests, and each arena goes back to the upstream once its last block dies.
Tensors made inside and still alive stay valid: the route keeps the plans alive until the last
of them is freed back to it. Nesting is :func:`~tensorarena.torch.use`'s: the innermost route
serving a thread wins.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from tensorarena.errors import InvalidArgumentError, ResourceClosedError
from tensorarena.interop import torch_cpu_shim
from tensorarena.learned import LearnedPlans, LearnedPlansReport
from tensorarena.learned.native_serving import NativeServing
from tensorarena.memory.resource import MemoryResource
from tensorarena.stats import MemoryStatistics
from tensorarena.torch.route import Route, Threads

__all__ = ["LearnedSteps", "StepScope", "learned"]


class StepScope:
    """What :meth:`LearnedSteps.step` returns: the marker already happened; as a context it
    marks again when its body ends (``failed=True`` if the body raised)."""

    __slots__ = ("_plans",)

    def __init__(self, plans: LearnedPlans) -> None:
        self._plans = plans

    def __enter__(self) -> StepScope:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._plans.step(failed=kind is not None)


class LearnedSteps:
    """A route to learned plans, installed by :func:`learned` (module docstring)."""

    def __init__(self, upstream: MemoryResource | None = None, *, threads: Threads | None = None,
                 native: bool = True, **options: Any) -> None:
        if type(native) is not bool:
            raise InvalidArgumentError(f"native must be a bool, got {native!r}")
        self._plans = LearnedPlans(upstream, **options)
        self._route = Route(self._plans, device="cpu", threads=threads)
        self._closed = False
        self._native = native
        self._server: NativeServing | None = None

    @property
    def plans(self) -> LearnedPlans:
        """The resource that serves the steps."""
        return self._plans

    @property
    def route(self) -> Route:
        """The route that sends torch's allocations to :attr:`plans`."""
        return self._route

    @property
    def native_served(self) -> int:
        """Allocations served in C++ with no Python call so far (0 with ``native=False``)."""
        return 0 if self._server is None else self._server.served

    @property
    def upstream(self) -> MemoryResource:
        """:attr:`plans`, as adaptors expose theirs (``tensorarena.memory_stats(steps)``)."""
        return self._plans

    @property
    def closed(self) -> bool:
        """True once the route is uninstalled and the plans closed."""
        return self._closed

    def install(self) -> LearnedSteps:
        """Put the route in place (:func:`learned` does); returns ``self``."""
        if self._closed:
            raise ResourceClosedError(f"{self!r} is closed: make another with learned()")
        self._route.install()
        if self._native and self._server is None:
            self._server = NativeServing(self._plans, torch_cpu_shim.extension(),
                                         self._route.shim_handle)
        return self

    def step(self, *, failed: bool = False) -> StepScope:
        """Mark the end of a step (and the start of the next); ``failed=True``: it raised
        halfway, learn nothing from it. ``with steps.step():`` marks after its body too."""
        if self._closed:
            raise ResourceClosedError(f"{self!r} is closed: make another with learned()")
        self._plans.step(failed=failed)
        return StepScope(self._plans)

    def report(self) -> LearnedPlansReport:
        """The plans' report: steps, served, fell back and why, reserved bytes."""
        return self._plans.report()

    def statistics(self) -> MemoryStatistics:
        """The plans' statistics: live (requested) bytes and what is held (reserved)."""
        return self._plans.statistics()

    def close(self) -> None:
        """Uninstall the route and close the plans (twice does nothing)."""
        if self._closed:
            return
        self._route.uninstall()
        self._closed = True
        self._plans.close()
        if self._server is not None:
            self._server.close()

    def __enter__(self) -> LearnedSteps:
        if not self._route.installed:
            self.install()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else (
            "installed" if self._route.installed else "uninstalled")
        return f"LearnedSteps({state}, {self._plans!r})"


def learned(upstream: MemoryResource | None = None, *, threads: Threads | None = None,
            native: bool = True, **options: Any) -> LearnedSteps:
    """Serve torch's CPU allocations from plans learned from the first step, from now on;
    returns the installed :class:`LearnedSteps` (a context manager, or call
    :meth:`LearnedSteps.close`).

    ``upstream``: where the plans' memory comes from (default ``HostMemory()``); ``threads``:
    as :func:`~tensorarena.torch.use`'s; ``native``: serve a step that repeats its plan in C++,
    with no Python call per allocation (``False``: every allocation calls the plans);
    ``options`` go to :class:`~tensorarena.learned.LearnedPlans` (``max_patterns``,
    ``key_length``, ...).
    """
    return LearnedSteps(upstream, threads=threads, native=native, **options).install()
