"""How a call's arguments become a graph's placeholders, and the graph's outputs a call's result.

Three conventions, one small class each:

- :class:`ExportedSignature` — an ``ExportedProgram``: parameters, buffers and constants come
  from the program's state, user inputs from ``(*args, **kwargs)`` flattened with the program's
  input spec; buffer and user-input mutations are written back; user outputs are unflattened
  with its output spec. The same behaviour as ``ep.module()(*args, **kwargs)``.
- :class:`FlatSignature` — an FX graph called with its placeholders in order (``make_fx`` and
  ``aot_autograd`` graphs); a graph with a pytree code generator is (un)flattened by its specs.
- :class:`StateSignature` — a flat graph whose leading placeholders are a module's parameters and
  buffers, read from the module at every call (a training step traced by
  :func:`~tensorarena.planning.trace_training`), so one replaced since is the one used, and
  checked like an input.

Each also names its checked placeholders (``input_ids``, ``input0``) for error messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tensorarena.errors import InvalidArgumentError

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

    def flatten(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        """The placeholder values, in graph order."""
        raise NotImplementedError

    def unflatten(self, outputs: Any, inputs: list[Any]) -> Any:
        """The call's result from the graph's outputs (``inputs``: what :meth:`flatten` gave)."""
        raise NotImplementedError


class ExportedSignature(Signature):
    """The calling convention of an ``ExportedProgram`` (see the module docstring)."""

    def __init__(self, ep: torch.export.ExportedProgram) -> None:
        from torch.export.graph_signature import InputKind, OutputKind, TensorArgument

        self._in_spec = ep.call_spec.in_spec
        self._out_spec = ep.call_spec.out_spec
        state = {**ep.state_dict, **ep.constants}
        self._fixed: list[tuple[int, Any]] = []  # (position, value) from the program's state
        self._user: list[int] = []  # positions of user inputs, in flattening order
        self.checked = []
        by_target: dict[str, int] = {}
        for position, spec in enumerate(ep.graph_signature.input_specs):
            if spec.kind == InputKind.USER_INPUT:
                self._user.append(position)
                name = getattr(spec.arg, "name", f"input{len(self._user) - 1}")
                if isinstance(spec.arg, TensorArgument):
                    self.checked.append((position, name))
            elif spec.target is not None and spec.target in state:
                self._fixed.append((position, state[spec.target]))
                by_target[spec.target] = position
            else:
                raise InvalidArgumentError(
                    f"exported input {spec.arg} of kind {spec.kind.name} is not supported "
                    "by the planned executor"
                )
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
        from torch.export._tree_utils import reorder_kwargs
        from torch.utils import _pytree as pytree

        try:
            kwargs = reorder_kwargs(kwargs, self._in_spec) if kwargs else kwargs
        except (ValueError, KeyError, AssertionError) as exc:
            raise InvalidArgumentError(f"keyword arguments do not match the program: {exc}") \
                from None
        flat, spec = pytree.tree_flatten((args, kwargs))
        if spec != self._in_spec:
            raise InvalidArgumentError(
                f"the program takes inputs structured as {self._in_spec}, got {spec}"
            )
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

    def __init__(self, module: torch.nn.Module, gm: torch.fx.GraphModule,
                 example: tuple[tuple[Any, ...], dict[str, Any]]) -> None:
        from torch.utils import _pytree as pytree

        self._module = module
        self._state = self._state_names()
        flat, self._in_spec = pytree.tree_flatten(example)
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
        from torch.utils import _pytree as pytree

        flat, spec = pytree.tree_flatten((args, kwargs))
        if spec != self._in_spec:
            raise InvalidArgumentError(
                f"the step was traced for inputs structured as {self._in_spec}, got {spec}"
            )
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
