"""A process that runs under LD_PRELOAD=libcmt.so with the stand-in driver and performs the copies
the tests ask for, one JSON request per stdin line, one JSON reply per stdout line.

It reaches the driver through ctypes, i.e. the dlsym door, or through cuGetProcAddress when a
request says so. Every copy is checked byte for byte here, against the device bytes read with the
fake's peek (which bypasses cmt), and the reply says what cmt did with it (its statistics).
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import random
import sys
import threading
import time
import traceback

import numpy as np

from fake_cuda.fake_client import (
    CU_GET_PROC_ADDRESS_LEGACY_STREAM,
    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
    CU_STREAM_NON_BLOCKING,
    STREAM_LEGACY,
    STREAM_PER_THREAD,
    Driver,
)

drv = Driver("libcuda.so.1")
if os.environ.get("SERVER_CONTEXT") == "created":
    # A context of its own (cuCtxCreate): cmt sets its staging up at its first copy, where a
    # primary context's retain starts it at once (what the tests of copies during a setup need).
    drv.init()
    ctx = drv.ctx_create(0)
    drv.ctx_set_current(ctx)
else:
    ctx = drv.init_primary(0)
_cmt = ctypes.CDLL(None)  # the preloaded library answers through the global scope


def stats() -> dict:
    fn = _cmt.cmt_stats_json
    fn.restype = ctypes.c_int
    size = fn(None, 0)
    buf = ctypes.create_string_buffer(size + 1)
    fn(buf, size + 1)
    return json.loads(buf.value)


def stats_delta(before: dict, after: dict) -> dict:
    """{"h2d": {"accelerated": copies, ...}} for the outcomes that changed."""
    out: dict = {}
    for d in ("h2d", "d2h"):
        for k, (c, _b) in after[d].items():
            diff = c - before[d][k][0]
            if diff:
                out.setdefault(d, {})[k] = diff
    return out


_BASE = {  # exact entry point -> base name for cuGetProcAddress
    "cuMemcpyHtoD_v2": "cuMemcpyHtoD", "cuMemcpyHtoD_v2_ptds": "cuMemcpyHtoD",
    "cuMemcpyDtoH_v2": "cuMemcpyDtoH", "cuMemcpyDtoH_v2_ptds": "cuMemcpyDtoH",
    "cuMemcpyHtoDAsync_v2": "cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync_v2_ptsz": "cuMemcpyHtoDAsync",
    "cuMemcpyDtoHAsync_v2": "cuMemcpyDtoHAsync", "cuMemcpyDtoHAsync_v2_ptsz": "cuMemcpyDtoHAsync",
    "cuMemcpy": "cuMemcpy", "cuMemcpy_ptds": "cuMemcpy",
    "cuMemcpyAsync": "cuMemcpyAsync", "cuMemcpyAsync_ptsz": "cuMemcpyAsync",
}


def entry(name: str, door: str):
    """The callable for an exact entry point, reached through `door`."""
    if door == "dlsym":
        assert drv.dlsym(name) == wrapper_address(name), f"dlsym: {name} was not replaced by cmt's wrapper"
        return drv.fn(name), name
    per_thread = name.endswith(("_ptds", "_ptsz"))
    flags = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM if per_thread else CU_GET_PROC_ADDRESS_LEGACY_STREAM
    api = {"gpa_v2": "cuGetProcAddress_v2", "gpa_v2_ptsz": "cuGetProcAddress_v2", "gpa_v1": "cuGetProcAddress"}[door]
    if door == "gpa_v2_ptsz":  # the _ptsz resolver treats DEFAULT flags as per-thread
        api, flags = "cuGetProcAddress_v2_ptsz", (0 if per_thread else CU_GET_PROC_ADDRESS_LEGACY_STREAM)
    # The resolver itself must come back as cmt's wrapper when looked up through the resolver.
    resolver_fn, resolver_addr, _ = drv.get_proc_address("cuGetProcAddress", 13000, 0)
    assert resolver_addr == drv.dlsym("cuGetProcAddress_v2"), "resolver not wrapped"
    fn, addr, _status = drv.get_proc_address(_BASE[name], 13000, flags, api=api)
    got = drv.exported_name(addr)
    assert got == name, f"{door} resolved {_BASE[name]} to {got}, expected {name}"
    assert addr == wrapper_address(name), f"{door}: {name} was not replaced by cmt's wrapper"
    return fn, name


def wrapper_address(name: str) -> int:
    """cmt's exported wrapper for `name` (the global scope finds the preloaded library first)."""
    return ctypes.cast(getattr(_cmt, name), ctypes.c_void_p).value


