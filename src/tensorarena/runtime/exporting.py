"""Exporting a module for a planned program: what ``torch.export`` needs first, its errors as ours.

:func:`export_module` is ``torch.export.export`` under ``no_grad``, with three things around it:

- **Inputs that have data.** A tensor on the ``meta`` device, among the example inputs or the
  model's parameters and buffers, has a shape and no values; export may even capture it, but the
  program cannot run. It is refused before the export starts (which takes seconds to minutes
  at full size), naming the tensor (:func:`check_has_data`).
- **transformers' KV caches.** A transformers model whose config enables ``use_cache`` returns
  its keys and values in a ``Cache`` object (``DynamicCache``, ``EncoderDecoderCache``), which
  export can only flatten into tensors once the class is a pytree node; transformers does not
  register it on import (5.x), so ``GPT2LMHeadModel(GPT2Config())`` failed to export. Its own
  registration is run first (:func:`_register_caches`), so the program returns what the model
  does: the logits and a cache of the same class, whose tensors are outputs of the graph (a
  generation can go on from it as from eager's). Where the installed transformers has no
  registration, the model is exported with its config's ``use_cache`` off, unless the caller
  passed ``use_cache``: the outputs are then the model's without the cache (``None`` in its
  place); pass ``{"use_cache": True}`` to insist (and register the class yourself).
- **torch's errors as ours.** A failure raises :class:`~tensorarena.errors.ExportFailedError`
  (:class:`~tensorarena.errors.DataDependentError` for a branch on a tensor's value) whose
  first line says what failed and why, followed by what to try; torch's error is its cause,
  its traceback trimmed to the frames outside torch (the model's own code, where it stopped)
  so that the part a user can act on is not buried under hundreds of tracing frames.
  ``torch.export.export(model, args)`` itself shows the whole of it.
- **Less left behind.** torch 2.13 keeps a map from the last trace's fake tensors to its nodes
  (the whole traced graph, :func:`_forget_trace`), and the stack traces export records read the
  source of every file they pass through into :mod:`linecache` (the model's modules, torch's
  own: a megabyte or more for a transformers model). Both go after the export; lines of files
  on disk are read again when a traceback needs them.

:func:`check_sizes_follow_shapes` refuses an exported program in which a tensor's size
depends on the values of the inputs (``x[x > 0]``, ``torch.nonzero``): a plan is made before
the call, from the inputs' shapes. It runs on every ``ExportedProgram`` a planned program is
built from, before planning.
"""

from __future__ import annotations

import linecache
import os
import re
import sys
import types
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

from tensorarena._optional import load_torch
from tensorarena.errors import DataDependentError, ExportFailedError, InvalidArgumentError
from tensorarena.runtime.export_process import can_export_in_child, export_in_child

if TYPE_CHECKING:
    import torch
    import torch.fx

__all__ = ["ISOLATE_BY_DEFAULT", "check_has_data", "check_sizes_follow_shapes", "export_module"]

#: What every export failure can try (after the advice that fits the failure).
_GENERAL = (
    "torch.compile(model, backend='tensorarena'), which plans the parts export cannot capture "
    "whole (graph breaks); strict=False if you passed True; a dynamic_shapes spec if a "
    "dimension changes between calls; or export the model yourself and pass the program to "
    "PlannedProgram.from_exported"
)
#: torch's words for an object in a model's inputs or outputs that it cannot flatten.
_UNKNOWN_TYPE = re.compile(r"Found <class '([^']+)'> in (output|input)")
#: Whether a program's export runs in a child process where none is asked for and one can run:
#: what the export imports and caches then stays out of this process, at the cost of saving and
#: reading the program once (bench/RESULTS.md has both, measured).
ISOLATE_BY_DEFAULT = True
_TORCH_DIR: str | None = None  # set at first use: the directory of the torch package


def export_module(model: torch.nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any],
                  *, dynamic_shapes: Any, strict: bool,
                  isolated: bool | None = None) -> torch.export.ExportedProgram:
    """``torch.export.export`` under ``no_grad`` (see the module docstring); its failure
    raises :class:`ExportFailedError` carrying torch's error and what to try. ``isolated``
    runs it in a child process where one can run (:mod:`~tensorarena.runtime.export_process`);
    ``None`` means :data:`ISOLATE_BY_DEFAULT`."""
    if isolated is not None and not isinstance(isolated, bool):
        raise InvalidArgumentError(
            f"isolate_export takes True, False or None (where a child can run), got {isolated!r}")
    check_has_data(model, args, kwargs)

    def export_here() -> torch.export.ExportedProgram:
        return _export(model, args, kwargs, dynamic_shapes=dynamic_shapes, strict=strict)

    if isolated is None:
        isolated = ISOLATE_BY_DEFAULT
    if isolated and can_export_in_child():
        # the child registers the caches for the export (_caches_exportable); here, only a
        # program whose inputs or outputs hold one needs them (transformers' exporter modules
        # weigh 1.5 MiB of objects: a ResNet's or BERT's program reads none)
        register = partial(_register_caches, model) if _is_transformers_model(model) else None
        ep = export_in_child(export_here, model, register=register)
        if ep is not None:
            return ep
    return export_here()


