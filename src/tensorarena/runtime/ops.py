"""Which ATen ops can write their result into a given tensor: ``out=`` overloads from op schemas.

An op overload such as ``aten::mm(Tensor self, Tensor mat2) -> Tensor`` has an out variant when
its overload packet holds another overload with the same arguments, in the same order with the
same types, plus keyword-only outputs annotated as written (``Tensor(a!) out``), one per return:
``aten::mm.out``, ``aten::add.out`` for ``add.Tensor``, ``add.Scalar_out`` for ``add.Scalar``,
``native_layer_norm.out(..., out0, out1, out2)`` for a three-output op. Matching on the whole
argument list, not on overload names, finds all of these. Two widenings, each exact:

* a factory's keyword-only tensor options (``dtype``, ``layout``, ``device``, ``pin_memory``) may
  be missing from its out variant (``arange.default`` → ``arange.out``): the slot written is
  already of the node's dtype, layout and device, so they are dropped from the call
  (:attr:`OutVariant.dropped`);
* the operator dunders ``__and__``/``__or__``/``__xor__`` are ``bitwise_and``/``_or``/``_xor``
  (ATen implements them so) and take those out variants.

Answers are cached per op overload: a runtime asks once per node when it builds a program.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

__all__ = ["OutVariant", "out_differs", "out_variant"]


@dataclass(frozen=True)
class OutVariant:
    """The out overload of an op: call ``op(*args, **kwargs, **{name: tensor for each output})``."""

    op: Any  #: the ``torch._ops.OpOverload`` of the out variant
    outputs: tuple[str, ...]  #: keyword names of its outputs, in the order of the op's returns
    dropped: frozenset[str] = frozenset()  #: keyword arguments of the op to leave out of the call

    @property
    def name(self) -> str:
        """The schema name with overload, e.g. ``aten::mm.out``."""
        schema = self.op._schema
        return f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name


def out_variant(op: Any) -> OutVariant | None:
    """The out variant of an ``OpOverload`` (``torch.ops.aten.mm.default`` → ``mm.out``), or
    ``None`` when it has none (views, in-place ops, composite ops such as ``layer_norm``, factory
    functions whose out variant takes other arguments, ops that are not ``OpOverload``\\ s)."""
    try:
        return _out_variant(op)
    except TypeError:  # unhashable target: not an op overload
        return None


#: Keyword-only arguments of factories that the out tensor decides instead.
_TENSOR_OPTIONS = frozenset({"dtype", "layout", "device", "pin_memory"})
#: Operator dunders and the ops ATen runs for them.
_SAME_AS = {"__and__": "bitwise_and", "__or__": "bitwise_or", "__xor__": "bitwise_xor"}


@functools.cache
def _out_variant(op: Any) -> OutVariant | None:
    schema = getattr(op, "_schema", None)
    packet = getattr(op, "overloadpacket", None)
    if schema is None or packet is None or schema.is_mutable or not schema.returns:
        return None
    if any(ret.alias_info is not None for ret in schema.returns):
        return None  # a view or an in-place op: its result is an input's storage already
    if any(str(ret.type) != "Tensor" for ret in schema.returns):
        return None  # lists and optional results have no fixed slot
    wanted = [_signature(arg) for arg in schema.arguments]
    options = frozenset(a.name for a in schema.arguments
                        if a.kwarg_only and a.name in _TENSOR_OPTIONS)
    without = [s for s in wanted if s[0] not in options]
    packets = [packet]
    if packet.__name__ in _SAME_AS:
        import torch

        packets.append(getattr(torch.ops.aten, _SAME_AS[packet.__name__]))
    for owner in packets:
        for name in owner.overloads():
            candidate = getattr(owner, name)
            arguments = candidate._schema.arguments
            outputs = [arg for arg in arguments if arg.is_out]
            if len(outputs) != len(schema.returns) or any(str(a.type) != "Tensor"
                                                          for a in outputs):
                continue
            inputs = [_signature(arg) for arg in arguments if not arg.is_out]
            if inputs == wanted:
                return OutVariant(candidate, tuple(arg.name for arg in outputs))
            if options and inputs == without:
                return OutVariant(candidate, tuple(arg.name for arg in outputs), options)
    return None


def _signature(arg: Any) -> tuple[str, str, bool]:
    return arg.name, str(arg.type), bool(arg.kwarg_only)


def out_differs(node: Any) -> bool:
    """Whether ``node``'s out variant computes by another kernel than the op itself, so that its
    result may differ in the last bit: ``adaptive_avg_pool2d`` to ``1 x 1`` is a ``mean`` in
    ATen's composite op but a pooling kernel in ``adaptive_avg_pool2d.out`` (ResNet's pooled
    output). Such a node takes the copy path (run, then copied into its slot)."""
    import torch

    if node.target is not torch.ops.aten.adaptive_avg_pool2d.default or len(node.args) < 2:
        return False
    size = node.args[1]
    return isinstance(size, (list, tuple)) and all(v == 1 for v in size)
