"""What went through a :class:`~tensorarena.torch.Route`, in PyTorch's words.

``RouteStatistics`` counts the blocks torch took through the route and their bytes (torch's own
request sizes: the CPU allocator does not round them), current, peak and total, and the
refusals. :func:`memory_stats` gives the flat dictionary of ``torch.cuda.memory_stats()``: the
route's counts under PyTorch's keys (``"allocation.all.current"``,
``"allocated_bytes.all.peak"``, ``"num_ooms"``, ...), and from the resource below what only it
knows (``"reserved_bytes.all.current"``, ``"segment.all.count"``..., via
:func:`tensorarena.report.memory_stats`) where it keeps statistics. ``memory_stats(resource)``
is the resource's alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tensorarena.errors import InvalidArgumentError
from tensorarena.report.summary import memory_stats as resource_stats
from tensorarena.stats import Count, flatten

__all__ = ["RouteStatistics", "memory_stats"]


@dataclass(frozen=True, slots=True)
class RouteStatistics:
    """A snapshot of one route's traffic."""

    allocations: Count = field(default_factory=Count)  #: blocks torch took through it
    allocated_bytes: Count = field(default_factory=Count)  #: their bytes
    num_ooms: int = 0  #: allocations the resource refused (torch raised OutOfMemoryError)
    num_free_failures: int = 0  #: frees the resource raised on (see ``Route.last_error``)
    num_deferred_frees: int = 0  #: frees that arrived during a call into the resource

    @property
    def active_bytes(self) -> Count:
        """As ``allocated_bytes``: a host free is reusable at once."""
        return self.allocated_bytes


def memory_stats(source: object) -> dict[str, int | float | None]:
    """``torch.cuda.memory_stats()``'s flat dictionary for a route (what went through it, with
    the reserved bytes and segments of its resource) or for a resource."""
    statistics = getattr(source, "statistics", None)
    route = statistics() if callable(statistics) else None
    if not isinstance(route, RouteStatistics):
        return resource_stats(source)
    try:
        flat = resource_stats(source.upstream)  # type: ignore[attr-defined]
    except InvalidArgumentError:  # a resource that keeps no statistics: the route's alone
        flat = {}
    flat.update(flatten(route))
    for key in ("current", "peak", "allocated", "freed"):
        flat[f"active_bytes.all.{key}"] = flat[f"allocated_bytes.all.{key}"]
    return flat
