"""The planning package's lazy names: ``__all__`` written out (documentation tools read it
without importing) is exactly the names the package loads on first use, and each loads."""

from __future__ import annotations

import tensorarena.planning as planning


def test_all_is_exactly_the_lazily_loaded_names_and_each_loads() -> None:
    loaded = vars(planning)["_WHERE"]
    assert sorted(planning.__all__) == sorted(loaded)
    for name in planning.__all__:
        assert getattr(planning, name) is not None, name
