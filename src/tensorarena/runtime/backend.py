"""``torch.compile(model, backend="tensorarena")``: every captured graph runs as a planned program.

Dynamo captures the graphs (breaking where it must), ``aot_autograd`` splits each into a forward
and a backward graph of ATen ops, and each of those becomes a
:class:`~tensorarena.runtime.PlannedProgram`: the backward graph's intermediates are planned
like the forward's. The two programs of one captured graph share a
:class:`~tensorarena.runtime.Workspace` (they never run at the same time); separate captured
graphs get one each unless a :class:`Backend` is given a workspace to share.

What ``aot_autograd`` saves for the backward pass is an *output* of the forward graph, so it is
planned around (fresh at each call), not placed in the arena: with ``torch.compile`` only the
intermediates inside each graph are planned. :class:`~tensorarena.runtime.training.TrainingStep`
plans forward and backward as one graph, saved activations included.

The name ``"tensorarena"`` is registered by :func:`register_backend` (importing tensorarena
registers nothing, as it must not import torch); a ``torch_dynamo_backends`` entry point lets
``torch.compile`` find it without that call once the package declares one.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from tensorarena._optional import load_torch
from tensorarena.errors import InvalidArgumentError
from tensorarena.runtime.device import common_device
from tensorarena.runtime.options import ProgramOptions, concurrency_for
from tensorarena.runtime.program import PlannedProgram
from tensorarena.runtime.workspace import Workspace

if TYPE_CHECKING:
    import torch
    import torch.fx

__all__ = ["BACKEND_NAME", "Backend", "backend", "register_backend"]

#: The name ``torch.compile`` knows this backend by.
BACKEND_NAME = "tensorarena"


class Backend:
    """A dynamo backend: ``torch.compile(model, backend=Backend(poison=True))``.

    ``workspace``: one :class:`Workspace` for every graph this backend compiles (default: one
    per captured graph, shared by its forward and backward programs). Other keyword options are
    those of :class:`~tensorarena.runtime.PlannedProgram` (``resource``, ``planner``,
    ``unplaceable``, ``poison``, ...). ``programs`` lists every program made, for reports.
    """

    def __init__(self, *, workspace: Workspace | None = None, **options: Any) -> None:
        _check(workspace, options)
        self.workspace = workspace
        self.options = options
        self.programs: list[PlannedProgram] = []
        self._counter = itertools.count()

    def __call__(
        self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]
    ) -> Callable[..., Any]:
        load_torch()
        from torch._dynamo.backends.common import aot_autograd

        workspace = self.workspace or Workspace(
            self.options.get("resource"),
            concurrency=concurrency_for(self.options.get("concurrency"), None),
            device=common_device(example_inputs),
        )
        graph = next(self._counter)
        options = {k: v for k, v in self.options.items() if k not in ("resource", "concurrency")}

        def compiler(kind: str) -> Callable[[torch.fx.GraphModule, Sequence[Any]], Any]:
            def compile_graph(aten: torch.fx.GraphModule, inputs: Sequence[Any]) -> Any:
                program = PlannedProgram.from_graph_module(
                    aten, check_inputs=False, workspace=workspace,
                    name=f"graph {graph} {kind}", **options,
                )
                self.programs.append(program)

                def run(args: list[Any]) -> Any:
                    return program.run_flat(list(args))

                run._boxed_call = True  # type: ignore[attr-defined]
                return run

            return compile_graph

        return aot_autograd(
            fw_compiler=compiler("forward"),
            bw_compiler=compiler("backward"),
            inference_compiler=compiler("inference"),
        )(gm, example_inputs)


def _check(workspace: Workspace | None, options: dict[str, Any]) -> None:
    """Refuse here what the first compiled graph would refuse inside dynamo (as a
    BackendCompilerFailed): an option programs do not take, a bad value, a workspace that is
    not one or that comes with a resource it would ignore."""
    unknown = sorted(set(options) - {option.name for option in fields(ProgramOptions)})
    if unknown:
        raise InvalidArgumentError(f"Backend takes no option {unknown}")
    if workspace is not None and not isinstance(workspace, Workspace):
        raise InvalidArgumentError(f"workspace must be a Workspace, got {type(workspace).__name__}")
    if workspace is not None and options.get("resource") is not None:
        raise InvalidArgumentError(
            "give resource or workspace, not both: the programs take their memory from the "
            "workspace's resource (Workspace(resource))"
        )
    ProgramOptions(**options)
    concurrency_for(options.get("concurrency"), workspace)


_default = Backend()


def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
    """The ``"tensorarena"`` backend with default options (one workspace per captured graph)."""
    return _default(gm, example_inputs)


def register_backend() -> None:
    """Make ``torch.compile(model, backend="tensorarena")`` work in this process (idempotent)."""
    load_torch()
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    if _COMPILER_FNS.get(BACKEND_NAME) is not backend:
        _COMPILER_FNS.pop(BACKEND_NAME, None)
        register_backend(compiler_fn=backend, name=BACKEND_NAME)
