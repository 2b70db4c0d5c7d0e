"""A small ctypes binding of the CUDA driver API (libcuda.so.1): no toolkit, PyTorch or cuda-python.

Used by `cmt bench`, `cmt tune` and the GPU tests. Handles and pointers are plain ints::

    drv = cuda.load()                      # CmtError when there is no driver or no GPU
    dev = drv.open_device(0)               # primary context retained and current on this thread
    d = drv.mem_alloc(1 << 20)
    drv.memcpy_htod(d, host_address, 1 << 20)

Every failing call raises CudaError, which carries the CUresult and its name.
Constants and entry-point names match /usr/local/cuda/include/cuda.h (CUDA 12/13).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from ctypes import POINTER, byref, c_char_p, c_float, c_int, c_size_t, c_uint, c_ulonglong, c_void_p
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from .errors import CmtError

LIBRARY = "libcuda.so.1"

CUDA_SUCCESS = 0
CUDA_ERROR_NOT_INITIALIZED = 3
CUDA_ERROR_NO_DEVICE = 100
CUDA_ERROR_INVALID_DEVICE = 101

# CUdevice_attribute
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33
CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID = 34
CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT = 40
CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41
CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID = 50
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76

# cuMemHostAlloc flags
CU_MEMHOSTALLOC_PORTABLE = 0x01
CU_MEMHOSTALLOC_DEVICEMAP = 0x02
CU_MEMHOSTALLOC_WRITECOMBINED = 0x04

# stream and event flags, special stream handles
CU_STREAM_DEFAULT = 0x0
CU_STREAM_NON_BLOCKING = 0x1
CU_STREAM_LEGACY = 0x1
CU_STREAM_PER_THREAD = 0x2
CU_EVENT_DEFAULT = 0x0
CU_EVENT_BLOCKING_SYNC = 0x1
CU_EVENT_DISABLE_TIMING = 0x2

_P = POINTER
# name: argument types (every entry point returns a CUresult). Pointers and handles pass as
# c_void_p / c_ulonglong so that callers deal in plain ints.
_SIGNATURES: dict[str, list] = {
    "cuInit": [c_uint],
    "cuDriverGetVersion": [_P(c_int)],
    "cuGetErrorName": [c_int, _P(c_char_p)],
    "cuGetErrorString": [c_int, _P(c_char_p)],
    "cuDeviceGet": [_P(c_int), c_int],
    "cuDeviceGetCount": [_P(c_int)],
    "cuDeviceGetName": [c_char_p, c_int, c_int],
    "cuDeviceGetAttribute": [_P(c_int), c_int, c_int],
    "cuDeviceGetPCIBusId": [c_char_p, c_int, c_int],
    "cuDeviceTotalMem_v2": [_P(c_size_t), c_int],
    "cuDevicePrimaryCtxRetain": [_P(c_void_p), c_int],
    "cuDevicePrimaryCtxRelease_v2": [c_int],
    "cuCtxSetCurrent": [c_void_p],
    "cuCtxSynchronize": [],
    "cuMemGetInfo_v2": [_P(c_size_t), _P(c_size_t)],
    "cuMemAlloc_v2": [_P(c_ulonglong), c_size_t],
    "cuMemFree_v2": [c_ulonglong],
    "cuMemsetD8_v2": [c_ulonglong, ctypes.c_ubyte, c_size_t],
    "cuMemHostAlloc": [_P(c_void_p), c_size_t, c_uint],
    "cuMemFreeHost": [c_void_p],
    "cuStreamCreate": [_P(c_void_p), c_uint],
    "cuStreamDestroy_v2": [c_void_p],
    "cuStreamSynchronize": [c_void_p],
    "cuEventCreate": [_P(c_void_p), c_uint],
    "cuEventDestroy_v2": [c_void_p],
    "cuEventRecord": [c_void_p, c_void_p],
    "cuEventSynchronize": [c_void_p],
    "cuEventElapsedTime": [_P(c_float), c_void_p, c_void_p],
    "cuMemcpyHtoD_v2": [c_ulonglong, c_void_p, c_size_t],
    "cuMemcpyDtoH_v2": [c_void_p, c_ulonglong, c_size_t],
    "cuMemcpyHtoDAsync_v2": [c_ulonglong, c_void_p, c_size_t, c_void_p],
    "cuMemcpyDtoHAsync_v2": [c_void_p, c_ulonglong, c_size_t, c_void_p],
}
# CUDA 13 renamed cuEventElapsedTime to _v2 (same arguments); older drivers only have the first.
_ALTERNATIVES = {"cuEventElapsedTime": "cuEventElapsedTime_v2"}


class CudaError(CmtError):
    """A driver call failed: `code` is the CUresult, `name` its name (CUDA_ERROR_...)."""

    def __init__(self, call: str, code: int, name: str):
        super().__init__(f"CUDA error in {call}: {name} ({code})", exit_code=1)
        self.call, self.code, self.name = call, code, name


@dataclass(frozen=True)
class PcieLink:
    """The GPU's PCIe link. `gen` is what the link trains to under load (GPUs drop to a lower
    generation when idle, shown in `gen_current`); `source` says where the figures came from."""

    gen: int | None
    width: int | None
    gen_current: int | None
    source: str


@dataclass(frozen=True)
class Device:
    ordinal: int
    handle: int
    context: int
    name: str
    pci_bus_id: str  # as the driver writes it: 00000000:18:00.0
    total_mem: int


class Driver:
    """The driver library with typed entry points. Create with `load()`."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        self._fns = {}
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(lib, _ALTERNATIVES.get(name, name), None) or getattr(lib, name, None)
            if fn is None:
                continue  # reported when called: an old driver may lack an entry point nobody uses
            fn.argtypes, fn.restype = argtypes, c_int
            self._fns[name] = fn

    # -- plumbing ------------------------------------------------------------------------------
    def call(self, name: str, *args) -> None:
        fn = self._fns.get(name)
        if fn is None:
            raise CmtError(f"the CUDA driver has no entry point {name}: it is too old for cmt", exit_code=1)
        code = fn(*args)
        if code != CUDA_SUCCESS:
            raise CudaError(name, code, self.error_name(code))

    def error_name(self, code: int) -> str:
        s = c_char_p()
        fn = self._fns.get("cuGetErrorName")
        if fn is not None and fn(code, byref(s)) == CUDA_SUCCESS and s.value:
            return s.value.decode()
        return f"CUresult {code}"

    def _out(self, name: str, ctype, *args):
        value = ctype()
        self.call(name, byref(value), *args)
        return value.value

    # -- driver and devices --------------------------------------------------------------------
    def init(self) -> None:
        self.call("cuInit", 0)

    def driver_version(self) -> int:
        """E.g. 13000 for CUDA 13.0 (the newest CUDA version the driver supports)."""
        return self._out("cuDriverGetVersion", c_int)

    def device_count(self) -> int:
        return self._out("cuDeviceGetCount", c_int)

    def device(self, ordinal: int) -> int:
        return self._out("cuDeviceGet", c_int, ordinal)

    def device_name(self, dev: int) -> str:
        buf = ctypes.create_string_buffer(256)
        self.call("cuDeviceGetName", buf, len(buf), dev)
        return buf.value.decode(errors="replace")

    def attribute(self, dev: int, attr: int) -> int:
        return self._out("cuDeviceGetAttribute", c_int, attr, dev)

    def pci_bus_id(self, dev: int) -> str:
        buf = ctypes.create_string_buffer(64)
        self.call("cuDeviceGetPCIBusId", buf, len(buf), dev)
        return buf.value.decode()

    def total_mem(self, dev: int) -> int:
        return self._out("cuDeviceTotalMem_v2", c_size_t, dev)

    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes of the current context's device."""
        free, total = c_size_t(), c_size_t()
        self.call("cuMemGetInfo_v2", byref(free), byref(total))
        return free.value, total.value

    # -- contexts ------------------------------------------------------------------------------
    def retain_primary(self, dev: int) -> int:
        return self._out("cuDevicePrimaryCtxRetain", c_void_p, dev)

    def release_primary(self, dev: int) -> None:
        self.call("cuDevicePrimaryCtxRelease_v2", dev)

    def set_current(self, ctx: int) -> None:
        self.call("cuCtxSetCurrent", ctx)

    def synchronize(self) -> None:
        self.call("cuCtxSynchronize")

    def open_device(self, ordinal: int) -> Device:
        """Device `ordinal` with its primary context retained and current on the calling thread."""
        count = self.device_count()
        if not 0 <= ordinal < count:
            raise CmtError(f"GPU {ordinal} does not exist: {count} GPU{'s' if count != 1 else ''} found "
                           f"(numbered from 0)")
        dev = self.device(ordinal)
        ctx = self.retain_primary(dev)
        self.set_current(ctx)
        return Device(ordinal, dev, ctx, self.device_name(dev), self.pci_bus_id(dev), self.total_mem(dev))

    def close_device(self, device: Device) -> None:
        self.release_primary(device.handle)

    # -- memory --------------------------------------------------------------------------------
    def mem_alloc(self, nbytes: int) -> int:
        return self._out("cuMemAlloc_v2", c_ulonglong, nbytes)

    def mem_free(self, dptr: int) -> None:
        self.call("cuMemFree_v2", dptr)

    def memset_d8(self, dptr: int, value: int, nbytes: int) -> None:
        self.call("cuMemsetD8_v2", dptr, value, nbytes)

    def host_alloc(self, nbytes: int, flags: int = CU_MEMHOSTALLOC_PORTABLE) -> int:
        """Pinned (page-locked) host memory."""
        return self._out("cuMemHostAlloc", c_void_p, nbytes, flags)

    def host_free(self, ptr: int) -> None:
        self.call("cuMemFreeHost", ptr)

    # -- streams and events --------------------------------------------------------------------
    def stream_create(self, flags: int = CU_STREAM_NON_BLOCKING) -> int:
        return self._out("cuStreamCreate", c_void_p, flags)

    def stream_destroy(self, stream: int) -> None:
        self.call("cuStreamDestroy_v2", stream)

    def stream_synchronize(self, stream: int | None) -> None:
        self.call("cuStreamSynchronize", stream)

    def event_create(self, flags: int = CU_EVENT_DEFAULT) -> int:
        return self._out("cuEventCreate", c_void_p, flags)

    def event_destroy(self, event: int) -> None:
        self.call("cuEventDestroy_v2", event)

    def event_record(self, event: int, stream: int | None) -> None:
        self.call("cuEventRecord", event, stream)

    def event_synchronize(self, event: int) -> None:
        self.call("cuEventSynchronize", event)

    def event_elapsed_ms(self, start: int, end: int) -> float:
        ms = c_float()
        self.call("cuEventElapsedTime", byref(ms), start, end)
        return ms.value

    # -- copies (the typed entry points the interposer also intercepts) -------------------------
    def memcpy_htod(self, dst: int, src: int, nbytes: int) -> None:
        self.call("cuMemcpyHtoD_v2", dst, src, nbytes)

    def memcpy_dtoh(self, dst: int, src: int, nbytes: int) -> None:
        self.call("cuMemcpyDtoH_v2", dst, src, nbytes)

    def memcpy_htod_async(self, dst: int, src: int, nbytes: int, stream: int | None) -> None:
        self.call("cuMemcpyHtoDAsync_v2", dst, src, nbytes, stream)

    def memcpy_dtoh_async(self, dst: int, src: int, nbytes: int, stream: int | None) -> None:
        self.call("cuMemcpyDtoHAsync_v2", dst, src, nbytes, stream)

    # -- PCIe link -----------------------------------------------------------------------------
    def pcie_link(self, dev: int) -> PcieLink:
        return pcie_link(self.pci_bus_id(dev))


