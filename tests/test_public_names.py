"""House rules on the public names: the root namespace pinned, one exception tree by domain.

As httpx does, the package root's ``__all__`` is compared with a list written out here: a name
added or dropped is a decision made in this file, not a side effect of an import. Resources'
statistics records and the adaptors are exported with what returns or wraps them, and every
exception is defined in :mod:`tensorarena.errors`, in the section of its domain
(``docs/architecture.md`` says where each concept lives).
"""

from __future__ import annotations

import ast
import inspect
import re
import typing
from pathlib import Path

import tensorarena
import tensorarena.adaptors as adaptors
from tensorarena import errors

ROOT = Path(tensorarena.__file__).parent

#: ``tensorarena.__all__``, sorted: edit it with the names in ``_EXPORTS``.
ROOT_NAMES = [
    "Arena", "ArenaStatistics", "AsyncWorkError", "BufferOverflowError", "ConcurrentUseError",
    "Count", "Counting", "CpuStream", "CudaError", "DataDependentError", "DeviceArray",
    "DeviceMismatchError", "DeviceUnavailableError", "DoubleFreeError", "ExportFailedError",
    "ExportProcessError",
    "Guarded", "GuardedStatistics", "HostMemory", "InfeasibleError", "InvalidAddressError",
    "InvalidAlignmentError", "InvalidArgumentError", "InvalidDtypeError", "InvalidPlanError",
    "InvalidProblemError", "InvalidResourceError", "InvalidSizeError", "InvariantError",
    "LeakWarning", "LearnedPlans", "LearnedPlansReport", "Limiting", "LockedHostMemory",
    "Logging", "MalformedTraceError", "MemoryCorruptionError", "MemoryKind", "MemoryResource",
    "MemoryStatistics", "MissingDependencyError", "ModelSkippedWarning", "NoGradWarning",
    "NotHostAccessibleError", "NumaBindError", "OutOfMemoryError", "PinnedHostMemory",
    "PlacementStrategy", "PlanDoesNotFitError", "PlanVerificationError", "Poisoning",
    "PoisoningStatistics", "Pool", "ResourceClosedError", "ResourceInUseError", "STRATEGIES",
    "ScopeEscapeError", "ShapeNotCoveredError", "ShimUnavailableError", "SizeMismatchError",
    "StreamClosedError", "StreamOrdered", "StreamOrderedStatistics",
    "SystemAllocatorUnavailableError", "TensorArenaError", "TensorArenaWarning",
    "ThreadCacheStatistics", "ThreadCached", "ThreadSafe", "Tracking", "TrafficStatistics",
    "UnknownNameError", "UnsafePickleError", "UnsupportedError", "UseAfterFreeError",
    "VirtualMemory", "__version__", "current_device", "current_scope", "debug_level",
    "default_resource", "device_empty", "device_pool", "dump_snapshot", "empty", "empty_cache",
    "format_size", "memory_snapshot", "memory_stats", "memory_summary", "parse_size",
    "pinned_pool", "record_memory_history", "reset_peak_stats", "scope", "set_debug_level",
    "set_default_resource", "to_device", "to_host", "use_device", "zeros",
]

#: The domains of the exception tree, in the order of errors.py's docstring and sections.
DOMAINS = ["Input", "Memory", "Devices", "Planning", "Runtime", "Traces"]

#: Exceptions defined elsewhere on purpose, each with why: none reaches a user.
INTERNAL_EXCEPTIONS = {
    # the CUDA simulator's signal carrying a cudaError_t out of a call, caught by the simulator
    ("testing/cuda/_errors.py", "Failure"),
}


def test_the_root_namespace_is_the_list_checked_in() -> None:
    assert sorted(ROOT_NAMES) == ROOT_NAMES
    assert tensorarena.__all__ == ROOT_NAMES
    for name in ROOT_NAMES:
        getattr(tensorarena, name)  # AttributeError names an export that does not load


def test_every_adaptor_is_exported_at_the_root() -> None:
    wrapping = [name for name in adaptors.__all__
                if inspect.isclass(value := getattr(adaptors, name))
                and isinstance(inspect.getattr_static(value, "upstream", None), property)]
    assert len(wrapping) >= 9
    assert [name for name in wrapping if name not in ROOT_NAMES] == []


def _statistics_return_name(cls: type) -> str:
    """The name of the type ``cls.statistics()`` is annotated to return; read from the source
    where the method is compiled (mypyc keeps no annotations on the methods it builds)."""
    hints = typing.get_type_hints(cls.statistics)
    if "return" in hints:
        return str(hints["return"].__name__)
    owner = next(klass for klass in cls.__mro__ if "statistics" in vars(klass))
    source = ROOT.parent / (owner.__module__.replace(".", "/") + ".py")
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == owner.__name__:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "statistics":
                    assert item.returns is not None, (cls, "statistics() has no annotation")
                    return ast.unparse(item.returns).strip("'\"")
    raise AssertionError(f"{owner.__name__}.statistics not found in {source}")


