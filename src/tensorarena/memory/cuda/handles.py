"""Stream and event handles as plain ints, whatever library or bindings version they came from.

PyTorch streams carry ``.cuda_stream``, CuPy's ``.ptr``, ours ``.handle``; ``None`` is the legacy
default stream (0). cuda-bindings 13 handles (``cudaStream_t``, ``cudaEvent_t``) are read with
their ``getPtr()`` accessor, since ``int()`` of a handle is deprecated there.
"""

from __future__ import annotations

from typing import Any

from tensorarena.errors import InvalidArgumentError

__all__ = ["handle_value", "stream_handle"]


def stream_handle(stream: Any) -> int:
    """A stream as the runtime's integer handle: ``None`` is the legacy default stream (0); a
    ``CudaStream`` (``.handle``), a PyTorch stream (``.cuda_stream``), a CuPy stream (``.ptr``)
    or an int-like gives its own."""
    if stream is None:
        return 0
    for attribute in ("handle", "cuda_stream", "ptr"):
        value = getattr(stream, attribute, None)
        if value is not None:
            stream = value
            break
    if isinstance(stream, bool | float | str | bytes):  # int() would make a handle of them
        raise InvalidArgumentError(
            f"stream must be None, a stream object or an int handle, not {stream!r}"
        )
    try:
        handle = int(stream)
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            f"stream must be None, a stream object or an int handle, not {stream!r}"
        ) from None
    if handle < 0:
        raise InvalidArgumentError(f"a stream handle is non-negative, not {handle}")
    return handle


def handle_value(handle: Any) -> int:
    """A bindings handle (``cudaStream_t``, ``cudaEvent_t``) or an int as a plain int."""
    get = getattr(handle, "getPtr", None)
    return int(get()) if callable(get) else int(handle)
