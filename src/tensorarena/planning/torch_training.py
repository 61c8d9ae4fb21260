"""One training step of a PyTorch model traced as a graph (:func:`trace_training`).

:func:`trace_training` traces forward, loss and ``torch.autograd.grad`` together with ``make_fx``,
so the training graph's saved activations and gradients are planned too
(:func:`~tensorarena.planning.torch_frontend.problem_from_fx`): its placeholders carry their kind
and source in ``node.meta`` (:data:`KIND_KEY`, :data:`SOURCE_KEY`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, cast

from tensorarena._optional import load_torch
from tensorarena.errors import InvalidProblemError

if TYPE_CHECKING:
    import torch
    import torch.fx

__all__ = [
    "KIND_KEY",
    "SOURCE_KEY",
    "TRACING_MODE_KEY",
    "data_dependent_errors",
    "default_loss",
    "lazy_modules",
    "trace_training",
]

#: The node meta keys :func:`trace_training` sets on placeholders: kind and source name.
KIND_KEY = "tensorarena_kind"
SOURCE_KEY = "tensorarena_source"
#: The ``GraphModule.meta`` key where :func:`trace_training` says how it traced: fake or real.
TRACING_MODE_KEY = "tensorarena_tracing_mode"


def lazy_modules() -> contextlib.AbstractContextManager[None]:
    """Within it, ``make_fx`` makes FX's lazy module (``_LazyGraphModule``): its ``forward`` is
    written and compiled when something runs or reads it, not as it is made. The planner never
    runs the traced step's module; writing it was the build's peak (the whole step's Python,
    thousands of nodes, and its syntax tree). A torch without it traces as before."""
    from torch.fx import _lazy_graph_module

    use = getattr(_lazy_graph_module, "_use_lazy_graph_module", None)
    return use(True) if use is not None else contextlib.nullcontext()


def trace_training(
    model: torch.nn.Module,
    example_inputs: Sequence[Any] | Any = (),
    example_kwargs: Mapping[str, Any] | None = None,
    *,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    tracing_mode: Literal["fake", "real"] = "fake",
) -> torch.fx.GraphModule:
    """Trace one training step (forward, loss, gradients of every trainable parameter) as a graph.

    The loss is ``loss_fn(output)``, or else ``output.loss`` when the model returns one, or else
    the sum of every floating-point tensor in the output. The graph returns the loss and the
    gradients; its placeholders are the parameters, the module buffers, then the inputs, marked
    in ``node.meta`` so that :func:`~tensorarena.planning.torch_frontend.problem_from_fx` leaves
    them out of the plan. The model is traced in its current mode (call ``model.train()`` first
    for dropout and batch statistics).
    ``tracing_mode="fake"`` (default) runs no real kernel; ``"real"`` does. Where fake tensors
    cannot trace the step (a guard on a value computed in the graph, such as torch 2.11's
    ``GuardOnDataDependentSymNode: Eq(u0, 1)`` on one architecture), it is traced again with real
    tensors, which run every kernel once; ``gm.meta[TRACING_MODE_KEY]`` says which mode made it.
    A step that neither can trace is an :class:`InvalidProblemError`.
    """
    th = load_torch()
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils import _pytree as pytree

    if isinstance(example_inputs, th.Tensor):
        example_inputs = (example_inputs,)
    args = tuple(example_inputs)
    kwargs = dict(example_kwargs or {})
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    trainable = [p.requires_grad for p in params.values()]
    if not any(trainable):
        raise InvalidProblemError("the model has no trainable parameter to differentiate")

    def step(
        p: list[torch.Tensor], b: list[torch.Tensor], a: tuple[Any, ...], k: dict[str, Any]
    ) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        state = {**dict(zip(params, p, strict=True)), **dict(zip(buffers, b, strict=True))}
        out = th.func.functional_call(model, state, a, k)
        loss = loss_fn(out) if loss_fn is not None else default_loss(out)
        wrt = [t for t, grad in zip(p, trainable, strict=True) if grad]
        grads = th.autograd.grad(loss, wrt, allow_unused=True)
        return loss, list(grads)

    inputs = (list(params.values()), list(buffers.values()), args, kwargs)
    try:
        with lazy_modules():
            gm = make_fx(step, tracing_mode=tracing_mode)(*inputs)
    except data_dependent_errors() as exc:
        if tracing_mode == "real":
            raise InvalidProblemError(f"cannot trace the training step: {exc}") from exc
        tracing_mode = "real"  # real values answer the guards that fake ones cannot
        try:
            with lazy_modules():
                gm = make_fx(step, tracing_mode=tracing_mode)(*inputs)
        except Exception as again:
            raise InvalidProblemError(
                f"cannot trace the training step with fake tensors ({type(exc).__name__}: "
                f"{exc}) nor with real ones ({type(again).__name__}: {again})"
            ) from again
    gm.meta[TRACING_MODE_KEY] = tracing_mode
    sources = (
        [("parameter", n) for n in params]
        + [("buffer", n) for n in buffers]
        + [("input", f"input{i}") for i in range(len(pytree.tree_leaves((args, kwargs))))]
    )
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) == len(sources):  # make_fx gives one placeholder per flattened leaf
        for node, (kind, source) in zip(placeholders, sources, strict=True):
            node.meta[KIND_KEY] = kind
            node.meta[SOURCE_KEY] = source
    return gm


def data_dependent_errors() -> tuple[type[BaseException], ...]:
    """What fake tracing raises on a value it cannot know (looked up: names move across torch
    versions)."""
    import importlib

    found: list[type[BaseException]] = []
    for module, name in (
        ("torch.fx.experimental.symbolic_shapes", "GuardOnDataDependentSymNode"),
        ("torch._subclasses.fake_tensor", "DataDependentOutputException"),
        ("torch._subclasses.fake_tensor", "DynamicOutputShapeException"),
    ):
        error = getattr(importlib.import_module(module), name, None)
        if isinstance(error, type) and issubclass(error, BaseException):
            found.append(error)
    return tuple(found)


def default_loss(out: Any) -> torch.Tensor:
    """The loss :func:`trace_training` trains on when given no ``loss_fn``: the output's ``loss``
    where it has one (a transformers model given labels), else the sum of its floating-point
    tensors that require grad."""
    th = load_torch()
    from torch.utils import _pytree as pytree

    loss = getattr(out, "loss", None)
    if isinstance(loss, th.Tensor):
        return cast("torch.Tensor", loss)
    if hasattr(out, "to_tuple"):  # transformers' ModelOutput
        out = out.to_tuple()
    leaves = [
        t
        for t in pytree.tree_leaves(out)
        if isinstance(t, th.Tensor) and t.is_floating_point() and t.requires_grad
    ]
    if not leaves:
        raise InvalidProblemError("the model's output has no differentiable tensor to sum")
    return cast("torch.Tensor", sum((t.sum() for t in leaves[1:]), leaves[0].sum()))
