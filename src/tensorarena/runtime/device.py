"""Where a planned program's arena lives: on its graph's device, in memory of the matching kind.

A graph whose tensors are on the CPU gets its arena in host memory (:func:`tensorarena.empty`
over the resource; default: tensorarena's default resource). A graph whose tensors are on
``cuda:N`` gets it on that device: a :class:`~tensorarena.interop.DeviceArray` from the resource
(default: ``stream_ordered_pool(N)``, the device's best-fit pool over ``cudaMalloc`` reused in
stream order) that torch wraps as a CUDA ``uint8`` tensor through ``__cuda_array_interface__``
(no copy; torch holds the array, so the bytes go back when the last slot over them is gone, and
reach another stream only after the legacy default stream, which orders after torch's blocking
streams, has passed the free). The same planned code then
runs over device memory: slots are views of that tensor and ``out=`` kernels write into them.

The device is read from the graph once (:func:`graph_device`: every tensor value's device; one
accelerator at most), and a resource that cannot serve it is refused before anything is
allocated: host memory for a CUDA graph, device memory for a CPU graph, another device's pool.
Tensors of a CUDA graph that stay on the CPU (a scalar made on the host) are left out of the
plan (:func:`off_device`): an ``out=`` kernel cannot write them into a device slot.

Only :func:`_as_cuda_tensor` needs a real GPU; the tests on the CPU replace it, so every
decision above runs there against the simulated CUDA runtime (tensorarena.testing.cuda).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from tensorarena.errors import InvalidArgumentError, InvalidResourceError
from tensorarena.memory.resource import check_resource
from tensorarena.memory_kind import MemoryKind, memory_kind_of
from tensorarena.planning.torch_graph import is_tensor_like, meta_value

if TYPE_CHECKING:
    import torch
    import torch.fx

    from tensorarena.memory.resource import MemoryResource

__all__ = ["BLOCK_ALIGNMENT", "CPU", "check_arena", "common_device", "device_block", "graph_device",
           "off_device"]

CPU = "cpu"
#: Offsets of planned buffers are multiples of this (the front ends' default buffer
#: alignment); so is every block's address.
BLOCK_ALIGNMENT = 256


def _device_name(value: Any) -> str | None:
    device = getattr(value, "device", None)
    if device is None or device.type == "meta":
        return None
    if device.type == "cpu":
        return CPU
    return f"{device.type}:{device.index if device.index is not None else 0}"


def _values(graph: torch.fx.Graph) -> Iterable[Any]:
    for node in graph.nodes:
        value = meta_value(node)
        for v in value if isinstance(value, (list, tuple)) else (value,):
            if is_tensor_like(v):
                yield v


def graph_device(graph: torch.fx.Graph) -> str:
    """``"cpu"``, or ``"cuda:N"`` when the graph's tensors are on that accelerator (CPU
    tensors may sit beside it). Tensors on two accelerators are refused: one arena, one device."""
    return common_device(_values(graph))


def common_device(tensors: Iterable[Any]) -> str:
    """The device of ``tensors`` as :func:`graph_device` decides it (non-tensors ignored)."""
    found = {name for name in map(_device_name, tensors) if name is not None}
    accelerators = sorted(found - {CPU})
    if len(accelerators) > 1:
        raise InvalidArgumentError(
            f"the graph's tensors are on several devices ({', '.join(accelerators)}); a planned "
            "program keeps its intermediates in one arena on one device: plan each part apart"
        )
    return accelerators[0] if accelerators else CPU


def off_device(values: Mapping[str, Any], device: str) -> dict[str, str]:
    """Tensor name -> reason, for the tensors of ``values`` that are not on ``device``."""
    return {name: f"on {where}, the arena is on {device}" for name, value in values.items()
            if (where := _device_name(value)) is not None and where != device}


def _index(device: str) -> int:
    kind, _, index = device.partition(":")
    if kind != "cuda" or not index.isdigit():
        raise InvalidArgumentError(f"an arena lives on 'cpu' or 'cuda:N', not {device!r}")
    return int(index)


def check_arena(resource: object, device: str) -> None:
    """Raise now what :func:`device_block` would raise at the first block for ``resource`` and
    ``device``: a device that is not ``"cpu"`` or ``"cuda:N"``, a resource of the wrong kind."""
    if device != CPU:
        _index(device)
    if resource is not None:
        check_resource(resource, name="resource")
        _check_resource(resource, device)


def _check_resource(resource: object, device: str) -> None:
    from tensorarena.interop.device_arrays import device_of

    kind = memory_kind_of(resource)
    name = type(resource).__name__
    if device == CPU:
        if kind is not None and not kind.host_accessible:
            raise InvalidResourceError(
                f"the graph runs on the CPU but {name} holds {kind.value} memory; give a host "
                "resource (or move the model and inputs to the GPU)"
            )
        return
    if kind not in (MemoryKind.DEVICE, MemoryKind.MANAGED):
        shown = "declares no memory_kind" if kind is None else f"holds {kind.value} memory"
        raise InvalidResourceError(
            f"the graph runs on {device} but {name} {shown}; give device or managed memory "
            f"(tensorarena.device_pool({_index(device)}), or a Pool over CudaMemory)"
        )
    owner = device_of(resource)
    if owner is not None and owner != _index(device):
        raise InvalidResourceError(
            f"the graph runs on {device} but {name} allocates on device {owner}"
        )


def _as_cuda_tensor(array: Any, device: str) -> torch.Tensor:
    """A CUDA tensor over ``array``'s bytes (the one step that needs a GPU)."""
    import torch

    return torch.as_tensor(array, device=device)


def device_block(nbytes: int, resource: MemoryResource | None, device: str) -> torch.Tensor:
    """A ``uint8`` tensor of ``nbytes`` bytes on ``device`` from ``resource`` (default: the
    default resource on the CPU, ``stream_ordered_pool(N)`` on ``cuda:N``); see the module
    docstring."""
    if device == CPU:
        from tensorarena.interop import empty

        if resource is not None:
            _check_resource(resource, device)
        memory = empty(nbytes, np.uint8, resource=resource, like="torch", alignment=BLOCK_ALIGNMENT)
        return cast("torch.Tensor", memory)
    from tensorarena.interop.device_arrays import device_empty

    index = _index(device)
    if resource is None:
        from tensorarena.interop.stream_pools import stream_ordered_pool

        resource = stream_ordered_pool(index)
    _check_resource(resource, device)
    array = device_empty(nbytes, np.uint8, resource=resource, alignment=BLOCK_ALIGNMENT)
    return _as_cuda_tensor(array, device)
