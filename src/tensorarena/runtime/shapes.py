"""Input shapes against a graph's: concrete values for its size symbols, or an error naming a dim.

A static graph fixes every input dimension; a graph exported with dynamic dimensions names some
with symbols (``s0``), possibly within a range (``ep.range_constraints``). :class:`ShapeBinder`
reads both from the placeholders once, then, at each call, checks the inputs and returns the
*bindings* (symbol → value) that pick a plan. The common case, every input as expected, is one
tuple comparison and a dtype and a device comparison per input. An input on another device or
of another dtype is refused naming it (the plan's code would run it against the arena's device
and dtypes); one that requires grad is warned about once (a call runs under ``no_grad``).

Dimensions are named ``input_ids.shape[1]`` everywhere: in errors, in ``max_shapes`` and in
``growing``.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tensorarena.errors import InvalidArgumentError, NoGradWarning, ShapeNotCoveredError
from tensorarena.planning.torch_graph import evaluate, meta_value

if TYPE_CHECKING:
    import torch.fx

__all__ = ["ShapeBinder", "ShapeNotCoveredError", "dim_label"]


def dim_label(name: str, dim: int) -> str:
    """How a dimension is named: ``input_ids.shape[1]``."""
    return f"{name}.shape[{dim}]"


@dataclass(frozen=True)
class _Input:
    position: int
    name: str
    dtype: Any  # torch.dtype, or None for a SymInt placeholder
    static: tuple[int, ...] | None  # the whole shape when every dimension is fixed
    dims: tuple[Any, ...]  # per dimension: an int, or a sympy expression
    device: Any = None  # torch.device, or None for a SymInt placeholder


class ShapeBinder:
    """Checks a call's inputs against the graph's placeholders and binds the size symbols
    (with ``check=False``, only binds: for callers that guard shapes themselves, as dynamo).
    The first call where one of ``grad_watched`` requires grad warns (:class:`NoGradWarning`),
    once."""

    def __init__(
        self,
        graph: torch.fx.Graph,
        checked: Sequence[tuple[int, str]],
        *,
        ranges: Mapping[Any, tuple[int | None, int | None]] | None = None,
        check: bool = True,
        grad_watched: Sequence[tuple[int, str]] = (),
    ) -> None:
        import torch

        self._grad_watched = tuple(grad_watched)

        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        self._inputs: list[_Input] = []
        self.labels: dict[Any, str] = {}  # symbol -> the first dimension that shows it
        self._where: dict[Any, tuple[int, int | None]] = {}  # symbol -> (input, dim or None)
        for position, name in checked:
            value = meta_value(placeholders[position])
            if isinstance(value, torch.SymInt):
                expr = value.node.expr
                if expr.is_symbol and expr not in self._where:
                    self._where[expr] = (len(self._inputs), None)
                    self.labels[expr] = name
                self._inputs.append(_Input(position, name, None, None, (expr,)))
                continue
            if not isinstance(value, torch.Tensor):
                continue
            dims: list[Any] = []
            for d, size in enumerate(value.shape):
                if isinstance(size, int):
                    dims.append(size)
                    continue
                expr = size.node.expr
                dims.append(int(expr) if expr.is_number else expr)
                if expr.is_symbol and expr not in self._where:
                    self._where[expr] = (len(self._inputs), d)
                    self.labels[expr] = dim_label(name, d)
            static = tuple(dims) if all(isinstance(d, int) for d in dims) else None
            if static is not None and not check:
                continue  # the caller guards shapes already; only symbols need binding
            self._inputs.append(_Input(position, name, value.dtype, static, tuple(dims),
                                       value.device))
        self.symbols: tuple[Any, ...] = tuple(self._where)
        self._ranges = dict(ranges or {})

    @property
    def is_static(self) -> bool:
        """True when no input dimension is symbolic: one plan serves every call."""
        return not self.symbols

    def symbol(self, label: str) -> Any:
        """The symbol of a dimension named ``label`` (``"input_ids.shape[1]"``)."""
        for symbol, known in self.labels.items():
            if known == label:
                return symbol
        names = ", ".join(self.labels.values()) or "none: every dimension is static"
        raise InvalidArgumentError(f"no dynamic dimension {label!r}; dynamic dimensions: {names}")

    def bind(self, inputs: Sequence[Any]) -> dict[Any, int]:
        """The symbols' values for these inputs (empty for a static graph); raises
        :class:`ShapeNotCoveredError` naming the first dimension that does not fit."""
        bindings: dict[Any, int] = {}
        for spec in self._inputs:
            value = inputs[spec.position]
            if spec.dtype is None:  # a SymInt placeholder: its value is the size
                bindings[spec.dims[0]] = _size(spec.name, value)
                continue
            shape = getattr(value, "shape", None)
            if shape is None:
                raise InvalidArgumentError(
                    f"input {spec.name!r} must be a tensor, got {type(value).__name__}"
                )
            if (spec.static is not None and shape == spec.static and value.dtype == spec.dtype
                    and value.device == spec.device):
                continue
            self._check(spec, value, bindings)
        if self.symbols:
            self._check_ranges(bindings)
        if self._grad_watched:
            self._watch_grad(inputs)
        return bindings

    def _watch_grad(self, inputs: Sequence[Any]) -> None:
        for position, name in self._grad_watched:
            if getattr(inputs[position], "requires_grad", False):
                self._grad_watched = ()  # once per program
                warnings.warn(NoGradWarning(
                    f"input {name!r} requires grad, but a planned call runs under "
                    "torch.no_grad(): its outputs carry no autograd history (for gradients: "
                    "tensorarena.runtime.TrainingStep, or torch.compile(model, "
                    "backend='tensorarena')); said once per program"), stacklevel=5)
                return

    def bind_shapes(self, shapes: Mapping[str, Sequence[int]]) -> dict[Any, int]:
        """The symbols' values for declared shapes by input name (``max_shapes``)."""
        names = [spec.name for spec in self._inputs if spec.dtype is not None]
        unknown = [name for name in shapes if name not in names]
        if unknown:
            raise InvalidArgumentError(
                f"max_shapes names no input {unknown}; the inputs are {names}"
            )
        bindings: dict[Any, int] = {}
        for spec in self._inputs:
            if spec.name not in shapes or spec.dtype is None:
                continue
            shape = tuple(int(s) for s in shapes[spec.name])
            if len(shape) != len(spec.dims):
                raise InvalidArgumentError(
                    f"input {spec.name!r} has {len(spec.dims)} dimensions, the shape given for "
                    f"it has {len(shape)}"
                )
            for d, (size, dim) in enumerate(zip(shape, spec.dims, strict=True)):
                if not isinstance(dim, int) and dim.is_symbol:
                    bindings.setdefault(dim, size)
                elif isinstance(dim, int) and dim != size:
                    raise InvalidArgumentError(
                        f"{dim_label(spec.name, d)} is static ({dim}); the shape given says {size}"
                    )
        missing = [self.labels[s] for s in self.symbols if s not in bindings]
        if missing:
            raise InvalidArgumentError(f"no size given for the dynamic dimensions {missing}")
        return bindings

    def _check(self, spec: _Input, value: Any, bindings: dict[Any, int]) -> None:
        import torch

        if not isinstance(value, torch.Tensor):  # a NumPy array has a shape and a dtype too
            raise InvalidArgumentError(
                f"input {spec.name!r} must be a torch.Tensor, got {type(value).__module__}."
                f"{type(value).__name__} (torch.from_numpy() shares a NumPy array's bytes)"
            )
        shape = tuple(value.shape)
        if value.device != spec.device:
            meta = " (a meta tensor has a shape but no data)" if value.device.type == "meta" \
                else ""
            raise ShapeNotCoveredError(
                f"input {spec.name!r} is on {value.device}{meta}; the program was built for "
                f"{spec.device}, where its graph and arena run: pass "
                f"{spec.name}.to({str(spec.device)!r})",
                dim=spec.name,
                got=value.device,
                expected=spec.device,
            )
        if value.dtype != spec.dtype:
            raise ShapeNotCoveredError(
                f"input {spec.name!r} has dtype {value.dtype}; the program was traced for "
                f"{spec.dtype}",
                dim=spec.name,
                got=value.dtype,
                expected=spec.dtype,
            )
        if len(shape) != len(spec.dims):
            raise ShapeNotCoveredError(
                f"input {spec.name!r} has {len(shape)} dimensions; the program was traced for "
                f"{len(spec.dims)} ({list(spec.dims)})",
                dim=spec.name,
                got=shape,
                expected=spec.dims,
            )
        for d, (size, dim) in enumerate(zip(shape, spec.dims, strict=True)):
            if isinstance(dim, int):
                if size != dim:
                    raise ShapeNotCoveredError(
                        f"{dim_label(spec.name, d)} is {size}, but the program was traced with "
                        f"a static size of {dim} there (export it with a dynamic dimension, "
                        "torch.export.Dim, to plan each shape)",
                        dim=dim_label(spec.name, d),
                        got=size,
                        expected=dim,
                    )
            elif dim.is_symbol:
                bound = bindings.setdefault(dim, size)
                if bound != size:
                    raise ShapeNotCoveredError(
                        f"{dim_label(spec.name, d)} is {size}, but it must equal "
                        f"{self.labels[dim]} ({bound})",
                        dim=dim_label(spec.name, d),
                        got=size,
                        expected=bound,
                    )
        # Dimensions that are expressions of symbols (2*s0) are checked once all are bound.
        for d, (size, dim) in enumerate(zip(shape, spec.dims, strict=True)):
            if not isinstance(dim, int) and not dim.is_symbol:
                expected = evaluate(dim, bindings)
                if expected is not None and expected != size:
                    raise ShapeNotCoveredError(
                        f"{dim_label(spec.name, d)} is {size}; the program needs {dim} = "
                        f"{expected} there",
                        dim=dim_label(spec.name, d),
                        got=size,
                        expected=expected,
                    )

    def _check_ranges(self, bindings: Mapping[Any, int]) -> None:
        for symbol, (low, high) in self._ranges.items():
            if symbol not in bindings:
                continue
            value = bindings[symbol]
            if (low is not None and value < low) or (high is not None and value > high):
                label = self.labels.get(symbol, str(symbol))
                span = (f"{low}..{high}" if low is not None and high is not None
                        else f">= {low}" if low is not None else f"<= {high}")
                raise ShapeNotCoveredError(
                    f"{label} is {value}, outside the range the program covers ({span})",
                    dim=label,
                    got=value,
                    expected=(low, high),
                )

    def limit(self, maximum: Mapping[Any, int]) -> None:
        """Also refuse sizes above ``maximum`` (symbol → the largest value planned for)."""
        for symbol, high in maximum.items():
            low, old = self._ranges.get(symbol, (0, None))
            self._ranges[symbol] = (low, high if old is None else min(old, high))


