"""``torch.export`` in a child process, so that what it leaves behind stays out of this one.

An export imports several hundred modules this process never needs again (``torch.export``'s
tracer pulls in ``aot_autograd``, its partitioners and ``networkx``) and fills caches that are
never emptied: tens of megabytes of resident memory that stayed after every program built from
it was deleted, more than a small model's whole plan. :func:`export_in_child` forks, exports
there, and sends back the program: a program with static shapes and no subgraphs in the
planner's form (:mod:`~tensorarena.runtime.export_wire`: the graph rebuilt here node by node,
which leaves far less garbage among its objects than ``torch.export.load``'s parse), any other
with ``torch.export.save``, read here with ``torch.export.load`` (a score of modules imported and
no tracer). The model's parameters and persistent buffers do not travel (torch's format sends
each as a shape, a ``meta`` tensor): the copy read here gets the model's tensors back by name
(constants that are the model's buffers too), the very objects an export made here would hold.
Everything else (the graph, its symbolic shapes, constants the export lifted out of the code,
the example inputs) travels whole.

The child runs only where it is safe and can help: where the platform forks, while this
process runs no other Python thread (a lock another thread holds at the fork would never be
freed in the child; tqdm's progress monitor, which FX and model downloads start, is stopped for
the fork and comes back with the next progress bar) and before it has made a CUDA context
(which a forked child cannot use). A program that ``torch.export.save`` cannot write (a custom
class among its constants) or ``torch.export.load`` cannot read gives ``None``: it is exported
here. A failure of the export itself comes back as the error the same export raises here: its
class, message and attributes, with torch's error and the model's frames as text in its cause
(:class:`ExportProcessError`).
"""

from __future__ import annotations

import io
import os
import pickle
import signal
import struct
import sys
import threading
import traceback
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from functools import partial
from typing import TYPE_CHECKING, Any

import tensorarena.errors as error_classes
from tensorarena._optional import load_torch
from tensorarena.errors import ExportFailedError, ExportProcessError
from tensorarena.interop.other_threads import is_progress_monitor, other_threads
from tensorarena.runtime.export_wire import lazy_graph_modules, pack, propagate_fakes, unpack

if TYPE_CHECKING:
    import torch

__all__ = ["can_export_in_child", "export_in_child", "reloader", "threads_in_the_way",
           "unregistered_nodes"]

_OK, _FAILED, _UNSAVED = b"O", b"F", b"U"
_WIRED, _SAVED = b"W", b"S"  # the two forms of a program sent
_LENGTH = struct.Struct("<Q")

#: How to read each program sent by a child back again (by the program read, weakly): what a
#: program that gave up the exported program's graph reads to make ``verify``'s reference.
_RELOADS: weakref.WeakKeyDictionary[Any, Callable[[], torch.export.ExportedProgram]] = (
    weakref.WeakKeyDictionary())


def reloader(ep: torch.export.ExportedProgram) -> Callable[[], torch.export.ExportedProgram] | None:
    """A function that reads ``ep`` back anew from what the child sent (the same graph, node
    names and metadata, over the same tensors), or ``None`` for a program exported here."""
    return _RELOADS.get(ep)


def can_export_in_child() -> bool:
    """Whether :func:`export_in_child` may fork here: a platform with ``fork``, no Python
    thread but this one (tqdm's progress monitor aside: it is stopped for the fork), and no
    CUDA context yet (a forked child cannot use its parent's)."""
    if not hasattr(os, "fork") or threads_in_the_way():
        return False
    cuda = getattr(load_torch(), "cuda", None)
    return not (cuda is not None and cuda.is_initialized())


def threads_in_the_way() -> list[threading.Thread]:
    """The Python threads other than this one that forbid a fork (one may hold a lock the child
    would need). tqdm's monitor is not among them: it only wakes progress bars, and tqdm
    starts it again with the next bar; FX's interpreter and model downloads start one."""
    return other_threads()


def _stop_progress_monitors() -> None:
    """Stop tqdm's monitor threads (``TMonitor.exit`` sets their event and joins them)."""
    for thread in threading.enumerate():
        if is_progress_monitor(thread):
            thread.exit()  # type: ignore[attr-defined]


