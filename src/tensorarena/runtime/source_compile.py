"""Generated source compiled in a short-lived interpreter, so that its syntax tree never lives here.

CPython's ``compile()`` builds the whole syntax tree and symbol tables of a module before it
emits bytecode, about a hundred bytes of C heap per character of source, and a planned
program's function runs to hundreds of thousands of characters for a full-size model; the first
call of a shape compiles twice (the recording's code, then the steady one). That peak was the
process's highest of the whole run for a planned program, and glibc kept part of it resident.
:func:`compile_source` has a fresh ``sys.executable -I -S`` compile the source and send back the
code object as :mod:`marshal` bytes (``bench/build_peaks.py`` measures both ways).

The child and this interpreter must read the same bytecode: the child writes its
``importlib.util.MAGIC_NUMBER`` first and the code is loaded only when it is ours. Anything
else compiles here, as ``compile()`` would, so the result and the errors are those of
``compile()``: a source below :data:`ELSEWHERE_FROM` characters (starting an interpreter costs
more than its syntax tree), no ``sys.executable`` or one not named ``python*`` (a host program
embedding Python), a source that cannot be encoded to send, a child that fails, times out or
writes something else, a syntax error. A child that cannot be started at all is not tried
again in this process.
"""

from __future__ import annotations

import marshal
import os
import re
import subprocess
import sys
from importlib.util import MAGIC_NUMBER
from types import CodeType

__all__ = ["ELSEWHERE_FROM", "TIMEOUT_SECONDS", "compile_source"]

#: Sources shorter than this (characters) compile here: a few MiB of syntax tree at most.
ELSEWHERE_FROM = 32 * 1024
#: The longest a child may take before the source is compiled here instead.
TIMEOUT_SECONDS = 20.0
#: What ``sys.executable`` must be called to be started: where Python is embedded it can be
#: the host program (a server, an editor), which the child's arguments mean nothing to.
_PYTHON = re.compile(r"python[0-9.]*(\.exe)?", re.IGNORECASE)

_CHILD = (
    "import sys, marshal\n"
    "from importlib.util import MAGIC_NUMBER\n"
    "name, optimize = sys.argv[1], int(sys.argv[2])\n"
    "code = compile(sys.stdin.buffer.read().decode(), name, 'exec', dont_inherit=True,"
    " optimize=optimize)\n"
    "sys.stdout.buffer.write(MAGIC_NUMBER + marshal.dumps(code))\n"
)

_spawn_failed: list[str] = []  # why a child could not be started (then never tried again)


def compile_source(source: str, filename: str) -> CodeType:
    """``compile(source, filename, "exec")``, in a child interpreter where ``source`` is long
    (module docstring); the same code object either way."""
    if len(source) >= ELSEWHERE_FROM and _interpreter() and not _spawn_failed:
        code = _compile_elsewhere(source, filename)
        if code is not None:
            return code
    return compile(source, filename, "exec", dont_inherit=True, optimize=sys.flags.optimize)


def _interpreter() -> bool:
    """Whether ``sys.executable`` is a CPython interpreter to start (not a host program)."""
    return (sys.implementation.name == "cpython" and bool(sys.executable)
            and _PYTHON.fullmatch(os.path.basename(sys.executable)) is not None)


def _compile_elsewhere(source: str, filename: str) -> CodeType | None:
    """The code object compiled by a child, or None where it gave none that is ours."""
    command = [sys.executable, "-I", "-S", "-c", _CHILD, filename, str(sys.flags.optimize)]
    try:
        text = source.encode()
    except UnicodeEncodeError:  # a lone surrogate: compile() says what it makes of it
        return None
    try:
        done = subprocess.run(command, input=text, capture_output=True,
                              timeout=TIMEOUT_SECONDS, check=False)
    except subprocess.TimeoutExpired:
        return None
    except (OSError, ValueError) as exc:  # no such interpreter, no processes left, ...
        _spawn_failed.append(f"{type(exc).__name__}: {exc}")
        return None
    out = done.stdout
    if done.returncode != 0 or not out.startswith(MAGIC_NUMBER):
        return None
    try:
        code = marshal.loads(out[len(MAGIC_NUMBER):])
    except (EOFError, ValueError, TypeError):
        return None
    return code if isinstance(code, CodeType) and code.co_filename == filename else None