_NO_GPU = "no NVIDIA GPU / driver found"


@cache
def load() -> Driver:
    """The driver, initialised; CmtError when it cannot be loaded or has no GPU."""
    try:
        lib = ctypes.CDLL(LIBRARY)
    except OSError as e:
        raise CmtError(f"{_NO_GPU}: cannot load {LIBRARY} ({e})", exit_code=1) from None
    drv = Driver(lib)
    try:
        drv.init()
        count = drv.device_count()
    except CudaError as e:
        raise CmtError(f"{_NO_GPU}: cuInit failed with {e.name}", exit_code=1) from None
    if count == 0:
        raise CmtError(f"{_NO_GPU}: the driver sees no device", exit_code=1)
    return drv


# -- PCIe link: not a driver attribute; sysfs or nvidia-smi know it ------------------------------
_GT_PER_GEN = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6, 128.0: 7}


def _gen_from_speed(text: str) -> int | None:
    """'32.0 GT/s PCIe' -> 5."""
    try:
        return _GT_PER_GEN.get(float(text.split()[0]))
    except (ValueError, IndexError):
        return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def sysfs_path(bus_id: str) -> Path:
    """The driver's '00000000:18:00.0' is sysfs's '0000:18:00.0'."""
    domain, rest = bus_id.split(":", 1)
    return Path("/sys/bus/pci/devices") / f"{int(domain, 16):04x}:{rest.lower()}"


