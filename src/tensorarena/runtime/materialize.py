"""From a plan to memory: one block of ``plan.height`` bytes and a tensor per buffer at its offset.

The bridge for users with a runtime of their own: :func:`materialize` takes the graph problem
(which knows every planned buffer's shape, strides and dtype) and a plan of it, takes one block
from a tensorarena resource, and lays a tensor over each buffer's bytes. Buffers that share bytes
in the plan share them here, so a tensor is only meaningful during its buffer's lifetime.

:func:`slot` is the one function that turns (block, offset, layout) into a tensor; the planned
executor (:mod:`tensorarena.runtime.program`) uses it too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from tensorarena._optional import load_torch
from tensorarena.errors import InvalidArgumentError
from tensorarena.planning.graph_problem import GraphProblem, TensorSpec
from tensorarena.planning.problem import Plan
from tensorarena.planning.validate import validate
from tensorarena.runtime.device import BLOCK_ALIGNMENT, CPU, device_block

if TYPE_CHECKING:
    import torch

    from tensorarena.memory.resource import MemoryResource

__all__ = ["BLOCK_ALIGNMENT", "Materialized", "block", "materialize", "slot", "torch_dtype"]



@dataclass(frozen=True)
class Materialized:
    """One block holding every planned buffer: ``block`` is a ``torch.uint8`` tensor of
    ``plan.height`` bytes (from a tensorarena resource), ``tensors`` maps each buffer id to a
    tensor over its bytes with the buffer's shape, strides and dtype."""

    plan: Plan
    block: torch.Tensor
    tensors: dict[str, torch.Tensor]

    @property
    def nbytes(self) -> int:
        """Bytes in the block (``plan.height``)."""
        return self.plan.height

    def __repr__(self) -> str:
        return (
            f"Materialized({self.plan.problem.name!r}, buffers={len(self.tensors)}, "
            f"nbytes={self.nbytes}, address={self.block.data_ptr():#x})"
        )


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype named ``name`` (``"float32"``), as :class:`TensorSpec` stores it."""
    th = load_torch()
    dtype = getattr(th, name, None)
    if not isinstance(dtype, th.dtype):
        raise InvalidArgumentError(f"unknown torch dtype {name!r}")
    return cast("torch.dtype", dtype)


def block(nbytes: int, resource: MemoryResource | None = None, *,
          device: str = CPU) -> torch.Tensor:
    """A ``torch.uint8`` tensor of ``nbytes`` bytes on ``device`` (``"cpu"`` or ``"cuda:N"``)
    from ``resource`` (default: tensorarena's default resource on the CPU, ``device_pool(N)`` on
    a GPU: :mod:`~tensorarena.runtime.device`); the bytes go back when the tensor and every view
    of it are gone."""
    return device_block(nbytes, resource, device)


def slot(memory: torch.Tensor, offset: int, spec: TensorSpec) -> torch.Tensor:
    """A tensor with ``spec``'s layout over ``memory`` (a ``uint8`` tensor) from byte ``offset``.

    Raises :class:`InvalidArgumentError` if the bytes do not fit or ``offset`` is not a multiple
    of the item size (a plan of aligned buffers never is).
    """
    nbytes = spec.nbytes
    if offset < 0 or offset + nbytes > memory.numel():
        raise InvalidArgumentError(
            f"a {nbytes}-byte tensor at offset {offset} does not fit in {memory.numel()} bytes"
        )
    if offset % spec.itemsize:
        raise InvalidArgumentError(
            f"offset {offset} is not a multiple of the item size {spec.itemsize} ({spec.dtype})"
        )
    dtype = torch_dtype(spec.dtype)
    # view(dtype) needs a whole number of items: take the span rounded up to the item size.
    items = -(-nbytes // spec.itemsize) if nbytes else 0
    typed = memory[offset : offset + items * spec.itemsize].view(dtype)
    # as_strided's storage offset counts from the start of the whole storage, not of the view.
    return typed.as_strided(spec.shape, spec.stride, typed.storage_offset() + spec.storage_offset)


def materialize(
    graph: GraphProblem,
    plan: Plan,
    *,
    resource: MemoryResource | None = None,
    specs: Mapping[str, TensorSpec] | None = None,
    device: str = CPU,
) -> Materialized:
    """One block of ``plan.height`` bytes from ``resource`` on ``device`` (``"cuda:N"`` for
    device memory; see :func:`block`) and a tensor per planned buffer at its offset, with the
    shape, strides and dtype of ``graph.tensors`` (or ``specs``).

    The plan is checked first by the independent validator (:func:`~tensorarena.planning.validate`)
    against its own problem, whose buffers must all be buffers of ``graph`` with the same sizes;
    a plan of a subset of the graph's buffers (a runtime leaving some out) is fine. Raises
    :class:`InvalidArgumentError` for a buffer without a layout, a plan of another graph, or
    arguments of the wrong kind (the resource in the plan's place).
    """
    if not isinstance(graph, GraphProblem):
        raise InvalidArgumentError(
            f"graph must be a GraphProblem (from problem_from_exported or problem_from_fx), "
            f"got {type(graph).__name__}"
        )
    if not isinstance(plan, Plan):
        raise InvalidArgumentError(
            f"plan must be a Plan (plan(graph.problem)), got {type(plan).__name__}"
        )
    validate(plan.problem, plan)
    specs = graph.tensors if specs is None else specs
    sizes = {b.id: b.nbytes for b in graph.problem.buffers}
    for buffer in plan.problem.buffers:
        if sizes.get(buffer.id) != buffer.nbytes:
            raise InvalidArgumentError(
                f"buffer {buffer.id!r} of the plan is not a {buffer.nbytes}-byte buffer of "
                f"graph {graph.name!r}"
            )
        if buffer.id not in specs:
            raise InvalidArgumentError(
                f"buffer {buffer.id!r} has no shape/dtype (graph problems from the PyTorch "
                "front end carry them; ONNX ones do not yet)"
            )
    memory = block(plan.height, resource, device=device)
    tensors = {
        buffer.id: slot(memory, offset, specs[buffer.id])
        for buffer, offset in zip(plan.problem.buffers, plan.offsets, strict=True)
    }
    return Materialized(plan, memory, tensors)
