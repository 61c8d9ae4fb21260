"""Static memory planning: lifetimes in, offsets out, checked by an independent validator.

Front ends (:mod:`~tensorarena.planning.torch_frontend`, :mod:`~tensorarena.planning.onnx_frontend`)
import torch and onnx only when called.
"""

from tensorarena.planning.budget import DEFAULT_NODE_LIMIT, StopReason
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

__all__ = [
    "DEFAULT_NODE_LIMIT",
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
