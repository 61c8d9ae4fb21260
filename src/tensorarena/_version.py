"""The version of tensorarena, the one place it is written, and which build of it is running.

``pyproject.toml`` reads ``__version__`` for the package metadata (``[tool.setuptools.dynamic]``,
parsed without importing the package) and ``tensorarena.__version__`` re-exports it, so the two
cannot disagree.

The allocation core exists in two builds of one source: *compiled* (the modules below compiled
by mypyc into C extensions, chosen by ``setup.py`` when a C compiler is present) and *pure* (the
same ``.py`` files interpreted: the reference, and the fallback). ``build()`` tells which one this
process imported; ``tensorarena --version`` and every benchmark report it. ``setup.py`` reads
``COMPILED_MODULES`` from this file (without importing the package), so the list is written once.
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
    "tensorarena.core._address_ordered",
    "tensorarena.core.first_fit",
    "tensorarena.core.next_fit",
    "tensorarena.core.best_fit",
    "tensorarena.core.buddy",
    "tensorarena.core._segregated",
    "tensorarena.core.segregated_fit",
    "tensorarena.core.tlsf",
    "tensorarena.adaptors._thread_cache_state",
    "tensorarena.adaptors._thread_cache",
    "tensorarena.interop.arrays",
)


def compiled_modules() -> list[str]:
    """Those of :data:`COMPILED_MODULES` that this process imports as compiled extensions."""
    import importlib

    compiled = []
    for name in COMPILED_MODULES:
        path = getattr(importlib.import_module(name), "__file__", None) or ""
        if not path.endswith(".py"):
            compiled.append(name)
    return compiled


def build() -> str:
    """``"compiled"`` when every module of the compiled build runs as C, else ``"pure"``.

    A partly compiled core (an extension deleted by hand) reports ``"pure"``: its numbers would
    not be the compiled build's.
    """
    return "compiled" if len(compiled_modules()) == len(COMPILED_MODULES) else "pure"
