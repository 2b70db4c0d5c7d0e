"""Finds and loads the native library (the LD_PRELOAD interposer, which is also the engine's C API)."""

from __future__ import annotations

import ctypes
import os
from functools import cache
from pathlib import Path

from .errors import CmtError

_LIB_NAME = "libcmt.so"


def library_path() -> Path:
    """Path of libcmt.so: installed beside the package, or CMT_LIBRARY for development builds."""
    override = os.environ.get("CMT_LIBRARY")
    candidates = [Path(override)] if override else []
    candidates.append(Path(__file__).resolve().parent / "lib" / _LIB_NAME)
    for path in candidates:
        if path.is_file():
            return path
    raise CmtError(
        f"native library {_LIB_NAME} not found (looked in {', '.join(str(c) for c in candidates)}); "
        "reinstall with `pip install .`"
    )


@cache
def load() -> ctypes.CDLL:
    """The library loaded privately (RTLD_LOCAL): its driver wrappers do not interpose here."""
    lib = ctypes.CDLL(str(library_path()), mode=os.RTLD_LOCAL)
    lib.cmt_version.restype = ctypes.c_char_p
    lib.cmt_configure.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.cmt_configure.restype = ctypes.c_int
    for name in ("cmt_active_plan", "cmt_stats_json", "cmt_last_timeline", "cmt_settings_schema"):
        fn = getattr(lib, name)
        fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        fn.restype = ctypes.c_int
    lib.cmt_memcpy.argtypes = [
        ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p,
        ctypes.c_void_p, ctypes.POINTER(ctypes.c_int),
    ]
    lib.cmt_memcpy.restype = ctypes.c_int
    lib.cmt_transfer_blocks.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int,
                                        ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t]
    lib.cmt_transfer_blocks.restype = ctypes.c_int
    lib.cmt_host_copy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    lib.cmt_host_copy.restype = ctypes.c_int
    lib.cmt_plan_stages.argtypes = [ctypes.c_int, ctypes.c_size_t]
    lib.cmt_plan_stages.restype = ctypes.c_int
    lib.cmt_outcome_name.argtypes = [ctypes.c_int]
    lib.cmt_outcome_name.restype = ctypes.c_char_p
    return lib


def _read_string(fn) -> str:
    size = fn(None, 0)
    buf = ctypes.create_string_buffer(size + 1)
    fn(buf, size + 1)
    return buf.value.decode()


def active_plan() -> str:
    """The plan string the library uses now (its built-in defaults unless configured)."""
    return _read_string(load().cmt_active_plan)


def configure(plan: str) -> None:
    """Sets the plan of the library loaded in this process (benchmarks, tuner)."""
    err = ctypes.create_string_buffer(256)
    if load().cmt_configure(plan.encode(), err, len(err)) != 0:
        raise CmtError(f"invalid plan {plan!r}: {err.value.decode()}")


def plan_stages(direction: str, nbytes: int) -> bool:
    """Whether the plan in force stages copies of this size ('h2d' or 'd2h'); if not, `cmt run`
    hands them to the driver's own function untouched."""
    return bool(load().cmt_plan_stages(0 if direction == "h2d" else 1, nbytes))


class CopyResult(int):
    """CUresult of an engine copy, with what cmt did (`outcome`: accelerated, below_minimum, ...)."""

    outcome: str


@cache
def settings_schema() -> tuple[dict, ...]:
    """The engine's tuning settings in their native order: name, what, and min/max or choices
    (native/src/types.hpp, SETTINGS_TABLE). cmt.config validates tuned files against it."""
    import json

    return tuple(json.loads(_read_string(load().cmt_settings_schema)))


def _settings_struct(values: dict[str, int | str]) -> ctypes.Array:
    """The native Settings struct (int64 fields in schema order); a choice is passed as its index."""
    fields = settings_schema()
    row = (ctypes.c_int64 * len(fields))()
    for i, f in enumerate(fields):
        v = values[f["name"]]
        row[i] = f["choices"].index(v) if "choices" in f else int(v)
    return row


def memcpy(direction: str, host: int, device: int, nbytes: int, stream: int = 0,
           settings: dict[str, int | str] | None = None) -> CopyResult:
    """One copy through the engine: direction 'h2d' or 'd2h'; settings (name -> value, e.g.
    cmt.config.Settings.as_dict()) stage it as given, None lets the plan decide."""
    outcome = ctypes.c_int(-1)
    row = _settings_struct(settings) if settings is not None else None
    r = load().cmt_memcpy(0 if direction == "h2d" else 1, host, device, nbytes, stream,
                          ctypes.cast(row, ctypes.c_void_p) if row is not None else None, ctypes.byref(outcome))
    result = CopyResult(r)
    result.outcome = load().cmt_outcome_name(outcome.value).decode()
    return result


def host_copy(dst: int, src: int, nbytes: int, settings: dict[str, int | str] | None = None) -> str:
    """One copy between two host buffers through the engine's threads (native/src/host_copy.hpp):
    settings (threads, and chunk_bytes per piece) stage it as given, None lets the plan decide.
    Returns the outcome (accelerated, below_minimum, ...)."""
    row = _settings_struct(settings) if settings is not None else None
    outcome = load().cmt_host_copy(dst, src, nbytes, ctypes.cast(row, ctypes.c_void_p) if row is not None else None)
    if outcome < 0:
        raise CmtError(f"settings out of the engine's limits: {settings}")
    return load().cmt_outcome_name(outcome).decode()


def transfer_blocks(direction: str, nbytes: int, chunk_bytes: int, lanes: int = 8) -> list[int]:
    """The block sizes the engine cuts such a copy into (native/src/transfer_plan.hpp), in order."""
    lib = load()
    count = lib.cmt_transfer_blocks(0 if direction == "h2d" else 1, nbytes, chunk_bytes, lanes, None, 0)
    if count < 0:
        raise CmtError(f"no transfer plan for {nbytes} bytes in blocks of {chunk_bytes}")
    out = (ctypes.c_size_t * count)()
    lib.cmt_transfer_blocks(0 if direction == "h2d" else 1, nbytes, chunk_bytes, lanes, out, count)
    return list(out)


TIMELINE_STEPS = ("copy_start", "lane_start", "dma_queued", "dma_done", "lane_end", "copy_end")


def last_timeline() -> dict | None:
    """The steps of the engine's last copy in this process (needs CMT_TRACE=1 when it loaded):
    {"direction", "bytes", "blocks", "lanes", "steps": [(ns, lane, step name, block), ...]}, ns on
    time.monotonic_ns()'s clock; None when tracing is off."""
    import json

    text = _read_string(load().cmt_last_timeline)
    if not text:
        return None
    doc = json.loads(text)
    doc["steps"] = [(ns, lane, TIMELINE_STEPS[step], block) for ns, lane, step, block in doc["steps"]]
    return doc
