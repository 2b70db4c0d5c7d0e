"""safetensors checkpoints into PyTorch tensors on a GPU, through cmt's storage path. The one part of
cmt.io that needs PyTorch: `import cmt.io` never imports this module (cmt.io's wrappers do, on call).

load_safetensors: one GPU allocation per file, the size of its data section, filled by one cmt.io
read of the whole section; each tensor is a view of its bytes with its dtype and shape. A tensor
whose offset is not a multiple of its element size (the format does not promise alignment) cannot
be such a view and gets an aligned copy of its own, made on the GPU."""

from __future__ import annotations

import errno
import os
from contextlib import nullcontext
from typing import Any

import torch

from .errors import FileIOError
from .file import File
from .safetensors_files import checkpoint_headers, read_data
from .safetensors_format import Header, SafetensorsError, TensorInfo, read_header

# The torch dtype of each format dtype, by attribute name: a missing one is a dtype this torch lacks
# (the float8 types came in 2.1, U16-U64 in 2.3, float8_e8m0fnu and float4_e2m1fn_x2 in 2.7/2.8).
_TORCH_DTYPE = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16", "U32": "uint32",
    "I32": "int32", "U64": "uint64", "I64": "int64", "F16": "float16", "BF16": "bfloat16", "F32": "float32",
    "F64": "float64", "C64": "complex64", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz", "F8_E8M0": "float8_e8m0fnu",
    "F4": "float4_e2m1fn_x2",  # two elements a byte: the last dimension halves
}


def torch_dtype(path: str, t: TensorInfo) -> torch.dtype:
    dtype = getattr(torch, _TORCH_DTYPE.get(t.dtype, ""), None)
    if not isinstance(dtype, torch.dtype):
        raise SafetensorsError(path, f"tensor {t.name!r} is {t.dtype}, which PyTorch {torch.__version__} has no "
                                     "dtype for")
    if t.dtype == "F4" and (not t.shape or t.shape[-1] % 2):
        raise SafetensorsError(path, f"tensor {t.name!r}: F4 in PyTorch packs pairs along the last dimension, "
                                     f"which shape {list(t.shape)} lacks")
    return dtype


def _torch_shape(t: TensorInfo) -> tuple[int, ...]:
    return (*t.shape[:-1], t.shape[-1] // 2) if t.dtype == "F4" else t.shape


def _device(device: Any) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"invalid device {device!r}: {e}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"device {device!r}: PyTorch sees no CUDA GPU")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        if dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: PyTorch sees {torch.cuda.device_count()} GPU(s)")
    elif dev.type != "cpu":
        raise ValueError(f"device {device!r}: cmt.io loads into CUDA or CPU memory only")
    return dev


def view_of(raw: torch.Tensor, t: TensorInfo, dtype: torch.dtype) -> torch.Tensor:
    """The tensor `t` over raw, the uint8 bytes of its data section (or of its own bytes, at 0)."""
    shape = _torch_shape(t)
    if t.nbytes == 0:
        return torch.empty(shape, dtype=dtype, device=raw.device)
    piece = raw[t.begin:t.end]
    if piece.data_ptr() % t.itemsize:
        piece = piece.clone()  # a fresh allocation is aligned; torch refuses a misaligned view
    return piece.view(dtype).view(shape)


def _on(dev: torch.device):
    """The device current while cmt.io reads into its memory; the current stream's earlier work is
    done first, since the caching allocator may hand out memory that work still uses."""
    if dev.type != "cuda":
        return nullcontext()
    torch.cuda.current_stream(dev).synchronize()
    return torch.cuda.device(dev)


def _load_file(h: Header, dev: torch.device) -> dict[str, torch.Tensor]:
    dtypes = {name: torch_dtype(h.path, t) for name, t in h.tensors.items()}
    raw = torch.empty(h.data_size, dtype=torch.uint8, device=dev)
    with _on(dev):
        read_data(h, raw)
    return {name: view_of(raw, t, dtypes[name]) for name, t in h.tensors.items()}


def load_safetensors(path_or_dir: str | os.PathLike, device: Any = "cuda:0") -> dict[str, torch.Tensor]:
    """Loads a safetensors file, a sharded checkpoint's folder or its index file into tensors on
    `device` ('cuda', 'cuda:N', a torch.device or an index; 'cpu' reads into host memory). The
    tensors of one file share one allocation, freed when the last of them goes. Errors:
    SafetensorsError (a ValueError) for a malformed or truncated file, FileIOError for a missing
    shard or a failed read, each naming the file."""
    dev = _device(device)
    headers = checkpoint_headers(path_or_dir)
    for h in headers:
        for t in h.tensors.values():
            torch_dtype(h.path, t)  # every shard's dtypes checked before the first read
    out: dict[str, torch.Tensor] = {}
    for h in headers:
        out.update(_load_file(h, dev))
    return out


class safe_open:  # noqa: N801 - the name of the safetensors API it stands in for
    """A lazy handle on one safetensors file (as safetensors.safe_open): keys(), metadata(),
    get_tensor(name), each tensor read on request with its own cmt.io read. Use it as a context
    manager, or close() it."""

    def __init__(self, path: str | os.PathLike, device: Any = "cuda:0", framework: str = "pt"):
        if framework not in ("pt", "torch", "pytorch"):
            raise ValueError(f"framework {framework!r}: cmt.io.safe_open gives PyTorch tensors ('pt')")
        if os.path.isdir(path):
            raise IsADirectoryError(f"{os.fspath(path)} is a folder: safe_open takes one file; "
                                    "cmt.io.load_safetensors loads a sharded checkpoint")
        self._device = _device(device)
        self._header = read_header(path)
        self._file = File(self._header.path, "r")

    def keys(self) -> list[str]:
        return list(self._header.tensors)

    def metadata(self) -> dict[str, str] | None:
        return None if self._header.metadata is None else dict(self._header.metadata)

    def get_tensor(self, name: str) -> torch.Tensor:
        t = self._header.tensors.get(name)
        if t is None:
            raise KeyError(f"{self._header.path} has no tensor {name!r}")
        if self._file.closed:
            raise ValueError(f"{self._header.path}: the handle is closed")
        dtype = torch_dtype(self._header.path, t)
        # its own allocation, which is aligned for any dtype
        raw = torch.empty(max(t.nbytes, 1), dtype=torch.uint8, device=self._device)
        if t.nbytes:
            with _on(self._device):
                n = self._file.read(raw, size=t.nbytes, file_offset=self._header.data_start + t.begin)
            if n != t.nbytes:
                at = self._header.data_start + t.begin + n
                raise FileIOError(errno.EIO, f"the file ended at offset {at}, inside tensor {name!r}: it was "
                                  "truncated after it was opened", self._header.path, at)
        moved = TensorInfo(t.name, t.dtype, t.shape, 0, t.nbytes)
        return view_of(raw, moved, dtype)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> safe_open:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return len(self._header.tensors)

    def __repr__(self) -> str:
        return f"<cmt.io.safe_open {self._header.path!r} device={str(self._device)!r}>"

