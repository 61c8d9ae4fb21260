"""Kernels run straight in their slot where ATen's out variant computes elsewhere and copies.

``embedding.out`` makes the rows of the table that the indices pick, then copies them into
``out``; ``embedding`` itself is ``weight.index_select(0, indices.reshape(-1))`` viewed in the
result's shape, so :func:`embedding_in_slot` nodes run ``index_select.out`` straight into the
slot seen as ``(-1, dim)``: the same rows, no allocation (one per embedding per call before:
two on tiny GPT-2, three on tiny BERT).

Factories and conversions go the same way (:func:`written_in_slot`): ``empty_like``,
``new_empty`` and ``empty`` write nothing (the slot is their memory), ``_to_copy`` is
``empty`` then ``copy_`` in ATen itself, ``full_like``/``ones_like``/``new_ones`` a ``fill_``
and ``zeros_like``/``new_zeros`` a ``zero_``: their out variants made the result elsewhere first
(an ``empty_like`` feeding a dropout mask, 8 192 bytes per call on tiny GPT-2's step; T5's step
had 16 384 of them at its peak).

``clone.out`` clones elsewhere, then copies. A clone is its input's values in the layout the
graph gave it, which is the slot's, so :func:`clone_in_slot` nodes run ``slot.copy_(input)``.

``embedding_dense_backward.out`` on the CPU makes a zeroed gradient table of its own, adds each
index's row of the incoming gradient into it, in index order, and then copies the table into
``out``: a whole embedding table allocated by torch on top of the arena (32 768 bytes on tiny
GPT-2, the largest allocation of its planned training step once the gradients are planned).
:func:`embedding_dense_backward_into` does the same adds in the slot itself: zero it,
``index_add_`` the rows in the same order, zero the padding row ATen skips. Float32 and float64
add the same values in the same order, so the table is the same bit for bit (checked, repeated
indices and a padding row included); half types and ``scale_grad_by_freq`` keep ATen's out
variant, and so does a GPU, where ``index_add_`` accumulates with atomics in no fixed order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from tensorarena.planning.torch_graph import is_tensor_like, meta_value

if TYPE_CHECKING:
    import torch
    import torch.fx

__all__ = [
    "Written",
    "clone_in_slot",
    "embedding_backward_in_slot",
    "embedding_dense_backward_into",
    "embedding_in_slot",
    "written_in_slot",
]

#: How a factory or conversion fills its slot: nothing, a copy of its input, a fill with its
#: second argument, with one, or with zero.
Written = Literal["empty", "copy", "fill", "one", "zero"]


def written_in_slot(node: torch.fx.Node) -> Written | None:
    """How ``node`` fills its slot when it is a factory or conversion that needs no kernel of
    its own there (module docstring), else None."""
    import torch

    aten = torch.ops.aten
    kinds: dict[Any, Written] = {
        aten.empty_like.default: "empty", aten.new_empty.default: "empty",
        aten.empty.memory_format: "empty", aten._to_copy.default: "copy",
        aten.full_like.default: "fill", aten.ones_like.default: "one",
        aten.new_ones.default: "one", aten.zeros_like.default: "zero",
        aten.new_zeros.default: "zero",
    }
    kind = kinds.get(node.target)
    if kind == "copy" and not (node.args and isinstance(node.args[0], type(node))):
        return None
    if kind == "fill" and (len(node.args) < 2 or isinstance(node.args[1], type(node))):
        return None  # the value is a tensor: full_like takes a number
    return kind


def clone_in_slot(node: torch.fx.Node) -> bool:
    """Whether ``node`` is a ``clone`` (any memory format: the slot has the layout chosen), which
    runs as a copy into its slot (module docstring)."""
    import torch

    return node.target is torch.ops.aten.clone.default and bool(node.args)


def embedding_in_slot(node: torch.fx.Node) -> bool:
    """Whether ``node`` is an ``embedding`` whose rows ``index_select.out`` can write into its
    slot (module docstring); the slot must be contiguous, which the generator checks."""
    import torch

    return node.target is torch.ops.aten.embedding.default and len(node.args) >= 2


def embedding_backward_in_slot(node: torch.fx.Node) -> bool:
    """Whether ``node`` is an ``embedding_dense_backward`` that
    :func:`embedding_dense_backward_into` computes exactly (module docstring)."""
    import torch

    if node.target is not torch.ops.aten.embedding_dense_backward.default:
        return False
    if len(node.args) != 5 or node.kwargs or node.args[4] is not False:
        return False  # scale_grad_by_freq, or arguments given by name: ATen's own
    grad = node.args[0]
    value: Any = meta_value(grad) if isinstance(grad, type(node)) else None
    return (is_tensor_like(value) and value.device.type == "cpu"
            and value.dtype in (torch.float32, torch.float64)
            and isinstance(node.args[3], int))


def embedding_dense_backward_into(out: torch.Tensor, grad: torch.Tensor,
                                  indices: torch.Tensor, padding_idx: int) -> torch.Tensor:
    """``embedding_dense_backward(grad, indices, len(out), padding_idx, False)`` written in
    ``out`` (a ``(num_weights, dim)`` table); returns ``out``."""
    out.zero_()
    out.index_add_(0, indices.reshape(-1), grad.reshape(-1, out.shape[-1]))
    if padding_idx >= 0:
        out[padding_idx].zero_()
    return out
