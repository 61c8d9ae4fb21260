"""Types of the C extension ``_native_owner.c`` (see :mod:`tensorarena.interop.owner`)."""

from typing import Any

from tensorarena.interop.owner import Allocation

def define_type(base: type[Allocation]) -> type[Allocation]: ...
def owner(resource: Any, address: int, nbytes: int) -> Allocation: ...
