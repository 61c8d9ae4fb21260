"""The version of tensorarena, the one place it is written, and which build of it is running.

``pyproject.toml`` reads ``__version__`` for the package metadata (``[tool.setuptools.dynamic]``,
parsed without importing the package) and ``tensorarena.__version__`` re-exports it, so the two
cannot disagree.

The allocation core exists in two builds of one source: *compiled* (the modules below compiled
by mypyc into C extensions, chosen by ``setup.py`` when a C compiler is present) and *pure* (the
same ``.py`` files interpreted: the reference, and the fallback). ``build()`` tells which one this
process imported; ``tensorarena --version`` and every benchmark report it. ``setup.py`` reads
``COMPILED_MODULES`` and ``NATIVE_EXTENSIONS`` from this file (without importing the package),
so the lists are written once.
"""

__version__ = "0.1.0"

#: The modules the compiled build compiles. ``core/strategy.py`` and ``core/registry.py`` stay
#: interpreted: the strategy protocol is runtime-checkable, which mypyc does not support.
COMPILED_MODULES = (
    "tensorarena.core.arena",
    "tensorarena.core._arena_check",
    "tensorarena.core._arena_errors",
    "tensorarena.core._recent_frees",
    "tensorarena.core._bisect",
    "tensorarena.core._builtin",
    "tensorarena.core._packed_vec",
    "tensorarena.core._packed_first_fit",
    "tensorarena.core._address_ordered",
    "tensorarena.core.first_fit",
    "tensorarena.core.next_fit",
    "tensorarena.core._packed_best_fit",
    "tensorarena.core.best_fit",
    "tensorarena.core.buddy",
    "tensorarena.core._segregated",
    "tensorarena.core.segregated_fit",
    "tensorarena.core.tlsf",
    "tensorarena.adaptors._thread_cache_state",
    "tensorarena.adaptors._thread_cache",
    "tensorarena.interop._torch_route",
    "tensorarena.interop.arrays",
    # The exact planner's node (its NumPy twin, planning/exact_node.py, serves the pure build).
    "tensorarena.planning.exact_lists",
    "tensorarena.planning.exact_pins",
)

#: The hand-written C extensions the compiled build adds (their sources are ``.c`` files beside
#: where the module would be, sharing ``interop/_native_*.h``): the native array owner, which
#: ``interop/owner.py`` falls back from to ctypes where it is absent, the DLPack capsule of
#: ``empty(like="torch")``, which falls back to ``torch.frombuffer``, and ``empty``'s compiled
#: entry (``interop/_entry.py``), without which ``empty`` is the Python function. Built together
#: with the modules above, all or nothing.
NATIVE_EXTENSIONS = (
    "tensorarena.interop._native_owner",
    "tensorarena.interop._native_dlpack",
    "tensorarena.interop._native_empty",
)


def compiled_modules() -> list[str]:
    """Those of :data:`COMPILED_MODULES` and :data:`NATIVE_EXTENSIONS` that this process imports
    as C extensions (a native extension that does not import is not one)."""
    import importlib

    compiled = []
    for name in COMPILED_MODULES:
        path = getattr(importlib.import_module(name), "__file__", None) or ""
        if not path.endswith(".py"):
            compiled.append(name)
    for name in NATIVE_EXTENSIONS:
        try:
            importlib.import_module(name)
        except ImportError:  # not built (the pure build), or blocked (tests force the fallback)
            continue
        compiled.append(name)
    return compiled


def build() -> str:
    """``"compiled"`` when every module of the compiled build runs as C, else ``"pure"``.

    A partly compiled core (an extension deleted by hand) reports ``"pure"``: its numbers would
    not be the compiled build's.
    """
    every = len(COMPILED_MODULES) + len(NATIVE_EXTENSIONS)
    return "compiled" if len(compiled_modules()) == every else "pure"
