"""Tests of the stand-in driver itself (tests/fake_cuda), without cmt."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from fake_cuda import fake_client as fc
from fake_cuda.fake_client import CudaError, Driver

MiB = 1 << 20

COPY_NAMES = [
    "cuMemcpyHtoD_v2", "cuMemcpyHtoD_v2_ptds", "cuMemcpyDtoH_v2", "cuMemcpyDtoH_v2_ptds",
    "cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync_v2_ptsz", "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoHAsync_v2_ptsz",
    "cuMemcpy", "cuMemcpy_ptds", "cuMemcpyAsync", "cuMemcpyAsync_ptsz",
    "cuMemcpyDtoD_v2", "cuMemcpyDtoD_v2_ptds", "cuMemcpyDtoDAsync_v2", "cuMemcpyDtoDAsync_v2_ptsz",
    "cuMemcpyHtoD", "cuMemcpyDtoH", "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync",
]


@pytest.fixture
def drv(fake_driver: Driver) -> Driver:
    fake_driver.ctx_set_current(fake_driver.primary_ctx(0))
    return fake_driver


def rand_bytes(n: int, seed: int = 0) -> bytes:
    import random

    return random.Random(seed).randbytes(n)


def buf(data: bytes | int):
    if isinstance(data, bytes):
        return ctypes.create_string_buffer(data, len(data))
    return ctypes.create_string_buffer(data)


def pinned(drv: Driver, n: int):
    p = drv.host_alloc(n)
    return p, (ctypes.c_char * n).from_address(p)


# ---------------------------------------------------------------------------------------------
# exports and basics
# ---------------------------------------------------------------------------------------------
def test_exports_every_entry_point(drv: Driver):
    for name in fc.SIGNATURES:
        assert drv.dlsym(name), name
    addrs = [drv.dlsym(n) for n in COPY_NAMES]
    assert len(set(addrs)) == len(addrs), "every copy entry point must have its own address"


def test_device_queries(drv: Driver):
    assert drv.driver_version() == 13000
    assert drv.device_count() == 1
    name = ctypes.create_string_buffer(64)
    drv.check("cuDeviceGetName", name, 64, 0)
    assert name.value == b"Fake CUDA Device"
    v = ctypes.c_int()
    drv.check("cuDeviceGetAttribute", ctypes.byref(v), 41, 0)  # UNIFIED_ADDRESSING
    assert v.value == 1
    drv.check("cuDeviceGetAttribute", ctypes.byref(v), 123456, 0)
    assert v.value == 0
    total, free = ctypes.c_size_t(), ctypes.c_size_t()
    drv.check("cuDeviceTotalMem_v2", ctypes.byref(total), 0)
    drv.check("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
    assert 0 < free.value <= total.value
    bus = ctypes.create_string_buffer(32)
    drv.check("cuDeviceGetPCIBusId", bus, 32, 0)
    assert b":" in bus.value
    assert drv.error_name(900) == "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
    s = ctypes.c_char_p()
    assert drv.call("cuGetErrorString", 1, ctypes.byref(s)) == 0 and s.value
    assert drv.call("cuGetErrorString", 123456, ctypes.byref(s)) == fc.CUDA_ERROR_INVALID_VALUE
    assert drv.call("cuDeviceGet", ctypes.byref(v), 5) == 101


def test_context_stack(drv: Driver):
    primary = drv.ctx_get_current()
    ctx = drv.ctx_create(0)
    assert drv.ctx_get_current() == ctx != primary
    assert drv.ctx_get_device() == 0
    assert drv.ctx_pop() == ctx
    assert drv.ctx_get_current() == primary
    drv.ctx_push(ctx)
    d = drv.mem_alloc(4096)
    assert drv.pointer_attributes(d)["context"] == ctx
    s = drv.stream_create()
    assert drv.stream_get_ctx(s) == ctx
    assert drv.stream_get_ctx(0) == ctx
    drv.mem_free(d)
    drv.ctx_destroy(ctx)
    assert drv.ctx_get_current() == primary
    assert drv.call("cuCtxSetCurrent", ctx) == fc.CUDA_ERROR_INVALID_CONTEXT


def test_not_initialized_and_no_context(run_python):
    code = textwrap.dedent("""
        import ctypes, threading
        from fake_cuda.fake_client import Driver
        d = Driver()
        p = ctypes.c_ulonglong()
        assert d.call("cuMemAlloc_v2", ctypes.byref(p), 16) == 3
        assert d.call("cuStreamSynchronize", None) == 3
        assert d.call("cuPointerGetAttributes", 0, None, None, 0) == 3
        v = ctypes.c_int()
        assert d.call("cuDriverGetVersion", ctypes.byref(v)) == 0
        d.init()
        assert d.call("cuMemAlloc_v2", ctypes.byref(p), 16) == 201
        assert d.call("cuMemcpyHtoD_v2", 0x1000, None, 16) == 201
        assert d.call("cuStreamSynchronize", None) == 201
        assert d.call("cuCtxSynchronize") == 201
        d.ctx_set_current(d.primary_ctx(0))
        assert d.call("cuMemAlloc_v2", ctypes.byref(p), 16) == 0
        out = []
        t = threading.Thread(target=lambda: out.append(d.call("cuMemAlloc_v2", ctypes.byref(p), 16)))
        t.start(); t.join()
        assert out == [201], out   # the current context is per thread
        print("ok")
    """)
    r = run_python(code)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def test_multiple_devices(run_python):
    code = textwrap.dedent("""
        from fake_cuda.fake_client import Driver
        d = Driver(); d.init()
        assert d.device_count() == 3
        ptrs = []
        for dev in range(3):
            d.ctx_set_current(d.primary_ctx(dev))
            assert d.ctx_get_device() == dev
            p = d.mem_alloc(1000)
            ptrs.append(p)
            assert d.pointer_attributes(p)["device_ordinal"] == dev
        d.ctx_set_current(d.primary_ctx(0))
        d.memset_d8(ptrs[2], 7, 1000)   # UVA: any context's memory, any current context
        assert d.read_device(ptrs[2], 1000) == bytes([7]) * 1000
        print("ok")
    """)
    r = run_python(code, env={"FAKE_CUDA_DEVICES": "3"})
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


# ---------------------------------------------------------------------------------------------
# copies
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 7, 4096, 1000003, 16 * MiB + 5])
def test_round_trip_sync(drv: Driver, n: int):
    data = rand_bytes(n, n)
    d = drv.mem_alloc(n)
    drv.htod(d, buf(data), n)
    out = buf(n)
    drv.dtoh(out, d, n)
    assert out.raw == data
    assert drv.peek(d, n) == data
    drv.mem_free(d)


@pytest.mark.parametrize(
    "h2d,d2h,stream_kind",
    [
        ("cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2", None),
        ("cuMemcpyHtoD_v2_ptds", "cuMemcpyDtoH_v2_ptds", None),
        ("cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "user"),
        ("cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", 0),
        ("cuMemcpyHtoDAsync_v2_ptsz", "cuMemcpyDtoHAsync_v2_ptsz", 0),
        ("cuMemcpyHtoDAsync_v2_ptsz", "cuMemcpyDtoHAsync_v2_ptsz", fc.STREAM_LEGACY),
        ("cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", fc.STREAM_PER_THREAD),
        ("cuMemcpyAsync", "cuMemcpyAsync", "nb"),
        ("cuMemcpyAsync_ptsz", "cuMemcpyAsync_ptsz", 0),
        ("cuMemcpy", "cuMemcpy", None),
        ("cuMemcpy_ptds", "cuMemcpy_ptds", None),
    ],
)
@pytest.mark.parametrize("host_kind", ["pageable", "pinned", "registered"])
def test_round_trip_entry_points(drv: Driver, h2d, d2h, stream_kind, host_kind):
    n = 3 * MiB + 17
    data = rand_bytes(n, 1)
    if host_kind == "pinned":
        src_addr, src = pinned(drv, n)
        dst_addr, dst = pinned(drv, n)
        src[:] = data
    else:
        src, dst = buf(data), buf(n)
        src_addr, dst_addr = ctypes.addressof(src), ctypes.addressof(dst)
        if host_kind == "registered":
            drv.host_register(src_addr, n)
            drv.host_register(dst_addr, n)
    s = None
    if stream_kind == "user":
        s = drv.stream_create()
    elif stream_kind == "nb":
        s = drv.stream_create(fc.CU_STREAM_NON_BLOCKING)
    elif stream_kind is not None:
        s = stream_kind
    d = drv.mem_alloc(n)
    extra = () if stream_kind is None else (s,)
    drv.memcpy(h2d, d, src_addr, n, *extra)
    drv.memcpy(d2h, dst_addr, d, n, *extra)
    if stream_kind is not None:
        drv.stream_sync(s, ptsz=h2d.endswith("_ptsz"))
    assert ctypes.string_at(dst_addr, n) == data
    drv.mem_free(d)
    if host_kind == "pinned":
        drv.host_free(src_addr)
        drv.host_free(dst_addr)
    elif host_kind == "registered":
        drv.host_unregister(src_addr)
        drv.host_unregister(dst_addr)
    if stream_kind in ("user", "nb"):
        drv.stream_destroy(s)


def test_uva_memcpy_all_directions(drv: Driver):
    n = 100000
    data = rand_bytes(n, 2)
    a, b = drv.mem_alloc(n), drv.mem_alloc(n)
    m = drv.alloc_managed(n)
    h1, h2 = buf(data), buf(n)
    drv.memcpy("cuMemcpy", a, h1, n)                    # H2D
    drv.memcpy("cuMemcpy", b, a, n)                     # D2D
    drv.memcpy("cuMemcpyDtoD_v2", m, b, n)              # D2D into managed
    assert ctypes.string_at(m, n) == data               # managed is CPU-accessible
    drv.memcpy("cuMemcpy", ctypes.addressof(h2), m, n)  # managed -> host
    assert h2.raw == data
    h3 = buf(n)
    drv.memcpy("cuMemcpy", ctypes.addressof(h3), ctypes.addressof(h1), n)  # host -> host
    assert h3.raw == data
    drv.memset_d8(a, 0x5A, n)
    assert drv.read_device(a, n) == b"\x5a" * n
    for p in (a, b, m):
        drv.mem_free(p)


def test_device_pointer_not_cpu_accessible(drv: Driver, run_python):
    d = drv.mem_alloc(4096)
    attrs = drv.pointer_attributes(d)
    assert attrs["memory_type"] == fc.MEMORYTYPE_DEVICE
    assert attrs["host_pointer"] is None
    drv.mem_free(d)
    code = textwrap.dedent("""
        import ctypes, sys
        from fake_cuda.fake_client import Driver
        d = Driver(); d.init_primary(0)
        p = d.mem_alloc(4096)
        d.memset_d8(p, 1, 4096)
        print("about to touch", flush=True)
        ctypes.string_at(p, 1)
        print("NOT REACHED", flush=True)
    """)
    r = run_python(code)
    assert "about to touch" in r.stdout and "NOT REACHED" not in r.stdout
    assert r.returncode < 0 or r.returncode == 139  # SIGSEGV


def test_pointer_attributes(drv: Driver):
    n = 10000
    d = drv.mem_alloc(n)
    ctx = drv.ctx_get_current()
    a = drv.pointer_attributes(d + 100)
    assert a == {
        "context": ctx, "memory_type": 2, "device_pointer": d + 100, "host_pointer": None,
        "is_managed": 0, "device_ordinal": 0, "range_start": d, "range_size": n,
    }
    assert drv.pointer_attribute(fc.ATTR_MEMORY_TYPE, d) == 2
    assert drv.pointer_attribute(fc.ATTR_RANGE_SIZE, d + 5) == n

    h = drv.host_alloc(n)
    a = drv.pointer_attributes(h + 1)
    assert a["memory_type"] == fc.MEMORYTYPE_HOST and a["range_start"] == h and a["range_size"] == n
    assert a["is_managed"] == 0 and a["host_pointer"] == h + 1

    reg = buf(n)
    drv.host_register(reg, n)
    a = drv.pointer_attributes(ctypes.addressof(reg))
    assert a["memory_type"] == fc.MEMORYTYPE_HOST and a["range_size"] == n
    with pytest.raises(CudaError) as ei:
        drv.host_register(reg, n)
    assert ei.value.code == 712
    drv.host_unregister(reg)
    with pytest.raises(CudaError) as ei:
        drv.host_unregister(reg)
    assert ei.value.code == 713

    m = drv.alloc_managed(n)
    a = drv.pointer_attributes(m)
    assert a["memory_type"] == fc.MEMORYTYPE_DEVICE and a["is_managed"] == 1 and a["range_size"] == n

    pageable = buf(n)
    a = drv.pointer_attributes(pageable)
    assert a == {
        "context": None, "memory_type": 0, "device_pointer": 0, "host_pointer": None,
        "is_managed": 0, "device_ordinal": 0, "range_start": 0, "range_size": 0,
    }
    with pytest.raises(CudaError) as ei:
        drv.pointer_attribute(fc.ATTR_MEMORY_TYPE, pageable)
    assert ei.value.code == fc.CUDA_ERROR_INVALID_VALUE

    # freed memory becomes unknown
    drv.mem_free(d)
    assert drv.pointer_attributes(d)["memory_type"] == 0
    drv.host_free(h)
    assert drv.pointer_attributes(h)["memory_type"] == 0
    drv.mem_free(m)


def test_range_errors(drv: Driver):
    n = 4096
    d = drv.mem_alloc(n)
    drv.memset_d8(d, 0x11, n)
    src = buf(b"\xee" * (2 * n))
    for name, args in [
        ("cuMemcpyHtoD_v2", (d + 1, src, n)),
        ("cuMemcpyHtoD_v2", (d, src, n + 1)),
        ("cuMemcpyHtoDAsync_v2", (d + n - 1, src, 2, None)),
        ("cuMemcpyDtoH_v2", (src, d + 10, n)),
        ("cuMemcpy", (d, ctypes.addressof(src), n + 1)),
        ("cuMemcpyDtoD_v2", (d, d + 1, n)),
    ]:
        rc = drv.call(name, *[ctypes.addressof(a) if isinstance(a, ctypes.Array) else a for a in args])
        assert rc == fc.CUDA_ERROR_INVALID_VALUE, name
    assert drv.peek(d, n) == b"\x11" * n, "a failed copy must not write anything"
    # pageable memory is not a valid device destination
    assert drv.call("cuMemcpyHtoD_v2", ctypes.addressof(src), ctypes.addressof(src), 16) == 1
    assert drv.call("cuMemcpyDtoD_v2", ctypes.addressof(src), d, 16) == 1
    # size 0 is a no-op, even for junk pointers
    assert drv.call("cuMemcpyHtoD_v2", 0, None, 0) == 0
    assert drv.call("cuMemcpyDtoHAsync_v2", None, 0, 0, None) == 0
    # invalid stream handle
    assert drv.call("cuMemcpyHtoDAsync_v2", d, src, 16, 0xDEAD0) == fc.CUDA_ERROR_INVALID_HANDLE
    assert drv.call("cuStreamSynchronize", 0xDEAD0) == fc.CUDA_ERROR_INVALID_HANDLE
    # freed pointer
    drv.mem_free(d)
    assert drv.call("cuMemcpyHtoD_v2", d, src, 16) == fc.CUDA_ERROR_INVALID_VALUE
    assert drv.call("cuMemFree_v2", d) == fc.CUDA_ERROR_INVALID_VALUE
    # the 32-bit CUDA 2.0 ABI entry points cannot reach our 64-bit device pointers
    assert drv.call("cuMemcpyHtoD", 0x1000, src, 16) == fc.CUDA_ERROR_NOT_SUPPORTED
    assert drv.call("cuMemcpyDtoHAsync", src, 0x1000, 16, None) == fc.CUDA_ERROR_NOT_SUPPORTED


# ---------------------------------------------------------------------------------------------
# stream semantics
# ---------------------------------------------------------------------------------------------
def test_async_pinned_returns_early_but_stays_ordered(drv: Driver):
    n = MiB
    s = drv.stream_create()
    d = drv.mem_alloc(n)
    drv.memset_d8(d, 0, n)
    hp, h = pinned(drv, n)
    drv.delayed_write(s, d, 0xAB, n, 300_000)
    t0 = time.monotonic()
    drv.memcpy("cuMemcpyDtoHAsync_v2", hp, d, n, s)
    assert time.monotonic() - t0 < 0.2, "an async copy with pinned memory must not wait"
    assert not drv.stream_query(s)
    drv.stream_sync(s)
    assert drv.stream_query(s)
    assert h.raw == b"\xab" * n
    # async H2D from pinned memory also returns at once and lands after the earlier kernel
    h[:] = b"\x01" * n
    drv.delayed_write(s, d, 0xCD, n, 200_000)
    t0 = time.monotonic()
    drv.memcpy("cuMemcpyHtoDAsync_v2", d, hp, n, s)
    assert time.monotonic() - t0 < 0.15
    drv.stream_sync(s)
    assert drv.peek(d, n) == b"\x01" * n
    drv.host_free(hp)
    drv.mem_free(d)
    drv.stream_destroy(s)


def test_async_pageable_waits(drv: Driver):
    n = MiB
    s = drv.stream_create()
    d = drv.mem_alloc(n)
    h = buf(n)
    drv.delayed_write(s, d, 0x42, n, 200_000)
    t0 = time.monotonic()
    drv.memcpy("cuMemcpyDtoHAsync_v2", h, d, n, s)
    assert time.monotonic() - t0 >= 0.19
    assert h.raw == b"\x42" * n, "pageable async D2H must be complete when it returns"
    drv.stream_destroy(s)
    drv.mem_free(d)


def test_sync_copy_waits_for_legacy_stream(drv: Driver):
    n = 4096
    d = drv.mem_alloc(n)
    drv.delayed_write(0, d, 0x33, n, 150_000)
    assert drv.read_device(d, n) == b"\x33" * n
    drv.mem_free(d)


@pytest.mark.parametrize("kind", ["blocking", "ptds"])
def test_legacy_waits_for_blocking_streams(drv: Driver, kind):
    n = 4096
    d = drv.mem_alloc(n)
    drv.memset_d8(d, 0, n)
    s = drv.stream_create(fc.CU_STREAM_DEFAULT) if kind == "blocking" else fc.STREAM_PER_THREAD
    drv.delayed_write(s, d, 0x77, n, 250_000)
    out = buf(n)
    drv.dtoh(out, d, n)  # legacy stream
    assert out.raw == b"\x77" * n
    if kind == "blocking":
        drv.stream_destroy(s)
    drv.mem_free(d)


def test_legacy_does_not_wait_for_non_blocking(drv: Driver):
    n = 4096
    d = drv.mem_alloc(n)
    drv.memset_d8(d, 0, n)
    nb = drv.stream_create(fc.CU_STREAM_NON_BLOCKING)
    drv.delayed_write(nb, d, 0x99, n, 600_000)
    t0 = time.monotonic()
    out = buf(n)
    drv.dtoh(out, d, n)
    assert time.monotonic() - t0 < 0.4
    assert out.raw == b"\x00" * n
    drv.stream_sync(nb)
    assert drv.read_device(d, n) == b"\x99" * n
    drv.stream_destroy(nb)
    drv.mem_free(d)


@pytest.mark.parametrize("flags,sees_write", [(fc.CU_STREAM_DEFAULT, True), (fc.CU_STREAM_NON_BLOCKING, False)])
def test_blocking_stream_waits_for_legacy(drv: Driver, flags, sees_write):
    n = 4096
    d = drv.mem_alloc(n)
    drv.memset_d8(d, 0, n)
    s = drv.stream_create(flags)
    hp, h = pinned(drv, n)
    drv.delayed_write(fc.STREAM_LEGACY, d, 0x55, n, 300_000)
    drv.memcpy("cuMemcpyDtoHAsync_v2", hp, d, n, s)
    drv.stream_sync(s)
    assert h.raw == (b"\x55" if sees_write else b"\x00") * n
    drv.ctx_synchronize()
    drv.stream_destroy(s)
    drv.host_free(hp)
    drv.mem_free(d)


def test_per_thread_default_stream_is_per_thread(drv: Driver):
    n = 4096
    d = drv.mem_alloc(n)
    drv.memset_d8(d, 0, n)
    ctx = drv.ctx_get_current()
    drv.delayed_write(fc.STREAM_PER_THREAD, d, 0x21, n, 400_000)
    result = {}

    def other():
        drv.ctx_set_current(ctx)
        t0 = time.monotonic()
        drv.stream_sync(0, ptsz=True)  # this thread's own per-thread stream: idle
        result["dt"] = time.monotonic() - t0

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert result["dt"] < 0.3
    drv.stream_sync(0, ptsz=True)
    assert drv.peek(d, n) == b"\x21" * n
    drv.mem_free(d)


def test_events_and_wait_event(drv: Driver):
    n = 4096
    d = drv.mem_alloc(n)
    drv.memset_d8(d, 0, n)
    s1 = drv.stream_create(fc.CU_STREAM_NON_BLOCKING)
    s2 = drv.stream_create(fc.CU_STREAM_NON_BLOCKING)
    e0, e1 = drv.event_create(), drv.event_create()
    assert drv.event_query(e0)  # never recorded: complete
    drv.stream_wait_event(s2, e0)  # never recorded: no-op
    drv.event_record(e0, s1)
    drv.delayed_write(s1, d, 0x66, n, 200_000)
    drv.event_record(e1, s1)
    assert not drv.event_query(e1)
    assert drv.call("cuEventElapsedTime", ctypes.byref(ctypes.c_float()), e0, e1) == fc.CUDA_ERROR_NOT_READY
    drv.stream_wait_event(s2, e1)
    hp, h = pinned(drv, n)
    drv.memcpy("cuMemcpyDtoHAsync_v2", hp, d, n, s2)
    drv.stream_sync(s2)
    assert h.raw == b"\x66" * n
    drv.event_sync(e1)
    ms = drv.event_elapsed_ms(e0, e1)
    assert 150 <= ms < 2000
    # re-recording: waits refer to the most recent record as of the call
    drv.delayed_write(s1, d, 0x67, n, 300_000)
    drv.event_record(e1, s1)
    assert not drv.event_query(e1)
    drv.event_sync(e1)
    assert drv.event_query(e1)
    nt = drv.event_create(fc.CU_EVENT_DISABLE_TIMING)
    drv.event_record(nt, s1)
    drv.event_sync(nt)
    assert drv.call("cuEventElapsedTime", ctypes.byref(ctypes.c_float()), e0, nt) == fc.CUDA_ERROR_INVALID_HANDLE
    for e in (e0, e1, nt):
        drv.event_destroy(e)
    assert drv.call("cuEventQuery", e0) == fc.CUDA_ERROR_INVALID_HANDLE
    drv.stream_destroy(s1)
    drv.stream_destroy(s2)
    drv.host_free(hp)
    drv.mem_free(d)


def test_host_func_runs_in_order(drv: Driver):
    n = 64
    d = drv.mem_alloc(n)
    s = drv.stream_create()
    seen = []
    drv.delayed_write(s, d, 0x10, n, 100_000)
    drv.launch_host_func(s, lambda: seen.append(drv.peek(d, 1)))
    drv.stream_sync(s)
    assert seen == [b"\x10"]
    drv.stream_destroy(s)
    drv.mem_free(d)


def test_stream_misc(drv: Driver):
    before = drv.live_streams()
    s = drv.stream_create(fc.CU_STREAM_NON_BLOCKING, priority=-1)
    assert drv.live_streams() == before + 1
    assert drv.stream_get_flags(s) == 1
    assert drv.stream_get_flags(0) == 0
    assert drv.stream_get_ctx(s) == drv.ctx_get_current()
    c, g = ctypes.c_void_p(), ctypes.c_void_p(1)
    drv.check("cuStreamGetCtx_v2", s, ctypes.byref(c), ctypes.byref(g))
    assert c.value == drv.ctx_get_current() and g.value is None
    # destroying a busy stream returns at once; its work still completes
    d = drv.mem_alloc(16)
    drv.delayed_write(s, d, 3, 16, 200_000)
    drv.stream_destroy(s)
    assert drv.live_streams() == before
    assert drv.call("cuStreamQuery", s) == fc.CUDA_ERROR_INVALID_HANDLE
    time.sleep(0.3)
    assert drv.peek(d, 16) == b"\x03" * 16
    drv.mem_free(d)
    mode = ctypes.c_int(2)
    drv.check("cuThreadExchangeStreamCaptureMode", ctypes.byref(mode))
    assert mode.value == 0
    drv.check("cuThreadExchangeStreamCaptureMode", ctypes.byref(mode))
    assert mode.value == 2


def test_call_counts(drv: Driver):
    drv.reset_counts()
    assert drv.call_count("cuMemcpyHtoD_v2") == 0
    d = drv.mem_alloc(16)
    src = buf(16)
    for _ in range(3):
        drv.htod(d, src, 16)
    drv.call("cuMemcpyHtoD_v2", d, src, 1 << 40)  # failing calls count too
    assert drv.call_count("cuMemcpyHtoD_v2") == 4
    assert drv.call_count("cuMemcpyHtoD_v2_ptds") == 0
    assert drv.call_count("cuMemAlloc_v2") == 1
    assert drv.call_count("no_such_function") == -1
    drv.mem_free(d)


# ---------------------------------------------------------------------------------------------
# stream capture
# ---------------------------------------------------------------------------------------------
def test_capture(drv: Driver):
    n = 4096
    d = drv.mem_alloc(n)
    drv.memset_d8(d, 0, n)
    hp, h = pinned(drv, n)
    h[:] = b"\x12" * n
    s = drv.stream_create()
    nb = drv.stream_create(fc.CU_STREAM_NON_BLOCKING)
    assert drv.is_capturing(s) == 0
    assert drv.call("cuStreamBeginCapture_v2", 0, 0) == fc.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED

    drv.begin_capture(nb)
    assert drv.is_capturing(nb) == 1
    assert drv.is_capturing(0) == 0  # non-blocking captures do not involve the legacy stream
    assert drv.end_capture(nb)

    drv.begin_capture(s)
    assert drv.call("cuStreamBeginCapture_v2", s, 0) == fc.CUDA_ERROR_ILLEGAL_STATE
    assert drv.is_capturing(s) == 1
    st = ctypes.c_int()
    assert drv.call("cuStreamIsCapturing", None, ctypes.byref(st)) == fc.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
    assert drv.call("cuStreamIsCapturing", fc.STREAM_LEGACY, ctypes.byref(st)) == 906
    assert drv.call("cuStreamIsCapturing_ptsz", None, ctypes.byref(st)) == 0 and st.value == 0
    # pinned copy: recorded into the graph, not executed
    drv.memcpy("cuMemcpyHtoDAsync_v2", d, hp, n, s)
    assert drv.peek(d, n) == b"\x00" * n
    graph = drv.end_capture(s)
    assert graph
    drv.check("cuGraphDestroy", graph)
    assert drv.is_capturing(s) == 0

    # pageable copy during capture: unsupported, and the capture is invalidated
    drv.begin_capture(s)
    page = buf(n)
    assert drv.call("cuMemcpyHtoDAsync_v2", d, page, n, s) == fc.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
    assert drv.is_capturing(s) == 2
    assert drv.call("cuStreamEndCapture", s, ctypes.byref(ctypes.c_void_p())) == 901  # INVALIDATED
    assert drv.is_capturing(s) == 0

    # sync calls on a capturing stream, and legacy-stream work while a blocking stream captures
    drv.begin_capture(s)
    assert drv.call("cuStreamSynchronize", s) == fc.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
    drv.call("cuStreamEndCapture", s, ctypes.byref(ctypes.c_void_p()))
    drv.begin_capture(s)
    assert drv.call("cuMemcpyHtoD_v2", d, hp, n) == fc.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
    assert drv.call("cuStreamEndCapture", s, ctypes.byref(ctypes.c_void_p())) == 901  # INVALIDATED
    assert drv.call("cuStreamEndCapture", s, ctypes.byref(ctypes.c_void_p())) == fc.CUDA_ERROR_ILLEGAL_STATE
    drv.stream_destroy(s)
    drv.stream_destroy(nb)
    drv.host_free(hp)
    drv.mem_free(d)


# ---------------------------------------------------------------------------------------------
# cuGetProcAddress
# ---------------------------------------------------------------------------------------------
RESOLVE_CASES = [
    # (symbol, version, flags, api, expected exported name)
    ("cuMemcpyHtoD", 13000, 0, "cuGetProcAddress_v2", "cuMemcpyHtoD_v2"),
    ("cuMemcpyHtoD", 13000, 1, "cuGetProcAddress_v2", "cuMemcpyHtoD_v2"),
    ("cuMemcpyHtoD", 13000, 2, "cuGetProcAddress_v2", "cuMemcpyHtoD_v2_ptds"),
    ("cuMemcpyHtoD", 13000, 0, "cuGetProcAddress_v2_ptsz", "cuMemcpyHtoD_v2_ptds"),
    ("cuMemcpyHtoD", 13000, 1, "cuGetProcAddress_v2_ptsz", "cuMemcpyHtoD_v2"),
    ("cuMemcpyHtoD", 3020, 0, "cuGetProcAddress_v2", "cuMemcpyHtoD_v2"),
    ("cuMemcpyHtoD", 3010, 0, "cuGetProcAddress_v2", "cuMemcpyHtoD"),
    ("cuMemcpyHtoD", 2000, 2, "cuGetProcAddress_v2", "cuMemcpyHtoD"),
    ("cuMemcpyHtoD", 6050, 2, "cuGetProcAddress_v2", "cuMemcpyHtoD_v2"),  # ptds needs 7.0
    ("cuMemcpyHtoDAsync", 12000, 2, "cuGetProcAddress", "cuMemcpyHtoDAsync_v2_ptsz"),
    ("cuMemcpyHtoDAsync", 99999, 0, "cuGetProcAddress", "cuMemcpyHtoDAsync_v2"),
    ("cuMemcpyDtoHAsync", 12080, 2, "cuGetProcAddress_v2", "cuMemcpyDtoHAsync_v2_ptsz"),
    ("cuMemcpyDtoHAsync", 3000, 0, "cuGetProcAddress_v2", "cuMemcpyDtoHAsync"),
    ("cuMemcpyDtoH", 13000, 2, "cuGetProcAddress_v2", "cuMemcpyDtoH_v2_ptds"),
    ("cuMemcpy", 13000, 0, "cuGetProcAddress_v2", "cuMemcpy"),
    ("cuMemcpy", 13000, 2, "cuGetProcAddress_v2", "cuMemcpy_ptds"),
    ("cuMemcpyAsync", 13000, 2, "cuGetProcAddress_v2", "cuMemcpyAsync_ptsz"),
    ("cuMemcpyDtoDAsync", 13000, 2, "cuGetProcAddress_v2", "cuMemcpyDtoDAsync_v2_ptsz"),
    ("cuStreamSynchronize", 13000, 2, "cuGetProcAddress_v2", "cuStreamSynchronize_ptsz"),
    ("cuStreamDestroy", 13000, 2, "cuGetProcAddress_v2", "cuStreamDestroy_v2"),  # no ptsz: legacy
    ("cuStreamGetCtx", 12000, 0, "cuGetProcAddress_v2", "cuStreamGetCtx"),
    ("cuStreamGetCtx", 13000, 0, "cuGetProcAddress_v2", "cuStreamGetCtx_v2"),
    ("cuStreamGetCtx", 13000, 2, "cuGetProcAddress_v2", "cuStreamGetCtx_v2_ptsz"),
    ("cuGetProcAddress", 11030, 0, "cuGetProcAddress", "cuGetProcAddress"),
    ("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2", "cuGetProcAddress_v2"),
    ("cuGetProcAddress", 12000, 2, "cuGetProcAddress_v2", "cuGetProcAddress_v2_ptsz"),
    ("cuPointerGetAttributes", 13000, 0, "cuGetProcAddress_v2", "cuPointerGetAttributes"),
    ("cuMemHostRegister", 13000, 0, "cuGetProcAddress_v2", "cuMemHostRegister_v2"),
    ("cuEventRecord", 13000, 2, "cuGetProcAddress_v2", "cuEventRecord_ptsz"),
    ("cuInit", 2000, 0, "cuGetProcAddress_v2", "cuInit"),
]


@pytest.mark.parametrize("symbol,version,flags,api,expected", RESOLVE_CASES)
def test_get_proc_address_selection(drv: Driver, symbol, version, flags, api, expected):
    fn, addr, status = drv.get_proc_address(symbol, version, flags, api)
    assert addr == drv.dlsym(expected), (drv.exported_name(addr), expected)
    assert status in (None, fc.SYMBOL_SUCCESS)
    assert fn is not None


SUPERSEDED = {
    "cuMemcpyHtoD": 3000, "cuMemcpyDtoH": 3000, "cuMemcpyHtoDAsync": 3000, "cuMemcpyDtoHAsync": 3000,
    "cuGetProcAddress": 11030, "cuStreamGetCtx": 12000, "cuEventElapsedTime": 12000,
}


def test_get_proc_address_covers_every_export(drv: Driver):
    """Every exported cu* entry point is reachable through the resolver at the newest version,
    with the right flags, and the address equals dlsym's."""
    import re

    for name in fc.SIGNATURES:
        if not name.startswith("cu"):
            continue
        per_thread = name.endswith(("_ptds", "_ptsz"))
        base = re.sub(r"(_v\d+)?(_ptds|_ptsz)?$", "", name)
        # ABIs superseded by a newer _vN are reached with a cudaVersion below the newer one's
        version = SUPERSEDED.get(name.replace("_ptds", "").replace("_ptsz", ""), 13000)
        _, addr, status = drv.get_proc_address(base, version, 2 if per_thread else 1)
        assert status == fc.SYMBOL_SUCCESS, name
        assert addr == drv.dlsym(name), (name, drv.exported_name(addr))


