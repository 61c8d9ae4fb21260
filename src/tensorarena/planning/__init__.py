"""Static memory planning: lifetimes in, offsets out, checked by an independent validator.

Front ends (:mod:`~tensorarena.planning.torch_frontend`, :mod:`~tensorarena.planning.onnx_frontend`)
import torch and onnx only when called. The names below are imported on first use (PEP 562, as at
the package root): ``tensorarena plan`` imports the planners it runs, not the reordering, the
graph front ends or the ONNX shape inference (a third of the package's import time).
"""

# The imports under TYPE_CHECKING re-export for type checkers; __all__ lists _EXPORTS's names.

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tensorarena.planning.budget import DEFAULT_NODE_LIMIT, DEFAULT_WORK_LIMIT, StopReason
    from tensorarena.planning.csv_io import (
        capacity_from_name,
        read_problem,
        read_solution,
        write_problem,
        write_solution,
    )
    from tensorarena.planning.exact import ExactResult, solve_exact
    from tensorarena.planning.exact_params import SolverParams
    from tensorarena.planning.graph_problem import GraphProblem
    from tensorarena.planning.heuristics import (
        greedy_breadth,
        greedy_size,
        greedy_size_first_fit,
        heap_best_fit,
        naive,
        portfolio,
    )
    from tensorarena.planning.onnx_frontend import problem_from_onnx
    from tensorarena.planning.op_graph import OpGraph, check_order
    from tensorarena.planning.planners import PLANNERS, plan
    from tensorarena.planning.problem import Buffer, Plan, PlanStatistics, Problem, lower_bound
    from tensorarena.planning.progress import Progress
    from tensorarena.planning.reorder import Reordering, Schedule, reorder
    from tensorarena.planning.torch_frontend import (
        problem_from_exported,
        problem_from_fx,
        trace_training,
    )
    from tensorarena.planning.validate import is_valid, validate

_EXPORTS: dict[str, tuple[str, ...]] = {
    "tensorarena.planning.budget": ("DEFAULT_NODE_LIMIT", "DEFAULT_WORK_LIMIT", "StopReason"),
    "tensorarena.planning.csv_io": (
        "capacity_from_name", "read_problem", "read_solution", "write_problem", "write_solution",
    ),
    "tensorarena.planning.exact": ("ExactResult", "solve_exact"),
    "tensorarena.planning.exact_params": ("SolverParams",),
    "tensorarena.planning.graph_problem": ("GraphProblem",),
    "tensorarena.planning.heuristics": (
        "greedy_breadth", "greedy_size", "greedy_size_first_fit", "heap_best_fit", "naive",
        "portfolio",
    ),
    "tensorarena.planning.onnx_frontend": ("problem_from_onnx",),
    "tensorarena.planning.op_graph": ("OpGraph", "check_order"),
    "tensorarena.planning.planners": ("PLANNERS", "plan"),
    "tensorarena.planning.problem": ("Buffer", "Plan", "PlanStatistics", "Problem", "lower_bound"),
    "tensorarena.planning.progress": ("Progress",),
    "tensorarena.planning.reorder": ("Reordering", "Schedule", "reorder"),
    "tensorarena.planning.torch_frontend": (
        "problem_from_exported", "problem_from_fx", "trace_training",
    ),
    "tensorarena.planning.validate": ("is_valid", "validate"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = [  # the names of _EXPORTS, written out so documentation tools read them
    "DEFAULT_NODE_LIMIT",
    "DEFAULT_WORK_LIMIT",
    "PLANNERS",
    "Buffer",
    "ExactResult",
    "GraphProblem",
    "OpGraph",
    "Plan",
    "PlanStatistics",
    "Problem",
    "Progress",
    "Reordering",
    "Schedule",
    "SolverParams",
    "StopReason",
    "capacity_from_name",
    "check_order",
    "greedy_breadth",
    "greedy_size",
    "greedy_size_first_fit",
    "heap_best_fit",
    "is_valid",
    "lower_bound",
    "naive",
    "plan",
    "portfolio",
    "problem_from_exported",
    "problem_from_fx",
    "problem_from_onnx",
    "read_problem",
    "read_solution",
    "reorder",
    "solve_exact",
    "trace_training",
    "validate",
    "write_problem",
    "write_solution",
]


def __getattr__(name: str) -> Any:
    """Import a public name on first use (a submodule imports as usual)."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup finds it without coming here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Package(types.ModuleType):
    """The package, whose two names that are also submodules' (``reorder``, ``validate``) stay
    the functions: importing a submodule sets it on its package under its own name, which
    would hide the function (``from tensorarena.planning import validate`` gave the module
    once ``tensorarena.planning.validate`` had been imported by anything)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and _WHERE.get(name) == value.__name__:
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
