"""NUMA: the topology from a fake sysfs tree, and the real mbind/get_mempolicy on node 0."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pytest

from tensorarena.memory import libc
from tensorarena.memory.host import PAGE_SIZE, map_region, unmap_region
from tensorarena.memory.numa import (
    NumaBindError,
    NumaTopology,
    UnknownNameError,
    bind_to_node,
    current_cpu,
    memory_policy,
    node_of_page,
    parse_cpulist,
)


def _fake_tree(root: Path) -> Path:
    """Two sockets plus a CPU-less memory node (as CXL memory shows up), with sysfs noise."""
    nodes = {
        0: ("0-3,8-11\n", 16 * 1024 * 1024, 1024),
        1: ("4-7,12-15\n", 16 * 1024 * 1024, 2048),
        3: ("\n", 64 * 1024 * 1024, 4096),
    }
    for node, (cpulist, total_kib, free_kib) in nodes.items():
        directory = root / f"node{node}"
        directory.mkdir(parents=True)
        (directory / "cpulist").write_text(cpulist)
        (directory / "meminfo").write_text(
            f"Node {node} MemTotal:       {total_kib} kB\n"
            f"Node {node} MemFree:        {free_kib} kB\n"
            f"Node {node} MemUsed:        {total_kib - free_kib} kB\n"
            f"Node {node} HugePages_Total:     0\n"
        )
    (root / "online").write_text("0-1,3\n")
    (root / "possible").write_text("0-7\n")
    (root / "nodefake").mkdir()  # not nodeN: ignored
    return root


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0", {0}),
        ("0-3", {0, 1, 2, 3}),
        ("0-1,8,10-11\n", {0, 1, 8, 10, 11}),
        ("", set()),
        ("\n", set()),
        (" 2 , 4-5 ", {2, 4, 5}),
    ],
)
def test_parse_cpulist(text: str, cpus: set[int]) -> None:
    assert parse_cpulist(text) == frozenset(cpus)


@pytest.mark.parametrize("text", ["a", "3-1", "1-", "0,,x"])
def test_malformed_cpulists_are_refused(text: str) -> None:
    with pytest.raises(UnknownNameError, match="malformed"):
        parse_cpulist(text)


def test_topology_of_a_fake_two_socket_machine(tmp_path: Path) -> None:
    topology = NumaTopology.read(_fake_tree(tmp_path))
    assert topology.node_ids == (0, 1, 3)
    assert len(topology) == 3
    assert topology.node(0).cpus == frozenset({0, 1, 2, 3, 8, 9, 10, 11})
    assert topology.node(1).memory_total == 16 * 1024**3
    assert topology.node(1).memory_free == 2048 * 1024
    assert topology.node(3).cpus == frozenset()
    assert topology.node_of_cpu(5) == 1
    assert topology.node_of_cpu(9) == 0
    with pytest.raises(UnknownNameError, match=r"\[0, 1, 3\]"):
        topology.node(2)
    with pytest.raises(UnknownNameError):
        topology.node("0")
    with pytest.raises(UnknownNameError, match="CPU 64"):
        topology.node_of_cpu(64)


def test_a_tree_without_nodes_is_one_node_with_every_cpu(tmp_path: Path) -> None:
    for root in (tmp_path, tmp_path / "missing"):
        topology = NumaTopology.read(root)
        assert topology.node_ids == (0,)
        assert topology.node(0).cpus == frozenset(range(os.cpu_count() or 1))
        assert topology.node(0).memory_total > 0


def test_this_machine_has_a_node_for_the_current_cpu() -> None:
    topology = NumaTopology.read()
    cpu = current_cpu()
    assert cpu in os.sched_getaffinity(0)
    assert topology.local_node() in topology.node_ids
    assert topology.node_of_cpu(cpu) in topology.node_ids


def test_current_cpu_falls_back_to_proc(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoSchedGetcpu:
        def sched_getcpu(self) -> int:
            raise AttributeError("sched_getcpu")

    monkeypatch.setattr(libc, "_libc", lambda: NoSchedGetcpu())
    assert libc.sched_getcpu() in os.sched_getaffinity(0)


def test_bind_to_node_zero_for_real() -> None:
    address = map_region(8 * PAGE_SIZE, PAGE_SIZE)
    try:
        assert memory_policy(address)[0] == "default"
        try:
            bind_to_node(address, 8 * PAGE_SIZE, 0)
        except NumaBindError as exc:  # pragma: no cover - containers that forbid mbind
            pytest.skip(f"mbind refused here: {exc}")
        assert memory_policy(address) == ("bind", frozenset({0}))
        ctypes.memset(address, 1, 8 * PAGE_SIZE)
        assert node_of_page(address) == 0
        assert node_of_page(address + 7 * PAGE_SIZE) == 0
        bind_to_node(address, 8 * PAGE_SIZE, 0, preferred=True)
        assert memory_policy(address) == ("preferred", frozenset({0}))
    finally:
        unmap_region(address, 8 * PAGE_SIZE)


def test_binding_to_a_node_the_kernel_lacks_is_an_error() -> None:
    address = map_region(PAGE_SIZE, PAGE_SIZE)
    try:
        missing = max(NumaTopology.read().node_ids) + 1
        with pytest.raises(NumaBindError) as error:
            bind_to_node(address, PAGE_SIZE, missing)
        assert error.value.errno != 0
        assert memory_policy(address)[0] == "default", "a failed bind must change nothing"
    finally:
        unmap_region(address, PAGE_SIZE)
