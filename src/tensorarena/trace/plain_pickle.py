"""Loading a pickle that cannot run code: plain containers, strings and numbers only.

``pickle.load`` runs whatever callable a file names (``os.system``, say, through a
``__reduce__``), so a snapshot downloaded from anywhere must never reach it. Every way a pickle
reaches code goes through the unpickler's ``find_class`` (the ``GLOBAL``/``STACK_GLOBAL``
opcodes, and the extension registry's ``EXT*`` opcodes, which the C unpickler resolves through
it too) or ``persistent_load``; both refuse here. What remains builds only dicts, lists, tuples,
sets, strings, bytes, numbers, booleans and ``None`` — all a PyTorch memory snapshot holds
(``torch.cuda.memory._snapshot()`` returns plain data), so a genuine snapshot loads whole and a
crafted file gets a :class:`UnsafePickleError` naming what it asked for, before anything runs.
"""

from __future__ import annotations

import io
import pickle
from typing import IO, Any

from tensorarena.errors import MalformedTraceError, UnsafePickleError

__all__ = ["UnsafePickleError", "load_plain"]


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise UnsafePickleError(
            f"refused to load {module}.{name}: a memory snapshot holds only plain data (dicts, "
            "lists, strings, numbers), so this file is not one, or it was made to run code "
            "when loaded; nothing from it was run")

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError(
            "refused a persistent id: a memory snapshot holds only plain data; nothing from "
            "this file was run")


def load_plain(handle: IO[bytes], *, name: str = "<pickle>") -> Any:
    """Unpickle plain data from ``handle``, refusing every global (see the module docstring)."""
    try:
        return _PlainUnpickler(handle).load()
    except UnsafePickleError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError,
            AttributeError, OverflowError, MemoryError, RecursionError) as exc:
        raise MalformedTraceError(f"{name}: not a readable pickle ({type(exc).__name__}: "
                                  f"{exc})") from None


def loads_plain(data: bytes) -> Any:
    """:func:`load_plain` over bytes."""
    return load_plain(io.BytesIO(data))