def _export(model: torch.nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any],
            *, dynamic_shapes: Any, strict: bool) -> torch.export.ExportedProgram:
    th = load_torch()
    cached = set(linecache.cache)
    try:
        with th.no_grad(), _caches_exportable(model, kwargs):
            ep: torch.export.ExportedProgram = th.export.export(
                model, tuple(args), dict(kwargs), dynamic_shapes=dynamic_shapes, strict=strict)
            return ep
    except Exception as exc:
        error = _export_error(type(model).__name__, exc)
        raise error from exc.with_traceback(_outside_torch(exc.__traceback__))
    finally:
        _forget_trace()
        _forget_source_lines(cached)


def _forget_trace() -> None:
    """Drop what torch 2.13's export keeps of its last trace: a module-level map from its fake
    tensors to the traced graph's nodes (``_FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT``), which
    kept the whole traced graph alive after every program built from it was deleted. Only an
    export in progress reads it; where torch has no such map, nothing to do."""
    try:
        from torch.fx.experimental import proxy_tensor
    except ImportError:  # pragma: no cover - torch without FX
        return
    traced = getattr(proxy_tensor, "_FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT", None)
    if isinstance(traced, dict):
        traced.clear()


def _forget_source_lines(cached: set[str]) -> None:
    """Drop the :mod:`linecache` entries made since ``cached`` for files on disk (those with a
    modification time: read again on demand); sources registered without a file stay."""
    for name in set(linecache.cache) - cached:
        entry = linecache.cache.get(name)
        if entry is not None and len(entry) == 4 and entry[1] is not None:
            linecache.cache.pop(name, None)


# ----------------------------------------------------------------------------------------------
# Before the export
# ----------------------------------------------------------------------------------------------