def export_in_child(export: Callable[[], torch.export.ExportedProgram],
                    model: torch.nn.Module, *,
                    register: Callable[[], object] | None = None
                    ) -> torch.export.ExportedProgram | None:
    """``export()`` run in a child process and read back here with ``model``'s tensors, or
    ``None`` where no child can run or the program cannot be saved (export it here). A failure
    of ``export()`` raises its error here; a child that dies raises :class:`ExportFailedError`.

    ``register`` makes the classes the program's inputs and outputs may hold pytree nodes
    here (transformers' caches): run only where the program read back holds one that is not
    (or before ``torch.export.load``, which looks them up by name), as its imports weigh
    megabytes in a process that may never need them."""
    _stop_progress_monitors()
    if threads_in_the_way():  # one started since the caller asked
        return None
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    read_end, write_end = os.pipe()
    try:
        pid = os.fork()
    except OSError:  # no process to be had (a limit on processes, or memory): export here
        os.close(read_end)
        os.close(write_end)
        return None
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        os.close(read_end)
        _child(export, model, write_end)
    os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as pipe:
            kind, payload = _receive(pipe)
    finally:
        status = _reap(pid)
    if kind == _OK:
        try:
            return _load(payload, model, register)
        except Exception:  # a program torch.export.load cannot read back is exported here
            return None
    if kind == _FAILED:
        raise _error_from(payload)
    if kind == _UNSAVED:
        return None
    raise ExportFailedError(
        f"torch.export of {type(model).__name__} ran in a child process that ended before it "
        f"answered ({_how_it_ended(status)}; out of memory?)\nWhat to try: "
        "PlannedProgram.from_module(..., isolate_export=False) exports in this process")


# ----------------------------------------------------------------------------------------------
# The child
# ----------------------------------------------------------------------------------------------


def _child(export: Callable[[], torch.export.ExportedProgram], model: torch.nn.Module,
           write_end: int) -> None:  # pragma: no cover - runs in the child
    code = 0
    try:
        load_torch().set_num_threads(1)  # the parent's thread pool did not come with the fork
        with os.fdopen(write_end, "wb") as pipe:
            try:
                ep = export()
            except BaseException as exc:  # every failure goes to the parent
                _send(pipe, _FAILED, _pickled_error(exc))
            else:
                try:
                    data = _saved_without_weights(ep, model)
                except Exception as exc:  # unsaved programs are exported there
                    _send(pipe, _UNSAVED, str(exc).encode("utf-8", "replace"))
                else:
                    _send(pipe, _OK, data)
    except BaseException:  # the parent sees a child without an answer
        code = 1
    finally:
        os._exit(code)


def _saved_without_weights(ep: torch.export.ExportedProgram, model: torch.nn.Module) -> bytes:
    """``ep`` without ``model``'s parameters and persistent buffers: in the planner's format
    where it carries the program (:mod:`~tensorarena.runtime.export_wire`), else saved by
    ``torch.export.save`` with each of them replaced by its shape (the names of the model's
    tensors to give back, then the saved bytes)."""
    th = load_torch()
    own = _named_tensors(model)
    wired = pack(ep, own)
    if wired is not None:
        return _WIRED + wired
    moved: dict[str, list[str]] = {"state_dict": [], "constants": []}
    # Constants (a non-persistent buffer among them) travel whole: torch.export.load cannot
    # read one saved as a shape. The model's own are given back by name all the same.
    moved["constants"] = [name for name, tensor in ep.constants.items() if own.get(name) is tensor]
    with _swapped(ep._state_dict, own, moved["state_dict"]):
        buffer = io.BytesIO()
        th.export.save(ep, buffer)
    names = pickle.dumps(moved, protocol=pickle.HIGHEST_PROTOCOL)
    return _SAVED + _LENGTH.pack(len(names)) + names + buffer.getvalue()


@contextmanager
def _swapped(table: dict[str, Any], own: dict[str, Any], moved: list[str]) -> Iterator[None]:
    """Each entry of ``table`` that is the model's own tensor under that name, replaced by a
    ``meta`` tensor of its shape (a ``Parameter`` stays one) while the block runs."""
    th = load_torch()
    kept = dict(table)
    for name, tensor in kept.items():
        if own.get(name) is tensor:
            shape = th.empty_like(tensor, device="meta")
            if isinstance(tensor, th.nn.Parameter):
                shape = th.nn.Parameter(shape, requires_grad=tensor.requires_grad)
            table[name] = shape
            moved.append(name)
    try:
        yield
    finally:
        table.update(kept)


def _pickled_error(exc: BaseException) -> bytes:
    """What the parent needs to raise ``exc`` as ours: class name, message, attributes, and
    the cause's text (torch's error with the frames it kept)."""
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    text = "".join(traceback.format_exception(type(cause), cause, cause.__traceback__))
    attributes = {k: v for k, v in vars(exc).items() if _picklable(v)}
    return pickle.dumps((type(exc).__name__, str(exc), attributes, text))


def _picklable(value: Any) -> bool:
    try:
        pickle.dumps(value)
    except Exception:  # anything unpicklable is left out
        return False
    return True


# ----------------------------------------------------------------------------------------------
# The parent
# ----------------------------------------------------------------------------------------------


def _send(pipe: Any, kind: bytes, payload: bytes) -> None:  # pragma: no cover - in the child
    pipe.write(kind + _LENGTH.pack(len(payload)))
    pipe.write(payload)


