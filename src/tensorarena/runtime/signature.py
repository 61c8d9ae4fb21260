"""How a call's arguments become a graph's placeholders, and the graph's outputs a call's result.

Three conventions, one small class each:

- :class:`ExportedSignature` — an ``ExportedProgram``: parameters, buffers and constants come
  from the program's state, user inputs from ``(*args, **kwargs)`` laid out as the program's
  input spec says; buffer and user-input mutations are written back; user outputs are
  unflattened with its output spec. The same behaviour as ``ep.module()(*args, **kwargs)``,
  guards included: a non-tensor argument other than the one exported with is refused.
- :class:`FlatSignature` — an FX graph called with its placeholders in order (``make_fx`` and
  ``aot_autograd`` graphs); a graph with a pytree code generator is (un)flattened by its specs.
- :class:`StateSignature` — a flat graph whose leading placeholders are a module's parameters and
  buffers, read from the module at every call (a training step traced by
  :func:`~tensorarena.planning.trace_training`), so one replaced since is the one used, and
  checked like an input; its non-tensor arguments are guarded as an exported program's.

The call's layout and its non-tensor values are checked by a
:class:`~tensorarena.runtime.arguments.CallLayout`. Each also names its checked placeholders
(``input_ids``, ``input0``) for error messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tensorarena.errors import InvalidArgumentError
from tensorarena.runtime.arguments import BakedValues, CallLayout

if TYPE_CHECKING:
    import torch
    import torch.fx

__all__ = ["ExportedSignature", "FlatSignature", "Signature", "StateSignature"]


class Signature:
    """Maps a call to the flat placeholder list and the flat outputs back to a result."""

    #: (placeholder position, name) of the inputs whose shapes a call must match
    checked: list[tuple[int, str]]
    #: False when the caller guards shapes itself: static inputs are then not checked
    check: bool = True
    #: (placeholder position, name) of the inputs whose ``requires_grad`` a call warns about
    #: (once): user inputs, never parameters
    grad_watched: list[tuple[int, str]]
    #: the call's layout, where the signature checks one (names arguments and their values)
    layout: CallLayout | None = None
    #: the layout's baked values at their placeholders' positions
    _placeholder_baked: BakedValues | None = None

    def flatten(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        """The placeholder values, in graph order."""
        raise NotImplementedError

    def unflatten(self, outputs: Any, inputs: list[Any]) -> Any:
        """The call's result from the graph's outputs (``inputs``: what :meth:`flatten` gave)."""
        raise NotImplementedError

    def check_flat(self, inputs: list[Any]) -> None:
        """Refuse placeholder values (``run_flat``'s) whose baked values differ from the graph's
        (:meth:`flatten` checks its own)."""
        if self._placeholder_baked is not None:
            self._placeholder_baked.check(inputs)


class ExportedSignature(Signature):
    """The calling convention of an ``ExportedProgram`` (see the module docstring)."""

    #: what a baked value that differs is told to do instead (from_module re-exports)
    ADVICE = (" To pass other values, export with the value as a tensor, or an int marked "
              "dynamic (dynamic_shapes, torch.export.Dim.DYNAMIC), or build with "
              "PlannedProgram.from_module, which exports again for each new value.")

    def __init__(self, ep: torch.export.ExportedProgram) -> None:
        from torch.export.graph_signature import (
            ConstantArgument,
            InputKind,
            OutputKind,
            SymIntArgument,
            TensorArgument,
        )

        self._out_spec = ep.call_spec.out_spec
        state = {**ep.state_dict, **ep.constants}
        self._fixed: list[tuple[int, Any]] = []  # (position, value) from the program's state
        self._user: list[int] = []  # positions of user inputs, in flattening order
        self.checked = []
        baked: dict[int, Any] = {}  # user input index -> the value exported with
        by_target: dict[str, int] = {}
        for position, spec in enumerate(ep.graph_signature.input_specs):
            if spec.kind == InputKind.USER_INPUT:
                self._user.append(position)
                name = getattr(spec.arg, "name", f"input{len(self._user) - 1}")
                if isinstance(spec.arg, (TensorArgument, SymIntArgument)):
                    self.checked.append((position, name))  # an int marked dynamic: a size
                elif isinstance(spec.arg, ConstantArgument):
                    baked[len(self._user) - 1] = spec.arg.value
            elif spec.target is not None and spec.target in state:
                self._fixed.append((position, state[spec.target]))
                by_target[spec.target] = position
            else:
                raise InvalidArgumentError(
                    f"exported input {spec.arg} of kind {spec.kind.name} is not supported "
                    "by the planned executor"
                )
        call = ep.module_call_graph[0].signature if ep.module_call_graph else None
        self.layout = self._layout = CallLayout(ep.call_spec.in_spec,
                                                names=getattr(call, "forward_arg_names",
                                                              None) or (),
                                                baked=baked, advice=self.ADVICE)
        self.grad_watched = list(self.checked)
        user = self._user
        self._placeholder_baked = self._layout.baked.moved(lambda i: user[i])
        self._size = len(ep.graph_signature.input_specs)
        user_positions = {spec.arg.name: i for i, spec in enumerate(ep.graph_signature.input_specs)
                          if spec.kind == InputKind.USER_INPUT and hasattr(spec.arg, "name")}
        # Outputs: (kind, where): user outputs are returned, mutations are written back.
        self._outputs: list[tuple[str, int | None]] = []
        for spec in ep.graph_signature.output_specs:
            if spec.kind == OutputKind.BUFFER_MUTATION and spec.target in by_target:
                self._outputs.append(("write", by_target[spec.target]))
            elif spec.kind == OutputKind.USER_INPUT_MUTATION and spec.target in user_positions:
                self._outputs.append(("write", user_positions[spec.target]))
            elif spec.kind == OutputKind.TOKEN:
                self._outputs.append(("drop", None))
            else:
                self._outputs.append(("user", None))

    def flatten(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        flat = self._layout.flatten(args, kwargs)
        inputs: list[Any] = [None] * self._size
        for position, value in self._fixed:
            inputs[position] = value
        for position, value in zip(self._user, flat, strict=True):
            inputs[position] = value
        return inputs

    def unflatten(self, outputs: Any, inputs: list[Any]) -> Any:
        from torch.utils import _pytree as pytree

        user = []
        for (kind, position), value in zip(self._outputs, outputs, strict=True):
            if kind == "user":
                user.append(value)
            elif kind == "write" and position is not None:
                inputs[position].copy_(value)
        return pytree.tree_unflatten(user, self._out_spec)


class FlatSignature(Signature):
    """Placeholders in order; a pytree code generator's specs, if the graph has one."""

    def __init__(self, gm: torch.fx.GraphModule, names: Sequence[str] | None = None,
                 *, check: bool = True) -> None:
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self._size = len(placeholders)
        info = getattr(gm.graph._codegen, "pytree_info", None)
        self._in_spec = getattr(info, "in_spec", None)
        self._out_spec = getattr(info, "out_spec", None)
        labels = list(names) if names is not None else [n.name for n in placeholders]
        self.checked = list(enumerate(labels))
        self.check = check
        # An ATen graph (make_fx, aot_autograd, a traced training step) is below autograd: its
        # inputs may require grad by design (parameters; dynamo's), nothing to warn about.
        self.grad_watched = []

    def flatten(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        from torch.utils import _pytree as pytree

        if self._in_spec is not None:
            flat, spec = pytree.tree_flatten((args, kwargs) if kwargs else args)
            if spec != self._in_spec and not kwargs:
                flat, spec = pytree.tree_flatten((args, {}))
            inputs = list(flat)
        else:
            if kwargs:
                raise InvalidArgumentError("this program takes positional arguments only")
            inputs = list(args)
        if len(inputs) != self._size:
            raise InvalidArgumentError(f"the program takes {self._size} inputs, got {len(inputs)}")
        return inputs

    def unflatten(self, outputs: Any, inputs: list[Any]) -> Any:
        from torch.utils import _pytree as pytree

        if self._out_spec is not None:
            return pytree.tree_unflatten(list(outputs), self._out_spec)
        return outputs


class StateSignature(Signature):
    """``parameters + buffers + flattened (args, kwargs)``, the first two read from ``module``
    at each call (so an optimizer's in-place updates and replaced parameters are seen)."""

    ADVICE = " Make a TrainingStep with that value for it."

    def __init__(self, module: torch.nn.Module, gm: torch.fx.GraphModule,
                 example: tuple[tuple[Any, ...], dict[str, Any]]) -> None:
        import torch
        from torch.utils import _pytree as pytree

        self._module = module
        self._state = self._state_names()
        flat, in_spec = pytree.tree_flatten(example)
        # make_fx bakes every non-tensor leaf of the example into the step.
        baked = {i: v for i, v in enumerate(flat) if not isinstance(v, torch.Tensor)}
        self.layout = self._layout = CallLayout(
            in_spec, names=_positional_names(module, len(example[0])), baked=baked,
            advice=self.ADVICE)
        # The step's parameters require grad by design; its outputs are its gradients.
        self.grad_watched = []
        first = len(self._state)
        self._placeholder_baked = self._layout.baked.moved(lambda i: first + i)
        info = getattr(gm.graph._codegen, "pytree_info", None)
        self._out_spec = getattr(info, "out_spec", None)
        # Parameters and buffers are checked like inputs: one replaced by a tensor of another
        # shape or dtype (model.half(), a new head) is refused naming it.
        self.checked = [*enumerate(self._state),
                        *((len(self._state) + i, f"input{i}") for i in range(len(flat)))]

    def _state_names(self) -> list[str]:
        return [*(name for name, _ in self._module.named_parameters()),
                *(name for name, _ in self._module.named_buffers())]

    def flatten(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        flat = self._layout.flatten(args, kwargs)
        state = [*(p for _, p in self._module.named_parameters()),
                 *(b for _, b in self._module.named_buffers())]
        if len(state) != len(self._state):
            raise InvalidArgumentError(
                f"the module has {len(state)} parameters and buffers now, the step was traced "
                f"with {len(self._state)} ({self._state_names()} now, {self._state} then): "
                "make a new TrainingStep"
            )
        return [*state, *flat]

    def unflatten(self, outputs: Any, inputs: list[Any]) -> Any:
        from torch.utils import _pytree as pytree

        if self._out_spec is not None:
            return pytree.tree_unflatten(list(outputs), self._out_spec)
        return outputs


def _positional_names(module: torch.nn.Module, count: int) -> list[str]:
    """The names of ``module.forward``'s first ``count`` positional parameters, as far as it
    has named ones (``*args`` is left to the layout's ``args[i]``)."""
    import inspect

    try:
        parameters = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return []
    named = [p.name for p in parameters
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return named[:count]
