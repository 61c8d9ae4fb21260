"""Griffe extension: the docstrings' Sphinx roles shown as code, not as raw reST.

The package's docstrings cross-reference with Sphinx roles (``:class:`~tensorarena.memory.Pool```),
which Markdown would print as they are. Each becomes a code span of what Sphinx would show
(``Pool`` for a ``~`` target, the whole path otherwise). Not a link: many targets are private or
undocumented modules, and a link that cannot resolve would fail the strict build.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj|const|py:\w+):`(~?)([^`]+)`")


def _shown(match: re.Match[str]) -> str:
    target = match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if match.group(1) else target}`"


class SphinxRolesAsCode(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(_shown, obj.docstring.value)
