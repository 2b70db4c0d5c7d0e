"""cmt.io: files to and from GPU memory through cmt's copy engine, shaped after KvikIO and cuFile.

    import cmt.io
    with cmt.io.open("weights.bin", "r") as f:
        n = f.read(tensor)                          # synchronous: bytes read
        fut = f.pread(other, file_offset=1 << 30)   # a future: fut.get()
        sf = f.read_async(third, stream)            # ordered on a CUDA stream: sf.check_bytes_done()

Buffers: PyTorch or CuPy tensors (``__cuda_array_interface__`` or DLPack), raw device memory as
``DevicePointer(ptr, nbytes)`` or ``(ptr, nbytes)``, and host arrays (numpy, bytearray). Failed
transfers raise FileIOError (an OSError with the file, the offset and the OS error). docs/storage.md
describes the design.

    tensors = cmt.io.load_safetensors("model-dir", device="cuda:0")   # needs PyTorch, imported then
    with cmt.io.safe_open("model.safetensors") as f: w = f.get_tensor("w")"""

from __future__ import annotations

import os
from typing import Any

from ._lib import counters, default_settings, prepare
from .batch import Batch, Completion
from .buffers import DevicePointer
from .errors import FileIOError
from .file import File
from .futures import IOFuture
from .safetensors_format import SafetensorsError
from .stream import StreamFuture

__all__ = ["Batch", "Completion", "DevicePointer", "File", "FileIOError", "IOFuture", "SafetensorsError",
           "StreamFuture", "counters", "default_settings", "load_safetensors", "open", "safe_open"]


prepare()  # the first transfer's staging is faulted in meanwhile (a setup then only registers it)


def open(path: str | os.PathLike, mode: str = "r", settings: Any = None) -> File:  # noqa: A001
    """Opens a file for transfers with device or host memory (see File for the modes and settings).
    A missing file, a permission denied or a directory raise the usual OSError subclasses."""
    return File(path, mode, settings)


def _torch_part():
    """The module that needs PyTorch, imported on first use so that `import cmt.io` never imports torch."""
    try:
        from . import safetensors_load
    except ImportError as e:
        if e.name != "torch":
            raise
        raise ImportError("cmt.io.load_safetensors and cmt.io.safe_open need PyTorch (pip install torch)") from None
    return safetensors_load


def load_safetensors(path_or_dir: str | os.PathLike, device: Any = "cuda:0") -> dict[str, Any]:
    """A safetensors file, a sharded checkpoint's folder or its index file, loaded into PyTorch tensors
    on `device`: one allocation and one read per file, each tensor a view with its dtype and shape.
    SafetensorsError (a ValueError) for a malformed or truncated file, FileIOError for a missing
    shard or a failed read (safetensors_load.load_safetensors has the details)."""
    return _torch_part().load_safetensors(path_or_dir, device)


def safe_open(path: str | os.PathLike, device: Any = "cuda:0", framework: str = "pt") -> Any:
    """A lazy handle on one safetensors file, as safetensors.safe_open: keys(), metadata(),
    get_tensor(name); a context manager."""
    return _torch_part().safe_open(path, device, framework)