def resolve_stream(kind: str, streams: dict) -> int | None:
    if kind == "null":
        return None
    if kind == "legacy":
        return STREAM_LEGACY
    if kind == "per_thread":
        return STREAM_PER_THREAD
    if kind not in streams:
        streams[kind] = drv.stream_create(CU_STREAM_NON_BLOCKING if kind == "nonblocking" else 0)
    return streams[kind]


_streams: dict = {}


class HostBuffer:
    """Host memory of a given kind; release() undoes pinning/registration (a stale registration
    would make later, unrelated buffers at the same address look pinned)."""

    def __init__(self, kind: str, n: int):
        self.kind = kind
        if kind == "pinned":
            self.addr = drv.host_alloc(max(n, 1))
            return
        if kind == "fresh":  # never-touched pages but the first, like a new malloc'ed block
            self._map = mmap.mmap(-1, max(n, 1))
            self.addr = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
            ctypes.memset(self.addr, 0, 16)
            return
        self._buf = ctypes.create_string_buffer(max(n, 1))
        self.addr = ctypes.addressof(self._buf)
        if kind == "registered":
            drv.host_register(self.addr, max(n, 1))
        elif kind != "pageable":
            raise ValueError(kind)

    def release(self) -> None:
        if self.kind == "pinned":
            drv.host_free(self.addr)
        elif self.kind == "registered":
            drv.host_unregister(self.addr)


def roundtrip(req: dict) -> dict:
    """H2D then D2H of `size` bytes at odd offsets through the given entry points and door."""
    n, hoff, doff = req["size"], req.get("host_off", 0), req.get("dev_off", 0)
    h2d_name, d2h_name = req.get("h2d", "cuMemcpyHtoD_v2"), req.get("d2h", "cuMemcpyDtoH_v2")
    door = req.get("door", "dlsym")
    stream = resolve_stream(req.get("stream", "null"), _streams)
    data = np.random.default_rng(req.get("seed", 0)).bytes(n)
    src = HostBuffer(req.get("host_kind", "pageable"), n + hoff)
    src_addr = src.addr
    ctypes.memmove(src_addr + hoff, data, n)
    dev = drv.mem_alloc(n + doff + 1)
    before = stats()
    h2d, _ = entry(h2d_name, door)
    args = (dev + doff, src_addr + hoff, n)  # cuMemcpyHtoD*(dst, src, n) and cuMemcpy*(dst, src, n) alike
    rc = h2d(*args, stream) if "Async" in h2d_name else h2d(*args)
    assert rc == 0, f"{h2d_name} returned {rc}"
    # Stream order: D2H on the same stream sees the H2D; a pageable source can be reused at once
    # (a pinned one only after the stream's copy ran).
    if src.kind != "pageable":
        drv.stream_sync(stream)
    ctypes.memset(src_addr + hoff, 0, n)
    dst = HostBuffer(req.get("dst_kind", "pageable"), n + hoff + 3)
    dst_addr = dst.addr
    d2h, _ = entry(d2h_name, door)
    args = (dst_addr + hoff + 3, dev + doff, n)
    rc = d2h(*args, stream) if "Async" in d2h_name else d2h(*args)
    assert rc == 0, f"{d2h_name} returned {rc}"
    if "Async" in d2h_name and req.get("dst_kind", "pageable") != "pageable":
        drv.stream_sync(stream)
    device_bytes = drv.peek(dev + doff, n)
    back = ctypes.string_at(dst_addr + hoff + 3, n)
    after = stats()
    drv.mem_free(dev)
    src.release()
    dst.release()
    return {"device_ok": device_bytes == data, "host_ok": back == data, "stats": stats_delta(before, after)}


