"""Running PyTorch models with a static memory plan: the hybrid static + dynamic runtime.

:class:`PlannedProgram` runs a ``torch.export`` program or an FX graph node by node with every
planned intermediate written into its slot of one arena (a :class:`Workspace` over tensorarena
memory, on the graph's device: host memory, or a GPU's pool for a CUDA graph); its
``record_memory`` returns one call as a PyTorch memory snapshot; :class:`TrainingStep` plans
forward, loss and gradients as one program;
:func:`register_backend` makes ``torch.compile(model, backend="tensorarena")`` work;
:func:`materialize` is the bridge for runtimes of one's own (one block, a tensor per buffer).
Kernels' own CPU allocations (layer norm's copies, im2col columns) are served from the arena too
where a small C++ shim builds (:mod:`tensorarena.runtime.kernel_arena`).
torch is imported only when one of these is used. Its errors live in :mod:`tensorarena.errors`
and are re-exported here.
"""

from tensorarena.errors import (
    DataDependentError,
    ExportFailedError,
    PlanVerificationError,
    ShapeNotCoveredError,
)
from tensorarena.runtime.backend import Backend, register_backend
from tensorarena.runtime.lowering import PATHS, NodePath
from tensorarena.runtime.materialize import Materialized, materialize
from tensorarena.runtime.measure import AllocatorTrace, trace_allocations
from tensorarena.runtime.program import PlannedProgram
from tensorarena.runtime.report import ExecutionReport
from tensorarena.runtime.training import TrainingStep
from tensorarena.runtime.workspace import Workspace, WorkspaceStatistics

__all__ = [
    "PATHS",
    "AllocatorTrace",
    "Backend",
    "DataDependentError",
    "ExecutionReport",
    "ExportFailedError",
    "Materialized",
    "NodePath",
    "PlanVerificationError",
    "PlannedProgram",
    "ShapeNotCoveredError",
    "TrainingStep",
    "Workspace",
    "WorkspaceStatistics",
    "materialize",
    "register_backend",
    "trace_allocations",
]