def test_the_statistics_records_are_exported_with_what_returns_them() -> None:
    # A user who gets a record from pool.statistics() can name its type where they got the
    # pool: tensorarena.PoolX and tensorarena.XStatistics, never one without the other.
    returned = set()
    for name in ROOT_NAMES:
        value = getattr(tensorarena, name)
        if inspect.isclass(value) and callable(getattr(value, "statistics", None)):
            record_name = _statistics_return_name(value)
            returned.add(record_name)
            assert inspect.isclass(getattr(tensorarena, record_name, None)), (name, record_name)
    assert {"ArenaStatistics", "MemoryStatistics", "TrafficStatistics"} <= returned


def _exception_classes(tree: ast.Module) -> list[ast.ClassDef]:
    bases_of_ours = ("Error", "Exception", "Warning", "Interrupt", "Exit")
    return [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
            and any((base.id if isinstance(base, ast.Name) else
                     base.attr if isinstance(base, ast.Attribute) else "").endswith(bases_of_ours)
                    for base in node.bases)]


def test_every_exception_is_defined_in_errors_py() -> None:
    # Module-private ones (_Terminated, _TooLarge) are control flow that never leaves the module.
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative == "errors.py":
            continue
        for node in _exception_classes(ast.parse(path.read_text(encoding="utf-8"))):
            if not node.name.startswith("_") and (relative, node.name) not in INTERNAL_EXCEPTIONS:
                found.append(f"{relative}:{node.lineno} {node.name}")
    assert found == [], f"exceptions defined outside tensorarena/errors.py: {found}"


def test_the_guard_finds_an_exception_defined_elsewhere() -> None:
    tree = ast.parse("class Oops(errors.TensorArenaError):\n    pass\nclass Fine:\n    pass\n")
    assert [node.name for node in _exception_classes(tree)] == ["Oops"]


def _documented_tree() -> dict[str, list[tuple[int, str]]]:
    """errors.py's docstring tree: domain -> (indent, class name) in order."""
    domains: dict[str, list[tuple[int, str]]] = {}
    current: list[tuple[int, str]] = []
    for line in (errors.__doc__ or "").splitlines():
        heading = re.match(r"([A-Z]\w+): ", line)
        if heading:
            current = domains.setdefault(heading.group(1), [])
        elif entry := re.match(r"( {4,})([A-Z]\w+(?:Error|Warning))\b", line):
            current.append((len(entry.group(1)), entry.group(2)))
    return domains


def test_the_exception_tree_is_documented_by_domain_as_defined() -> None:
    tree = _documented_tree()
    assert list(tree) == DOMAINS
    documented = [name for entries in tree.values() for _, name in entries]
    defined = [name for name in errors.__all__
               if name not in ("TensorArenaError", "TensorArenaWarning")]
    assert sorted(documented) == sorted(defined), set(documented) ^ set(defined)
    for entries in tree.values():
        for index, (indent, name) in enumerate(entries):
            cls = getattr(errors, name)
            if indent > 4:  # a subclass of the nearest entry above indented less
                parent = next(n for i, n in reversed(entries[:index]) if i < indent)
                assert issubclass(cls, getattr(errors, parent)), (name, parent)
            else:
                base = errors.TensorArenaWarning if issubclass(cls, Warning) else (
                    errors.TensorArenaError)
                assert base in cls.__bases__ or any(
                    b.__module__ == errors.__name__ and b is not base for b in cls.__bases__), name


def test_each_domain_is_a_section_of_errors_py_in_the_documented_order() -> None:
    source = Path(errors.__file__).read_text(encoding="utf-8")
    sections = re.findall(r"^# -+\n# (\w+)", source, flags=re.MULTILINE)
    assert sections == ["Bases", *DOMAINS]
    tree = _documented_tree()
    body = re.split(r"^# -+\n# \w+.*\n# -+\n", source, flags=re.MULTILINE)[2:]
    for domain, text in zip(DOMAINS, body, strict=True):
        assert sorted(re.findall(r"^class (\w+)", text, flags=re.MULTILINE)) == sorted(
            name for _, name in tree[domain]), domain


def test_one_error_for_every_unknown_name() -> None:
    unknown = [name for name in errors.__all__ if name.startswith("Unknown")]
    assert unknown == ["UnknownNameError"]
    error = errors.UnknownNameError("unknown planner 'x'", kind="planner", name="x",
                                    known=("auto",))
    assert isinstance(error, errors.InvalidArgumentError) and isinstance(error, ValueError)
    assert (error.kind, error.name, error.known) == ("planner", "x", ("auto",))
