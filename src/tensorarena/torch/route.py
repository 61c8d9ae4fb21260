"""``use()``: an eager PyTorch program's allocations served by a tensorarena resource.

::

    with tensorarena.torch.use(pool) as route:      # a context manager...
        loss = model(x).sum(); loss.backward()       # every CPU tensor's bytes come from pool
    route = tensorarena.torch.use(pool)              # ...or an install / uninstall pair
    ...
    route.uninstall()

A :class:`Route` is installed when :func:`use` returns (as ``torch.set_grad_enabled`` acts when
called, and works as a context too); leaving the ``with`` block, or :meth:`Route.uninstall`,
restores what served allocations before. Nothing else changes for the program: tensors made
inside and freed outside go back to the resource, tensors made before (or on a thread the route
does not serve) go back to torch's allocator, each block to the one that made it. A route
uninstalled while its tensors live keeps its resource alive until the last of them dies.

**CPU** (``device="cpu"``): torch's CPU allocator shim (:mod:`tensorarena.interop.torch_cpu_shim`,
compiled on first use) calls ``resource.allocate(nbytes, 64)`` once per allocation (64: torch's
CPU alignment), under the GIL: one Python call per allocation, a few microseconds for a
:class:`~tensorarena.memory.Pool` (``tensorarena bench torch-use`` measures it). Two resources
are served with no Python call: a :class:`~tensorarena.torch.NativePool` (one arena whose
bookkeeping lives in C++: the route takes each block there and frees it there, at a fraction of a
Python call's cost (``bench torch-use``); an allocation its arena has no room for is the one
Python call, to its ``allocate``, which its ``fallback`` serves or refuses) and learned plans
(:func:`tensorarena.torch.learned`, a step that repeats its plan); their blocks are taken and
freed with no GIL either (each owner's books under its own lock, the block found by its address:
no process-wide table of blocks), so torch's intra-op and autograd threads never wait for Python
there; the GIL is taken only for a Python call. Where the shim cannot be
built, no CPU route can be installed (:class:`~tensorarena.errors.ShimUnavailableError`); a
``NativePool`` then keeps its books in Python and still serves as a resource. Zero-byte
allocations stay torch's (they hold no memory). ``threads="all"``
serves every thread (torch's intra-op workers and autograd's too), ``threads="calling"`` only the
thread that installed it. Under ``"all"`` the resource is called from several threads (one at a
time for the GIL, but its Python code may be interleaved), so it must be thread-safe, as a
``Pool`` and the default resource are. A resource that raises makes the allocation fail with
``torch.OutOfMemoryError`` (a ``RuntimeError``) naming the cause; the exception itself is
:attr:`Route.last_error`; a ``KeyboardInterrupt`` (Ctrl-C inside the resource) stays one.
Frees come from any thread, with or without the GIL; once the interpreter is shutting down,
routed blocks freed then are left to the process's exit.
**CUDA** (``device="cuda"``): the same call goes through ``torch.cuda.use_mem_pool`` over
:class:`~tensorarena.interop.torch_allocator.TorchAllocator` (the calling thread only, as torch's
MemPool routes; one CUDA route at a time: PyTorch's pluggable allocator has one pair of hooks).

What went through a route: :meth:`Route.statistics`, ``tensorarena.torch.memory_stats(route)``
(``torch.cuda.memory_stats()``'s keys). ``torch.cuda.memory._record_memory_history`` records
CUDA's caching allocator and has no CPU counterpart; instead the resource's own history
(``tensorarena.report.record_memory_history(resource=pool)``, then ``dump_snapshot`` and
``tensorarena viz``) shows every routed block, and routed allocations are reported to torch's
profiler as torch's CPU allocator reports its own, so ``torch.profiler(profile_memory=True)`` and
``tensorarena trace record`` see them.

Routes nest: the innermost installed route serving a thread wins (a thread's own ``"calling"``
route before an ``"all"`` one), and uninstalling one that is not innermost takes it out of the
stack. After ``fork`` the child keeps the routes and its copy of the resource.
"""

from __future__ import annotations

import atexit
import threading
from types import TracebackType
from typing import Any, Literal

from tensorarena._optional import require
from tensorarena.errors import (
    ConcurrentUseError,
    DeviceUnavailableError,
    InvalidArgumentError,
    NotHostAccessibleError,
    ShimUnavailableError,
    UnsupportedError,
)
from tensorarena.interop import torch_cpu_shim
from tensorarena.interop.default import default_resource
from tensorarena.memory.resource import MemoryResource, check_resource
from tensorarena.memory_kind import memory_kind_of
from tensorarena.sizes import format_size
from tensorarena.stats import Count
from tensorarena.torch.native_pool import NativePool
from tensorarena.torch.statistics import RouteStatistics

__all__ = ["Route", "Threads", "use"]

Threads = Literal["all", "calling"]
#: The alignment torch's CPU allocator gives every block (``c10::gAlignment``).
CPU_ALIGNMENT = 64

