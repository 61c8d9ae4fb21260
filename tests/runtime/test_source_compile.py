"""Generated source compiled in a child interpreter: the same code as ``compile()``, or compiled
here whenever the child gives nothing that is ours."""

from __future__ import annotations

import subprocess
from types import CodeType
from typing import Any

import pytest

from tensorarena.runtime import source_compile
from tensorarena.runtime.source_compile import ELSEWHERE_FROM, compile_source

NAME = "<tensorarena planned Test>"


def _source(at_least: int) -> str:
    """A generated-looking function of exactly ``at_least`` characters (padded with a comment)."""
    lines = ["def run(inputs):", "    v0 = inputs[0]"]
    i = 0
    while sum(len(line) + 1 for line in lines) + 100 < at_least:
        lines.append(f"    v{i + 1} = v{i} * 3 + {i} - (v{i} // 7)")
        i += 1
    text = "\n".join([*lines, f"    return v{i}"]) + "\n"
    return text + "#" * (at_least - len(text) - 1) + "\n"


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Every child started, by command; no earlier failure to start one remembered."""
    monkeypatch.setattr(source_compile, "_spawn_failed", [])
    started: list[list[str]] = []
    real = subprocess.run

    def run(command: list[str], **kwargs: Any) -> Any:
        started.append(command)
        return real(command, **kwargs)

    monkeypatch.setattr(subprocess, "run", run)
    return started


def _same(a: CodeType, b: CodeType) -> None:
    assert a.co_code == b.co_code and a.co_filename == b.co_filename
    inner_a = [c for c in a.co_consts if isinstance(c, CodeType)]
    inner_b = [c for c in b.co_consts if isinstance(c, CodeType)]
    assert [c.co_code for c in inner_a] == [c.co_code for c in inner_b]
    assert [c.co_consts for c in inner_a] == [c.co_consts for c in inner_b]


def _run(code: CodeType) -> Any:
    namespace: dict[str, Any] = {}
    exec(code, namespace)
    return namespace["run"]([5])


def test_a_long_source_is_compiled_by_a_child_into_the_code_compile_makes(
        _fresh: list[list[str]]) -> None:
    source = _source(ELSEWHERE_FROM + 5_000)
    code = compile_source(source, NAME)
    assert len(_fresh) == 1
    here = compile(source, NAME, "exec", dont_inherit=True)
    _same(code, here)
    assert _run(code) == _run(here)


def test_the_child_is_used_from_exactly_the_threshold_on(_fresh: list[list[str]]) -> None:
    at = _source(ELSEWHERE_FROM)
    assert len(at) == ELSEWHERE_FROM
    compile_source(at[:-2] + "\n", NAME)  # one character shorter: compiled here
    assert _fresh == []
    _same(compile_source(at, NAME), compile(at, NAME, "exec", dont_inherit=True))
    assert len(_fresh) == 1


def test_a_syntax_error_is_compiles_own() -> None:
    source = _source(ELSEWHERE_FROM) + "def broken(:\n"
    with pytest.raises(SyntaxError) as err:
        compile_source(source, NAME)
    assert err.value.filename == NAME
    assert err.value.lineno == source.count("\n")


@pytest.mark.parametrize(("tail", "error"), [("x = 1\0\n", SyntaxError),
                                             ("s = '\ud800'\n", UnicodeEncodeError)])
def test_a_source_compile_refuses_is_refused_as_compile_refuses_it(
        tail: str, error: type[Exception]) -> None:
    source = _source(ELSEWHERE_FROM) + tail  # a null byte; a lone surrogate (cannot travel)
    with pytest.raises(error):
        compile(source, NAME, "exec", dont_inherit=True)
    with pytest.raises(error):
        compile_source(source, NAME)


def test_without_an_interpreter_to_start_it_compiles_here(
        monkeypatch: pytest.MonkeyPatch, _fresh: list[list[str]]) -> None:
    source = _source(ELSEWHERE_FROM)
    monkeypatch.setattr(source_compile.sys, "executable", "")
    assert _run(compile_source(source, NAME)) == _run(compile(source, NAME, "exec"))
    assert _fresh == []


@pytest.mark.parametrize("executable", ["/usr/bin/uwsgi", "/opt/app/python-host.sh", "pythonx"])
def test_a_host_program_embedding_python_is_not_started(
        monkeypatch: pytest.MonkeyPatch, executable: str, _fresh: list[list[str]]) -> None:
    source = _source(ELSEWHERE_FROM)
    monkeypatch.setattr(source_compile.sys, "executable", executable)
    assert _run(compile_source(source, NAME)) == _run(compile(source, NAME, "exec"))
    assert _fresh == []


def test_an_interpreter_that_cannot_start_is_not_tried_again(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any, _fresh: list[list[str]]) -> None:
    source = _source(ELSEWHERE_FROM)
    monkeypatch.setattr(source_compile.sys, "executable", str(tmp_path / "python3.11"))
    assert _run(compile_source(source, NAME)) == _run(compile(source, NAME, "exec"))
    assert _run(compile_source(source, NAME)) == _run(compile(source, NAME, "exec"))
    assert len(_fresh) == 1
    assert "python3.11" in source_compile._spawn_failed[0]


@pytest.mark.parametrize("child", [
    "import sys; sys.stdout.buffer.write(b'junk')",  # not a code object
    "import sys; sys.exit(3)",  # fails
    # a code object of another bytecode version
    "import sys, marshal; sys.stdout.buffer.write(b'\\x00\\x00\\r\\n' + marshal.dumps("
    "compile('x = 1', sys.argv[1], 'exec')))",
    # ours, but not the source's file name
    "import sys, marshal; from importlib.util import MAGIC_NUMBER; sys.stdout.buffer.write("
    "MAGIC_NUMBER + marshal.dumps(compile('x = 1', 'elsewhere', 'exec')))",
    # ours, truncated
    "import sys, marshal; from importlib.util import MAGIC_NUMBER; sys.stdout.buffer.write("
    "(MAGIC_NUMBER + marshal.dumps(compile('x = 1', sys.argv[1], 'exec')))[:-3])",
])
def test_a_child_that_gives_nothing_of_ours_leaves_it_to_compile_here(
        monkeypatch: pytest.MonkeyPatch, child: str, _fresh: list[list[str]]) -> None:
    source = _source(ELSEWHERE_FROM)
    monkeypatch.setattr(source_compile, "_CHILD", child)
    code = compile_source(source, NAME)
    assert len(_fresh) == 1
    _same(code, compile(source, NAME, "exec", dont_inherit=True))
    assert source_compile._spawn_failed == []  # it started: the next source tries again


def test_a_child_past_its_time_leaves_it_to_compile_here(monkeypatch: pytest.MonkeyPatch) -> None:
    source = _source(ELSEWHERE_FROM)
    monkeypatch.setattr(source_compile, "_CHILD", "import time; time.sleep(30)")
    monkeypatch.setattr(source_compile, "TIMEOUT_SECONDS", 0.5)
    _same(compile_source(source, NAME), compile(source, NAME, "exec", dont_inherit=True))


def test_a_planned_program_runs_code_compiled_elsewhere(
        monkeypatch: pytest.MonkeyPatch, _fresh: list[list[str]]) -> None:
    torch = pytest.importorskip("torch")
    from tensorarena.runtime import PlannedProgram

    monkeypatch.setattr(source_compile, "ELSEWHERE_FROM", 0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    x = torch.randn(3, 8)
    program = PlannedProgram.from_module(model, (x,))
    for _ in range(3):
        assert torch.equal(program(x), model(x))
    assert any("compile(" in part for command in _fresh for part in command)
