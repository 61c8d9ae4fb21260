"""A training step (forward, loss and every gradient) as one planned program.

:class:`TrainingStep` traces the step with :func:`~tensorarena.planning.trace_training` (one
``make_fx`` graph through ``torch.autograd.grad``), so activations saved for the backward pass
are intermediates like any other: planned, with their bytes reused once the gradient that needs
them is computed. Parameters and buffers are read from the module at every call (an optimizer's
in-place updates are seen) and are never planned; the loss and the gradients are graph outputs,
handed to the caller at every call.

By default the step plans its outputs too and runs in the order
:func:`tensorarena.planning.reorder` picks (``outputs="arena"``, ``reorder=True``; pass
``outputs="fresh"``, ``reorder=False`` for the plain program): the gradients then take the bytes
of the activations their backward freed, in an arena the caller's gradients hold until they
are dropped (:mod:`~tensorarena.runtime.held_arenas`), instead of coming on top of an arena of
activations; what it saves on tiny GPT-2, against eager's peak: ``tensorarena bench exec
--training``, recorded in ``bench/RESULTS.md``. The order costs a search at construction,
bounded by a budget of work steps (the same order on any machine; seconds on a full-size model:
``bench/RESULTS.md``).

Random ops (dropout) run the same kernels in the same order as eager execution, so the same seed
gives the same masks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tensorarena.runtime.options import check_example
from tensorarena.runtime.program import PlannedProgram
from tensorarena.runtime.signature import StateSignature
from tensorarena.runtime.torch_residue import caches_as_they_were

if TYPE_CHECKING:
    import torch

__all__ = ["TrainingStep"]


class TrainingStep:
    """``step(*args, **kwargs) -> (loss, grads)`` for ``model``, planned; ``grads`` maps each
    trainable parameter's name to its gradient (``None`` if the loss does not depend on it).

    ``args``/``kwargs`` are example inputs (shapes and structure of every later call; a new
    shape is refused naming the dimension). ``loss_fn(output)`` makes the loss; by default the
    model's own ``loss`` or the sum of its floating-point outputs. Other keyword options are
    those of :class:`~tensorarena.runtime.PlannedProgram` (with ``outputs="arena"`` and
    ``reorder=True`` by default: see the module docstring). Trace in the mode to train in
    (``model.train()`` first for dropout and batch statistics).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        loss_fn: Callable[[Any], torch.Tensor] | None = None,
        **options: Any,
    ) -> None:
        from tensorarena.planning.torch_frontend import trace_training

        check_example(args, kwargs)
        args = tuple(args)
        kwargs = dict(kwargs or {})
        self.model = model
        self._names = [name for name, p in model.named_parameters() if p.requires_grad]
        with caches_as_they_were():  # FX would keep the traced module's source for the process
            gm = trace_training(model, args, kwargs, loss_fn=loss_fn)
        params = [p for _, p in model.named_parameters()]
        buffers = [b for _, b in model.named_buffers()]

        def reference(*a: Any, **k: Any) -> Any:
            return gm(params, buffers, a, k)

        options.setdefault("name", f"{type(model).__name__} training step")
        options.setdefault("outputs", "arena")
        options.setdefault("reorder", True)
        self.program = PlannedProgram.from_graph_module(
            gm, signature=StateSignature(model, gm, (args, kwargs)), reference=reference,
            **options,
        )
        self.graph_module = gm

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        loss, grads = self.program(*args, **kwargs)
        return loss, dict(zip(self._names, grads, strict=True))

    def backward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Run the step and accumulate the gradients into ``param.grad``, as
        ``loss.backward()`` would; return the (detached) loss. With ``outputs="arena"`` a
        ``.grad`` that was None becomes a view of the step's arena, which stays held while it
        lives: ``zero_grad(set_to_none=True)`` between steps lets every step run in one arena
        (without it, each step takes another while the first one's gradients live)."""
        loss, grads = self(*args, **kwargs)
        params = dict(self.model.named_parameters())
        for name, grad in grads.items():
            if grad is None:
                continue
            param = params[name]
            if param.grad is None:
                param.grad = grad
            else:
                param.grad += grad
        return loss

    def verify(self, *args: Any, **kwargs: Any) -> Any:
        """:meth:`PlannedProgram.verify` of the step (poisoned slots vs the unplanned graph)."""
        return self.program.verify(*args, **kwargs)

    def report(self) -> Any:
        """:meth:`PlannedProgram.report` of the step."""
        return self.program.report()
