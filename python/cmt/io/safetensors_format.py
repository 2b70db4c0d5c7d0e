"""The safetensors file format, read and checked without PyTorch (or any framework).

A file is: 8 bytes, the header's length N (unsigned, little-endian); N bytes of JSON, an object
mapping each tensor's name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` plus an optional
``"__metadata__"`` of strings; then the data section, where each tensor's bytes lie at its offsets
(relative to the data section's start, 8 + N), little-endian and row-major.

`read_header` checks everything that can be checked before a byte of data is read, so a bad file is
a `SafetensorsError` naming the file and what is wrong, never a traceback from deep inside a load."""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from typing import Any

# The safetensors library refuses headers over 100 MB: a larger length is a corrupt file, not a model.
MAX_HEADER_BYTES = 100_000_000

# Every dtype of the format (safetensors 0.8) and its size in bits. Sub-byte dtypes (F4, F6) pack
# their elements; a tensor of them must fill whole bytes.
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "U16": 16, "I16": 16, "U32": 32, "I32": 32, "U64": 64, "I64": 64,
    "F16": 16, "BF16": 16, "F32": 32, "F64": 64, "C64": 64,
    "F8_E4M3": 8, "F8_E5M2": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "F8_E8M0": 8,
    "F6_E2M3": 6, "F6_E3M2": 6, "F4": 4,
}


class SafetensorsError(ValueError):
    """A safetensors file (or a checkpoint's index) that is not well formed: ``path`` is the file."""

    def __init__(self, path: str | os.PathLike, problem: str):
        self.path = os.fsdecode(os.fspath(path))
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a file: its bytes are data[begin:end] of the file's data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def itemsize(self) -> int:
        """Bytes per element, at least 1 (the alignment a view of this dtype wants)."""
        return max(1, DTYPE_BITS[self.dtype] // 8)


@dataclass(frozen=True)
class Header:
    """A checked header: the tensors in file order, where the data section starts, and its size
    (the end of the last tensor)."""

    path: str
    data_start: int
    data_size: int
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str] | None


def _fail(path: str, problem: str) -> SafetensorsError:
    return SafetensorsError(path, problem)


def _int_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def _tensor(path: str, name: str, entry: Any) -> TensorInfo:
    where = f"tensor {name!r}"
    if not isinstance(entry, dict):
        raise _fail(path, f"{where}: expected an object with dtype, shape and data_offsets, got {type(entry).__name__}")
    missing = [k for k in ("dtype", "shape", "data_offsets") if k not in entry]
    if missing:
        raise _fail(path, f"{where} has no {', '.join(missing)}")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in DTYPE_BITS:
        raise _fail(path, f"{where} has an unknown dtype {dtype!r} (known: {', '.join(DTYPE_BITS)})")
    if not _int_list(shape) or any(d < 0 for d in shape):
        raise _fail(path, f"{where}: shape must be a list of non-negative integers, got {shape!r}")
    if not _int_list(offsets) or len(offsets) != 2 or not 0 <= offsets[0] <= offsets[1]:
        raise _fail(path, f"{where}: data_offsets must be [begin, end] with 0 <= begin <= end, got {offsets!r}")
    bits = math.prod(shape) * DTYPE_BITS[dtype]
    if bits % 8:
        raise _fail(path, f"{where}: {math.prod(shape)} elements of {dtype} are not a whole number of bytes")
    if offsets[1] - offsets[0] != bits // 8:
        raise _fail(path, f"{where}: shape {shape} of {dtype} is {bits // 8} bytes but data_offsets {offsets} "
                          f"hold {offsets[1] - offsets[0]}")
    return TensorInfo(name, dtype, tuple(shape), offsets[0], offsets[1])


def parse_header(path: str | os.PathLike, text: bytes, file_size: int | None = None) -> Header:
    """Checks the header's JSON (the N bytes after the length) of the file `path`; `file_size`, when
    given, is checked to hold the whole data section."""
    path = os.fsdecode(os.fspath(path))
    try:
        doc = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _fail(path, f"the header is not JSON ({e}): not a safetensors file, or a corrupt one") from None
    if not isinstance(doc, dict):
        raise _fail(path, f"the header is JSON but not an object ({type(doc).__name__})")
    metadata = doc.pop("__metadata__", None)
    if metadata is not None and (not isinstance(metadata, dict)
                                 or not all(isinstance(v, str) for v in metadata.values())):
        raise _fail(path, "__metadata__ must be an object of strings")
    tensors = [_tensor(path, name, entry) for name, entry in doc.items()]
    tensors.sort(key=lambda t: (t.begin, t.end))
    before = None  # the non-empty tensor that ends last so far (an empty one overlaps nothing)
    for t in tensors:
        if t.nbytes == 0:
            continue
        if before is not None and t.begin < before.end:
            raise _fail(path, f"tensors {before.name!r} [{before.begin}, {before.end}) and {t.name!r} "
                              f"[{t.begin}, {t.end}) overlap")
        if before is None or t.end > before.end:
            before = t
    data_start = 8 + len(text)
    data_size = max((t.end for t in tensors), default=0)
    if file_size is not None and data_start + data_size > file_size:
        last = max(tensors, key=lambda t: t.end)
        raise _fail(path, f"the file is truncated: it has {file_size} bytes, but tensor {last.name!r} ends at byte "
                          f"{data_start + data_size} ({data_start + data_size - file_size} bytes missing)")
    return Header(path, data_start, data_size, {t.name: t for t in tensors}, metadata)


def read_header(path: str | os.PathLike) -> Header:
    """The checked header of the safetensors file `path` (OSError if it cannot be opened or read)."""
    path = os.fsdecode(os.fspath(path))
    with open(path, "rb") as f:
        file_size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) < 8:
            raise _fail(path, f"the file has {file_size} bytes, too few for a safetensors header's length (8)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES:
            raise _fail(path, f"the header's length says {n} bytes (over {MAX_HEADER_BYTES}): not a safetensors "
                              "file, or a corrupt one")
        if 8 + n > file_size:
            raise _fail(path, f"the header's length says {n} bytes but the file has only {file_size - 8} after it: "
                              "not a safetensors file, or a truncated one")
        text = f.read(n)
    return parse_header(path, text, file_size)
