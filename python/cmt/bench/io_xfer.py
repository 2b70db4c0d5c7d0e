"""The transfer types of `cmt bench io`, all in one table (`XFER_TYPES`), each a small class:

    setup      __init__(ctx, slots, slot_bytes): buffers for `slots` I/Os of `slot_bytes` at once
    run        io(slot, file_offset, nbytes) -> bytes moved; for the types with futures, submit(...) -> a
               future and batch(ops) (all at once from one thread)
    teardown   close()

A slot is one I/O's memory: slot i of a thread's stream, or op i of a batch. `missing()` says why a
type cannot run here (its library is not installed); the bench reports it as skipped.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from .. import cuda

_FILL = 16 << 20  # device buffers are filled through host memory this much at a time


@dataclass
class Ctx:
    """What every transfer type is given."""

    path: Path
    mode: str  # "read" or "write"
    drv: cuda.Driver | None = None
    dev: cuda.Device | None = None
    threads: int = 1
    seed: int = 7


def pattern(nbytes: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


def posix_io(fd: int, view: memoryview, offset: int, write: bool) -> int:
    """pread/pwrite of the whole view; only the end of the file makes it shorter."""
    done = 0
    while done < len(view):
        got = os.pwritev(fd, [view[done:]], offset + done) if write else os.preadv(fd, [view[done:]], offset + done)
        if got <= 0:
            break
        done += got
    return done


class _Host:
    """Host memory: pageable (numpy) or pinned (cuMemHostAlloc), with its address and a view."""

    def __init__(self, nbytes: int, drv: cuda.Driver | None = None, fill: np.ndarray | None = None):
        self.drv, self.nbytes = drv, nbytes
        if drv is None:
            self.array = np.empty(nbytes, np.uint8)
            self.array.fill(0)  # every page touched: faults are not what is measured
            self.addr = self.array.ctypes.data
            self.view = memoryview(self.array)
        else:
            self.addr = drv.host_alloc(nbytes)
            self.array = np.frombuffer((ctypes.c_ubyte * nbytes).from_address(self.addr), np.uint8)
            self.array[:] = 0
            self.view = memoryview(self.array)
        if fill is not None:
            self.array[:len(fill)] = fill

    def free(self) -> None:
        self.view.release()
        if self.drv is not None:
            self.array = None
            self.drv.host_free(self.addr)


class _Device:
    """Device memory (cuMemAlloc), filled with `fill` (repeated) for writes."""

    def __init__(self, drv: cuda.Driver, nbytes: int, fill: np.ndarray | None = None):
        self.drv, self.nbytes = drv, nbytes
        self.ptr = drv.mem_alloc(nbytes)
        drv.memset_d8(self.ptr, 0, nbytes)
        if fill is not None:
            for off in range(0, nbytes, _FILL):
                n = min(_FILL, nbytes - off, len(fill))
                drv.memcpy_htod(self.ptr + off, fill.ctypes.data, n)

    def to_host(self, offset: int, nbytes: int) -> bytes:
        out = np.empty(nbytes, np.uint8)
        self.drv.memcpy_dtoh(out.ctypes.data, self.ptr + offset, nbytes)
        return out.tobytes()

    def free(self) -> None:
        self.drv.mem_free(self.ptr)


class Xfer:
    name: ClassVar[str] = ""
    gdsio: ClassVar[str] = ""  # gdsio's XferType word
    needs_gpu: ClassVar[bool] = True
    about: ClassVar[str] = ""

    @classmethod
    def missing(cls) -> str | None:
        return None

    def __init__(self, ctx: Ctx, slots: int, slot_bytes: int):
        self.ctx, self.slots, self.slot_bytes = ctx, slots, slot_bytes
        self.write = ctx.mode == "write"
        self.fill = pattern(min(slots * slot_bytes, _FILL), ctx.seed) if self.write else None

    def label(self) -> str:
        """The XferType of the gdsio line (may depend on what the library chose: compat or GDS)."""
        return self.gdsio

    def details(self) -> dict[str, Any]:
        return {}

    def thread_start(self) -> None:
        """In every thread that calls io(): the GPU's context current."""
        if self.needs_gpu:
            self.ctx.drv.set_current(self.ctx.dev.context)

    def before_run(self) -> None:
        """Before each timed run (a library's global setting that another run may have changed)."""

    def io(self, slot: int, offset: int, nbytes: int) -> int:
        raise NotImplementedError

    submit = None  # types with futures: submit(slot, file_offset, nbytes) -> a future with .get() -> bytes

    def batch(self, ops: list[tuple[int, int, int]]) -> list[tuple[int, int, BaseException | None]]:
        """All of `ops` (slot, file offset, bytes) submitted at once from this thread: (bytes, the
        perf_counter_ns when it was seen done, error) per op. Here: futures, waited on in order
        (every one, also after a failure: none may still write into the buffers)."""
        futures = [self.submit(slot, off, n) for slot, off, n in ops]
        out: list[tuple[int, int, BaseException | None]] = []
        for fut in futures:
            try:
                out.append((fut.get(), time.perf_counter_ns(), None))
            except Exception as e:  # noqa: BLE001 - reported by the caller
                out.append((0, time.perf_counter_ns(), e))
        return out

    def batch_api(self) -> str | None:
        """How the batch is submitted: None for the types without futures (their threads share it)."""
        return "pread futures" if self.submit is not None else None

    def fetch(self, slot: int, nbytes: int) -> bytes:
        """The slot's first bytes, brought to the host (to check them)."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class _PosixFile:
    """One descriptor shared by the threads: pread and pwrite take their own offsets."""

    def _open(self, ctx: Ctx) -> None:
        self.fd = os.open(ctx.path, os.O_RDWR if ctx.mode == "write" else os.O_RDONLY)

    def _close(self) -> None:
        os.close(self.fd)


class CpuOnly(Xfer, _PosixFile):
    name, gdsio, needs_gpu = "cpu", "CPUONLY", False
    about = "pread/pwrite into pageable host memory only (gdsio -x 1, through the page cache)"

    def __init__(self, ctx: Ctx, slots: int, slot_bytes: int):
        super().__init__(ctx, slots, slot_bytes)
        self._open(ctx)
        self.host = _Host(slots * slot_bytes, fill=self.fill)

    def io(self, slot: int, offset: int, nbytes: int) -> int:
        at = slot * self.slot_bytes
        return posix_io(self.fd, self.host.view[at:at + nbytes], offset, self.write)

    def fetch(self, slot: int, nbytes: int) -> bytes:
        return self.host.view[slot * self.slot_bytes:][:nbytes].tobytes()

    def close(self) -> None:
        self.host.free()
        self._close()


class CpuGpu(Xfer, _PosixFile):
    """pread into host memory, then a copy to the GPU (writes: the copy back, then pwrite)."""

    name, gdsio = "cpu-gpu", "CPU_PAGEABLE_GPU"
    about = "pread into pageable host memory, then cuMemcpyHtoD (writes: cuMemcpyDtoH, then pwrite)"
    pinned = False

    def __init__(self, ctx: Ctx, slots: int, slot_bytes: int):
        super().__init__(ctx, slots, slot_bytes)
        self._open(ctx)
        self.host = _Host(slots * slot_bytes, ctx.drv if self.pinned else None)
        self.dev = _Device(ctx.drv, slots * slot_bytes, self.fill)

    def io(self, slot: int, offset: int, nbytes: int) -> int:
        at = slot * self.slot_bytes
        view, drv = self.host.view[at:at + nbytes], self.ctx.drv
        if self.write:
            drv.memcpy_dtoh(self.host.addr + at, self.dev.ptr + at, nbytes)
            return posix_io(self.fd, view, offset, True)
        got = posix_io(self.fd, view, offset, False)
        if got:
            drv.memcpy_htod(self.dev.ptr + at, self.host.addr + at, got)
        return got

    def fetch(self, slot: int, nbytes: int) -> bytes:
        return self.dev.to_host(slot * self.slot_bytes, nbytes)

    def close(self) -> None:
        self.dev.free()
        self.host.free()
        self._close()


class CpuPinnedGpu(CpuGpu):
    name, gdsio, pinned = "cpu-pinned-gpu", "CPU_GPU", True
    about = "pread into pinned host memory (cuMemHostAlloc), then cuMemcpyHtoD (gdsio -x 2 without O_DIRECT)"


class CmtIo(Xfer):
    """cmt's storage API (cmt.io): buffers are (device pointer, bytes)."""

    name, gdsio = "cmt", "CMT"
    about = "cmt.io.open(path).read/write; the batch through cmt.io.Batch (else pread futures)"

    @classmethod
    def missing(cls) -> str | None:
        try:
            cmt_io = importlib.import_module("cmt.io")
        except ImportError as e:
            return f"cmt.io cannot be imported ({e})"
        return None if callable(getattr(cmt_io, "open", None)) else "this build's cmt.io has no open()"

    def __init__(self, ctx: Ctx, slots: int, slot_bytes: int):
        super().__init__(ctx, slots, slot_bytes)
        cmt_io = importlib.import_module("cmt.io")
        self.dev = _Device(ctx.drv, slots * slot_bytes, self.fill)
        self.buf = (self.dev.ptr, self.dev.nbytes)
        self.f = cmt_io.open(str(ctx.path), "r+" if self.write else "r")  # "w" would truncate
        self.Batch = getattr(cmt_io, "Batch", None)

    def io(self, slot: int, offset: int, nbytes: int) -> int:
        call = self.f.write if self.write else self.f.read
        return call(self.buf, size=nbytes, file_offset=offset, dev_offset=slot * self.slot_bytes)

    def submit(self, slot: int, offset: int, nbytes: int):  # the batch: reads only
        return self.f.pread(self.buf, nbytes, offset, slot * self.slot_bytes)

    def batch_api(self) -> str:
        return "cmt.io.Batch" if self.Batch is not None else "pread futures"

    def batch(self, ops: list[tuple[int, int, int]]) -> list[tuple[int, int, BaseException | None]]:
        """cmt.io.Batch (cuFile's shape) where it exists: completions as they finish; else futures."""
        if self.Batch is None:
            return super().batch(ops)
        batch, out = self.Batch(), [(0, 0, None)] * len(ops)
        if hasattr(batch, "read_many"):  # one call for all (cuFileBatchIOSubmit's shape)
            batch.read_many(self.f, self.buf, [n for _, _, n in ops], [off for _, off, _ in ops],
                            [slot * self.slot_bytes for slot, _, _ in ops])
        else:
            for slot, off, n in ops:
                batch.read(self.f, self.buf, n, off, slot * self.slot_bytes)
        while batch.outstanding:
            for done in batch.poll(1):
                out[done.index] = (done.nbytes, time.perf_counter_ns(), done.error)
        return out

    def fetch(self, slot: int, nbytes: int) -> bytes:
        return self.dev.to_host(slot * self.slot_bytes, nbytes)

    def close(self) -> None:
        self.f.close()
        self.dev.free()


