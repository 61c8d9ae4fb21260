"""One node's statement in the generated code, and the writer of that code's source lines.

:func:`write_statement` emits the line(s) that run one node on the path
:func:`~tensorarena.runtime.lowering.classify` chose for it: the op as it is, its out variant
with the slots as ``out`` (or an in-slot rewrite, :mod:`~tensorarena.runtime.in_slot`) inside a
``try`` that falls back to a copy, the op followed by a copy into its slots, or the out variant
into blocks of the dynamic pool. :class:`SourceWriter` holds the lines and the globals they name
(constants are hoisted, never printed).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tensorarena.runtime.in_slot import (
    clone_in_slot,
    embedding_backward_in_slot,
    embedding_dense_backward_into,
    embedding_in_slot,
    written_in_slot,
)
from tensorarena.runtime.ops import out_variant
from tensorarena.runtime.scalars import hoisted, mean_as_sum

if TYPE_CHECKING:
    import torch
    import torch.fx

    from tensorarena.runtime.lowering import Lowering

__all__ = ["SourceWriter", "resolve_target", "write_statement"]


def resolve_target(owner: Any, target: str) -> Any:
    """The attribute of ``owner`` that a ``get_attr`` or ``call_module`` target names (dotted)."""
    value = owner
    for part in target.split("."):
        value = getattr(value, part)
    return value


def write_statement(
    writer: SourceWriter,
    node: torch.fx.Node,
    i: int,
    index: Mapping[torch.fx.Node, int],
    lowering: Lowering,
    slots: Mapping[str, torch.Tensor],
    failed: dict[str, str],
    pool_tensor: Callable[[str], Any] | None,
    owner: Any,
) -> None:
    """Append the statement that runs ``node`` (index ``i``) on its path in ``lowering``."""
    lines = writer.lines
    target = node.target
    if node.op == "call_module":
        target = resolve_target(owner, str(target))
    if target is operator.getitem and len(node.args) == 2 and isinstance(node.args[1], int):
        lines.append(f"    v{i} = {writer.expr(node.args[0], index)}[{node.args[1]}]")
        return
    call_args, call_kwargs = node.args, node.kwargs
    rewritten = hoisted(node, _zero_dim) if node.op == "call_function" else None
    if rewritten is not None:  # classify chose the path for this target (_call_target)
        target, call_args, call_kwargs = rewritten
    target = _out_of_place_detach(target)
    args = ", ".join(
        [writer.expr(a, index) for a in call_args]
        + [f"{k}={writer.expr(v, index)}" for k, v in call_kwargs.items()]
    )
    if node.op == "call_method":
        self_arg, *rest = node.args
        rest_args = ", ".join(
            [writer.expr(a, index) for a in rest]
            + [f"{k}={writer.expr(v, index)}" for k, v in node.kwargs.items()]
        )
        call = f"{writer.expr(self_arg, index)}.{target}({rest_args})"
    else:
        call = f"{writer.const(_raw(target))}({args})"
    path = lowering.paths.get(node.name)
    names = lowering.results.get(node.name, [])
    sep = ", " if args else ""
    if path is None or path.path in ("alias", "dynamic", "other"):
        lines.append(f"    v{i} = {call}")
    elif path.path == "out":
        variant = out_variant(target)
        assert variant is not None  # classify chose "out" because there is one
        if variant.dropped:  # tensor options the slot already has
            args = ", ".join(
                [writer.expr(a, index) for a in call_args]
                + [f"{k}={writer.expr(v, index)}" for k, v in call_kwargs.items()
                   if k not in variant.dropped]
            )
            sep = ", " if args else ""
        outs = ", ".join(
            f"{kw}={writer.const(slots[str(name)])}"
            for kw, name in zip(variant.outputs, names, strict=True)
        )
        lines.append("    try:")
        summed = mean_as_sum(node)
        result = slots[str(names[0])] if len(names) == 1 else None
        if embedding_in_slot(node) and result is not None and result.is_contiguous():
            weight, indices = (writer.expr(a, index) for a in call_args[:2])
            rows = writer.const(result.view(-1, result.shape[-1]))
            import torch

            select = writer.const(_raw(torch.ops.aten.index_select.out))
            lines.append(f"        {select}({weight}, 0, {indices}.reshape(-1), out={rows})")
            lines.append(f"        v{i} = {writer.const(result)}")
        elif (written := written_in_slot(node)) is not None and result is not None:
            fill = ""  # "empty": the slot is the result
            if written == "copy":
                fill = f".copy_({writer.expr(call_args[0], index)})"
            elif written == "fill":
                fill = f".fill_({writer.expr(call_args[1], index)})"
            elif written in ("one", "zero"):
                fill = ".fill_(1)" if written == "one" else ".zero_()"
            lines.append(f"        v{i} = {writer.const(result)}{fill}")
        elif clone_in_slot(node) and result is not None:
            source = writer.expr(call_args[0], index)
            lines.append(f"        v{i} = {writer.const(result)}.copy_({source})")
        elif embedding_backward_in_slot(node) and len(names) == 1:
            grad, indices, _, padding_idx, _ = (writer.expr(a, index) for a in call_args)
            into = writer.const(embedding_dense_backward_into)
            lines.append(f"        v{i} = {into}({writer.const(slots[str(names[0])])}, "
                         f"{grad}, {indices}, {padding_idx})")
        elif summed is not None and len(names) == 1:  # mean = sum, then divide by a made count
            count = _zero_dim(summed[1], str(slots[str(names[0])].dtype).removeprefix("torch."))
            lines.append(f"        v{i} = {writer.const(_raw(summed[0]))}({args}{sep}{outs})")
            lines.append(f"        v{i}.div_({writer.const(count)})")
        else:
            lines.append(f"        v{i} = {writer.const(_raw(variant.op))}({args}{sep}{outs})")
        lines.append("    except Exception as error:")
        lines.append(f"        _failed[{node.name!r}] = f'{variant.name} failed: {{error}}'")
        lines.append(f"        v{i} = {_copy_into(writer, call, names, slots)}")
    elif path.path == "copy" and _copies_in_place(node, names, slots):
        # A reshape, contiguous or dtype conversion is a copy: the slot (seen in the input's
        # shape) takes the elements straight from the input, in the order the op reads them.
        slot_name, source = writer.const(slots[str(names[0])]), writer.expr(node.args[0], index)
        lines.append(f"    {slot_name}.view({source}.shape).copy_({source})")
        lines.append(f"    v{i} = {slot_name}")
    elif path.path == "copy":
        if writer.note is not None:  # recording kernels' allocations: keep the results' layout
            call = f"{writer.const(writer.note)}({node.name!r}, {call})"
        lines.append(f"    v{i} = {_copy_into(writer, call, names, slots)}")
    elif path.path == "pool":
        variant = out_variant(target)
        assert variant is not None and pool_tensor is not None
        outs = ", ".join(
            f"{kw}={writer.const(pool_tensor(str(name)))}()"
            for kw, name in zip(variant.outputs, names, strict=True)
        )
        lines.append(f"    v{i} = {writer.const(_raw(variant.op))}({args}{sep}{outs})")


def _copies_in_place(node: torch.fx.Node, names: list[str | None],
                     slots: Mapping[str, torch.Tensor]) -> bool:
    """A ``reshape``, ``contiguous`` or ``to(dtype)`` (ops that copy, or return their input)
    whose planned result is a contiguous slot: copy straight into it."""
    import torch

    aten = torch.ops.aten
    if node.target not in (aten.reshape.default, aten.contiguous.default, aten.to.dtype):
        return False
    if len(names) != 1 or (node.target is aten.to.dtype and (
        len(node.args) > 2 or set(node.kwargs) - {"non_blocking"}
    )):
        return False  # to(dtype, non_blocking, copy, memory_format): only the plain form
    result = slots.get(str(names[0]))
    return result is not None and result.is_contiguous() and isinstance(node.args[0], type(node))


def _out_of_place_detach(target: Any) -> Any:
    """``detach`` for ``detach_``, the op as it is otherwise.

    A planned slot is a view of the arena, and torch refuses to detach a view in place
    ("Can't detach views in-place"); export writes ``lift_fresh_copy`` then ``detach_`` for a
    tensor a model makes from data (``torch.tensor([])``, as transformers' ``DynamicCache``
    does). Calls run under ``no_grad``, so the in-place detach changes nothing but a flag
    that no planned tensor has set; the out-of-place one returns a view of the same storage,
    which is the node's result either way.
    """
    import torch

    detach_ = torch.ops.aten.detach_.default
    return torch.ops.aten.detach.default if target is detach_ else target


def _zero_dim(value: bool | int | float, dtype: str) -> torch.Tensor:
    import torch

    return torch.tensor(value, dtype=getattr(torch, dtype))


def _copy_into(
    writer: SourceWriter, call: str, names: list[str | None], slots: Mapping[str, torch.Tensor]
) -> str:
    """An expression: run ``call`` and copy its planned results into their slots."""
    if len(names) == 1 and names[0] is not None and names[0] in slots:
        return f"{writer.const(slots[names[0]])}.copy_({call})"
    parts = []
    for k, name in enumerate(names):
        if name is not None and name in slots:
            parts.append(f"{writer.const(slots[name])}.copy_(_r[{k}])")
        else:
            parts.append(f"_r[{k}]")
    return f"(lambda _r: ({', '.join(parts)},))({call})"


def _raw(target: Any) -> Any:
    """The C++ callable behind an ``OpOverload`` (skips one Python frame per call)."""
    raw = getattr(target, "_op", None)
    return raw if callable(raw) and hasattr(target, "_schema") else target


class SourceWriter:
    """Source lines plus the globals they name: constants are hoisted, never printed."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.globals: dict[str, Any] = {}
        self._names: dict[int, str] = {}
        #: what the copy path passes an op's results through first (KernelHooks.note)
        self.note: Callable[[str, Any], Any] | None = None

    def const(self, value: Any) -> str:
        key = id(value)
        name = self._names.get(key)
        if name is None:
            name = f"_g{len(self._names)}"
            self._names[key] = name
            self.globals[name] = value
        return name

    def expr(self, value: Any, index: Mapping[Any, int]) -> str:
        import torch.fx

        if isinstance(value, torch.fx.Node):
            return f"v{index[value]}"
        if isinstance(value, tuple):
            items = [self.expr(v, index) for v in value]
            return f"({', '.join(items)}{',' if len(items) == 1 else ''})"
        if isinstance(value, list):
            return f"[{', '.join(self.expr(v, index) for v in value)}]"
        if isinstance(value, dict):
            pairs = ", ".join(f"{k!r}: {self.expr(v, index)}" for k, v in value.items())
            return f"{{{pairs}}}"
        if isinstance(value, slice):
            parts = (self.expr(p, index) for p in (value.start, value.stop, value.step))
            return f"slice({', '.join(parts)})"
        if value is None or isinstance(value, (bool, int, str)):
            return repr(value)
        if isinstance(value, float) and math.isfinite(value):
            return repr(value)
        return self.const(value)
