"""Types of the C extension ``_native_dlpack.c`` (see :mod:`tensorarena.interop._torch_route`)."""

from typing import Any

def dlpack(
    resource: Any, address: int, nbytes: int, shape: int | tuple[int, ...], dtype: int
) -> Any: ...
