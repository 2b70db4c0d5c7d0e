"""Safetensors files for the tests: real ones from the safetensors package's numpy API for every dtype
numpy can express, and hand-made ones (any dtype, any header, any damage) for the rest."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

# The format's name of each numpy dtype safetensors.numpy writes.
NUMPY_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "U64": np.uint64,
    "I32": np.int32, "U32": np.uint32, "I16": np.int16, "U16": np.uint16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_, "C64": np.complex64,
}


def sample(dtype, shape, seed: int) -> np.ndarray:
    """Random values of every bit pattern the dtype allows (bools 0/1)."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if dtype == np.bool_:
        return rng.integers(0, 2, n).astype(np.bool_).reshape(shape)
    raw = rng.integers(0, 256, n * np.dtype(dtype).itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


def every_dtype(seed: int = 0, big: int = 0) -> dict[str, np.ndarray]:
    """One tensor per numpy dtype, odd shapes (so most offsets are not multiples of 8), a scalar, an
    empty one; `big` adds a tensor of that many bytes (several engine blocks)."""
    tensors = {}
    for i, (name, dtype) in enumerate(NUMPY_DTYPES.items()):
        tensors[f"t.{name.lower()}"] = sample(dtype, (3, 5 + i), seed + i)
    tensors["scalar"] = np.array(2.5, dtype=np.float32)
    tensors["empty"] = np.zeros((0, 7), dtype=np.float16)
    tensors["odd.u8"] = sample(np.uint8, (13,), seed + 99)
    if big:
        tensors["big"] = sample(np.uint8, (big,), seed + 100)
    return tensors


def handmade(path: Path, entries: dict, data: bytes, metadata: dict | None = None,
             header_bytes: bytes | None = None, length: int | None = None) -> Path:
    """A file with this header (entries as written, so they may be wrong) and data section; or raw
    `header_bytes`, and a `length` field that may lie."""
    doc = dict(entries)
    if metadata is not None:
        doc["__metadata__"] = metadata
    text = json.dumps(doc).encode() if header_bytes is None else header_bytes
    path.write_bytes(struct.pack("<Q", len(text) if length is None else length) + text + data)
    return path


def packed(tensors: dict[str, tuple[str, list[int], bytes]]) -> tuple[dict, bytes]:
    """Header entries and the data section for (dtype, shape, bytes) tensors laid one after another."""
    entries, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        entries[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    return entries, data