def _size(name: str, value: Any) -> int:
    """An int given for a dynamic size (a float or a bool would be truncated silently)."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise InvalidArgumentError(
        f"input {name!r} must be an int (the program takes it as a dynamic size), got "
        f"{value!r} ({type(value).__name__})"
    )


def ranges_of(ep: Any) -> dict[Any, tuple[int | None, int | None]]:
    """``(low, high)`` per symbol from an ``ExportedProgram``'s range constraints (``None`` for
    no bound: an int argument marked dynamic has neither)."""
    return {symbol: (_finite(span.lower), _finite(span.upper))
            for symbol, span in getattr(ep, "range_constraints", {}).items()}


def _finite(bound: Any) -> int | None:
    """A range's bound as an int, or None where it is infinite (sympy's ``oo``, torch's
    ``int_oo``, which ``int()`` refuses with one error or another)."""
    try:
        value = int(bound)
    except (TypeError, ValueError, OverflowError, AttributeError):
        return None
    return value if abs(value) <= 2**62 else None


def growing_symbols(binder: ShapeBinder, labels: Iterable[str]) -> frozenset[Any]:
    """The symbols of the dimensions named in ``labels``."""
    if isinstance(labels, str):  # iterated, it would name its characters
        raise InvalidArgumentError(
            f"growing takes a list of dimension names, got the str {labels!r}: "
            f"write growing=[{labels!r}]"
        )
    return frozenset(binder.symbol(label) for label in labels)