class _CudaArray:
    """Raw device memory as an object KvikIO takes (the CUDA array interface)."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "strides": None, "version": 3}


def kvikio_threads(kvikio: Any, n: int | None = None) -> int:
    """Sets KvikIO's thread-pool size (when n is given) and returns it: `defaults.set` since 25.04,
    `num_threads_reset` before."""
    # `import kvikio` 26.10 does not load its submodule defaults
    d = getattr(kvikio, "defaults", None) or importlib.import_module("kvikio.defaults")
    if n is not None:
        if hasattr(d, "set"):
            d.set({"num_threads": n})
        else:
            d.num_threads_reset(n)
    return int(d.get("num_threads") if hasattr(d, "get") else d.get_num_threads())


def kvikio_compat(kvikio: Any, handle: Any = None) -> bool:
    """Whether KvikIO reads through POSIX and its bounce buffers (compat) rather than cuFile (GDS)."""
    probe = getattr(handle, "is_compat_mode_preferred", None)
    if callable(probe):
        return bool(probe())
    # `import kvikio` 26.10 does not load its submodule defaults
    d = getattr(kvikio, "defaults", None) or importlib.import_module("kvikio.defaults")
    if hasattr(d, "is_compat_mode_preferred"):
        return bool(d.is_compat_mode_preferred())
    mode = d.compat_mode()  # a bool in old versions, CompatMode (ON/OFF/AUTO) later
    return mode if isinstance(mode, bool) else getattr(mode, "name", str(mode)).upper() == "ON"


class Kvikio(Xfer):
    name, gdsio = "kvikio", "KVIKIO"
    about = "kvikio.CuFile pread/pwrite (its thread pool sized to the run's threads), batches as futures"

    @classmethod
    def missing(cls) -> str | None:
        try:
            importlib.import_module("kvikio")
        except ImportError as e:
            return "kvikio is not installed" if e.name == "kvikio" else f"kvikio cannot be imported ({e})"
        except Exception as e:  # noqa: BLE001 - a broken install is a skip with its reason
            return f"kvikio cannot be imported ({e})"
        return None

    def __init__(self, ctx: Ctx, slots: int, slot_bytes: int):
        super().__init__(ctx, slots, slot_bytes)
        self.kv = importlib.import_module("kvikio")
        self.dev = _Device(ctx.drv, slots * slot_bytes, self.fill)
        self.f = self.kv.CuFile(str(ctx.path), "r+" if self.write else "r")  # "w" would truncate
        self.compat = kvikio_compat(self.kv, self.f)

    def label(self) -> str:
        return f"KVIKIO_{'COMPAT' if self.compat else 'GDS'}"

    def details(self) -> dict[str, Any]:
        return {"path": "compat" if self.compat else "GDS", "version": getattr(self.kv, "__version__", None)}

    def before_run(self) -> None:
        kvikio_threads(self.kv, self.ctx.threads)

    def submit(self, slot: int, offset: int, nbytes: int):
        buf = _CudaArray(self.dev.ptr + slot * self.slot_bytes, nbytes)
        return (self.f.pwrite if self.write else self.f.pread)(buf, nbytes, offset)

    def io(self, slot: int, offset: int, nbytes: int) -> int:
        return self.submit(slot, offset, nbytes).get()

    def fetch(self, slot: int, nbytes: int) -> bytes:
        return self.dev.to_host(slot * self.slot_bytes, nbytes)

    def close(self) -> None:
        self.f.close()
        self.dev.free()


class CuFile(Xfer):
    """cuFile through cuda-python's binding (cuda.bindings.cufile), O_DIRECT as gdsio -x 0."""

    name, gdsio = "cufile", "GPUD"
    about = "cuFileRead/cuFileWrite through cuda.bindings.cufile on an O_DIRECT descriptor (gdsio -x 0)"

    @classmethod
    def missing(cls) -> str | None:
        try:
            importlib.import_module("cuda.bindings.cufile")
        except ImportError:
            return "no cuFile binding for Python (cuda-python's cuda.bindings.cufile) is installed"
        except Exception as e:  # noqa: BLE001
            return f"cuda.bindings.cufile cannot be imported ({e})"
        return None

    def __init__(self, ctx: Ctx, slots: int, slot_bytes: int):
        super().__init__(ctx, slots, slot_bytes)
        self.cf = importlib.import_module("cuda.bindings.cufile")
        self.dev = _Device(ctx.drv, slots * slot_bytes, self.fill)
        self.cf.driver_open()
        self.fd = os.open(ctx.path, (os.O_RDWR if self.write else os.O_RDONLY) | os.O_DIRECT)
        descr = self.cf.Descr()
        descr.type = self.cf.FileHandleType.OPAQUE_FD
        descr.handle.fd = self.fd
        self.handle = self.cf.handle_register(descr.ptr)
        self.cf.buf_register(self.dev.ptr, self.dev.nbytes, 0)

    def io(self, slot: int, offset: int, nbytes: int) -> int:
        call = self.cf.write if self.write else self.cf.read
        return call(self.handle, self.dev.ptr, nbytes, offset, slot * self.slot_bytes)

    def fetch(self, slot: int, nbytes: int) -> bytes:
        return self.dev.to_host(slot * self.slot_bytes, nbytes)

    def close(self) -> None:
        self.cf.buf_deregister(self.dev.ptr)
        self.cf.handle_deregister(self.handle)
        os.close(self.fd)
        self.cf.driver_close()
        self.dev.free()


# The one list: name -> type, in the order the tables show them.
XFER_TYPES: dict[str, type[Xfer]] = {t.name: t for t in (CpuOnly, CpuGpu, CpuPinnedGpu, CmtIo, Kvikio, CuFile)}
# gdsio's -x numbers where one of ours is the same path
GDSIO_NUMBERS = {"0": "cufile", "1": "cpu", "2": "cpu-pinned-gpu"}