def test_get_proc_address_errors(drv: Driver):
    fn, addr, status = drv.get_proc_address("cuNoSuchThing", 13000, 0)
    assert fn is None and addr is None and status == fc.SYMBOL_NOT_FOUND
    fn, addr, status = drv.get_proc_address("cuMemcpyHtoD_v2", 13000, 0)  # takes base names only
    assert addr is None and status == fc.SYMBOL_NOT_FOUND
    fn, addr, status = drv.get_proc_address("cuStreamBeginCapture", 9000, 0)
    assert addr is None and status == fc.VERSION_NOT_SUFFICIENT
    fn, addr, status = drv.get_proc_address("cuGetProcAddress", 11020, 0)
    assert addr is None and status == fc.VERSION_NOT_SUFFICIENT
    pfn = ctypes.c_void_p(123)
    assert drv.call("cuGetProcAddress", b"cuNoSuchThing", ctypes.byref(pfn), 13000, 0) == 0
    assert pfn.value is None
    assert drv.call("cuGetProcAddress", None, ctypes.byref(pfn), 13000, 0) == fc.CUDA_ERROR_INVALID_VALUE


def test_resolved_function_works(drv: Driver):
    fn, _, _ = drv.get_proc_address("cuMemcpyHtoDAsync", 13000, 2)
    n = 1000
    d = drv.mem_alloc(n)
    data = rand_bytes(n, 9)
    assert fn(d, ctypes.addressof(buf(data)), n, None) == 0
    drv.stream_sync(0, ptsz=True)
    assert drv.peek(d, n) == data
    drv.mem_free(d)