def ordering(req: dict) -> dict:
    """A delayed "kernel" write on a stream, then cmt copies that must wait for it."""
    n = req["size"]
    stream = resolve_stream(req.get("stream", "blocking"), _streams)
    copy_stream = resolve_stream(req.get("copy_stream", req.get("stream", "blocking")), _streams)
    dev = drv.mem_alloc(n)
    drv.memset_d8(dev, 0, n)
    # D2H after a slow write on the same (or, for legacy, any blocking) stream sees the write.
    drv.delayed_write(stream, dev, 0x5A, n, 200_000)
    out = ctypes.create_string_buffer(n)
    if copy_stream in (None, STREAM_LEGACY) and req.get("sync", True):
        drv.memcpy("cuMemcpyDtoH_v2", out, dev, n)
    else:
        drv.memcpy("cuMemcpyDtoHAsync_v2", out, dev, n, copy_stream)
    d2h_ok = out.raw == b"\x5a" * n
    # H2D after a slow write on the stream must land after it: the final bytes are the H2D's.
    drv.delayed_write(stream, dev, 0x11, n, 200_000)
    src = ctypes.create_string_buffer(b"\x77" * n, n)
    t0 = time.perf_counter()
    drv.memcpy("cuMemcpyHtoDAsync_v2", dev, src, n, copy_stream)
    h2d_call_s = time.perf_counter() - t0
    # Later work on the stream waits for cmt's DMAs: a pinned D2H (passed through, asynchronous).
    pinned = drv.host_alloc(n)
    drv.memcpy("cuMemcpyDtoHAsync_v2", pinned, dev, n, copy_stream)
    drv.stream_sync(copy_stream)
    h2d_ok = drv.peek(dev, n) == b"\x77" * n and ctypes.string_at(pinned, n) == b"\x77" * n
    drv.host_free(pinned)
    drv.mem_free(dev)
    return {"d2h_waited": d2h_ok, "h2d_ordered": h2d_ok, "h2d_call_s": h2d_call_s}


