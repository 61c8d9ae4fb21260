"""Python numbers given to ATen as tensors, made once per program instead of at every call.

``x * 0.5`` in a graph is ``aten.mul.Tensor(x, 0.5)``: a number where the schema wants a
``Tensor``. ATen wraps it in a fresh one-element CPU tensor at every call (8 bytes from the
system allocator) and, when its dtype is not the computation's, converts it (4 bytes more); the
``.Scalar`` overloads of comparisons (``ne.Scalar(x, 0)``) wrap it the same way inside. On tiny
GPT-2 they were most of the planned call's allocator calls in steady state (``bench/RESULTS.md``).

:func:`hoisted` rewrites one node's call once, when the program's code is generated: each such
number becomes a 0-dim CPU tensor of the dtype of the op's first tensor argument (that is not a
``where`` condition), made here and
held by the generated code, and a comparison's ``.Scalar`` overload becomes its ``.Tensor`` twin
(same arguments, the number as a tensor; ``where.ScalarOther`` becomes ``where.self``, which
has an out variant). Results are bit-identical because the rewrite is made
only where nothing can change: the tensor's dtype is ``float32``, ``float64``, an integer type or
``bool`` (there ATen computes in that dtype, so the wrapped number was cast to it anyway; for
``float16``/``bfloat16`` ATen computes a number in ``float``, so those are left alone), and the
number's kind does not exceed the tensor's (an ``int`` tensor times ``0.5`` promotes to float:
left alone). A 0-dim CPU tensor is also what kernels accept beside CUDA tensors, so the same
rewrite serves the GPU.

:func:`mean_as_sum` does the same for a number ATen makes itself: on the CPU, ``mean.out`` is
``sum.out`` then ``div_`` by the count of elements reduced, wrapped at every call (8 + 4 bytes;
10 calls per tiny Llama call, one pair per RMSNorm). The generated code calls ``sum.IntList_out``
and divides by the count made once: the same two kernels on the same values, bit for bit
(checked on float32 and float64). Not on a GPU, where ``mean`` is one kernel of its own.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tensorarena.planning.torch_graph import is_tensor_like, meta_value

if TYPE_CHECKING:
    import torch.fx

__all__ = ["hoisted", "mean_as_sum"]

#: Comparisons whose ``.Scalar`` overload wraps its number; their ``.Tensor`` twin takes it made.
_COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})
_EXACT_FLOATS = ("float32", "float64")
_INTEGERS = ("int8", "int16", "int32", "int64", "uint8")


def _kind_fits(value: object, dtype: str) -> bool:
    if isinstance(value, bool):
        return True
    if isinstance(value, int):
        return dtype != "bool" and (dtype in _EXACT_FLOATS or dtype in _INTEGERS)
    if isinstance(value, float):
        return dtype in _EXACT_FLOATS
    return False


@functools.cache
def _tensor_twin(op: Any) -> Any:
    """``ne.Scalar`` → ``ne.Tensor``, ``where.ScalarOther`` → ``where.self`` (same argument
    names and order), else None."""
    packet = op.overloadpacket
    if packet.__name__ == "where" and op._overloadname == "ScalarOther":
        twin = getattr(packet, "self", None)
    elif packet.__name__ not in _COMPARISONS or op._overloadname != "Scalar":
        return None
    else:
        twin = getattr(packet, "Tensor", None)
    if twin is None:
        return None
    names = [a.name for a in op._schema.arguments]
    return twin if [a.name for a in twin._schema.arguments] == names else None


def hoisted(node: torch.fx.Node, make: Any) -> tuple[Any, tuple[Any, ...], dict[str, Any]] | None:
    """``(target, args, kwargs)`` for ``node`` with its wrapped numbers made once (module
    docstring), or None when nothing changes. ``make(value, dtype)`` makes the 0-dim tensor."""
    op: Any = node.target
    schema = getattr(op, "_schema", None)
    if schema is None or node.op != "call_function":
        return None
    tensors = [meta_value(a) for a in node.all_input_nodes if is_tensor_like(meta_value(a))]
    if not tensors:
        return None
    # The operand the number combines with: the first that is not a mask (where's condition).
    first = next((t for t in tensors if str(t.dtype) != "torch.bool"), tensors[0])
    dtype = str(first.dtype).removeprefix("torch.")
    twin = _tensor_twin(op)
    target: Any = twin if twin is not None else op
    positions: Mapping[str, int] = {a.name: k for k, a in enumerate(target._schema.arguments)}
    types = [str(a.type) for a in target._schema.arguments]

    def replace(name: str, value: Any) -> Any:
        k = positions.get(name)
        if k is None or types[k] != "Tensor" or isinstance(value, type(node)):
            return value
        if isinstance(value, (bool, int, float)) and _kind_fits(value, dtype):
            return make(value, dtype)
        return value

    names = [a.name for a in schema.arguments]
    args = tuple(replace(names[k], v) if k < len(names) else v for k, v in enumerate(node.args))
    kwargs = {name: replace(name, v) for name, v in node.kwargs.items()}
    changed = any(a is not b for a, b in zip(args, node.args, strict=True)) or any(
        kwargs[k] is not v for k, v in node.kwargs.items())
    if not changed:
        return None
    return target, args, kwargs


def mean_as_sum(node: torch.fx.Node) -> tuple[Any, int] | None:
    """``(sum.IntList_out, count)`` when ``node``'s ``mean.dim`` may run as ``sum`` then ``div_``
    by ``count`` (module docstring), else None."""
    import torch

    if node.target is not torch.ops.aten.mean.dim or node.kwargs.get("dtype") is not None:
        return None
    source = node.args[0]
    value: Any = meta_value(source) if isinstance(source, type(node)) else None
    if not is_tensor_like(value) or value.device.type != "cpu":
        return None
    if value.dtype not in (torch.float32, torch.float64):
        return None
    dims: Any = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    shape = value.shape
    if dims is None or len(dims) == 0:
        dims = range(len(shape))
    count = 1
    for d in dims:
        size = shape[d]
        if not isinstance(size, int):
            return None  # a symbolic size: the count changes with the shape
        count *= size
    if count == 0 or count >= 1 << 24:
        return None  # float32 holds every count below 2**24 exactly
    return torch.ops.aten.sum.IntList_out, count
