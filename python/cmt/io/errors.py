"""The storage path's errors: an OSError with the file, the offset and the OS error of a failed read
or write, and the translation of the native result into it."""

from __future__ import annotations

import ctypes
import errno
import os

from . import _lib


class FileIOError(OSError):
    """A read or write that failed: ``errno``, ``strerror``, ``filename`` as every OSError, and
    ``offset``, the file offset where it failed (None when it is not known)."""

    def __init__(self, code: int, message: str, filename: str, offset: int | None = None):
        super().__init__(code, message, filename)
        self.offset = offset


def _cuda_error_name(code: int) -> str:
    try:
        cuda = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD)
        name = ctypes.c_char_p()
        if cuda.cuGetErrorName(code, ctypes.byref(name)) == 0 and name.value:
            return name.value.decode()
    except OSError:
        pass
    return "an unknown CUDA error"


def check(result: _lib.Result, path: str, verb: str, device: int = 0) -> int:
    """The bytes done, or the exception for a failed transfer. `verb`: 'reading' or 'writing'."""
    status = result.status
    if status == _lib.OK:
        return result.done
    if status == _lib.OS_ERROR:
        code = result.os_errno
        raise FileIOError(code, f"{os.strerror(code)} ({verb} at offset {result.offset})", path, result.offset)
    if status == _lib.FILE_ENDED:
        raise FileIOError(errno.EIO, f"the file ended at offset {result.offset} while it was being read: "
                          "it was truncated meanwhile", path, result.offset)
    if status == _lib.CUDA_ERROR:
        code = result.cu_result
        raise FileIOError(errno.EIO, f"CUDA error {_cuda_error_name(code)} ({code}) while {verb}", path)
    if status == _lib.BAD_DEVICE:
        raise ValueError(f"the buffer at {device:#x} is not device memory of a CUDA context, or the size "
                         "runs past the end of its allocation")
    if status == _lib.BAD_REQUEST:
        if result.cu_result == 900:  # CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
            raise ValueError("the stream is being captured into a CUDA graph: stream-ordered reads and writes "
                             "cannot be part of a graph")
        raise ValueError(f"invalid transfer ({os.strerror(result.os_errno)}): check the settings and offsets")
    raise RuntimeError(f"unexpected transfer status {status}")