def test_get_proc_address_before_init_and_under_interposition(run_c_program, tmp_path: Path):
    """The resolver works before cuInit, and returns this library's own definitions even when an
    LD_PRELOAD library defines the same names (address identity with dlsym(handle, name))."""
    preload_src = tmp_path / "interpose.c"
    preload_src.write_text(textwrap.dedent("""
        typedef int CUresult;
        CUresult cuMemcpyHtoDAsync_v2_ptsz(unsigned long long d, const void* s, unsigned long n, void* st)
        { (void)d; (void)s; (void)n; (void)st; return 12345; }
        CUresult cuMemcpyHtoD_v2(unsigned long long d, const void* s, unsigned long n)
        { (void)d; (void)s; (void)n; return 12345; }
    """))
    preload = tmp_path / "libinterpose.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(preload), str(preload_src)], check=True)
    prog = textwrap.dedent(r"""
        #include <cstdio>
        #include <cstring>
        #include <dlfcn.h>
        #include "cmt/cuda_types.hpp"
        extern "C" CUresult cuGetProcAddress_v2(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
        extern "C" CUresult cuInit(unsigned int);
        int main() {
          void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
          if (!h) { printf("no handle\n"); return 2; }
          const char* names[][2] = {{"cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync_v2_ptsz"},
                                     {"cuMemcpyHtoD", "cuMemcpyHtoD_v2"}};
          int bad = 0;
          for (int i = 0; i < 2; ++i) {
            void* p = nullptr;
            CUdriverProcAddressQueryResult st;
            cuuint64_t fl = strstr(names[i][1], "ptsz") ? 2 : 0;
            CUresult rc = cuGetProcAddress_v2(names[i][0], &p, 13000, fl, &st);
            void* want = dlsym(h, names[i][1]);
            void* global = dlsym(RTLD_DEFAULT, names[i][1]);
            printf("%s rc=%d st=%d p=%p dlsym(h)=%p dlsym(default)=%p\n", names[i][1], rc, (int)st, p, want, global);
            if (rc || st || !p || p != want || p == global) bad = 1;
          }
          PFN_cuMemcpyHtoD f = nullptr;
          cuGetProcAddress_v2("cuMemcpyHtoD", (void**)&f, 13000, 0, nullptr);
          // calling the resolved pointer reaches the driver (3 = not initialised), not the preload
          CUresult r = f(0, nullptr, 8);
          printf("resolved call before init -> %d\n", r);
          if (r != CUDA_ERROR_NOT_INITIALIZED) bad = 1;
          printf(bad ? "BAD\n" : "OK\n");
          return bad;
        }
    """)
    r = run_c_program(prog, tmp_path, env={"LD_PRELOAD": str(preload)})
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


