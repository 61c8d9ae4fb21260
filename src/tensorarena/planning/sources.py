"""One door for every kind of problem file: minimalloc CSV, ONNX models, torch.export programs.

:func:`load_problem` picks the reader by the file's suffix (``.onnx``, ``.pt2``; anything else is
read as minimalloc CSV) and ``-`` reads CSV from standard input, so the command line, the
benchmarks and a user's script plan a graph the same way they plan a CSV. Graphs come back as a
:class:`~tensorarena.planning.graph_problem.GraphProblem` (what was left out of the plan and why
rides along), CSV as a bare :class:`~tensorarena.planning.problem.Problem`.

``input_shapes`` pins graph inputs' dynamic dimensions by input name: for ONNX they replace
symbolic dimensions before shape inference; for a ``.pt2`` program each symbolic size of a named
user input is bound to the given value (the runtime plans one shape at a time the same way).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from tensorarena.errors import InvalidArgumentError, InvalidProblemError
from tensorarena.planning.csv_io import read_problem
from tensorarena.planning.graph_problem import GraphProblem
from tensorarena.planning.problem import Problem

__all__ = ["GRAPH_SUFFIXES", "load_problem", "parse_input_shape"]

#: Suffixes read as graphs rather than as minimalloc CSV.
GRAPH_SUFFIXES = (".onnx", ".pt2")


def load_problem(
    source: str | os.PathLike[str] | TextIO,
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    alignment: int = 64,
) -> Problem | GraphProblem:
    """The problem in ``source``: a path (``.onnx``, ``.pt2``, else CSV), ``-`` for CSV on
    standard input, or an open text stream of CSV.

    ``alignment`` is every graph buffer's alignment (CSV files carry their own). Faults raise
    :class:`~tensorarena.errors.InvalidProblemError` naming the file (and the line, the tensor or
    the node where there is one).
    """
    if not isinstance(source, str | os.PathLike):
        return read_problem(source)
    if os.fspath(source) == "-":
        return read_problem(sys.stdin)
    path = Path(source)
    suffix = path.suffix.lower()
    if input_shapes and suffix not in GRAPH_SUFFIXES:
        raise InvalidArgumentError(
            f"input shapes apply to graphs ({', '.join(GRAPH_SUFFIXES)}), not to {path.name}"
        )
    if suffix == ".onnx":
        from tensorarena.planning.onnx_frontend import problem_from_onnx

        return problem_from_onnx(path, input_shapes=input_shapes, alignment=alignment)
    if suffix == ".pt2":
        return _exported_problem(path, input_shapes or {}, alignment)
    return read_problem(path)


def parse_input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``"ids=8,128"`` → ``("ids", (8, 128))``; ``"x="`` is a scalar (rank 0)."""
    name, sep, dims = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise InvalidArgumentError(
            f"an input shape is NAME=D,D,... (e.g. ids=8,128), got {text!r}"
        )
    shape: list[int] = []
    for part in (p.strip() for p in dims.split(",")) if dims.strip() else ():
        if not part.isdigit():
            raise InvalidArgumentError(
                f"input shape {text!r}: {part!r} is not a non-negative whole number"
            )
        shape.append(int(part))
    return name, tuple(shape)


def _exported_problem(path: Path, input_shapes: Mapping[str, Sequence[int]],
                      alignment: int) -> GraphProblem:
    from tensorarena._optional import require

    torch = require("torch", extra="torch", feature="planning saved torch.export programs")
    from tensorarena.planning.torch_frontend import problem_from_exported

    if not path.is_file():
        raise InvalidProblemError(f"cannot read {str(path)!r}: no such file")
    try:
        program = torch.export.load(str(path))
    except Exception as exc:  # torch raises many kinds for a file that is not a program
        raise InvalidProblemError(
            f"{str(path)!r} is not a saved torch.export program: {type(exc).__name__}: {exc}"
        ) from exc
    bindings = _bindings(program, input_shapes)
    return problem_from_exported(program, alignment=alignment, name=path.stem,
                                 bindings=bindings or None)


def _bindings(program: Any, input_shapes: Mapping[str, Sequence[int]]) -> dict[Any, int]:
    """Size symbol → value, from the shapes given for the program's user inputs."""
    user_inputs = list(program.graph_signature.user_inputs)
    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    bindings: dict[Any, int] = {}
    for name, shape in input_shapes.items():
        if name not in user_inputs:
            raise InvalidProblemError(
                f"input shape names {name!r}, which is not an input of the program; inputs "
                f"are {user_inputs}",
                column=name,
            )
        value = placeholders[name].meta.get("val")
        dims = list(getattr(value, "shape", ()))
        if len(dims) != len(shape):
            raise InvalidProblemError(
                f"input {name!r} has rank {len(dims)}, but the shape given is {list(shape)}",
                column=name,
            )
        for axis, (dim, size) in enumerate(zip(dims, shape, strict=True)):
            expr = getattr(getattr(dim, "node", None), "expr", None)
            if expr is None or not getattr(expr, "is_Symbol", False):
                if int(dim) != size:
                    raise InvalidProblemError(
                        f"input {name!r} axis {axis} is {int(dim)} in the program, not {size}",
                        column=name,
                    )
                continue
            if bindings.get(expr, size) != size:
                raise InvalidProblemError(
                    f"size {expr} is given two values ({bindings[expr]} and {size})",
                    column=name,
                )
            bindings[expr] = size
    return bindings
