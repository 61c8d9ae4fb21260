"""Concrete shapes for every tensor of an ONNX model, as real exporters write them.

ONNX's own shape inference stops short on the graphs people have:

- torch's legacy exporter computes ``nn.MultiheadAttention``'s slice bounds with shape arithmetic
  (``Shape`` → ``Mod`` of constants → ``Slice``) that inference's data propagation does not
  evaluate, so the slice, and everything after it, has an unknown dimension even when every
  input is static;
- torch's dynamo exporter stores its own shape hints (``value_info`` such as ``4*batch``) in the
  model; pinning the inputs does not change them, and inference keeps them rather than deriving
  the concrete ones.

:func:`pin_inputs` first replaces the inputs' symbolic dimensions with the shapes the caller
gives. Then :func:`infer_concrete_shapes` works in rounds, like ONNX Runtime's graph optimiser and
onnx-simplifier do: drop every stored hint that is not concrete (when inputs were pinned), infer
with data propagation, then *fold* what is now constant: a ``Shape`` of a tensor whose shape is
known, and any small node whose inputs are all constants (evaluated by ONNX's reference
evaluator), each replaced by an initializer; and infer again, until nothing changes. What is still
unknown after that and is needed, on a model whose inputs are all static, is measured by running
the model once on zero-filled inputs with the reference evaluator (slow on a large model, so the
last resort; it needs the weights, which are then loaded).

Folded tensors are constants, as a runtime's constant folding makes them: they are reported as
unplanned constants, not planned.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from numbers import Integral
from typing import Any

from tensorarena.errors import InvalidProblemError

__all__ = ["FOLDED", "FOLD_LIMIT", "UNFOLDABLE", "infer_concrete_shapes", "pin_inputs",
           "run_for_shapes"]

#: The ``doc_string`` of an initializer that folding made (a constant, not a weight).
FOLDED = "tensorarena: folded constant"

#: Largest constant (in elements) that folding makes: shape arithmetic, never a weight-sized one.
FOLD_LIMIT = 4096
# Rounds of inference and folding before giving up (each folds at least one node).
_MAX_ROUNDS = 32
#: Ops never folded: their output is not a function of their inputs.
UNFOLDABLE = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform",
                         "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout"})


def pin_inputs(graph: Any, input_shapes: Mapping[str, Sequence[int]]) -> None:
    """Give the graph inputs named in ``input_shapes`` those concrete shapes (in place).

    Only symbolic dimensions are filled in: a shape that contradicts a static one of the export
    is refused (:class:`~tensorarena.errors.InvalidProblemError` naming the input and both
    shapes), never silently planned as another model; nothing is changed when it raises.
    """
    inputs = {value.name: value for value in graph.input}
    pending: list[tuple[Any, list[int]]] = []
    for input_name, shape in input_shapes.items():
        if input_name not in inputs:
            raise InvalidProblemError(
                f"input_shapes names {input_name!r}, which is not a graph input; inputs are "
                f"{sorted(inputs)}",
                column=input_name,
            )
        dims = inputs[input_name].type.tensor_type.shape.dim
        if isinstance(shape, (str, bytes)) or not isinstance(shape, Iterable):
            raise InvalidProblemError(
                f"input_shapes[{input_name!r}] must be a sequence of non-negative ints, got "
                f"{type(shape).__name__} {shape!r:.60}",
                column=input_name,
            )
        shape = list(shape)
        if len(dims) and len(dims) != len(shape):
            raise InvalidProblemError(
                f"input {input_name!r} has rank {len(dims)}, but input_shapes gives {shape}",
                column=input_name,
            )
        if any(not isinstance(d, Integral) or isinstance(d, bool) or d < 0 for d in shape):
            raise InvalidProblemError(
                f"input_shapes[{input_name!r}] must be non-negative ints, got {shape}",
                column=input_name,
            )
        shape = [int(d) for d in shape]  # NumPy's ints too
        fixed = [(axis, d.dim_value) for axis, d in enumerate(dims) if d.HasField("dim_value")]
        clashes = [(axis, value) for axis, value in fixed if value != shape[axis]]
        if clashes:  # a static export: replacing its dims would plan another model
            exported = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                        for d in dims]
            which = ", ".join(f"dimension {axis} is {value}, not {shape[axis]}"
                              for axis, value in clashes)
            raise InvalidProblemError(
                f"input {input_name!r} was exported with the static shape {exported}, which "
                f"the shape given, {shape}, contradicts ({which}): export the model with "
                "dynamic axes to plan it at another shape, or give its own shape",
                column=input_name,
            )
        pending.append((inputs[input_name].type.tensor_type.shape, shape))
    for tensor_shape, shape in pending:  # every input checked first: all or nothing
        del tensor_shape.dim[:]
        for d in shape:
            tensor_shape.dim.add().dim_value = d


def infer_concrete_shapes(onnx: Any, model: Any, *, pinned: bool) -> Any:
    """``model`` with every shape inference and folding can make concrete (a new model).

    ``pinned`` says the caller replaced the inputs' symbolic dimensions: the stored hints are
    then stale and are dropped before the first round.
    """
    if pinned:
        _drop_symbolic_hints(model.graph)
    for _ in range(_MAX_ROUNDS):
        model = _infer(onnx, model)
        if not _fold(onnx, model):
            break
    return model


def run_for_shapes(onnx: Any, model: Any, path: str | os.PathLike[str] | None,
                   wanted: set[str]) -> dict[str, int]:
    """The sizes in bytes of ``wanted`` tensors, measured by running the model.

    It runs twice, on inputs filled with zeros and with ones, and keeps only the sizes both runs
    agree on: a size that follows the input's values (a ``Reshape`` to a shape given as an input,
    ``NonZero``) cannot be planned statically and stays unknown, as it does when a run fails.
    Needs every graph input's shape to be concrete; loads external weights from ``path``'s
    folder when the model keeps them outside.
    """
    import numpy as np
    from onnx.reference import ReferenceEvaluator

    initializers = {init.name for init in model.graph.initializer}
    inputs: dict[str, tuple[list[int], Any]] = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor_type.shape.dim]
        if any(d < 0 for d in dims):
            return {}
        inputs[value.name] = (dims, onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type))
    if path is not None and any(
        init.data_location == onnx.TensorProto.EXTERNAL for init in model.graph.initializer
    ):
        from onnx.external_data_helper import load_external_data_for_model

        load_external_data_for_model(model, os.path.dirname(os.fspath(path)) or ".")
    sizes: list[dict[str, int]] = []
    for fill in (0, 1):
        feeds = {name: np.full(dims, fill, dtype=dtype) for name, (dims, dtype) in inputs.items()}
        try:
            results = ReferenceEvaluator(model).run(None, feeds, intermediate=True)
        except Exception:  # the evaluator raises whatever its ops raise: sizes stay unknown
            return {}
        assert isinstance(results, dict)
        sizes.append({name: int(results[name].nbytes) for name in wanted
                      if isinstance(results.get(name), np.ndarray)})  # tensors, not sequences
    return {name: size for name, size in sizes[0].items() if sizes[1].get(name) == size}


# ---------------------------------------------------------------------------------------------
# Rounds
# ---------------------------------------------------------------------------------------------


def _drop_symbolic_hints(graph: Any) -> None:
    """Forget stored shapes that are not concrete: inference derives them from the inputs."""
    kept = [v for v in graph.value_info if _concrete_dims(v.type) is not None]
    del graph.value_info[:]
    graph.value_info.extend(kept)
    for value in graph.output:
        if value.type.HasField("tensor_type") and _concrete_dims(value.type) is None:
            value.type.tensor_type.ClearField("shape")


def _infer(onnx: Any, model: Any) -> Any:
    try:
        return onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception as exc:  # onnx raises its own C++-bound error types
        raise InvalidProblemError(f"ONNX shape inference failed: {exc}") from exc


def _concrete_dims(type_proto: Any) -> tuple[int, ...] | None:
    if type_proto.WhichOneof("value") != "tensor_type":
        return None
    tensor_type = type_proto.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    dims = []
    for dim in tensor_type.shape.dim:
        if not dim.HasField("dim_value"):
            return None
        dims.append(dim.dim_value)
    return tuple(dims)


def _fold(onnx: Any, model: Any) -> bool:
    """Replace constant shape arithmetic with initializers; True if anything was folded."""
    from onnx import numpy_helper

    graph = model.graph
    types = {v.name: v.type for v in (*graph.input, *graph.value_info, *graph.output)}
    constants: dict[str, Any] = {i.name: i for i in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and node.output:
            constants.setdefault(node.output[0], None)  # evaluated on demand
    outputs = {v.name for v in graph.output}
    folded: list[tuple[Any, list[Any]]] = []
    for node in graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type in UNFOLDABLE:
            continue
        if node.op_type == "Constant" or any(o in outputs for o in node.output):
            continue
        values = _folded_values(onnx, node, types, constants, graph)
        if values is None:
            continue
        tensors = [numpy_helper.from_array(v, name) for v, name in
                   zip(values, node.output, strict=True) if name]
        for tensor in tensors:
            tensor.doc_string = FOLDED
        folded.append((node, tensors))
        for tensor in tensors:
            constants[tensor.name] = tensor
    if not folded:
        return False
    gone = {id(node) for node, _ in folded}
    kept = [node for node in graph.node if id(node) not in gone]
    del graph.node[:]
    graph.node.extend(kept)
    for _, tensors in folded:
        graph.initializer.extend(tensors)
    return True


def _folded_values(onnx: Any, node: Any, types: dict[str, Any], constants: dict[str, Any],
                   graph: Any) -> list[Any] | None:
    import numpy as np

    if node.op_type == "Shape" and node.input and node.input[0] in types:
        dims = _concrete_dims(types[node.input[0]])
        if dims is None:
            return None
        start = _int_attribute(onnx, node, "start", 0)
        end = _int_attribute(onnx, node, "end", len(dims))
        return [np.array(dims[start:end], dtype=np.int64)]
    inputs = [name for name in node.input if name]
    if not inputs or not all(name in constants for name in inputs):
        return None
    feeds = {}
    for name in inputs:
        value = _constant_value(onnx, name, constants, graph)
        if value is None or value.size > FOLD_LIMIT:
            return None
        feeds[name] = value
    values = _evaluate(onnx, node, feeds)
    if values is None or not all(isinstance(v, np.ndarray) and v.dtype != object
                                 and v.size <= FOLD_LIMIT for v in values):
        return None  # sequences, maps, strings and large tensors are never folded
    return values


def _int_attribute(onnx: Any, node: Any, name: str, default: int) -> int:
    for attribute in node.attribute:
        if attribute.name == name:
            return int(onnx.helper.get_attribute_value(attribute))
    return default


def _constant_value(onnx: Any, name: str, constants: dict[str, Any], graph: Any) -> Any:
    from onnx import numpy_helper

    tensor = constants[name]
    if tensor is None:  # the output of a Constant node
        node = next(n for n in graph.node if n.op_type == "Constant" and n.output[0] == name)
        values = _evaluate(onnx, node, {})
        if values is None:
            return None
        constants[name] = numpy_helper.from_array(values[0], name)
        return values[0]
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return None  # a weight kept outside the file: never shape arithmetic
    return numpy_helper.to_array(tensor)


def _evaluate(onnx: Any, node: Any, feeds: dict[str, Any]) -> list[Any] | None:
    """Run one node with the reference evaluator; None if it cannot."""
    from onnx.reference import ReferenceEvaluator

    try:
        results = ReferenceEvaluator(node).run(None, feeds)
    except Exception:  # an op the evaluator lacks, or bad attributes: leave the node be
        return None
    return list(results)
