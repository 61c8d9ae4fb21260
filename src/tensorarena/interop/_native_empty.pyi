"""Types of the C extension ``_native_empty.c`` (see :mod:`tensorarena.interop._entry`)."""

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

class FastEmpty:
    def __init__(
        self,
        general: Callable[..., Any],
        routes: dict[Any, Any],
        scope_var: ContextVar[Any],
        defaults: dict[str, Any],
        alignment: int,
        max_size: int,
        *,
        dtypes: dict[Any, Any] | None = None,
        owner: Callable[..., Any] | None = None,
        frombuffer: Callable[..., Any] | None = None,
        default_dtype: Any = None,
    ) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...
    def forget(self) -> None: ...
