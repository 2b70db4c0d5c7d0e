"""What a read or write may use as its buffer, found without importing PyTorch or CuPy:

* device memory: anything with ``__cuda_array_interface__`` (PyTorch, CuPy, Numba), anything with
  DLPack (``__dlpack__`` and ``__dlpack_device__``) on a CUDA device, a raw pointer with its size as
  ``(ptr, nbytes)`` or ``DevicePointer(ptr, nbytes)``;
* host memory: anything with the buffer protocol (numpy arrays, bytearray, memoryview, mmap) and
  DLPack on the CPU (a PyTorch CPU tensor).

Every buffer must be contiguous."""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DevicePointer:
    """Raw device memory: an address (a CUdeviceptr) and how many bytes there are at it."""

    ptr: int
    nbytes: int


@dataclass(frozen=True)
class Buffer:
    """A resolved buffer: device memory (`ptr`) or host memory (`view`, a byte memoryview)."""

    device: bool
    ptr: int
    nbytes: int
    readonly: bool
    view: memoryview | None  # host memory only
    keep: Any  # what keeps the memory alive while a transfer uses it


# DLPack's C structures (dlpack.h): a "dltensor" capsule holds a DLManagedTensor, which begins with
# its DLTensor.
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13


def _contiguous(shape: list[int], strides: list[int] | None, itemsize: int, in_bytes: bool) -> bool:
    """Whether strides (in bytes, or in elements) are those of a C-contiguous array of that shape."""
    if strides is None or math.prod(shape) <= 1:
        return True
    step = itemsize if in_bytes else 1
    for n, s in zip(reversed(shape), reversed(strides), strict=True):
        if n != 1 and s != step:
            return False
        step *= n
    return True


def _from_torch_cuda(obj: Any) -> Buffer | None:
    """A CUDA torch.Tensor through its own methods: its __cuda_array_interface__ costs about 45 us
    (H100 machine, 2026-12-05), a third of read_async's return. None for anything else, and for a
    tensor that requires grad, which takes the interface's path (and its error)."""
    if not getattr(obj, "is_cuda", False) or getattr(obj, "requires_grad", True):
        return None
    if not obj.is_contiguous():
        raise ValueError("the device array is not contiguous: pass a contiguous one (e.g. .contiguous())")
    return Buffer(True, int(obj.data_ptr()), int(obj.numel()) * int(obj.element_size()), False, None, obj)


def _from_cuda_array_interface(obj: Any) -> Buffer:
    cai = obj.__cuda_array_interface__
    ptr, readonly = cai["data"]
    shape = [int(n) for n in cai["shape"]]
    itemsize = int(cai["typestr"][2:])
    strides = cai.get("strides")
    if not _contiguous(shape, list(strides) if strides is not None else None, itemsize, in_bytes=True):
        raise ValueError("the device array is not contiguous: pass a contiguous one (e.g. .contiguous())")
    return Buffer(True, int(ptr or 0), itemsize * math.prod(shape), bool(readonly), None, obj)


def _host_view(ptr: int, nbytes: int) -> memoryview:
    return memoryview((ctypes.c_char * nbytes).from_address(ptr)).cast("B") if nbytes else memoryview(b"")


def _from_dlpack(obj: Any) -> Buffer:
    device_type, _ = obj.__dlpack_device__()
    if device_type not in (_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED):
        raise TypeError(f"a DLPack tensor on device type {device_type} is neither CUDA nor host memory")
    capsule = obj.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    t = ctypes.cast(get(capsule, b"dltensor"), ctypes.POINTER(_DLTensor)).contents
    shape = [t.shape[i] for i in range(t.ndim)]
    strides = [t.strides[i] for i in range(t.ndim)] if t.strides else None
    itemsize = (t.dtype.bits * t.dtype.lanes + 7) // 8
    if not _contiguous(shape, strides, itemsize, in_bytes=False):
        raise ValueError("the tensor is not contiguous: pass a contiguous one (e.g. .contiguous())")
    ptr, nbytes = (t.data or 0) + t.byte_offset, itemsize * math.prod(shape)
    keep = (obj, capsule)  # the capsule's deleter runs when it goes, after the transfer
    if device_type in (_DL_CUDA, _DL_CUDA_MANAGED):
        return Buffer(True, ptr, nbytes, False, None, keep)
    return Buffer(False, ptr, nbytes, False, _host_view(ptr, nbytes), keep)


def resolve(obj: Any) -> Buffer:
    """The buffer behind `obj`; TypeError for anything that is not one, ValueError for one that is
    not contiguous."""
    if isinstance(obj, DevicePointer):
        return Buffer(True, int(obj.ptr), int(obj.nbytes), False, None, obj)
    if isinstance(obj, tuple) and len(obj) == 2 and all(isinstance(v, int) for v in obj):
        return Buffer(True, obj[0], obj[1], False, None, obj)
    if hasattr(obj, "data_ptr") and (tensor := _from_torch_cuda(obj)) is not None:
        return tensor
    if hasattr(obj, "__cuda_array_interface__"):
        return _from_cuda_array_interface(obj)
    try:
        view = memoryview(obj)
    except TypeError:
        view = None
    if view is not None:
        if not view.contiguous:
            raise ValueError("the host buffer is not contiguous")
        flat = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        return Buffer(False, 0, flat.nbytes, view.readonly, flat, obj)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        return _from_dlpack(obj)
    raise TypeError(f"cannot read into or write from a {type(obj).__name__}: pass a CUDA array or tensor, "
                    "DevicePointer(ptr, nbytes), a (ptr, nbytes) tuple, or a host buffer (numpy, bytearray)")
