"""The planning package's lazy names: ``__all__`` written out (documentation tools read it
without importing) is exactly the names the package loads on first use, and each loads."""

from __future__ import annotations

import tensorarena.planning as planning


def test_all_is_exactly_the_lazily_loaded_names_and_each_loads() -> None:
    loaded = vars(planning)["_WHERE"]
    assert sorted(planning.__all__) == sorted(loaded)
    for name in planning.__all__:
        assert getattr(planning, name) is not None, name


def test_a_name_shared_with_a_submodule_stays_the_function_once_it_is_imported() -> None:
    # In a fresh interpreter: the submodules imported first, as other modules of the package do.
    import subprocess
    import sys

    code = ("import tensorarena.planning.validate, tensorarena.planning.reorder\n"
            "from tensorarena.planning import reorder, validate\n"
            "import tensorarena.planning as planning\n"
            "print(callable(validate), callable(reorder), callable(planning.validate))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.split() == ["True", "True", "True"]
