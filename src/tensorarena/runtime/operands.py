"""Broadcast operands of matrix products copied into planned buffers before the product.

A matrix whose strides BLAS cannot take (a zero stride: an ``expand``, such as the gradient of
a ``sum`` spread over its input's shape) is made contiguous inside ``mm``/``bmm``/``addmm``:
a torch allocation on top of the arena at every call (16 384 bytes on tiny GPT-2's training
step, the largest one torch made in it once the gradients were planned).
:func:`contiguous_operands` puts that copy in the graph instead, as a ``clone`` node just
before the product: the front end plans its buffer like any other (its bytes then come from
the arena, reused), ``clone.out`` writes it, and the product reads the contiguous copy it would
have made itself, so the result is the same bit for bit. CPU graphs only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tensorarena.planning.torch_graph import meta_value

if TYPE_CHECKING:
    import torch.fx

__all__ = ["contiguous_operands"]


def _broadcast(value: Any) -> bool:
    """A CPU tensor with a zero stride along a dimension of more than one element."""
    import torch

    if not isinstance(value, torch.Tensor) or value.device.type != "cpu":
        return False  # shape-only metadata (no clone to make) or another device
    return any(stride == 0 and size > 1 for size, stride in zip(value.shape, value.stride(),
                                                                strict=True))


def contiguous_operands(graph: torch.fx.Graph) -> list[str]:
    """Insert a contiguous ``clone`` before every broadcast matrix operand of ``mm``, ``bmm``
    and ``addmm`` in ``graph`` (module docstring); return the names of the products rewritten."""
    import torch

    aten = torch.ops.aten
    matrices = {aten.mm.default: (0, 1), aten.bmm.default: (0, 1), aten.addmm.default: (1, 2)}
    rewritten: list[str] = []
    for node in list(graph.nodes):
        positions = matrices.get(node.target) if node.op == "call_function" else None
        if positions is None:
            continue
        args = list(node.args)
        for k in positions:
            operand = args[k] if k < len(args) else None
            if not isinstance(operand, torch.fx.Node) or not _broadcast(meta_value(operand)):
                continue
            with graph.inserting_before(node):
                copy = graph.call_function(aten.clone.default, (operand,),
                                           {"memory_format": torch.contiguous_format})
            copy.meta["val"] = meta_value(operand).clone(memory_format=torch.contiguous_format)
            args[k] = copy
        if args != list(node.args):
            node.args = tuple(args)
            rewritten.append(node.name)
    return rewritten