def check_has_data(model: torch.nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Raise :class:`InvalidArgumentError` when an example input, parameter or buffer is a
    tensor on the ``meta`` device (a shape without values: the program could not run)."""
    th = load_torch()
    from torch.utils import _pytree as pytree

    for label, tree in (("args", tuple(args)), ("kwargs", dict(kwargs))):
        for path, leaf in pytree.tree_flatten_with_path(tree)[0]:
            if isinstance(leaf, th.Tensor) and leaf.is_meta:
                raise InvalidArgumentError(
                    f"{label}{pytree.keystr(path)} is a tensor on the meta device "
                    f"(shape {tuple(leaf.shape)}, {leaf.dtype}, no data): a planned program "
                    "runs the model on real tensors. Pass a tensor with data instead, e.g. "
                    f"torch.zeros({tuple(leaf.shape)}, dtype={leaf.dtype}) on the model's "
                    "device: its values do not matter, its shape and dtype are what is planned"
                )
    state = [*model.named_parameters(), *model.named_buffers()]
    meta = [name for name, tensor in state if tensor.is_meta]
    if meta:
        raise InvalidArgumentError(
            f"{len(meta)} of the model's {len(state)} parameters and buffers are on the meta "
            f"device (first {meta[0]!r}): its weights were never loaded (built under "
            "torch.device('meta') or init_empty_weights, or loaded with a meta device_map), and "
            "a planned program runs on real weights. Load them first: model.to_empty(device="
            "'cpu') then model.load_state_dict(weights), or from_pretrained without a meta "
            "device map"
        )


@contextmanager
def _caches_exportable(model: torch.nn.Module, kwargs: Mapping[str, Any]) -> Iterator[None]:
    """Around the export of ``model``: its KV cache classes registered as pytree nodes (module
    docstring), or, where they cannot be and the caller did not pass ``use_cache``, the cache
    turned off in its config (as transformers' own exporter sets such flags) and back on after.
    The config, not a ``use_cache=False`` argument: the program is then called as the model is."""
    config: Any = getattr(model, "config", None)
    # Registered whatever the caller passed: use_cache=True, or a cache among the inputs.
    if (not _is_transformers_model(model) or _register_caches(model)
            or "use_cache" in kwargs or not getattr(config, "use_cache", False)):
        yield
        return
    was = config.use_cache
    config.use_cache = False
    try:
        yield
    finally:
        config.use_cache = was


def _is_transformers_model(model: Any) -> bool:
    return "transformers" in sys.modules and any(
        cls.__module__.startswith("transformers.") for cls in type(model).__mro__)


def _register_caches(model: torch.nn.Module) -> bool:
    """Register the model's cache classes as pytree nodes with transformers' own function
    (transformers ``5.x``: every ``Cache`` subclass and the model's own; ``4.5x``:
    ``DynamicCache``); True when
    ``DynamicCache`` is one afterwards (by this or by the import of transformers itself)."""
    from torch.utils import _pytree as pytree

    register: Any = None  # typed as transformers' versions type them: not at all, or not so
    try:
        from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model
    except ImportError:
        try:
            from transformers.integrations.executorch import (
                register_dynamic_cache_export_support,
            )
        except ImportError:
            pass
        else:
            register = register_dynamic_cache_export_support
            register()
    else:
        register = register_cache_pytrees_for_model
        register(model)
    try:
        from transformers.cache_utils import DynamicCache
    except ImportError:  # transformers of before caches: they are tuples, which export flattens
        return True
    return DynamicCache in pytree.SUPPORTED_NODES


# ----------------------------------------------------------------------------------------------
# After the export
# ----------------------------------------------------------------------------------------------


def check_sizes_follow_shapes(graph: torch.fx.Graph, name: str) -> None:
    """Raise :class:`DataDependentError` when a tensor of ``graph`` has a size that depends on
    the values of the inputs (an unbacked symbol, ``u0``), naming the first such node."""
    th = load_torch()
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    for node in graph.nodes:
        value = node.meta.get("val")
        for v in value if isinstance(value, (list, tuple)) else (value,):
            if not isinstance(v, th.Tensor):
                continue
            symbols = free_unbacked_symbols(v.shape)
            if not symbols:
                continue
            where = _model_line(node.meta.get("stack_trace"))
            raise DataDependentError(
                f"{name}: the size of tensor {node.name!r} ({node.target}, shape "
                f"{tuple(v.shape)}) depends on the values in the inputs, not only on their "
                f"shapes{f', at {where}' if where else ''}; a plan is made before the call, "
                "so it cannot size it\n"
                "What to try: torch.compile(model, backend='tensorarena'), which plans the "
                "parts around it (graph breaks); or compute it at a size the shapes fix "
                "(torch.where(x > 0, x, 0) in place of x[x > 0])",
                where=where or node.name,
            )


def _model_line(stack_trace: str | None) -> str:
    """``file.py:12 in forward: `code``` from a node's ``stack_trace`` (its innermost frame)."""
    if not stack_trace:
        return ""
    found = re.findall(r'File "([^"]+)", line (\d+), in (\w+)\n\s*(.*)', stack_trace)
    if not found:
        return ""
    path, line, function, code = found[-1]
    return f"{os.path.basename(path)}:{line} in {function}: `{code.strip()}`"


# ----------------------------------------------------------------------------------------------
# torch's errors as ours
# ----------------------------------------------------------------------------------------------


def _export_error(model: str, exc: Exception) -> ExportFailedError:
    """Our error for torch's ``exc``: its first line says what failed, then what to try."""
    from tensorarena.planning.torch_frontend import data_dependent_errors

    text = str(exc).strip()
    head = f"torch.export could not capture {model}"
    unknown = _UNKNOWN_TYPE.search(text)
    if isinstance(exc, data_dependent_errors()) or "data-dependent" in text.lower():
        where = _innermost_outside_torch(exc.__traceback__)
        return DataDependentError(
            f"{head}: a branch or a size depends on the values in its inputs"
            f"{f' (at {where})' if where else ''}, which export cannot follow\n"
            "What to try: torch.compile(model, backend='tensorarena'), which plans the parts "
            "around it (graph breaks); or compute without the branch (torch.where, torch.cond)",
            where=where,
        )
    if unknown is not None:
        qualified, side = unknown.groups()
        short = qualified.rsplit(".", 1)[-1]
        advice = (
            f"return tensors (or tuples, lists and dicts of them), or register {short} with "
            "torch.utils._pytree.register_pytree_node"
        )
        if short.endswith("Cache"):
            advice = (
                "pass use_cache=False (PlannedProgram.from_module(model, args, "
                f"{{'use_cache': False}})), or register {short} with "
                "torch.utils._pytree.register_pytree_node"
            )
        return ExportFailedError(
            f"{head}: its {side} holds a {short} ({qualified}), which export cannot flatten "
            f"into tensors\nWhat to try: {advice}"
        )
    first = text.splitlines()[0] if text else ""
    if len(first) > 200:
        first = first[:199] + "…"
    return ExportFailedError(
        f"{head}: {type(exc).__name__}: {first}\nWhat to try: {_GENERAL}")


def _torch_dir() -> str:
    global _TORCH_DIR
    if _TORCH_DIR is None:
        _TORCH_DIR = os.path.dirname(str(load_torch().__file__)) + os.sep
    return _TORCH_DIR


def _outside_torch(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` without its frames inside torch or generated by it (``<string>``), the innermost
    frame kept: where the error was raised."""
    frames = []
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    torch_dir = _torch_dir()
    kept = [f for k, f in enumerate(frames) if k == len(frames) - 1
            or not f.tb_frame.f_code.co_filename.startswith((torch_dir, "<"))]
    trimmed = None
    for frame in reversed(kept):
        trimmed = types.TracebackType(trimmed, frame.tb_frame, frame.tb_lasti, frame.tb_lineno)
    return trimmed


def _innermost_outside_torch(tb: types.TracebackType | None) -> str:
    """``file.py:12 in forward`` of the innermost frame outside torch and tensorarena (the
    model's line that failed), or ``""``."""
    torch_dir = _torch_dir()
    own_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    where = ""
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename
        if not path.startswith((torch_dir, own_dir)) and not path.startswith("<"):
            where = f"{os.path.basename(path)}:{tb.tb_lineno} in {tb.tb_frame.f_code.co_name}"
        tb = tb.tb_next
    return where