def _receive(pipe: Any) -> tuple[bytes, bytes]:
    head = pipe.read(1 + _LENGTH.size)
    if len(head) < 1 + _LENGTH.size:
        return b"", b""
    (length,) = _LENGTH.unpack(head[1:])
    payload = pipe.read(length)
    return (head[:1], payload) if len(payload) == length else (b"", b"")


def _reap(pid: int) -> int:
    """Wait for the child (its exit status; 0 where the system reaped it already: ``SIGCHLD``
    ignored); a ``KeyboardInterrupt`` here kills it first."""
    try:
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:
        return 0
    except BaseException:
        with suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        with suppress(ChildProcessError):
            os.waitpid(pid, 0)
        raise


def _how_it_ended(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit status {os.WEXITSTATUS(status)}"


def _load(payload: bytes, model: torch.nn.Module,
          register: Callable[[], object] | None = None) -> torch.export.ExportedProgram:
    """The program the child sent, with the model's own tensors where it sent none (and how to
    read it back again: :func:`reloader`); ``register`` as :func:`export_in_child` says."""
    own = _named_tensors(model)
    if register is not None and payload[:1] != _WIRED:
        register()
    ep = _read(payload, own)
    if register is not None and unregistered_nodes(ep):
        register()
    _RELOADS[ep] = partial(_read, payload, own)
    return ep


def unregistered_nodes(ep: torch.export.ExportedProgram) -> set[type]:
    """The classes in ``ep``'s input and output structure that are not pytree nodes here (a
    call could not flatten or rebuild them)."""
    from torch.utils import _pytree as pytree

    found: set[type] = set()
    specs = [ep.call_spec.in_spec, ep.call_spec.out_spec]
    while specs:
        spec = specs.pop()
        if spec is None or spec.is_leaf():
            continue
        if spec.type not in pytree.SUPPORTED_NODES:
            found.add(spec.type)
        specs.extend(spec.children())
    return found


def _read(payload: bytes, own: dict[str, Any]) -> torch.export.ExportedProgram:
    th = load_torch()
    if payload[:1] == _WIRED:
        return unpack(payload[1:], own)
    (length,) = _LENGTH.unpack_from(payload, 1)
    start = 1 + _LENGTH.size
    moved: dict[str, list[str]] = pickle.loads(payload[start:start + length])
    with lazy_graph_modules(th):  # its forward is never run here (export_wire)
        ep: torch.export.ExportedProgram = th.export.load(io.BytesIO(payload[start + length:]))
    for name in moved["state_dict"]:
        ep._state_dict[name] = own[name]
    for name in moved["constants"]:
        ep._constants[name] = own[name]
    _restore_views(ep)
    return ep


def _restore_views(ep: torch.export.ExportedProgram) -> None:
    """Give the read program's fake values the storages they share. A saved program keeps each
    value's shape and strides but not which values are views of which (every value read back
    has a storage of its own), and the planner finds views and in-place writes by shared
    storages: the graph is run again on fake tensors, from the placeholders' values, with each
    parameter and buffer made from the real tensor (tied weights share one, as in an export)."""
    th = load_torch()
    from torch._guards import detect_fake_mode

    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    values = [n.meta.get("val") for n in placeholders]
    mode = detect_fake_mode(values)
    if mode is None:
        return
    tensors = {**ep.state_dict, **ep.constants}
    targets = {spec.arg.name: spec.target for spec in ep.graph_signature.input_specs
               if getattr(spec.arg, "name", None) is not None and spec.target is not None}
    for k, node in enumerate(placeholders):
        real = tensors.get(targets.get(node.name, ""))
        if isinstance(real, th.Tensor) and isinstance(values[k], th.Tensor):
            values[k] = mode.from_tensor(real, static_shapes=True)
    propagate_fakes(ep.graph, values, mode)


def _error_from(payload: bytes) -> BaseException:
    name, message, attributes, text = pickle.loads(payload)
    cls = getattr(error_classes, name, None)
    if not (isinstance(cls, type) and issubclass(cls, error_classes.TensorArenaError)):
        if name == "KeyboardInterrupt":
            return KeyboardInterrupt()
        cls = ExportFailedError
        message = f"torch.export failed in its child process: {name}: {message}"
    error: BaseException = cls.__new__(cls)
    Exception.__init__(error, message)
    vars(error).update(attributes)
    error.__cause__ = ExportProcessError(text.rstrip())
    return error


def _named_tensors(model: torch.nn.Module) -> dict[str, Any]:
    tensors: dict[str, Any] = dict(model.named_parameters(remove_duplicate=False))
    tensors.update(model.named_buffers(remove_duplicate=False))
    return tensors