# ---------------------------------------------------------------------------------------------
# concurrency, throttling, fork, volume
# ---------------------------------------------------------------------------------------------
def test_eight_threads_copying(drv: Driver):
    ctx = drv.ctx_get_current()
    errors: list[BaseException] = []

    def worker(i: int):
        try:
            drv.ctx_set_current(ctx)
            kind = i % 4
            s = drv.stream_create(i % 2) if kind in (0, 1) else (0 if kind == 2 else fc.STREAM_PER_THREAD)
            for it in range(20):
                n = 1 + (i * 7919 + it * 104729) % (2 * MiB)
                data = rand_bytes(n, i * 1000 + it)
                d = drv.mem_alloc(n)
                src, out = buf(data), buf(n)
                h2d = "cuMemcpyHtoDAsync_v2_ptsz" if kind == 3 else "cuMemcpyHtoDAsync_v2"
                d2h = "cuMemcpyDtoHAsync_v2_ptsz" if kind == 3 else "cuMemcpyDtoHAsync_v2"
                stream_arg = 0 if kind == 3 else s
                drv.memcpy(h2d, d, src, n, stream_arg)
                drv.memcpy(d2h, out, d, n, stream_arg)
                assert out.raw == data
                drv.htod(d, src, n)
                assert drv.read_device(d, n) == data
                drv.mem_free(d)
            if kind in (0, 1):
                drv.stream_destroy(s)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors


