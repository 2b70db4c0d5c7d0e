"""The storage path's C API (native/src/io_api.cpp) through ctypes, and the settings of file transfers."""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_double, c_int, c_int64, c_uint64, c_void_p
from functools import cache
from typing import Any

from .. import native
from ..errors import CmtError

# cmt_io_result.status
PENDING, OK, OS_ERROR, CUDA_ERROR, FILE_ENDED, BAD_DEVICE, BAD_REQUEST = -1, 0, 1, 2, 3, 4, 5


class Result(ctypes.Structure):
    """struct cmt_io_result: what became of one transfer."""

    _fields_ = [
        ("done", c_int64),
        ("offset", c_int64),
        ("status", ctypes.c_int32),
        ("os_errno", ctypes.c_int32),
        ("cu_result", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
        ("direct_bytes", c_int64),
        ("buffered_bytes", c_int64),
    ]


_R = POINTER(Result)
_TRANSFER = [c_void_p, c_uint64, c_uint64, c_int64, c_void_p, _R]
_ASYNC = [c_void_p, c_uint64, c_uint64, c_int64, c_void_p, c_void_p, _R]


@cache
def lib() -> ctypes.CDLL:
    """The native library with the storage path's prototypes set."""
    so = native.load()
    protos: dict[str, tuple[list, Any]] = {
        "cmt_io_attach": ([c_int, POINTER(c_int)], c_void_p),
        "cmt_io_detach": ([c_void_p], None),
        "cmt_io_default_settings": ([c_void_p], c_int),
        "cmt_io_prepare": ([], None),
        "cmt_io_read": (_TRANSFER, c_int),
        "cmt_io_write": (_TRANSFER, c_int),
        "cmt_io_read_async": (_ASYNC, c_void_p),
        "cmt_io_write_async": (_ASYNC, c_void_p),
        "cmt_io_wait": ([c_void_p, c_int64], c_int),
        "cmt_io_result": ([c_void_p, _R], c_int),
        "cmt_io_release": ([c_void_p], None),
        "cmt_io_counters": ([POINTER(c_int64), c_int], c_int),
        "cmt_io_resident_fraction": ([c_int, c_uint64, c_uint64], c_double),
        "cmt_io_small_bytes": ([], c_uint64),
        "cmt_io_batch_new": ([], c_void_p),
        "cmt_io_batch_submit_many": ([c_void_p, c_void_p, c_int, c_int64, c_void_p, c_void_p, c_void_p, c_void_p,
                                      c_int64, _R], c_int),
        "cmt_io_batch_poll": ([c_void_p, c_int, c_int64, POINTER(c_int64), _R, c_int], c_int),
        "cmt_io_batch_free": ([c_void_p], None),
    }
    for name, (argtypes, restype) in protos.items():
        fn = getattr(so, name)
        fn.argtypes, fn.restype = argtypes, restype
    return so


@cache
def small_bytes() -> int:
    """Transfers of at most this many bytes go through a pinned bounce buffer of their own, many at
    once, rather than the engine (native/src/file_transfer.hpp, kSmallIoBytes)."""
    return int(lib().cmt_io_small_bytes())


def prepare() -> None:
    """Starts faulting in the staging of the process's first transfer, in the background (native
    cmt_io_prepare); nothing where the library does not load (its first use says why)."""
    try:
        lib().cmt_io_prepare()
    except (OSError, CmtError):
        pass


def default_settings() -> dict[str, int | str]:
    """The settings file transfers use unless told otherwise: threads (the usable CPUs, up to 16),
    buffers, chunk_bytes, stores; the same names as cmt.config.Settings."""
    schema = native.settings_schema()
    row = (c_int64 * len(schema))()
    lib().cmt_io_default_settings(row)
    return {f["name"]: f["choices"][row[i]] if "choices" in f else int(row[i]) for i, f in enumerate(schema)}


def settings_struct(overrides: Any = None) -> ctypes.Array:
    """The native Settings struct for a file: the defaults with `overrides` (a dict of some of the
    settings, or a cmt.config.Settings) laid over them. A name or value out of range is a ValueError."""
    values = default_settings()
    if overrides is not None:
        given = overrides.as_dict() if hasattr(overrides, "as_dict") else dict(overrides)
        for name, value in given.items():
            field = next((f for f in native.settings_schema() if f["name"] == name), None)
            if field is None:
                raise ValueError(f"unknown setting {name!r}; the settings are {', '.join(values)}")
            if "choices" in field:
                if value not in field["choices"]:
                    raise ValueError(f"setting {name} must be one of {', '.join(field['choices'])}, not {value!r}")
            elif isinstance(value, bool) or not isinstance(value, int) or not field["min"] <= value <= field["max"]:
                raise ValueError(f"setting {name} must be an integer from {field['min']} to {field['max']}, "
                                 f"not {value!r}")
            values[name] = value
    return native._settings_struct(values)


def counters() -> dict[str, int]:
    """This process's storage counters: bytes moved O_DIRECT, bytes through the page cache, and
    files whose file system refused O_DIRECT."""
    out = (c_int64 * 3)()
    lib().cmt_io_counters(out, 3)
    return {"direct_bytes": out[0], "buffered_bytes": out[1], "direct_refused_files": out[2]}


def resident_fraction(fd: int, offset: int, nbytes: int) -> float | None:
    """How much of a range of an open file is in the page cache (0 to 1), None if it cannot be told."""
    f = lib().cmt_io_resident_fraction(fd, offset, nbytes)
    return None if f < 0 else f
