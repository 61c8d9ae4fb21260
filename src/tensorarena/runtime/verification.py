"""Checking a plan by running it: :func:`verify_call`, behind :meth:`PlannedProgram.verify`.

The call runs code generated with ``poison=True``: the whole arena is overwritten before the first
node and every slot at the end of its buffer's lifetime, so a lifetime computed too short (a
buffer read after the plan let another take its bytes) shows as outputs that differ from the
unplanned graph's, instead of passing by luck because the stale bytes were still there. It also
checks that no op moved or reshaped a slot (the data pointer, shape, strides and offset of every
slot are the same after the call as before).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tensorarena._optional import load_torch
from tensorarena.errors import InvalidArgumentError, PlanVerificationError
from tensorarena.runtime.output_placement import call_memory
from tensorarena.runtime.shape_code import generate_code, serving
from tensorarena.runtime.shape_plans import specialization_for

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from tensorarena.runtime.compiler import Compiler

__all__ = ["verify_call"]


def verify_call(compiler: Compiler, reference: Callable[..., Any] | None,
                args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run the program of ``compiler`` on ``(*args, **kwargs)`` poisoned and compare with
    ``reference`` (module docstring); return the planned outputs or raise
    :class:`PlanVerificationError`."""
    torch = load_torch()
    if reference is None:
        raise InvalidArgumentError("this program has no reference to compare with")
    # Inputs the program refuses are refused before the reference sees them, with the
    # program's own error rather than whatever the reference's ops raise.
    inputs = compiler.signature.flatten(args, kwargs)
    bindings = compiler.binder.bind(inputs)
    # Both runs draw the same random numbers (dropout masks): same state before each.
    rng = torch.random.get_rng_state()
    with compiler.no_grad():
        expected = reference(*args, **kwargs)
    torch.random.set_rng_state(rng)
    with compiler.workspace.use(), compiler.no_grad():
        current = specialization_for(compiler, bindings)
        compiler.bindings = bindings
        checked = generate_code(compiler, current.graph, current.lowering, current.plan,
                                poison=True, memory=call_memory(compiler, current),
                                kernel=serving(current))
        layouts = {k: _layout(t) for k, t in checked.slots.items()}
        flat = checked.run(inputs)
        moved = [k for k, t in checked.slots.items() if _layout(t) != layouts[k]]
    got = compiler.signature.unflatten(flat, inputs)
    if moved:
        raise PlanVerificationError(f"ops changed the layout of the slots of {moved}")
    from torch.utils import _pytree as pytree

    # Compared leaf by leaf: assert_close knows containers and tensors, not every class a
    # program may return as a pytree node (transformers' DynamicCache holds its outputs' keys).
    got_leaves, got_spec = pytree.tree_flatten(got)
    expected_leaves, expected_spec = pytree.tree_flatten(expected)
    if got_spec != expected_spec:
        raise PlanVerificationError(
            f"outputs are structured as {got_spec}, the unplanned graph's as {expected_spec}")
    try:
        torch.testing.assert_close(got_leaves, expected_leaves, equal_nan=False)
    except AssertionError as exc:
        raise PlanVerificationError(
            f"outputs differ from the unplanned graph's with dead buffers poisoned: {exc}"
        ) from None
    return got


def _layout(tensor: torch.Tensor) -> tuple[Any, ...]:
    return (tensor.data_ptr(), tuple(tensor.shape), tensor.stride(), tensor.storage_offset())
