"""NUMA awareness for host memory: read the topology, find the local node, bind pages to a node.

On a multi-socket machine each memory node is near some CPUs and far from the others; a tensor
that a thread touches should live on that thread's node. This module reads the topology from
sysfs (``/sys/devices/system/node``: the nodes, their CPU lists, their memory) and binds a mapped
range to a node with the ``mbind`` system call, so the pages land there when first touched.

The sysfs root is an argument, so tests read a fake tree. A kernel without NUMA support (no
``node*`` directories) is one node, 0, holding every CPU and all memory. ``mbind`` can be refused
inside a container (seccomp, no ``CAP_SYS_NICE`` for some modes): that raises
:class:`NumaBindError` with the errno rather than silently placing the pages anywhere.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from tensorarena.errors import NumaBindError, UnknownNameError
from tensorarena.memory import libc

__all__ = [
    "DEFAULT_SYSFS_ROOT",
    "NumaBindError",
    "NumaNode",
    "NumaTopology",
    "bind_to_node",
    "current_cpu",
    "memory_policy",
    "node_of_page",
    "parse_cpulist",
]

DEFAULT_SYSFS_ROOT = "/sys/devices/system/node"

_NODE_DIR = re.compile(r"^node(\d+)$")
_MEMINFO = re.compile(r"^Node\s+\d+\s+(\w+):\s+(\d+)\s*(kB)?\s*$")


@dataclass(frozen=True, slots=True)
class NumaNode:
    """One memory node: its id, the CPUs near it, and its memory in bytes."""

    id: int
    cpus: frozenset[int]
    memory_total: int  #: bytes of RAM on the node (0 for a CPU-only node)
    memory_free: int | None  #: free bytes when the topology was read, if sysfs said


def parse_cpulist(text: str) -> frozenset[int]:
    """Parse a kernel CPU list such as ``"0-3,8,10-11"`` (empty → no CPUs)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        first, dash, last = part.partition("-")
        try:
            low = int(first)
            high = int(last) if dash else low
        except ValueError:
            raise UnknownNameError(f"malformed CPU list {text!r}", kind="CPU list",
                                   name=text) from None
        if high < low:
            raise UnknownNameError(f"malformed CPU list {text!r}", kind="CPU list", name=text)
        cpus.update(range(low, high + 1))
    return frozenset(cpus)


def _read_meminfo(path: Path) -> tuple[int, int | None]:
    total, free = 0, None
    try:
        lines = path.read_text(encoding="ascii").splitlines()
    except OSError:
        return total, free
    for line in lines:
        match = _MEMINFO.match(line)
        if match is None:
            continue
        value = int(match.group(2)) * (1024 if match.group(3) else 1)
        if match.group(1) == "MemTotal":
            total = value
        elif match.group(1) == "MemFree":
            free = value
    return total, free


def _system_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


@dataclass(frozen=True, slots=True)
class NumaTopology:
    """The machine's memory nodes, ordered by id."""

    nodes: tuple[NumaNode, ...]

    @classmethod
    def read(cls, root: str | os.PathLike[str] = DEFAULT_SYSFS_ROOT) -> NumaTopology:
        """Read the topology under ``root``; a missing or node-less tree means one node, 0."""
        base = Path(root)
        nodes: list[NumaNode] = []
        try:
            entries = sorted(base.iterdir())
        except OSError:
            entries = []
        for entry in entries:
            match = _NODE_DIR.match(entry.name)
            if match is None or not entry.is_dir():
                continue
            try:
                cpus = parse_cpulist((entry / "cpulist").read_text(encoding="ascii"))
            except OSError:
                cpus = frozenset()
            total, free = _read_meminfo(entry / "meminfo")
            nodes.append(NumaNode(int(match.group(1)), cpus, total, free))
        if not nodes:
            cpu_count = os.cpu_count() or 1
            nodes.append(NumaNode(0, frozenset(range(cpu_count)), _system_memory(), None))
        nodes.sort(key=lambda node: node.id)
        return cls(tuple(nodes))

    @property
    def node_ids(self) -> tuple[int, ...]:
        """The ids of every node."""
        return tuple(node.id for node in self.nodes)

    def node(self, node_id: object) -> NumaNode:
        """The node with id ``node_id``; raise :class:`~tensorarena.errors.UnknownNameError`
        if there is none."""
        if type(node_id) is int:
            for node in self.nodes:
                if node.id == node_id:
                    return node
        raise UnknownNameError(
            f"no NUMA node {node_id!r}: this machine has nodes {list(self.node_ids)}",
            kind="NUMA node", name=node_id, known=tuple(map(str, self.node_ids)),
        )

    def node_of_cpu(self, cpu: int) -> int:
        """The id of the node whose CPU list holds ``cpu``."""
        for node in self.nodes:
            if cpu in node.cpus:
                return node.id
        raise UnknownNameError(f"CPU {cpu} belongs to no NUMA node", kind="CPU", name=cpu)

    def local_node(self) -> int:
        """The node of the CPU the calling thread is running on now."""
        return self.node_of_cpu(current_cpu())

    def __len__(self) -> int:
        return len(self.nodes)


def current_cpu() -> int:
    """The CPU the calling thread runs on now (it may migrate right after: a hint, not a pin)."""
    return libc.sched_getcpu()


def bind_to_node(address: int, nbytes: int, node: int, *, preferred: bool = False) -> None:
    """Bind the page-aligned range ``[address, address + nbytes)`` to ``node``.

    ``preferred=False`` is ``MPOL_BIND`` (pages only from that node; allocation fails rather than
    spill), ``preferred=True`` is ``MPOL_PREFERRED`` (that node first, others when it is full).
    """
    mode = libc.MPOL_PREFERRED if preferred else libc.MPOL_BIND
    try:
        libc.mbind(address, nbytes, mode, [node])
    except OSError as exc:
        message = f"cannot bind memory to NUMA node {node}: {exc}"
        raise NumaBindError(exc.errno or 0, message) from exc


def memory_policy(address: int) -> tuple[str, frozenset[int]]:
    """The policy of the mapping holding ``address``: ``("bind" | "preferred" | ..., nodes)``."""
    mode, nodes = libc.get_mempolicy(address)
    names = {0: "default", 1: "preferred", 2: "bind", 3: "interleave", 4: "local"}
    return names.get(mode, f"mode {mode}"), nodes


def node_of_page(address: int) -> int:
    """The node that holds the page at ``address`` (faulting it in if it is not yet present)."""
    return libc.page_node(address)
