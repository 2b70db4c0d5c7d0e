"""Stream-ordered reads and writes (File.read_async, File.write_async), as cuFile's stream API: the
call returns at once, the transfer runs when the CUDA stream reaches it, and the stream's later
kernels wait for it (native/src/stream_io.hpp says how)."""

from __future__ import annotations

import ctypes
from typing import Any

from . import _lib
from .buffers import Buffer
from .errors import check


def handle(stream: Any) -> int:
    """The CUstream of `stream`: an int (0 or None: the legacy default stream), a torch.cuda.Stream
    (.cuda_stream), a CuPy stream (.ptr), or an object with the __cuda_stream__ protocol."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    if hasattr(stream, "__cuda_stream__"):
        return int(stream.__cuda_stream__()[1])
    for attr in ("cuda_stream", "ptr"):
        value = getattr(stream, attr, None)
        if isinstance(value, int):
            return value
    raise TypeError(f"not a CUDA stream: {type(stream).__name__} (pass a stream handle, a torch.cuda.Stream, "
                    "a CuPy stream, or None for the default stream)")


class StreamFuture:
    """A stream-ordered transfer. Its bytes are known once the stream has passed it:
    check_bytes_done() (KvikIO's name) waits for the transfer and returns them, or raises its error."""

    __slots__ = ("_op", "_path", "_verb", "_device", "_keep")

    def __init__(self, op: int, path: str, verb: str, device: int, keep: Any):
        self._op = op
        self._path, self._verb, self._device = path, verb, device
        self._keep = keep  # the buffer, alive until the transfer is done

    def done(self) -> bool:
        """Whether the transfer has run."""
        return _lib.lib().cmt_io_wait(self._op, 0) == 1

    def wait(self, timeout: float | None = None) -> bool:
        """Waits up to `timeout` seconds (None: as long as it takes); whether the transfer is done."""
        us = -1 if timeout is None else max(0, int(timeout * 1e6))
        return _lib.lib().cmt_io_wait(self._op, us) == 1

    def check_bytes_done(self, timeout: float | None = None) -> int:
        """The bytes read or written, once done (TimeoutError after `timeout` seconds); raises the
        transfer's error."""
        if not self.wait(timeout):
            raise TimeoutError(f"the stream-ordered transfer on {self._path} is not done yet: has its stream "
                               "reached it?")
        result = _lib.Result()
        _lib.lib().cmt_io_result(self._op, ctypes.byref(result))
        return check(result, self._path, self._verb, self._device)

    result = check_bytes_done

    def __del__(self) -> None:
        op, self._op = getattr(self, "_op", None), None
        if op:
            try:
                _lib.lib().cmt_io_release(op)
            except Exception:  # noqa: BLE001 - at interpreter exit the library may be gone already
                pass


def submit(native_file: int, write: bool, buf: Buffer, device: int, size: int, file_offset: int, stream: int,
           settings: ctypes.Array, path: str) -> StreamFuture:
    """Queues the transfer on the stream; errors found at once (a capturing stream) are raised here."""
    lib = _lib.lib()
    fn = lib.cmt_io_write_async if write else lib.cmt_io_read_async
    failed = _lib.Result()
    op = fn(native_file, device, size, file_offset, stream, ctypes.cast(settings, ctypes.c_void_p),
            ctypes.byref(failed))
    verb = "writing" if write else "reading"
    if not op:
        check(failed, path, verb, device)
        raise RuntimeError("the stream-ordered transfer could not be queued")
    return StreamFuture(op, path, verb, device, buf.keep)
