"""The three ways ``bench exec`` runs a model, built inside the measuring process.

``eager``     the model called as is (under ``torch.no_grad()`` for inference; for a training
              step: ``zero_grad``, forward, the loss, ``backward``)
``planned``   :class:`~tensorarena.runtime.PlannedProgram` (inference) or
              :class:`~tensorarena.runtime.TrainingStep`, at the runtime's defaults unless
              options say otherwise
``compiled``  ``torch.compile`` with Inductor on the CPU, called as eager is
``exported``  the module of ``torch.export.export(model)`` (as the runtime exports:
              :func:`~tensorarena.runtime.exporting.export_module`) called as eager is,
              inference only: what any export-based runtime pays for the export itself

Each is an :class:`Execution`: ``call()`` runs it once on the configuration's inputs and returns
what the caller gets; ``drop()`` lets go of what a call left besides that (an eager training
step's ``.grad`` tensors); ``arena_bytes`` is memory the call uses that torch's allocator never
sees (the planned arena), counted into its live peak. A training step returns ``(loss, grads)``
for every execution, so their outputs compare one to one.

:func:`warm_libraries` runs an execution once on a tiny model, so that what its library does
once per process (the lazy imports of ``torch.export`` or Inductor, the kernel arena's C++ shim,
Inductor's compiler) happens before a measurement's baseline and is not charged to the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tensorarena.errors import InvalidArgumentError

__all__ = ["EXECUTIONS", "Execution", "build_execution", "leaves", "max_abs_err",
           "measured_model", "warm_libraries"]

EXECUTIONS: tuple[str, ...] = ("eager", "planned", "compiled", "exported")


@dataclass
class Execution:
    """One way of running the model (module docstring)."""

    name: str
    call: Callable[[], Any]
    drop: Callable[[], None] = lambda: None
    #: the planned program (its report, trace and verification), None for the others
    program: Any = None
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def arena_bytes(self) -> int:
        """Bytes of the planned arena (what the plan needs), 0 for the others."""
        return int(self.program.report().planned_bytes) if self.program is not None else 0


def leaves(value: Any) -> list[Any]:
    """The tensors in an output (a ``ModelOutput``, tuple, dict, ...), in a fixed order."""
    import torch
    from torch.utils import _pytree as pytree

    if hasattr(value, "to_tuple"):
        value = value.to_tuple()
    return [leaf for leaf in pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor)]


def max_abs_err(got: Any, expected: Any) -> float:
    """The largest absolute difference between two outputs of the same structure."""
    pairs = list(zip(leaves(got), leaves(expected), strict=True))
    return max(
        ((g.double() - e.double()).abs().max().item() for g, e in pairs if g.numel()),
        default=0.0,
    )


def _training_call(model: Any, forward: Callable[..., Any], args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> Callable[[], Any]:
    """A training step through ``forward`` (the model or its compiled form), as
    :class:`~tensorarena.runtime.TrainingStep` returns it: the loss and every gradient."""
    import torch

    from tensorarena.planning.torch_frontend import default_loss

    names = [name for name, p in model.named_parameters() if p.requires_grad]

    def call() -> Any:
        torch.manual_seed(0)  # the same dropout masks in every execution
        model.zero_grad(set_to_none=True)
        loss = default_loss(forward(*args, **kwargs))
        loss.backward()  # type: ignore[no-untyped-call]
        params = dict(model.named_parameters())
        return loss.detach(), {name: params[name].grad for name in names}

    return call


def build_execution(name: str, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], *,
                    training: bool, options: dict[str, Any] | None = None) -> Execution:
    """Build execution ``name`` of ``model`` (already in train or eval mode). ``options`` go
    to the planned program. Nothing runs yet: the first ``call()`` plans or compiles what is
    left (torch.compile compiles there, and raises there when it cannot)."""
    import torch

    options = dict(options or {})
    if name == "planned":
        from tensorarena.runtime import PlannedProgram, TrainingStep

        if training:
            step = TrainingStep(model, args, kwargs, **options)

            def planned_step() -> Any:
                torch.manual_seed(0)
                return step(*args, **kwargs)

            return Execution(name, planned_step, program=step.program, options=options)
        program = PlannedProgram.from_module(model, args, kwargs, **options)
        return Execution(name, lambda: program(*args, **kwargs), program=program,
                         options=options)
    if name == "eager":
        forward = model
    elif name == "compiled":
        forward = torch.compile(model, backend="inductor")
    elif name == "exported":
        if training:
            raise InvalidArgumentError("the exported execution runs inference only")
        from tensorarena.runtime.exporting import export_module

        forward = export_module(model, args, kwargs, dynamic_shapes=None, strict=False,
                                isolated=False).module()
    else:
        raise InvalidArgumentError(f"unknown execution {name!r}; known: {', '.join(EXECUTIONS)}")
    if training:
        return Execution(name, _training_call(model, forward, args, kwargs),
                         drop=lambda: model.zero_grad(set_to_none=True))

    def inference() -> Any:
        with torch.no_grad():
            return forward(*args, **kwargs)

    return Execution(name, inference)


def warm_libraries(name: str, *, training: bool, options: dict[str, Any] | None = None) -> None:
    """Build execution ``name`` of a two-layer model and call it twice (module docstring)."""
    import torch

    torch.manual_seed(0)
    tiny = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
    tiny.train(training)
    execution = build_execution(name, tiny, (torch.randn(4, 16),), {}, training=training,
                                options=options)
    for _ in range(2):
        execution.call()
        execution.drop()


def measured_model(execution: str, model: str, *, batch: int, seq: int | None
                   ) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """``(model, args, kwargs)`` at full size for inference, set up as the memory scripts of
    ``bench/`` measure it: one torch thread, ``execution``'s libraries warmed first
    (:func:`warm_libraries`), random weights, the model in eval mode."""
    import torch

    from tensorarena.planning.models import build_model

    torch.set_num_threads(1)
    warm_libraries(execution, training=False)
    built, (args, kwargs) = build_model(model, size="base", batch=batch, seq=seq)
    built.eval()
    return built, tuple(args), dict(kwargs)
