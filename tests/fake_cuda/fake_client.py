"""Thin ctypes client for the CUDA driver API, for tests: drives the fake driver (or a real one).

    drv = Driver()                   # ctypes.CDLL("libcuda.so.1"), or Driver("/path/libcuda.so.1")
    ctx = drv.init_primary(0)        # cuInit + retain the primary context of device 0 + make it current
    d = drv.mem_alloc(1 << 20)
    drv.memcpy("cuMemcpyHtoD_v2", d, host_addr, n)   # any copy entry point by exact name
    drv.call("cuMemcpyHtoD_v2", d, host_addr, n)     # same, returning the CUresult instead of raising

Handles and pointers are plain ints. Errors raise CudaError (``.code`` is the CUresult).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from ctypes import (
    CFUNCTYPE,
    POINTER,
    byref,
    c_char_p,
    c_double,
    c_float,
    c_int,
    c_longlong,
    c_size_t,
    c_ubyte,
    c_uint,
    c_ulonglong,
    c_void_p,
)

CUresult = c_int
CUdeviceptr = c_ulonglong
CUdeviceptr_v1 = c_uint
CUstream = c_void_p
CUevent = c_void_p
CUcontext = c_void_p

CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_NOT_INITIALIZED = 3
CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_INVALID_HANDLE = 400
CUDA_ERROR_ILLEGAL_STATE = 401
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_NOT_READY = 600
CUDA_ERROR_NOT_SUPPORTED = 801
CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900
CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901
CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906

STREAM_LEGACY = 0x1
STREAM_PER_THREAD = 0x2
CU_STREAM_DEFAULT = 0
CU_STREAM_NON_BLOCKING = 1
CU_EVENT_DISABLE_TIMING = 2

CU_GET_PROC_ADDRESS_DEFAULT = 0
CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1
CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2
SYMBOL_SUCCESS = 0
SYMBOL_NOT_FOUND = 1
VERSION_NOT_SUFFICIENT = 2

# pointer attributes
ATTR_CONTEXT = 1
ATTR_MEMORY_TYPE = 2
ATTR_DEVICE_POINTER = 3
ATTR_HOST_POINTER = 4
ATTR_IS_MANAGED = 8
ATTR_DEVICE_ORDINAL = 9
ATTR_RANGE_START_ADDR = 11
ATTR_RANGE_SIZE = 12
MEMORYTYPE_HOST = 1
MEMORYTYPE_DEVICE = 2

ATTR_CTYPES = {
    ATTR_CONTEXT: c_void_p,
    ATTR_MEMORY_TYPE: c_uint,
    ATTR_DEVICE_POINTER: c_ulonglong,
    ATTR_HOST_POINTER: c_void_p,
    ATTR_IS_MANAGED: c_uint,
    ATTR_DEVICE_ORDINAL: c_int,
    ATTR_RANGE_START_ADDR: c_ulonglong,
    ATTR_RANGE_SIZE: c_size_t,
}
ATTR_NAMES = {
    ATTR_CONTEXT: "context",
    ATTR_MEMORY_TYPE: "memory_type",
    ATTR_DEVICE_POINTER: "device_pointer",
    ATTR_HOST_POINTER: "host_pointer",
    ATTR_IS_MANAGED: "is_managed",
    ATTR_DEVICE_ORDINAL: "device_ordinal",
    ATTR_RANGE_START_ADDR: "range_start",
    ATTR_RANGE_SIZE: "range_size",
}

HOST_FUNC = CFUNCTYPE(None, c_void_p)

_P = c_void_p  # generic out-pointer
_COPY = {
    "cuMemcpyHtoD_v2": (CUdeviceptr, c_void_p, c_size_t),
    "cuMemcpyHtoD_v2_ptds": (CUdeviceptr, c_void_p, c_size_t),
    "cuMemcpyDtoH_v2": (c_void_p, CUdeviceptr, c_size_t),
    "cuMemcpyDtoH_v2_ptds": (c_void_p, CUdeviceptr, c_size_t),
    "cuMemcpyHtoDAsync_v2": (CUdeviceptr, c_void_p, c_size_t, CUstream),
    "cuMemcpyHtoDAsync_v2_ptsz": (CUdeviceptr, c_void_p, c_size_t, CUstream),
    "cuMemcpyDtoHAsync_v2": (c_void_p, CUdeviceptr, c_size_t, CUstream),
    "cuMemcpyDtoHAsync_v2_ptsz": (c_void_p, CUdeviceptr, c_size_t, CUstream),
    "cuMemcpy": (CUdeviceptr, CUdeviceptr, c_size_t),
    "cuMemcpy_ptds": (CUdeviceptr, CUdeviceptr, c_size_t),
    "cuMemcpyAsync": (CUdeviceptr, CUdeviceptr, c_size_t, CUstream),
    "cuMemcpyAsync_ptsz": (CUdeviceptr, CUdeviceptr, c_size_t, CUstream),
    "cuMemcpyDtoD_v2": (CUdeviceptr, CUdeviceptr, c_size_t),
    "cuMemcpyDtoD_v2_ptds": (CUdeviceptr, CUdeviceptr, c_size_t),
    "cuMemcpyDtoDAsync_v2": (CUdeviceptr, CUdeviceptr, c_size_t, CUstream),
    "cuMemcpyDtoDAsync_v2_ptsz": (CUdeviceptr, CUdeviceptr, c_size_t, CUstream),
    "cuMemcpyHtoD": (CUdeviceptr_v1, c_void_p, c_uint),
    "cuMemcpyDtoH": (c_void_p, CUdeviceptr_v1, c_uint),
    "cuMemcpyHtoDAsync": (CUdeviceptr_v1, c_void_p, c_uint, CUstream),
    "cuMemcpyDtoHAsync": (c_void_p, CUdeviceptr_v1, c_uint, CUstream),
}
_GPA = (c_char_p, POINTER(c_void_p), c_int, c_ulonglong)
_GPA2 = (c_char_p, POINTER(c_void_p), c_int, c_ulonglong, POINTER(c_int))

# Argument types (restype is CUresult unless listed in _RESTYPE) of every entry point by exact name.
SIGNATURES: dict[str, tuple] = {
    "cuInit": (c_uint,),
    "cuDriverGetVersion": (POINTER(c_int),),
    "cuGetErrorString": (CUresult, POINTER(c_char_p)),
    "cuGetErrorName": (CUresult, POINTER(c_char_p)),
    "cuDeviceGet": (POINTER(c_int), c_int),
    "cuDeviceGetCount": (POINTER(c_int),),
    "cuDeviceGetName": (c_char_p, c_int, c_int),
    "cuDeviceGetAttribute": (POINTER(c_int), c_int, c_int),
    "cuDeviceGetPCIBusId": (c_char_p, c_int, c_int),
    "cuDeviceTotalMem_v2": (POINTER(c_size_t), c_int),
    "cuDevicePrimaryCtxRetain": (POINTER(CUcontext), c_int),
    "cuDevicePrimaryCtxRelease_v2": (c_int,),
    "cuDevicePrimaryCtxGetState": (c_int, POINTER(c_uint), POINTER(c_int)),
    "cuDevicePrimaryCtxReset_v2": (c_int,),
    "cuCtxCreate_v2": (POINTER(CUcontext), c_uint, c_int),
    "cuCtxDestroy_v2": (CUcontext,),
    "cuCtxSetCurrent": (CUcontext,),
    "cuCtxGetCurrent": (POINTER(CUcontext),),
    "cuCtxPushCurrent_v2": (CUcontext,),
    "cuCtxPopCurrent_v2": (POINTER(CUcontext),),
    "cuCtxGetDevice": (POINTER(c_int),),
    "cuCtxSynchronize": (),
    "cuCtxGetStreamPriorityRange": (POINTER(c_int), POINTER(c_int)),
    "cuMemGetInfo_v2": (POINTER(c_size_t), POINTER(c_size_t)),
    "cuMemAlloc_v2": (POINTER(CUdeviceptr), c_size_t),
    "cuMemFree_v2": (CUdeviceptr,),
    "cuMemGetAddressRange_v2": (POINTER(CUdeviceptr), POINTER(c_size_t), CUdeviceptr),
    "cuMemsetD8_v2": (CUdeviceptr, c_ubyte, c_size_t),
    "cuMemsetD8_v2_ptds": (CUdeviceptr, c_ubyte, c_size_t),
    "cuMemsetD8Async": (CUdeviceptr, c_ubyte, c_size_t, CUstream),
    "cuMemsetD8Async_ptsz": (CUdeviceptr, c_ubyte, c_size_t, CUstream),
    "cuMemHostAlloc": (POINTER(c_void_p), c_size_t, c_uint),
    "cuMemAllocHost_v2": (POINTER(c_void_p), c_size_t),
    "cuMemFreeHost": (c_void_p,),
    "cuMemHostRegister_v2": (c_void_p, c_size_t, c_uint),
    "cuMemHostUnregister": (c_void_p,),
    "cuMemHostGetDevicePointer_v2": (POINTER(CUdeviceptr), c_void_p, c_uint),
    "cuMemAllocManaged": (POINTER(CUdeviceptr), c_size_t, c_uint),
    "cuPointerGetAttribute": (c_void_p, c_int, CUdeviceptr),
    "cuPointerGetAttributes": (c_uint, POINTER(c_int), POINTER(c_void_p), CUdeviceptr),
    **_COPY,
    "cuStreamCreate": (POINTER(CUstream), c_uint),
    "cuStreamCreateWithPriority": (POINTER(CUstream), c_uint, c_int),
    "cuStreamDestroy_v2": (CUstream,),
    "cuStreamSynchronize": (CUstream,),
    "cuStreamSynchronize_ptsz": (CUstream,),
    "cuStreamQuery": (CUstream,),
    "cuStreamQuery_ptsz": (CUstream,),
    "cuStreamWaitEvent": (CUstream, CUevent, c_uint),
    "cuStreamWaitEvent_ptsz": (CUstream, CUevent, c_uint),
    "cuStreamGetCtx": (CUstream, POINTER(CUcontext)),
    "cuStreamGetCtx_ptsz": (CUstream, POINTER(CUcontext)),
    "cuStreamGetCtx_v2": (CUstream, POINTER(CUcontext), POINTER(c_void_p)),
    "cuStreamGetCtx_v2_ptsz": (CUstream, POINTER(CUcontext), POINTER(c_void_p)),
    "cuStreamGetFlags": (CUstream, POINTER(c_uint)),
    "cuStreamGetFlags_ptsz": (CUstream, POINTER(c_uint)),
    "cuLaunchHostFunc": (CUstream, HOST_FUNC, c_void_p),
    "cuLaunchHostFunc_ptsz": (CUstream, HOST_FUNC, c_void_p),
    "cuStreamBeginCapture_v2": (CUstream, c_int),
    "cuStreamBeginCapture_v2_ptsz": (CUstream, c_int),
    "cuStreamEndCapture": (CUstream, POINTER(c_void_p)),
    "cuStreamEndCapture_ptsz": (CUstream, POINTER(c_void_p)),
    "cuStreamIsCapturing": (CUstream, POINTER(c_int)),
    "cuStreamIsCapturing_ptsz": (CUstream, POINTER(c_int)),
    "cuThreadExchangeStreamCaptureMode": (POINTER(c_int),),
    "cuGraphDestroy": (c_void_p,),
    "cuEventCreate": (POINTER(CUevent), c_uint),
    "cuEventDestroy_v2": (CUevent,),
    "cuEventRecord": (CUevent, CUstream),
    "cuEventRecord_ptsz": (CUevent, CUstream),
    "cuEventRecordWithFlags": (CUevent, CUstream, c_uint),
    "cuEventRecordWithFlags_ptsz": (CUevent, CUstream, c_uint),
    "cuEventSynchronize": (CUevent,),
    "cuEventQuery": (CUevent,),
    "cuEventElapsedTime": (POINTER(c_float), CUevent, CUevent),
    "cuEventElapsedTime_v2": (POINTER(c_float), CUevent, CUevent),
    "cuGetProcAddress": _GPA,
    "cuGetProcAddress_v2": _GPA2,
    "cuGetProcAddress_v2_ptsz": _GPA2,
    # test-only hooks of the fake driver
    "fakecuda_call_count": (c_char_p,),
    "fakecuda_reset_counts": (),
    "fakecuda_enqueue_delayed_write": (CUstream, CUdeviceptr, c_ubyte, c_size_t, c_uint),
    "fakecuda_launch_loading": (c_uint,),
    "fakecuda_live_streams": (),
    "fakecuda_peek": (c_void_p, CUdeviceptr, c_size_t),
    "fakecuda_poke": (CUdeviceptr, c_void_p, c_size_t),
    "fakecuda_copy_gbps": (),
    "fakecuda_set_copy_gbps": (c_double, c_double),
}
_RESTYPE = {
    "fakecuda_call_count": c_longlong,
    "fakecuda_reset_counts": None,
    "fakecuda_live_streams": c_int,
    "fakecuda_copy_gbps": c_double,
    "fakecuda_set_copy_gbps": None,
}


class CudaError(RuntimeError):
    def __init__(self, code: int, what: str = "", name: str | None = None):
        self.code = code
        self.what = what
        super().__init__(f"{what}: CUresult {code}" + (f" ({name})" if name else ""))


def _addr(x) -> int | None:
    """Address of a ctypes object / buffer / int (None stays None)."""
    if x is None or isinstance(x, int):
        return x
    if hasattr(x, "ctypes"):  # numpy array
        return x.ctypes.data
    return ctypes.addressof(x)


class Driver:
    """ctypes wrapper around libcuda (fake or real)."""

    def __init__(self, path: str = "libcuda.so.1"):
        self.path = path
        self.lib = ctypes.CDLL(path)
        self._fns: dict[str, ctypes._CFuncPtr] = {}
        self._keep: list = []  # host-function callbacks must outlive their execution

    # -- plumbing -----------------------------------------------------------------------------
    def fn(self, name: str):
        f = self._fns.get(name)
        if f is None:
            f = getattr(self.lib, name)
            if name in SIGNATURES:
                f.argtypes = list(SIGNATURES[name])
            f.restype = _RESTYPE.get(name, CUresult)
            self._fns[name] = f
        return f

    def has(self, name: str) -> bool:
        return hasattr(self.lib, name)

    def dlsym(self, name: str) -> int | None:
        """Address of the exported symbol ``name`` in this library (None if absent)."""
        try:
            return ctypes.cast(getattr(self.lib, name), c_void_p).value
        except AttributeError:
            return None

    def call(self, name: str, *args) -> int:
        """Call entry point ``name`` and return its CUresult."""
        return self.fn(name)(*args)

    def check(self, name: str, *args) -> None:
        rc = self.call(name, *args)
        if rc != CUDA_SUCCESS:
            raise CudaError(rc, name, self.error_name(rc))

    def error_name(self, rc: int) -> str | None:
        s = c_char_p()
        if self.fn("cuGetErrorName")(rc, byref(s)) == CUDA_SUCCESS and s.value:
            return s.value.decode()
        return None

    # -- init / contexts -----------------------------------------------------------------------
    def init(self) -> None:
        self.check("cuInit", 0)

    def device_count(self) -> int:
        n = c_int()
        self.check("cuDeviceGetCount", byref(n))
        return n.value

    def driver_version(self) -> int:
        v = c_int()
        self.check("cuDriverGetVersion", byref(v))
        return v.value

    def primary_ctx(self, dev: int = 0) -> int:
        c = CUcontext()
        self.check("cuDevicePrimaryCtxRetain", byref(c), dev)
        return c.value

    def init_primary(self, dev: int = 0) -> int:
        """cuInit, retain device ``dev``'s primary context and make it current; returns it."""
        self.init()
        ctx = self.primary_ctx(dev)
        self.ctx_set_current(ctx)
        return ctx

    def ctx_create(self, dev: int = 0, flags: int = 0) -> int:
        c = CUcontext()
        self.check("cuCtxCreate_v2", byref(c), flags, dev)
        return c.value

    def ctx_destroy(self, ctx: int) -> None:
        self.check("cuCtxDestroy_v2", ctx)

    def ctx_set_current(self, ctx: int | None) -> None:
        self.check("cuCtxSetCurrent", ctx)

    def ctx_get_current(self) -> int | None:
        c = CUcontext()
        self.check("cuCtxGetCurrent", byref(c))
        return c.value

    def ctx_push(self, ctx: int) -> None:
        self.check("cuCtxPushCurrent_v2", ctx)

    def ctx_pop(self) -> int | None:
        c = CUcontext()
        self.check("cuCtxPopCurrent_v2", byref(c))
        return c.value

    def ctx_get_device(self) -> int:
        d = c_int()
        self.check("cuCtxGetDevice", byref(d))
        return d.value

    def ctx_synchronize(self) -> None:
        self.check("cuCtxSynchronize")

    # -- memory --------------------------------------------------------------------------------
    def mem_alloc(self, n: int) -> int:
        p = CUdeviceptr()
        self.check("cuMemAlloc_v2", byref(p), n)
        return p.value

    def mem_free(self, p: int) -> None:
        self.check("cuMemFree_v2", p)

    def memset_d8(self, p: int, value: int, n: int) -> None:
        self.check("cuMemsetD8_v2", p, value, n)

    def host_alloc(self, n: int, flags: int = 0) -> int:
        p = c_void_p()
        self.check("cuMemHostAlloc", byref(p), n, flags)
        return p.value

    def host_free(self, p: int) -> None:
        self.check("cuMemFreeHost", p)

    free_host = host_free

    def host_register(self, p, n: int, flags: int = 0) -> None:
        self.check("cuMemHostRegister_v2", _addr(p), n, flags)

    def host_unregister(self, p) -> None:
        self.check("cuMemHostUnregister", _addr(p))

    def alloc_managed(self, n: int, flags: int = 1) -> int:
        p = CUdeviceptr()
        self.check("cuMemAllocManaged", byref(p), n, flags)
        return p.value

    def pointer_attributes(self, ptr, attrs=tuple(ATTR_CTYPES)) -> dict[str, int | None]:
        """cuPointerGetAttributes for ``attrs``; returns {name: value}."""
        vals = [ATTR_CTYPES[a]() for a in attrs]
        arr = (c_int * len(attrs))(*attrs)
        data = (c_void_p * len(attrs))(*[ctypes.addressof(v) for v in vals])
        self.check("cuPointerGetAttributes", len(attrs), arr, data, _addr(ptr))
        return {ATTR_NAMES[a]: v.value for a, v in zip(attrs, vals, strict=True)}

    def pointer_attribute(self, attr: int, ptr):
        v = ATTR_CTYPES[attr]()
        self.check("cuPointerGetAttribute", ctypes.addressof(v), attr, _addr(ptr))
        return v.value

    # -- copies --------------------------------------------------------------------------------
    def memcpy(self, name: str, *args) -> None:
        """Call copy entry point ``name`` (exact exported name); ints or ctypes buffers."""
        self.check(name, *[_addr(a) if not isinstance(a, int) else a for a in args])

    def htod(self, dptr: int, src, n: int) -> None:
        self.check("cuMemcpyHtoD_v2", dptr, _addr(src), n)

    def dtoh(self, dst, dptr: int, n: int) -> None:
        self.check("cuMemcpyDtoH_v2", _addr(dst), dptr, n)

    def read_device(self, dptr: int, n: int) -> bytes:
        """Bytes at a device pointer through cuMemcpyDtoH_v2."""
        buf = ctypes.create_string_buffer(n)
        if n:
            self.dtoh(buf, dptr, n)
        return buf.raw

    # -- streams & events --------------------------------------------------------------------------
    def stream_create(self, flags: int = CU_STREAM_DEFAULT, priority: int | None = None) -> int:
        s = CUstream()
        if priority is None:
            self.check("cuStreamCreate", byref(s), flags)
        else:
            self.check("cuStreamCreateWithPriority", byref(s), flags, priority)
        return s.value

    def stream_destroy(self, s: int) -> None:
        self.check("cuStreamDestroy_v2", s)

    def stream_sync(self, s: int | None = None, ptsz: bool = False) -> None:
        self.check("cuStreamSynchronize_ptsz" if ptsz else "cuStreamSynchronize", s)

    def stream_query(self, s: int | None = None, ptsz: bool = False) -> bool:
        """True when idle, False while busy (CUDA_ERROR_NOT_READY)."""
        rc = self.call("cuStreamQuery_ptsz" if ptsz else "cuStreamQuery", s)
        if rc == CUDA_ERROR_NOT_READY:
            return False
        if rc != CUDA_SUCCESS:
            raise CudaError(rc, "cuStreamQuery", self.error_name(rc))
        return True

    def stream_wait_event(self, s: int | None, ev: int, ptsz: bool = False) -> None:
        self.check("cuStreamWaitEvent_ptsz" if ptsz else "cuStreamWaitEvent", s, ev, 0)

    def stream_get_ctx(self, s: int | None, ptsz: bool = False) -> int | None:
        c = CUcontext()
        self.check("cuStreamGetCtx_ptsz" if ptsz else "cuStreamGetCtx", s, byref(c))
        return c.value

    def stream_get_flags(self, s: int | None) -> int:
        f = c_uint()
        self.check("cuStreamGetFlags", s, byref(f))
        return f.value

    def launch_host_func(self, s: int | None, func, ptsz: bool = False) -> None:
        """Enqueue Python callable ``func()`` on stream s."""
        cb = HOST_FUNC(lambda _ud: func())
        self._keep.append(cb)
        self.check("cuLaunchHostFunc_ptsz" if ptsz else "cuLaunchHostFunc", s, cb, None)

    def begin_capture(self, s: int, mode: int = 0, ptsz: bool = False) -> None:
        self.check("cuStreamBeginCapture_v2_ptsz" if ptsz else "cuStreamBeginCapture_v2", s, mode)

    def end_capture(self, s: int, ptsz: bool = False) -> int | None:
        g = c_void_p()
        self.check("cuStreamEndCapture_ptsz" if ptsz else "cuStreamEndCapture", s, byref(g))
        return g.value

    def is_capturing(self, s: int | None, ptsz: bool = False) -> int:
        st = c_int()
        self.check("cuStreamIsCapturing_ptsz" if ptsz else "cuStreamIsCapturing", s, byref(st))
        return st.value

    def event_create(self, flags: int = 0) -> int:
        e = CUevent()
        self.check("cuEventCreate", byref(e), flags)
        return e.value

    def event_destroy(self, e: int) -> None:
        self.check("cuEventDestroy_v2", e)

    def event_record(self, e: int, s: int | None = None, ptsz: bool = False) -> None:
        self.check("cuEventRecord_ptsz" if ptsz else "cuEventRecord", e, s)

    def event_sync(self, e: int) -> None:
        self.check("cuEventSynchronize", e)

    def event_query(self, e: int) -> bool:
        rc = self.call("cuEventQuery", e)
        if rc == CUDA_ERROR_NOT_READY:
            return False
        if rc != CUDA_SUCCESS:
            raise CudaError(rc, "cuEventQuery", self.error_name(rc))
        return True

    def event_elapsed_ms(self, start: int, end: int) -> float:
        ms = c_float()
        self.check("cuEventElapsedTime", byref(ms), start, end)
        return ms.value

    # -- resolver ------------------------------------------------------------------------------
    def get_proc_address(
        self, symbol: str, version: int = 13000, flags: int = 0, api: str = "cuGetProcAddress_v2"
    ):
        """Resolve ``symbol`` through ``api`` (cuGetProcAddress, cuGetProcAddress_v2 or _v2_ptsz).

        Returns (callable or None, address or None, symbol status (None for the 4-arg API)). The
        callable has the signature of the exported name the address belongs to (found via dlsym)."""
        pfn = c_void_p()
        if api == "cuGetProcAddress":
            self.check(api, symbol.encode(), byref(pfn), version, flags)
            status = None
        else:
            st = c_int(-1)
            self.check(api, symbol.encode(), byref(pfn), version, flags, byref(st))
            status = st.value
        addr = pfn.value
        if not addr:
            return None, None, status
        name = self.exported_name(addr)
        fn = None
        if name in SIGNATURES:
            fn = CFUNCTYPE(_RESTYPE.get(name, CUresult), *SIGNATURES[name])(addr)
        return fn, addr, status

    def exported_name(self, addr: int) -> str | None:
        """Which entry point of SIGNATURES lives at ``addr`` (None if none)."""
        for name in SIGNATURES:
            if self.dlsym(name) == addr:
                return name
        return None

    # -- fake-driver test hooks ----------------------------------------------------------------------
    def call_count(self, name: str) -> int:
        return self.fn("fakecuda_call_count")(name.encode())

    def reset_counts(self) -> None:
        self.fn("fakecuda_reset_counts")()

    def launch_loading(self, timeout_ms: int) -> int:
        """A kernel launch that loads its module lazily: holds every other thread's driver calls until
        all streams have drained. Returns the result (CUDA_ERROR_LAUNCH_TIMEOUT: a hang on a real driver)."""
        return self.call("fakecuda_launch_loading", timeout_ms)

    def delayed_write(self, s: int | None, dptr: int, value: int, n: int, delay_us: int) -> None:
        """A fake "kernel" on stream s: sleep delay_us, then memset n bytes at dptr to value."""
        self.check("fakecuda_enqueue_delayed_write", s, dptr, value, n, delay_us)

    def live_streams(self) -> int:
        return self.fn("fakecuda_live_streams")()

    def peek(self, dptr: int, n: int) -> bytes:
        """Bytes of device/managed/pinned memory, bypassing streams and copy entry points."""
        buf = ctypes.create_string_buffer(n)
        self.check("fakecuda_peek", buf, dptr, n)
        return buf.raw

    def poke(self, dptr: int, data: bytes) -> None:
        self.check("fakecuda_poke", dptr, data, len(data))


def find_real_libcuda() -> str | None:
    return ctypes.util.find_library("cuda")


__all__ = [name for name in dir() if not name.startswith("_")]
