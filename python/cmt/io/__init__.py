"""cmt.io: files to and from GPU memory through cmt's copy engine, shaped after KvikIO and cuFile.

    import cmt.io
    with cmt.io.open("weights.bin", "r") as f:
        n = f.read(tensor)                          # synchronous: bytes read
        fut = f.pread(other, file_offset=1 << 30)   # a future: fut.get()
        sf = f.read_async(third, stream)            # ordered on a CUDA stream: sf.check_bytes_done()

Buffers: PyTorch or CuPy tensors (``__cuda_array_interface__`` or DLPack), raw device memory as
``DevicePointer(ptr, nbytes)`` or ``(ptr, nbytes)``, and host arrays (numpy, bytearray). Failed
transfers raise FileIOError (an OSError with the file, the offset and the OS error). docs/storage.md
describes the design."""

from __future__ import annotations

import os
from typing import Any

from ._lib import counters, default_settings
from .batch import Batch, Completion
from .buffers import DevicePointer
from .errors import FileIOError
from .file import File
from .futures import IOFuture
from .stream import StreamFuture

__all__ = ["Batch", "Completion", "DevicePointer", "File", "FileIOError", "IOFuture", "StreamFuture", "counters",
           "default_settings", "open"]


def open(path: str | os.PathLike, mode: str = "r", settings: Any = None) -> File:  # noqa: A001
    """Opens a file for transfers with device or host memory (see File for the modes and settings).
    A missing file, a permission denied or a directory raise the usual OSError subclasses."""
    return File(path, mode, settings)