def _link_from_nvidia_smi(bus_id: str) -> PcieLink | None:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    fields = "pcie.link.gen.max,pcie.link.width.current,pcie.link.gen.current"
    try:
        out = subprocess.run([smi, "-i", bus_id, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    values = [_int_or_none(v.strip()) for v in out.stdout.strip().split(",")]
    if out.returncode != 0 or len(values) != 3 or values[0] is None:
        return None
    return PcieLink(values[0], values[1], values[2], "nvidia-smi")


def _link_from_sysfs(bus_id: str) -> PcieLink | None:
    dev = sysfs_path(bus_id)
    current = _read(dev / "current_link_speed")
    if current is None:
        return None
    # The link trains to the lower of the GPU's and the upstream port's maximum generation.
    maxima = [_gen_from_speed(s) for s in (_read(dev / "max_link_speed"), _read(dev.resolve().parent /
              "max_link_speed")) if s]
    maxima = [g for g in maxima if g]
    gen = min(maxima) if maxima else _gen_from_speed(current)
    return PcieLink(gen, _int_or_none(_read(dev / "current_link_width")), _gen_from_speed(current), "sysfs")


def pcie_link(bus_id: str) -> PcieLink:
    """nvidia-smi asks the GPU itself (right in VMs, where sysfs shows a virtual bridge); sysfs otherwise."""
    return _link_from_nvidia_smi(bus_id) or _link_from_sysfs(bus_id) or PcieLink(None, None, None, "unknown")


# -- the benchmark must see the real driver, not cmt's interposer ---------------------------------
def _start_environment() -> dict[str, str]:
    """The environment this process started with (what the dynamic loader acted on)."""
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return dict(os.environ)
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def preloaded_cmt() -> str | None:
    """The libcmt entry of LD_PRELOAD this process started with, if any."""
    preload = _start_environment().get("LD_PRELOAD", "")
    for entry in preload.replace(":", " ").split():
        if os.path.basename(entry).startswith("libcmt"):
            return entry
    return None


def require_real_driver(what: str = "cmt bench") -> None:
    """Refuses to measure under `cmt run`: the 'default' copies would be cmt's own."""
    lib = preloaded_cmt()
    if lib:
        raise CmtError(f"{what} must not run under `cmt run` ({lib} is in LD_PRELOAD): its default-copy "
                       f"figures would be cmt's. Run `{what}` directly; it loads cmt's engine itself.")