_lock = threading.Lock()
_every: list[Route] = []  # installed CPU routes serving every thread, innermost last
_local = threading.local()  # .routes: this thread's installed "calling" CPU routes
_cuda: list[Route] = []  # the installed CUDA route, if any
_exit_hooked = False


def _shim() -> Any:
    module = torch_cpu_shim.extension()
    if module is None:
        raise ShimUnavailableError(
            f"tensorarena.torch.use(device='cpu') needs torch's CPU allocator shim, which "
            f"cannot be built here: {torch_cpu_shim.unavailable()}")
    return module


class _ThreadRoutes(list):  # type: ignore[type-arg]
    """A thread's installed ``"calling"`` routes. Python drops a thread's ``threading.local``
    data on the thread itself as it ends: routes it never uninstalled are uninstalled then, so
    their resources are let go and torch's allocator comes back at the last one (the shim's
    route for the thread is a C++ thread-local, reachable only from that thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.get_ident()

    def __del__(self) -> None:
        if not self or threading.get_ident() != self.thread:
            return  # nothing left, or not on its thread (an interpreter tearing down)
        try:
            shim = _shim()
            with _lock:
                shim.set_route(None, False)
                for route in self:
                    route._installed = False
                    shim.uninstall()
                self.clear()
        except Exception:  # a thread's end must not raise
            pass


def _thread_routes() -> list[Route]:
    routes: list[Route] | None = getattr(_local, "routes", None)
    if routes is None:
        routes = _local.routes = _ThreadRoutes()
    return routes


def _device(device: object) -> tuple[str, int]:
    text = str(device)
    kind, _, index = text.partition(":")
    if kind == "cpu" and not index:
        return "cpu", 0
    if kind == "cuda" and (not index or index.isdigit()):
        return "cuda", int(index) if index else -1
    raise InvalidArgumentError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")


class Route:
    """Torch's allocations on ``device`` served by ``resource`` while installed.

    Made (and installed) by :func:`use`; ``Route(...)`` makes one uninstalled, which
    :meth:`install` or ``with route:`` installs. ``resource`` is any memory resource
    (``allocate``/``deallocate``); ``None`` is the default resource (CPU) or each device's
    stream-ordered pool (CUDA). ``threads``: ``"all"`` or ``"calling"`` (``None``: ``"all"`` on
    the CPU, ``"calling"`` on CUDA, the only one torch's MemPool offers).
    """

    def __init__(self, resource: MemoryResource | None = None, *, device: str = "cpu",
                 threads: Threads | None = None) -> None:
        kind, index = _device(device)
        if threads is None:
            threads = "all" if kind == "cpu" else "calling"
        if threads not in ("all", "calling"):
            raise InvalidArgumentError(f"threads must be 'all' or 'calling', got {threads!r}")
        if kind == "cuda" and threads == "all":
            raise UnsupportedError(
                "use(device='cuda', threads='all'): torch.cuda.use_mem_pool routes the calling "
                "thread's allocations only; pass threads='calling'")
        self._kind, self._index, self._threads = kind, index, threads
        self._installed = False
        self._thread = 0
        self._capsule: Any = None
        self._allocator: Any = None
        self._context: Any = None
        self._resource: MemoryResource | None
        if kind == "cpu":
            self._resource = default_resource() if resource is None else check_resource(
                resource, name="resource")
            memory = memory_kind_of(self._resource)
            if memory is not None and not memory.host_accessible:
                raise NotHostAccessibleError(
                    f"use(device='cpu') needs a resource over host memory: "
                    f"{type(self._resource).__name__} hands out {memory.value} addresses")
        else:
            self._resource = resource if resource is None else check_resource(
                resource, name="resource")

    # --- what it is ----------------------------------------------------------------------------

    @property
    def resource(self) -> MemoryResource:
        """The resource serving the allocations."""
        if self._kind == "cuda" and self._allocator is not None:
            return self._allocator.resource(self._index)  # type: ignore[no-any-return]
        if self._resource is None:
            raise UnsupportedError("a CUDA route's default resource exists once it is installed")
        return self._resource

    @property
    def upstream(self) -> MemoryResource:
        """The resource, as adaptors expose theirs (``tensorarena.memory_stats(route)`` and
        ``memory_summary(route)`` descend through it)."""
        return self.resource

    @property
    def device(self) -> str:
        """``"cpu"``, or ``"cuda:N"``."""
        return "cpu" if self._kind == "cpu" else f"cuda:{self._index}"

    @property
    def threads(self) -> Threads:
        """``"all"`` or ``"calling"``."""
        return self._threads

    @property
    def shim_handle(self) -> Any:
        """The compiled shim's handle of a CPU route (made when first installed), or ``None``:
        what a native server of learned plans attaches to."""
        return self._capsule

    @property
    def installed(self) -> bool:
        """Whether the route is in place (it serves unless an inner route does)."""
        return self._installed

    @property
    def last_error(self) -> BaseException | None:
        """The last exception the resource raised to this route (an allocation it refused,
        a free that failed), or ``None``."""
        if self._capsule is not None:
            return _shim().route_statistics(self._capsule)[9]  # type: ignore[no-any-return]
        return getattr(self._allocator, "last_error", None)

    # --- installing ----------------------------------------------------------------------------

    def install(self) -> Route:
        """Put the route in place as the innermost one; returns it."""
        with _lock:
            if self._installed:
                raise ConcurrentUseError(f"{self!r} is installed already")
            if self._kind == "cpu":
                self._install_cpu()
            else:
                self._install_cuda()
            self._thread = threading.get_ident()
            self._installed = True
        return self

    def _install_cpu(self) -> None:
        global _exit_hooked
        shim = _shim()
        if self._capsule is None:
            resource = self.resource
            self._capsule = shim.new_route(resource.allocate, resource.deallocate, CPU_ALIGNMENT)
            if isinstance(resource, NativePool):  # its blocks taken in C++, no Python call
                resource.attach_route(shim, self._capsule)
        if not _exit_hooked:
            atexit.register(shim.shutdown)  # frees during shutdown must not call into Python
            _exit_hooked = True
        shim.install()  # counted: torch's allocator comes back at the last uninstall
        every = self._threads == "all"
        (_every if every else _thread_routes()).append(self)
        shim.set_route(self._capsule, every)

    def _install_cuda(self) -> None:
        torch = require("torch", extra="torch", feature="tensorarena.torch.use")
        if not torch.cuda.is_available():
            raise DeviceUnavailableError(
                f"use(device={self.device!r}): torch sees no CUDA device (torch.cuda.is_available()"
                " is False)")
        if _cuda:
            raise UnsupportedError(
                f"use(device='cuda'): {_cuda[0]!r} is installed; PyTorch's pluggable allocator "
                "has one pair of hooks, so one CUDA route at a time")
        from tensorarena.interop.torch_allocator import TorchAllocator

        if self._index < 0:
            self._index = torch.cuda.current_device()
        if self._allocator is None:
            self._allocator = TorchAllocator(self._resource)
        context = torch.cuda.use_mem_pool(self._allocator.mem_pool(), device=self._index)
        context.__enter__()
        self._context = context
        _cuda.append(self)

    def uninstall(self) -> None:
        """Restore what served allocations before (nothing happens if it is not installed).
        Tensors made under the route stay valid and go back to its resource when they die."""
        with _lock:
            if not self._installed:
                return
            if self._threads == "calling" and threading.get_ident() != self._thread:
                raise ConcurrentUseError(
                    f"{self!r} serves the thread that installed it: uninstall it from there")
            if self._kind == "cpu":
                shim = _shim()
                every = self._threads == "all"
                routes = _every if every else _thread_routes()
                innermost = routes[-1] is self
                routes.remove(self)
                if innermost:
                    shim.set_route(routes[-1]._capsule if routes else None, every)
                shim.uninstall()
            else:
                context, self._context = self._context, None
                _cuda.remove(self)
                context.__exit__(None, None, None)
            self._installed = False

    def __enter__(self) -> Route:
        if not self._installed:
            self.install()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.uninstall()

    # --- statistics ----------------------------------------------------------------------------

    def statistics(self) -> RouteStatistics:
        """What went through the route so far (a frozen snapshot)."""
        if self._capsule is not None:
            blocks, peak, total, nbytes, bytes_peak, bytes_total, ooms, failures, deferred, _ = (
                _shim().route_statistics(self._capsule))
            return RouteStatistics(Count(blocks, peak, total), Count(nbytes, bytes_peak,
                                   bytes_total), ooms, failures, deferred)
        allocator = self._allocator
        if allocator is None:
            return RouteStatistics(Count(), Count())
        live = allocator.allocations - allocator.frees
        return RouteStatistics(Count(live, live, allocator.allocations), Count(),
                               allocator.failures)

    def reset_peak_stats(self) -> None:
        """Set the route's peaks to their current values."""
        if self._capsule is not None:
            _shim().reset_route_peaks(self._capsule)

    def __repr__(self) -> str:
        state = "installed" if self._installed else "uninstalled"
        stats = self.statistics()
        resource = "default" if self._resource is None else type(self._resource).__name__
        return (f"Route({resource}, device={self.device!r}, "
                f"threads={self._threads!r}, {state}, live={stats.allocations.current}, "
                f"allocated={format_size(stats.allocated_bytes.current)})")


def use(resource: MemoryResource | None = None, *, device: str = "cpu",
        threads: Threads | None = None) -> Route:
    """Serve torch's allocations on ``device`` from ``resource`` from now on; returns the
    installed :class:`Route` (a context manager, or call :meth:`Route.uninstall`).

    ``resource``: any memory resource; ``None`` is the default resource on the CPU.
    ``threads``: ``"all"`` (the CPU's default) or ``"calling"``.
    """
    return Route(resource, device=device, threads=threads).install()


def routed_blocks() -> int:
    """Blocks made by CPU routes that are still alive, every route together (0 where the shim
    was never built)."""
    module = torch_cpu_shim.extension() if torch_cpu_shim.unavailable() == "" else None
    return 0 if module is None else int(module.routed_blocks())
