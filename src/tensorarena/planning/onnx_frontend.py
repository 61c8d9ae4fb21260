"""Planning problems from ONNX models, with concrete shapes for every tensor.

One buffer per node output, sized from its shape and element type. Time is the node's position
in topological order (the order of ``graph.node`` when it is already topological, as the standard
requires; otherwise a stable topological sort). Graph inputs, initializers, the outputs of
``Constant`` nodes and whatever shape arithmetic folds to a constant are not planned: their bytes
are part of the model (runtimes fold constants into initializers) and are reported with their
sizes. So are the outputs of deterministic nodes whose inputs are all constants (a ``Transpose``
of a tied embedding for the LM head, as the dynamo exporter writes GPT-2's): ONNX Runtime's
constant folding makes them initializers when the session loads, never arena tensors. As there,
an initializer that is also a graph input (IR < 4) can be overridden at run time, so it and what
is computed from it are not constant. Initializers are reported as parameters: ONNX does not
tell weights from other constants.
Graph outputs live to the end. An output nothing reads (an optional output such as a training
``Dropout``'s mask) lives for its node's step only, and one whose size cannot be known is left
out: nobody needs its bytes.

ONNX has no views, but runtimes give the outputs of ``Reshape``, ``Flatten``, ``Squeeze``,
``Unsqueeze`` and ``Identity`` their data input's bytes (ONNX Runtime's ``Alias(0, 0)``
kernels). ``alias_reshapes=True``, the default, models that, so that our plans are comparable
with ONNX Runtime's: those outputs alias their input and extend its lifetime, as views do in the
PyTorch front end. ``alias_reshapes=False`` gives every output fresh storage.

Tensors used inside the subgraphs of ``If``/``Loop``/``Scan`` count as used by that node; the
subgraphs' own temporaries are not planned.

Shapes come from :mod:`~tensorarena.planning.onnx_shapes`: ONNX shape inference with data
propagation, stale exporter hints dropped, constant shape arithmetic folded, and, as a last resort
for models whose inputs are all static, one run of the reference evaluator. ``input_shapes`` pins
the graph inputs' symbolic dimensions (``batch``, ``seq``) so that all of this can finish; a
tensor whose size still cannot be pinned down raises :class:`InvalidProblemError` naming it and
the node that makes it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tensorarena._optional import require
from tensorarena.errors import InvalidArgumentError, InvalidProblemError
from tensorarena.planning.graph_problem import GraphProblem, Liveness
from tensorarena.planning.onnx_shapes import (
    FOLDED,
    UNFOLDABLE,
    infer_concrete_shapes,
    pin_inputs,
    run_for_shapes,
)
from tensorarena.sizes import check_alignment

if TYPE_CHECKING:
    import onnx

__all__ = ["problem_from_onnx"]


def _onnx() -> Any:
    return require("onnx", extra="onnx", feature="planning from ONNX models")


def problem_from_onnx(
    model_or_path: onnx.ModelProto | str | os.PathLike[str],
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    alias_reshapes: bool = True,
    alignment: int = 64,
    name: str = "",
) -> GraphProblem:
    """The planning problem of an ONNX model (a ``ModelProto`` or a path to a ``.onnx`` file).

    ``input_shapes`` maps graph input names to concrete shapes, replacing symbolic dimensions
    before shape inference. The model passed in is not modified. Every buffer gets ``alignment``.
    ``alias_reshapes`` (default True, as ONNX Runtime does) lets shape-only ops share their
    input's storage (see the module doc).
    """
    if input_shapes is not None and not isinstance(input_shapes, Mapping):
        raise InvalidArgumentError(
            "input_shapes must map input names to shapes ({'ids': [8, 128]}), got "
            f"{type(input_shapes).__name__}"
        )
    if not isinstance(alias_reshapes, bool):
        raise InvalidArgumentError(f"alias_reshapes must be a bool, got {alias_reshapes!r}")
    check_alignment(alignment)
    onnx = _onnx()
    path: str | None = None
    if isinstance(model_or_path, (str, os.PathLike)):
        from google.protobuf.message import DecodeError  # onnx's own dependency

        path = os.fspath(model_or_path)
        try:
            # Shapes are all we need: leave external weight files on disk.
            model = onnx.load(path, load_external_data=False)
        except OSError as exc:
            raise InvalidProblemError(f"cannot read {path!r}: {exc.strerror or exc}") from exc
        except DecodeError as exc:
            raise InvalidProblemError(f"{path!r} is not an ONNX model: {exc}") from exc
        name = name or os.path.splitext(os.path.basename(os.fspath(model_or_path)))[0]
    elif isinstance(model_or_path, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(model_or_path)
    else:
        raise InvalidProblemError(
            f"expected an onnx.ModelProto or a path, got {type(model_or_path).__name__}"
        )
    if not model.HasField("graph"):  # what an empty file, or other bytes, parse to
        raise InvalidProblemError(f"{path or 'the model'!r} is not an ONNX model: it has no graph")
    name = name or model.graph.name
    if input_shapes:
        pin_inputs(model.graph, input_shapes)
    ordered = _topological(model.graph)  # shape inference, too, needs the nodes in order
    if [id(n) for n in ordered] != [id(n) for n in model.graph.node]:
        copies = [type(n)() for n in ordered]
        for copy, node in zip(copies, ordered, strict=True):
            copy.CopyFrom(node)
        del model.graph.node[:]
        model.graph.node.extend(copies)
    model = infer_concrete_shapes(onnx, model, pinned=bool(input_shapes))
    measured = _measure_unknown(onnx, model, path)
    return _walk(model.graph, alias_reshapes=alias_reshapes, alignment=alignment, name=name,
                 measured=measured)


def _measure_unknown(onnx: Any, model: Any, path: str | os.PathLike[str] | None) -> dict[str, int]:
    """Sizes measured by running the model, for needed tensors inference left unknown."""
    graph = model.graph
    types = {v.name: v.type for v in (*graph.input, *graph.value_info, *graph.output)}
    used = _consumed(graph)
    unknown: set[str] = set()
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            continue
        for out in node.output:
            if out and out in used and not _sized(types.get(out), out):
                unknown.add(out)
    if not unknown or not _inputs_static(graph):
        return {}
    return run_for_shapes(onnx, model, path, unknown)


def _inputs_static(graph: Any) -> bool:
    initializers = {init.name for init in graph.initializer}
    for value in graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        if not tensor_type.HasField("shape"):
            return False
        if not all(d.HasField("dim_value") for d in tensor_type.shape.dim):
            return False
    return True


def _sized(type_proto: Any, tensor: str) -> bool:
    if type_proto is None:
        return False
    try:
        _nbytes(type_proto, tensor)
    except InvalidProblemError:
        return False
    return True


def _consumed(graph: Any) -> set[str]:
    """Names some node reads (subgraphs included) or the graph returns."""
    used = {out.name for out in graph.output}
    for node in graph.node:
        used.update(_used_names(node))
    return used


#: Ops whose output may share the bytes of input 0 (ONNX Runtime's ``Alias(0, 0)`` kernels).
_SHAPE_ONLY_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})


def _folds(node: Any, constants: set[str]) -> bool:
    """True if a runtime folds ``node`` into initializers: a deterministic standard op, no
    subgraph, every input it names a constant."""
    names = [name for name in node.input if name]
    return (bool(names) and all(name in constants for name in names)
            and node.op_type not in UNFOLDABLE
            and not any(attr.g.ByteSize() or attr.graphs for attr in node.attribute))


def _walk(
    graph: onnx.GraphProto, *, alias_reshapes: bool, alignment: int, name: str,
    measured: dict[str, int],
) -> GraphProblem:
    types: dict[str, Any] = {}
    for value in (*graph.input, *graph.value_info, *graph.output):
        types[value.name] = value.type
    live = Liveness()
    overridable = {value.name for value in graph.input}
    constants = {init.name for init in graph.initializer if init.name not in overridable}
    for init in graph.initializer:
        nbytes = _packed(_product(init.dims), _bits(init.data_type, init.name))
        live.external(init.name, nbytes, "constant" if init.doc_string == FOLDED else "parameter")
    for sparse in graph.sparse_initializer:
        live.external(sparse.values.name, _nbytes_of_sparse(sparse), "parameter")
    for value in graph.input:
        if value.name not in live:
            live.external(value.name, _nbytes(types[value.name], value.name), "input")
    nodes = list(graph.node)  # already in topological order
    steps = len(nodes)
    consumed = _consumed(graph)
    for step, node in enumerate(nodes):
        for used in _used_names(node):
            if used in live:
                live.use(used, step)
        for out in node.output:
            if not out:
                continue  # an omitted optional output
            try:
                nbytes = measured[out] if out in measured else _nbytes(types[out], out)
            except KeyError:
                if out not in consumed:
                    continue  # nobody reads it: it needs no bytes of ours
                raise InvalidProblemError(
                    f"tensor {out!r} (output of {_describe(node)}) has no inferred type: shape "
                    "inference could not determine it",
                    column=out,
                ) from None
            except InvalidProblemError as exc:
                if out not in consumed:
                    continue
                raise InvalidProblemError(f"{exc} (output of {_describe(node)})",
                                          column=out) from None
            standard = node.domain in ("", "ai.onnx")
            shape_only = alias_reshapes and standard and node.op_type in _SHAPE_ONLY_OPS
            folds = standard and _folds(node, constants)
            if shape_only and node.input and node.input[0] in live:
                live.alias(out, node.input[0], step)
                if folds:
                    constants.add(out)
                continue
            if standard and (node.op_type == "Constant" or folds):
                live.external(out, nbytes, "constant")
                constants.add(out)
            else:
                live.produce(out, step, nbytes)
    live.output((out.name for out in graph.output if out.name in live), steps)
    return live.build(steps=steps, name=name, alignment=alignment)


def _describe(node: Any) -> str:
    return f"{node.op_type} node {node.name!r}" if node.name else f"a {node.op_type} node"


def _topological(graph: onnx.GraphProto) -> list[Any]:
    """``graph.node`` in a topological order, keeping the given order wherever it is valid."""
    nodes = list(graph.node)
    given = {v.name for v in graph.input} | {i.name for i in graph.initializer}
    given |= {s.values.name for s in graph.sparse_initializer} | {""}
    available = set(given)
    if all(_inputs_ready(n, available, add=True) for n in nodes):
        return nodes
    # Not in order: repeatedly take the first node whose inputs are all available.
    available = set(given)
    pending, ordered = nodes, []
    while pending:
        for i, node in enumerate(pending):
            if _inputs_ready(node, available, add=True):
                ordered.append(pending.pop(i))
                break
        else:
            missing = sorted({u for n in pending for u in n.input if u not in available})
            raise InvalidProblemError(
                f"the ONNX graph has a cycle or uses tensors nothing produces: {missing[:5]}",
                column=missing[0] if missing else None,
            )
    return ordered


def _inputs_ready(node: Any, available: set[str], *, add: bool) -> bool:
    if any(i not in available for i in node.input):
        return False
    if add:
        available.update(node.output)
    return True


def _used_names(node: Any) -> Iterator[str]:
    """Inputs of ``node``, plus outer-scope names its subgraphs refer to."""
    yield from (i for i in node.input if i)
    for attribute in node.attribute:
        for subgraph in (attribute.g, *attribute.graphs):
            if subgraph.ByteSize():
                yield from _outer_names(subgraph)


def _outer_names(graph: Any) -> Iterator[str]:
    local = {v.name for v in graph.input} | {i.name for i in graph.initializer}
    for node in graph.node:
        for used in _used_names(node):
            if used not in local:
                yield used
        local.update(node.output)


def _nbytes(type_proto: Any, tensor: str) -> int:
    if type_proto.WhichOneof("value") != "tensor_type":
        raise InvalidProblemError(
            f"tensor {tensor!r} is not a tensor (it is a {type_proto.WhichOneof('value')}); "
            "only tensors can be planned",
            column=tensor,
        )
    tensor_type = type_proto.tensor_type
    bits = _bits(tensor_type.elem_type, tensor)
    if not tensor_type.HasField("shape"):
        raise InvalidProblemError(
            f"tensor {tensor!r} has an unknown shape (not even its rank is known): pin the "
            "inputs with input_shapes, or export with static shapes",
            column=tensor,
        )
    count = 1
    for i, dim in enumerate(tensor_type.shape.dim):
        if dim.HasField("dim_value"):
            count *= dim.dim_value
        elif dim.HasField("dim_param") and not dim.dim_param.startswith("unk__"):
            raise InvalidProblemError(
                f"tensor {tensor!r} has a symbolic dimension {dim.dim_param!r} (axis {i}): pin "
                "it with input_shapes={input name: shape} (--input-shape NAME=D,D,... on the "
                "command line)",
                column=tensor,
            )
        else:  # no value, or a placeholder ("unk__0") that shape inference made up
            raise InvalidProblemError(
                f"tensor {tensor!r} has an unknown dimension (axis {i}): shape inference could "
                "not determine it (data-dependent?); pin the inputs with input_shapes",
                column=tensor,
            )
    return _packed(count, bits)


def _packed(count: int, bits: int) -> int:
    """Bytes of ``count`` elements of ``bits`` each: 4-bit types pack two to a byte."""
    return (count * bits + 7) // 8


def _bits(elem_type: int, tensor: str) -> int:
    onnx = _onnx()
    if elem_type in (onnx.TensorProto.UNDEFINED, onnx.TensorProto.STRING):
        kind = "an unknown" if elem_type == onnx.TensorProto.UNDEFINED else "a string"
        raise InvalidProblemError(
            f"tensor {tensor!r} has {kind} element type, so its size is unknown",
            column=tensor,
        )
    four_bit = {getattr(onnx.TensorProto, t, -1) for t in ("INT4", "UINT4", "FLOAT4E2M1")}
    if elem_type in four_bit:  # NumPy stands these in with one byte each
        return 4
    try:
        return 8 * int(onnx.helper.tensor_dtype_to_np_dtype(elem_type).itemsize)
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidProblemError(
            f"tensor {tensor!r} has element type {elem_type}, whose size is unknown",
            column=tensor,
        ) from exc


def _product(dims: Sequence[int]) -> int:
    count = 1
    for d in dims:
        count *= d
    return count


def _nbytes_of_sparse(sparse: Any) -> int:
    values = sparse.values
    indices = sparse.indices
    return _packed(_product(values.dims), _bits(values.data_type, values.name)) + _packed(
        _product(indices.dims), _bits(indices.data_type, indices.name)
    )