def test_big_copy_is_fast(drv: Driver):
    n = 256 * MiB
    d = drv.mem_alloc(n)
    hp, h = pinned(drv, n)
    ctypes.memset(hp, 0x3C, n)
    t0 = time.monotonic()
    drv.memcpy("cuMemcpyHtoD_v2", d, hp, n)
    ctypes.memset(hp, 0, n)
    drv.memcpy("cuMemcpyDtoH_v2", hp, d, n)
    dt = time.monotonic() - t0
    assert ctypes.string_at(hp + n - 4096, 4096) == b"\x3c" * 4096
    assert dt < 10
    drv.host_free(hp)
    drv.mem_free(d)


def test_copy_throttle(run_python):
    code = textwrap.dedent("""
        import ctypes, time
        from fake_cuda.fake_client import Driver
        d = Driver(); d.init_primary(0)
        n = 32 << 20
        p = d.mem_alloc(n)
        h = d.host_alloc(n)
        t0 = time.monotonic(); d.memcpy("cuMemcpyHtoD_v2", p, h, n); pinned = time.monotonic() - t0
        b = ctypes.create_string_buffer(n)
        t0 = time.monotonic(); d.htod(p, b, n); pageable = time.monotonic() - t0
        print(pinned, pageable)
        assert 0.06 <= pinned < 2, pinned      # 32 MiB at 0.5 GB/s = 67 ms
        assert 0.3 <= pageable < 4, pageable   # 32 MiB at 0.1 GB/s = 335 ms
        print("ok")
    """)
    r = run_python(code, env={"FAKE_CUDA_COPY_GBPS": "0.5", "FAKE_CUDA_PAGEABLE_GBPS": "0.1"})
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def test_fork_child_can_copy(run_python):
    code = textwrap.dedent("""
        import ctypes, os, sys, threading
        from fake_cuda.fake_client import Driver
        d = Driver(); ctx = d.init_primary(0)
        n = 1 << 20
        p = d.mem_alloc(n)
        stop = False
        def churn():   # keep other threads inside the driver while forking
            d.ctx_set_current(ctx)
            s = d.stream_create()
            b = ctypes.create_string_buffer(n)
            while not stop:
                d.memcpy("cuMemcpyHtoDAsync_v2", p, b, n, s)
        ts = [threading.Thread(target=churn) for _ in range(3)]
        for t in ts: t.start()
        for i in range(20):
            pid = os.fork()
            if pid == 0:
                try:
                    b = ctypes.create_string_buffer(b"x" * n, n)
                    a = d.pointer_attributes(p)
                    assert a["memory_type"] == 2
                    assert d.pointer_attributes(b)["memory_type"] == 0
                    d.htod(p, b, n)
                    o = ctypes.create_string_buffer(n)
                    d.memcpy("cuMemcpyDtoHAsync_v2", o, p, n, None)
                    assert o.raw == b.raw
                    os._exit(0)
                except BaseException as e:
                    print("child error", repr(e), flush=True)
                    os._exit(1)
            _, st = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(st) == 0, st
        stop = True
        for t in ts: t.join()
        print("ok")
    """)
    r = run_python(code, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def test_c_program_links_against_fake(run_c_program, tmp_path: Path):
    prog = textwrap.dedent(r"""
        #include <stdio.h>
        #include <string.h>
        #include "cmt/cuda_types.hpp"
        extern "C" {
        CUresult cuInit(unsigned); CUresult cuDevicePrimaryCtxRetain(CUcontext*, CUdevice);
        CUresult cuCtxSetCurrent(CUcontext); CUresult cuMemAlloc_v2(CUdeviceptr*, size_t);
        CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void*, size_t);
        CUresult cuMemcpyDtoH_v2(void*, CUdeviceptr, size_t);
        }
        int main() {
          CUcontext c; CUdeviceptr d; char a[100] = "hello fake", b[100] = {0};
          if (cuInit(0) || cuDevicePrimaryCtxRetain(&c, 0) || cuCtxSetCurrent(c)) return 1;
          if (cuMemAlloc_v2(&d, 100) || cuMemcpyHtoD_v2(d, a, 100) || cuMemcpyDtoH_v2(b, d, 100)) return 2;
          printf("%s\n", b);
          return strcmp(a, b) != 0;
        }
    """)
    r = run_c_program(prog, tmp_path)
    assert r.returncode == 0 and "hello fake" in r.stdout, r.stdout + r.stderr


@pytest.mark.gpu
def test_gpu_marker_only_runs_with_gpu():
    assert os.path.exists("/dev/nvidiactl")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
