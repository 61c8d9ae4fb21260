"""Where bytes come from: resources (host, pinned, NUMA, virtual) and pools over them."""

from tensorarena.memory.resource import DEFAULT_ALIGNMENT, MemoryResource, Stream

__all__ = ["DEFAULT_ALIGNMENT", "MemoryResource", "Stream"]