def in_threads(work, count: int) -> dict:
    """Runs work(0..count-1) on as many threads at once; returns what cmt did meanwhile."""
    before = stats()
    threads = [threading.Thread(target=work, args=(t,)) for t in range(count)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return stats_delta(before, stats())


def concurrent(req: dict) -> dict:
    """`threads` threads, each with `streams` streams, doing round trips at once."""
    errors: list[str] = []

    def work(t: int) -> None:
        try:
            drv.ctx_set_current(ctx)
            rng = random.Random(t)
            own = [drv.stream_create(CU_STREAM_NON_BLOCKING if i % 2 else 0) for i in range(req["streams"])]
            for i in range(req["rounds"]):
                n = rng.randint(1 << 20, 6 << 20) + rng.randint(0, 4095)
                s = own[i % len(own)]
                data = rng.randbytes(n)
                src = ctypes.create_string_buffer(data, n)
                dev = drv.mem_alloc(n)
                drv.memcpy("cuMemcpyHtoDAsync_v2", dev, src, n, s)
                out = ctypes.create_string_buffer(n)
                drv.memcpy("cuMemcpyDtoHAsync_v2", out, dev, n, s)
                if out.raw != data:
                    errors.append(f"thread {t} round {i}: mismatch")
                drv.mem_free(dev)
        except Exception as e:  # reported to the test
            errors.append(f"thread {t}: {e!r}")

    return {"errors": errors, "stats": in_threads(work, req["threads"])}


def multi_device(req: dict) -> dict:
    """Threads on every device's primary context copying at once: the engine moves between contexts."""
    errors: list[str] = []
    contexts = [drv.primary_ctx(d) for d in range(drv.device_count())]

    def work(t: int) -> None:
        try:
            rng = np.random.default_rng(t)
            for i in range(req["rounds"]):
                drv.ctx_set_current(contexts[(t + i) % len(contexts)])  # switch device every round
                n = int(rng.integers(2 << 20, 5 << 20))
                data = rng.bytes(n)
                src = ctypes.create_string_buffer(data, n)
                dev = drv.mem_alloc(n)
                stream = drv.stream_create(CU_STREAM_NON_BLOCKING)
                drv.memcpy("cuMemcpyHtoDAsync_v2", dev, src, n, stream)
                out = ctypes.create_string_buffer(n)
                drv.memcpy("cuMemcpyDtoH_v2", out, dev, n)
                if out.raw != data or drv.peek(dev, n) != data:
                    errors.append(f"thread {t} round {i}: mismatch")
                drv.stream_destroy(stream)
                drv.mem_free(dev)
        except Exception as e:  # reported to the test
            errors.append(f"thread {t}: {e!r}")

    delta = in_threads(work, req["threads"])
    drv.ctx_set_current(ctx)
    return {"devices": len(contexts), "errors": errors, "stats": delta}


def overlap(req: dict) -> dict:
    """Copies given as [direction, device] per thread, of `size` bytes (or [direction, device, bytes,
    delay_s]: started that long after the others): each once to warm up, then all at once, each
    thread on a stream of its own; then each alone. Wall seconds of both, when each copy ended
    (seconds from the start of all), and whether every byte arrived."""
    jobs = [(j[0], j[1], j[2] if len(j) > 2 else req["size"], j[3] if len(j) > 3 else 0.0) for j in req["jobs"]]
    contexts = [drv.primary_ctx(d) for d in range(drv.device_count())]
    errors: list[str] = []
    buffers = []
    for t, (_direction, device, n, _delay) in enumerate(jobs):
        drv.ctx_set_current(contexts[device])
        data = random.Random(t).randbytes(n)
        dev = drv.mem_alloc(n)
        drv.poke(dev, data)
        buffers.append((data, dev, ctypes.create_string_buffer(data, n), ctypes.create_string_buffer(n)))
    drv.ctx_set_current(ctx)
    ends = [0.0] * len(jobs)
    start = time.monotonic()

    def work(t: int, delayed: bool = False) -> None:
        try:
            direction, device, n, delay = jobs[t]
            if delayed:
                time.sleep(delay)
            drv.ctx_set_current(contexts[device])
            data, dev, src, out = buffers[t]
            stream = drv.stream_create(CU_STREAM_NON_BLOCKING)
            if direction == "h2d":
                drv.memcpy("cuMemcpyHtoDAsync_v2", dev, src, n, stream)
                drv.stream_sync(stream)
                ends[t] = time.monotonic() - start
                ok = drv.peek(dev, n) == data
            else:
                drv.memcpy("cuMemcpyDtoHAsync_v2", out, dev, n, stream)
                ends[t] = time.monotonic() - start
                ok = out.raw == data
            if not ok:
                errors.append(f"thread {t}: mismatch")
            drv.stream_destroy(stream)
        except Exception as e:  # reported to the test
            errors.append(f"thread {t}: {e!r}")

    for t in range(len(jobs)):  # first use (pipelines, workers, streams) is not what is compared
        in_threads(lambda _i, t=t: work(t), 1)
    start = time.monotonic()
    delta = in_threads(lambda t: work(t, delayed=True), len(jobs))
    together = time.monotonic() - start
    together_ends = list(ends)
    alone = []
    for t in range(len(jobs)):
        start = time.monotonic()
        in_threads(lambda _i, t=t: work(t), 1)
        alone.append(time.monotonic() - start)
    for _data, dev, _src, _out in buffers:
        drv.mem_free(dev)
    drv.ctx_set_current(ctx)
    return {"together_s": together, "alone_s": alone, "end_s": together_ends, "errors": errors, "stats": delta}


def timed_copies(req: dict) -> dict:
    """`count` round trips of `size` bytes, after setting the stand-in link's speed (GB/s, 0: as fast
    as it goes) for pinned DMAs (cmt's) and for pageable copies (the driver's own)."""
    drv.call("fakecuda_set_copy_gbps", float(req["pinned_gbps"]), float(req["pageable_gbps"]))
    n = req["size"]
    before = stats()
    data = random.Random(n).randbytes(n)
    src, out = ctypes.create_string_buffer(data, n), ctypes.create_string_buffer(n)
    dev = drv.mem_alloc(n)
    ok = True
    for _ in range(req["count"]):
        drv.memcpy("cuMemcpyHtoD_v2", dev, src, n)
        drv.memcpy("cuMemcpyDtoH_v2", out, dev, n)
        ok = ok and out.raw == data
    drv.mem_free(dev)
    after = stats()
    events = {k: after["events"][k] - before["events"][k] for k in after["events"]}
    return {"ok_bytes": ok, "stats": stats_delta(before, after), "events": events}


_held: list[tuple[threading.Thread, bytes, int, list]] = []


def hold(req: dict) -> dict:
    """Starts a host-to-device copy of `size` random bytes in a thread of its own and returns at
    once: its lanes are held while it runs (on a slow stand-in link)."""
    n = req["size"]
    data = random.Random(len(_held)).randbytes(n)
    src = ctypes.create_string_buffer(data, n)
    dev = drv.mem_alloc(n)
    result: list = []

    def work() -> None:
        drv.ctx_set_current(ctx)
        drv.memcpy("cuMemcpyHtoD_v2", dev, src, n)
        drv.ctx_synchronize()  # a pageable copy may return before its last DMAs land, as CUDA's does
        result.append(drv.peek(dev, n) == data)

    t = threading.Thread(target=work)
    t.start()
    _held.append((t, data, dev, result))
    time.sleep(req.get("settle_s", 0.3))
    return {}


def held(_req: dict) -> dict:
    """Waits for every copy `hold` started; whether each one's bytes all arrived."""
    exact = []
    for t, _data, dev, result in _held:
        t.join()
        drv.mem_free(dev)
        exact.append(bool(result and result[0]))
    _held.clear()
    return {"exact": exact}


def one_way(req: dict) -> dict:
    """One synchronous copy of `size` random bytes in `direction` (h2d or d2h): its wall seconds,
    whether every byte arrived, and cmt's events since the server started."""
    n = req["size"]
    data = random.Random(req.get("seed", 0)).randbytes(n)
    dev = drv.mem_alloc(n)
    host = ctypes.create_string_buffer(n)
    before = stats()
    if req["direction"] == "h2d":
        ctypes.memmove(host, data, n)
        start = time.monotonic()
        drv.memcpy("cuMemcpyHtoD_v2", dev, host, n)
        seconds = time.monotonic() - start
        drv.stream_sync(STREAM_LEGACY)  # a pageable copy returns once staged, as CUDA's own does
        got = drv.peek(dev, n)
    else:
        drv.poke(dev, data)
        start = time.monotonic()
        drv.memcpy("cuMemcpyDtoH_v2", host, dev, n)
        seconds = time.monotonic() - start
        got = host.raw
    after = stats()
    drv.mem_free(dev)
    wrong = [k for k in range(0, n, 4096) if got[k:k + 4096] != data[k:k + 4096]]  # 4 KiB pages
    return {"bytes_ok": not wrong, "wrong_pages": wrong[:8], "seconds": seconds, "stats": stats_delta(before, after),
            "events": after["events"]}


def context_ends(req: dict) -> dict:
    """A round trip, then the end of its context, `how`: "reset" (cudaDeviceReset's call: the primary
    context goes on under its handle with nothing of what it had) or "destroy" (a created context,
    destroyed; the next created one may get its handle); then round trips in the context after it,
    `repeat` times (each in a context after one that ended), then one from a new thread. Each round
    trip's bytes are checked."""
    global ctx
    n = req["size"]
    if req["how"] == "destroy":
        drv.ctx_set_current(drv.ctx_create(0))
    first = roundtrip({"size": n, "seed": 1})
    old = drv.ctx_get_current()
    after = []
    for _ in range(req.get("repeat", 1)):
        if req["how"] == "reset":
            drv.check("cuDevicePrimaryCtxReset_v2", 0)
        else:
            drv.ctx_destroy(drv.ctx_get_current())
            drv.ctx_set_current(drv.ctx_create(0))
        ctx = drv.ctx_get_current()
        after.append(roundtrip({"size": n, "seed": 2}))
    other: list = []
    worker = threading.Thread(
        target=lambda: (drv.ctx_set_current(ctx), other.append(roundtrip({"size": n, "seed": 3}))))
    worker.start()
    worker.join()
    return {"first": first, "after": after + other, "same_handle": ctx == old}


def counts(req: dict) -> dict:
    """How often the stand-in driver's entry points `names` were called so far."""
    return {"counts": {name: drv.call_count(name) for name in req["names"]}}


def node_lanes(_req: dict) -> dict:
    """The node's budgets of copy threads and pinned staging (MiB), and what all this user's processes
    (and this one's copies: mine) hold of them now."""
    _cmt.cmt_node_pinned_budget_mib.restype = _cmt.cmt_node_pinned_in_use_mib.restype = ctypes.c_long
    _cmt.cmt_others_busy_cpus.restype = ctypes.c_double
    return {"budget": _cmt.cmt_node_budget(), "in_use": _cmt.cmt_node_lanes_in_use(),
            "mine": _cmt.cmt_node_lanes_mine(),
            "pinned_budget": _cmt.cmt_node_pinned_budget_mib(), "pinned_in_use": _cmt.cmt_node_pinned_in_use_mib(),
            "others_busy": _cmt.cmt_others_busy_cpus()}


def threads(_req: dict) -> dict:
    """Each thread of this process: its name and the CPUs it may run on."""
    out = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            out.append({"name": name, "cpus": sorted(os.sched_getaffinity(int(tid)))})
        except OSError:  # the thread is gone
            pass
    return {"threads": out}


def legacy_during_capture(req: dict) -> dict:
    """A legacy-stream copy while a blocking stream captures: the driver's own error (906)."""
    n = req["size"]
    capturing = drv.stream_create(0)
    drv.begin_capture(capturing)
    dev = drv.mem_alloc(n)
    src = ctypes.create_string_buffer(n)
    before = stats()
    rc = drv.call("cuMemcpyHtoD_v2", dev, ctypes.addressof(src), n)
    after = stats()
    drv.call("cuStreamEndCapture", capturing, ctypes.byref(ctypes.c_void_p()))
    drv.mem_free(dev)
    return {"rc": rc, "stats": stats_delta(before, after)}


def call(req: dict) -> dict:
    """One raw call of an entry point (for pass-through and error cases); returns its CUresult."""
    n = req["size"]
    dev = drv.mem_alloc(n)
    host = HostBuffer(req.get("host_kind", "pageable"), n)
    host_addr = host.addr
    if req.get("managed"):
        host_addr = drv.alloc_managed(n)
    stream = resolve_stream(req.get("stream", "null"), _streams)
    if req.get("capture"):
        drv.begin_capture(stream)
    if req.get("no_context"):
        drv.ctx_set_current(None)
    name = req["entry"]
    dev_arg = dev + req.get("dev_off", 0)
    length = n + req.get("extra", 0)
    before = stats()
    if name.startswith("cuMemcpyHtoD"):
        args = [dev_arg, host_addr, length]
    elif name.startswith("cuMemcpyDtoH"):
        args = [host_addr, dev_arg, length]
    elif req.get("both_host"):
        other = HostBuffer("pageable", n)
        args = [other.addr, host_addr, length]
    elif req.get("both_device"):
        args = [drv.mem_alloc(n), dev_arg, length]
    else:
        args = [dev_arg, host_addr, length]
    if "Async" in name:
        args.append(stream)
    rc = drv.call(name, *args)
    after = stats()
    if req.get("no_context"):
        drv.ctx_set_current(ctx)
    if req.get("capture"):  # the failed copy invalidated the capture: its error is expected
        drv.call("cuStreamEndCapture", stream, ctypes.byref(ctypes.c_void_p()))
    host.release()
    return {"rc": rc, "stats": stats_delta(before, after)}


def fork(req: dict) -> dict:
    """A forked child's copies pass through (its CUDA state is not inherited); the parent goes on."""
    n = req["size"]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            drv.ctx_set_current(None)  # the fake's stream threads do not exist here either
            src = ctypes.create_string_buffer(n)
            before = stats()
            rc = drv.call("cuMemcpyHtoD_v2", 0x1234, ctypes.addressof(src), n)
            os.write(w, json.dumps({"rc": rc, "stats": stats_delta(before, stats())}).encode())
        finally:
            os._exit(0)
    os.close(w)
    child = json.loads(os.read(r, 65536) or b"{}")
    os.waitpid(pid, 0)
    parent = roundtrip({"size": n, "seed": 5})
    return {"child": child, "parent": parent}


def retain(req: dict) -> dict:
    """Retains a device's primary context (cuDevicePrimaryCtxRetain), as a runtime does: the driver's
    result."""
    c = ctypes.c_void_p()
    return {"rc": drv.call("cuDevicePrimaryCtxRetain", ctypes.byref(c), req.get("device", 0))}


def main() -> None:
    handlers = {"retain": retain, "roundtrip": roundtrip, "ordering": ordering, "concurrent": concurrent, "call": call,
                "fork": fork, "multi_device": multi_device, "legacy_during_capture": legacy_during_capture,
                "overlap": overlap, "timed_copies": timed_copies, "hold": hold, "held": held, "node_lanes": node_lanes,
                "counts": counts, "one_way": one_way, "context_ends": context_ends, "threads": threads,
                "stats": lambda _r: stats()}
    for line in sys.stdin:
        req = json.loads(line)
        try:
            reply = {"ok": True, **handlers[req["op"]](req)}
        except Exception:
            reply = {"ok": False, "error": traceback.format_exc()}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
