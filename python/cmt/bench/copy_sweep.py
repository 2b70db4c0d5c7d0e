"""Copy measurements: one (mode, direction, size) at a time, reusable by `cmt tune`.

Modes: `pageable` (the driver's default copy, cuMemcpyHtoD_v2/DtoH_v2 of malloc'd memory), `pinned`
(cuMemcpy*Async_v2 of page-locked memory: the link's limit), `cmt` (cmt's engine through its C API,
the code `cmt run` uses) and `cpu` (numpy memcpy split over T threads, pageable to pageable).
Directions: `h2d`, `d2h`, and `d2h-fresh` (device to a brand-new, never-touched mapping: the page
fault case that `.cpu()` and `torch.load` hit).

Pinned copies are timed with CUDA events. Everything else is timed with the host clock around the
copy and a synchronisation, because a pageable copy may return before its last DMA finished.
Every (mode, direction, size) is checked once against random data before it is timed.
"""

from __future__ import annotations

import ctypes
import os
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import cuda, native
from ..config import Settings
from ..errors import CmtError
from . import COPY_MODES, DIRECTIONS, MODES

__all__ = ["COPY_MODES", "DIRECTIONS", "MODES", "CopyBench", "Result", "measure", "measure_cpu"]
GB = 1e9


@dataclass
class Result:
    """One measured (mode, direction, size): per-repetition seconds and what they mean in GB/s."""

    mode: str
    direction: str
    nbytes: int
    seconds: list[float]
    warmup: int
    threads: int | None = None  # cpu mode: memcpy threads; cmt mode: explicit engine threads
    settings: Settings | None = None  # cmt mode: explicit engine settings (None: the plan's)
    outcome: str | None = None  # cmt mode: what the engine did (accelerated, below_minimum, ...)
    verified: bool = False

    @property
    def median_gbps(self) -> float:
        return self.nbytes / statistics.median(self.seconds) / GB

    def gbps_quantiles(self) -> dict[str, float]:
        rates = sorted(self.nbytes / s / GB for s in self.seconds)
        q = np.percentile(rates, [25, 75]) if len(rates) > 1 else [rates[0], rates[0]]
        return {"min": rates[0], "p25": float(q[0]), "p75": float(q[1]), "max": rates[-1]}

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"mode": self.mode, "direction": self.direction, "bytes": self.nbytes,
                               "median_gbps": round(self.median_gbps, 3),
                               **{f"{k}_gbps": round(v, 3) for k, v in self.gbps_quantiles().items()},
                               "median_s": statistics.median(self.seconds), "repeats": len(self.seconds),
                               "warmup": self.warmup, "verified": self.verified}
        if self.threads is not None:
            doc["threads"] = self.threads
        if self.settings is not None:
            doc["settings"] = self.settings.as_dict()
        if self.outcome is not None:
            doc["outcome"] = self.outcome
        return doc


class VerificationError(CmtError):
    def __init__(self, what: str, nbytes: int, first_bad: int):
        super().__init__(f"{what} of {nbytes} bytes copied wrong data (first bad byte at offset {first_bad})",
                         exit_code=1)


def random_pattern(nbytes: int, seed: int = 0x5EED) -> np.ndarray:
    """Random bytes, fast: a random 8 MiB block, shifted by a different constant in each block, so
    that no two blocks are equal and a chunk copied to the wrong place always shows."""
    words = (nbytes + 7) // 8
    block = min(words, 1 << 20)
    base = np.random.default_rng(seed).integers(0, 2**63, block, dtype=np.uint64)
    out = np.empty(-(-words // block) * block, dtype=np.uint64)
    tiles = out.reshape(-1, block)
    offsets = np.arange(tiles.shape[0], dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    np.add(base[None, :], offsets[:, None], out=tiles)
    return out.view(np.uint8)[:nbytes]


def host_view(address: int, nbytes: int) -> np.ndarray:
    """A numpy view of raw host memory (pinned buffers, fresh mappings)."""
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))


def address(array: np.ndarray) -> int:
    return array.ctypes.data


# -- fresh, never-touched host memory -----------------------------------------------------------
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_PROT_RW = 0x1 | 0x2
_MAP_PRIVATE_ANON = 0x02 | 0x20
_MAP_FAILED = ctypes.c_void_p(-1).value


class FreshMapping:
    """An anonymous mapping no one has touched: every page faults on first write, as with a large
    malloc (glibc serves those with mmap)."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.address = _libc.mmap(None, nbytes, _PROT_RW, _MAP_PRIVATE_ANON, -1, 0)
        if self.address in (None, _MAP_FAILED):
            raise CmtError(f"cannot map {nbytes} bytes of host memory: {os.strerror(ctypes.get_errno())}",
                           exit_code=1)

    def close(self) -> None:
        if self.address is not None:
            _libc.munmap(self.address, self.nbytes)
            self.address = None

    def __enter__(self) -> FreshMapping:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -- the measuring bench --------------------------------------------------------------------------
class CopyBench:
    """Buffers, a stream and events for copies of up to `capacity` bytes on an open device.

    Host buffers: `src` (pageable, random data), `dst` (pageable, pre-touched), `pinned_src` (the same
    random data), `pinned_dst`; one device buffer. Use as a context manager to free them.
    """

    def __init__(self, drv: cuda.Driver, device: cuda.Device, capacity: int):
        self.drv, self.device, self.capacity = drv, device, capacity
        self._freers: list[Callable[[], None]] = []
        try:
            self.stream = drv.stream_create(cuda.CU_STREAM_NON_BLOCKING)
            self._freers.append(lambda: drv.stream_destroy(self.stream))
            self.start, self.end = drv.event_create(), drv.event_create()
            self._freers += [lambda: drv.event_destroy(self.start), lambda: drv.event_destroy(self.end)]
            self.dev = drv.mem_alloc(capacity)
            self._freers.append(lambda: drv.mem_free(self.dev))
            self.pinned_src_ptr = drv.host_alloc(capacity)
            self._freers.append(lambda: drv.host_free(self.pinned_src_ptr))
            self.pinned_dst_ptr = drv.host_alloc(capacity)
            self._freers.append(lambda: drv.host_free(self.pinned_dst_ptr))
        except BaseException:
            self.close()
            raise
        self.pattern = random_pattern(capacity)
        self.src = self.pattern  # pageable, random, already touched
        self.dst = np.ones(capacity, dtype=np.uint8)  # pageable, every page touched
        self.pinned_src = host_view(self.pinned_src_ptr, capacity)
        self.pinned_src[:] = self.pattern
        self.pinned_dst = host_view(self.pinned_dst_ptr, capacity)
        self.last_outcome: str | None = None

    def close(self) -> None:
        for free in reversed(self._freers):
            try:
                free()
            except CmtError:
                pass  # freeing after a failed copy: the first error is the one to report
        self._freers.clear()

    def __enter__(self) -> CopyBench:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- one copy of each kind -------------------------------------------------------------------
    def _engine(self, direction: str, host: int, n: int, settings: Settings | None) -> str:
        r = native.memcpy("h2d" if direction == "h2d" else "d2h", host, self.dev, n, self.stream,
                          settings.as_dict() if settings is not None else None)
        if r != cuda.CUDA_SUCCESS:
            raise cuda.CudaError("cmt_memcpy", int(r), self.drv.error_name(int(r)))
        self.drv.stream_synchronize(self.stream)
        return r.outcome

    def _pageable(self, direction: str, host: int, n: int) -> None:
        if direction == "h2d":
            self.drv.memcpy_htod(self.dev, host, n)
        else:
            self.drv.memcpy_dtoh(host, self.dev, n)
        self.drv.stream_synchronize(None)  # a pageable H2D may return before its last DMA ends

    def _pinned_seconds(self, direction: str, n: int) -> float:
        drv = self.drv
        drv.event_record(self.start, self.stream)
        if direction == "h2d":
            drv.memcpy_htod_async(self.dev, self.pinned_src_ptr, n, self.stream)
        else:
            drv.memcpy_dtoh_async(self.pinned_dst_ptr, self.dev, n, self.stream)
        drv.event_record(self.end, self.stream)
        drv.event_synchronize(self.end)
        return drv.event_elapsed_ms(self.start, self.end) / 1e3

    def copy_seconds(self, mode: str, direction: str, n: int, settings: Settings | None = None) -> float:
        """One timed copy; returns seconds (the cmt engine's outcome is kept in `last_outcome`)."""
        if direction == "h2h":  # host to host: cmt's threads as the plan says (what `cmt run` gives)
            src, dst = address(self.src), address(self.dst)
            t0 = time.perf_counter()
            self.last_outcome = native.host_copy(dst, src, n, settings.as_dict() if settings else None)
            return time.perf_counter() - t0
        if mode == "pinned":
            return self._pinned_seconds("h2d" if direction == "h2d" else "d2h", n)
        if direction == "d2h-fresh":
            with FreshMapping(n) as fresh:
                return self._timed_host_copy(mode, "d2h", fresh.address, n, settings)
        host = address(self.src if direction == "h2d" else self.dst)
        return self._timed_host_copy(mode, direction, host, n, settings)

    def _timed_host_copy(self, mode: str, direction: str, host: int, n: int,
                         settings: Settings | None) -> float:
        if mode == "cmt" and settings is None and not native.plan_stages(direction, n):
            # What a program under `cmt run` gets: the very call it made, untouched (the C API's
            # own pass-through would use the asynchronous variant, a different driver path). Decided
            # before the clock starts: a Python call costs about a microsecond, 10% of a 4 KiB copy.
            mode, self.last_outcome = "pageable", "below_minimum"
        t0 = time.perf_counter()
        if mode == "cmt":
            self.last_outcome = self._engine(direction, host, n, settings)
        elif mode == "pageable":
            self._pageable(direction, host, n)
        else:
            raise CmtError(f"unknown copy mode {mode!r} (choose from {', '.join(COPY_MODES)})")
        return time.perf_counter() - t0

    # -- checking the bytes ----------------------------------------------------------------------
    def verify(self, mode: str, direction: str, n: int, settings: Settings | None = None) -> None:
        """One copy of random data through `mode`, checked byte for byte with the plain driver."""
        drv, what = self.drv, f"{mode} {direction} copy"
        if direction == "h2h":
            self.dst[:n] = 0
            self.copy_seconds(mode, direction, n, settings)
            _compare(self.dst[:n], self.pattern[:n], what)
            return
        if direction == "h2d":
            drv.memset_d8(self.dev, 0, n)
            drv.synchronize()
            self.copy_seconds(mode, direction, n, settings)
            drv.memcpy_dtoh(self.pinned_dst_ptr, self.dev, n)
            _compare(self.pinned_dst[:n], self.pattern[:n], what)
            return
        drv.memcpy_htod(self.dev, self.pinned_src_ptr, n)
        drv.synchronize()
        if direction == "d2h-fresh":
            with FreshMapping(n) as fresh:
                self._timed_host_copy(mode, "d2h", fresh.address, n, settings)
                _compare(host_view(fresh.address, n), self.pattern[:n], what)
            return
        target = self.pinned_dst if mode == "pinned" else self.dst
        target[:n] = 0
        self.copy_seconds(mode, direction, n, settings)
        _compare(target[:n], self.pattern[:n], what)

    # -- CPU memcpy ------------------------------------------------------------------------------
    def cpu_copy_seconds(self, threads: int, n: int) -> float:
        """Pageable-to-pageable copy: one thread's numpy copy (libc's memcpy), or split over `threads`
        of cmt's engine (the calling thread is one; 1 MiB pieces)."""
        if threads == 1:
            t0 = time.perf_counter()
            np.copyto(self.dst[:n], self.src[:n])
            return time.perf_counter() - t0
        return self.copy_seconds("cmt", "h2h", n, Settings(threads, 1, max(4096, min(1 << 20, n))))

    def verify_cpu(self, threads: int, n: int) -> None:
        self.dst[:n] = 0
        self.cpu_copy_seconds(threads, n)
        _compare(self.dst[:n], self.pattern[:n], f"CPU memcpy with {threads} threads")


def _compare(got: np.ndarray, want: np.ndarray, what: str) -> None:
    if not np.array_equal(got, want):
        raise VerificationError(what, len(want), int(np.flatnonzero(got != want)[0]))


# -- measuring with warm-ups and repeats ----------------------------------------------------------
def measure(bench: CopyBench, mode: str, direction: str, nbytes: int, repeats: int, warmup: int = 1,
            settings: Settings | None = None, verify: bool = True) -> Result:
    """Median and spread of one (mode, direction, size); `settings` forces cmt's engine settings."""
    if mode == "cpu":
        raise CmtError("use measure_cpu for CPU memcpy")
    if verify:
        bench.verify(mode, direction, nbytes, settings)
    for _ in range(warmup):
        bench.copy_seconds(mode, direction, nbytes, settings)
    seconds = [bench.copy_seconds(mode, direction, nbytes, settings) for _ in range(repeats)]
    outcome = bench.last_outcome if mode == "cmt" else None
    return Result(mode, direction, nbytes, seconds, warmup, settings.threads if settings else None,
                  settings, outcome, verify)


def measure_cpu(bench: CopyBench, threads: int, nbytes: int, repeats: int, warmup: int = 1,
                verify: bool = True) -> Result:
    if verify:
        bench.verify_cpu(threads, nbytes)
    for _ in range(warmup):
        bench.cpu_copy_seconds(threads, nbytes)
    seconds = [bench.cpu_copy_seconds(threads, nbytes) for _ in range(repeats)]
    return Result("cpu", "h2h", nbytes, seconds, warmup, threads=threads, verified=verify)


# -- the sweep ------------------------------------------------------------------------------------
def cpu_thread_counts(cores: int) -> list[int]:
    """1, 2, 4, ... up to `cores`, and `cores` itself."""
    counts, t = [], 1
    while t < cores:
        counts.append(t)
        t *= 2
    return [*counts, cores]


@dataclass(frozen=True)
class Repetitions:
    """Warm-ups and repeats per size: repeats fall with the size so that every size moves about
    `target_bytes`, within [least, most]."""

    warmup: int = 2
    least: int = 10
    most: int = 100
    target_bytes: int = 2 << 30
    fixed: int | None = None  # --repeats

    def repeats(self, nbytes: int) -> int:
        if self.fixed:
            return self.fixed
        return max(self.least, min(self.most, self.target_bytes // nbytes))


FULL = Repetitions()
QUICK = Repetitions(warmup=1, least=3, most=10, target_bytes=256 << 20)


@dataclass(frozen=True)
class Task:
    mode: str
    direction: str
    nbytes: int
    threads: int | None = None  # cpu mode only


@dataclass
class SweepPlan:
    sizes: list[int]
    directions: list[str]
    modes: list[str]
    cpu_threads: list[int] = field(default_factory=list)

    def tasks(self) -> list[Task]:
        """Size by size, so a partial run still covers whole sizes."""
        out = []
        for n in self.sizes:
            for d in self.directions:
                # Pinned memory is never fresh: d2h's pinned figure is that direction's ceiling too.
                out += [Task(m, d, n) for m in self.modes if m in COPY_MODES and not (m == "pinned" and
                                                                                      d == "d2h-fresh")]
            if "cpu" in self.modes:
                out += [Task("cpu", "h2h", n, t) for t in self.cpu_threads]
                if "cmt" in self.modes:
                    out.append(Task("cmt", "h2h", n))
        return out


def run_sweep(bench: CopyBench, tasks: Iterable[Task], reps: Repetitions,
              on_done: Callable[[Task, Result], None] | None = None) -> list[Result]:
    results = []
    for task in tasks:
        repeats = reps.repeats(task.nbytes)
        if task.mode == "cpu":
            r = measure_cpu(bench, task.threads or 1, task.nbytes, repeats, reps.warmup)
        else:
            r = measure(bench, task.mode, task.direction, task.nbytes, repeats, reps.warmup)
        results.append(r)
        if on_done:
            on_done(task, r)
    return results


def document(results: list[Result], machine: dict[str, Any], engine: dict[str, Any], plan: SweepPlan,
             reps: Repetitions, quick: bool) -> dict[str, Any]:
    """The JSON result file's content (format `cmt-bench-copy`, version 1)."""
    return {
        "format": "cmt-bench-copy", "version": 1, "date": machine.get("date"), "machine": machine,
        "cmt": engine,
        "settings": {"sizes": plan.sizes, "directions": plan.directions, "modes": plan.modes,
                     "cpu_threads": plan.cpu_threads, "quick": quick, "warmup": reps.warmup,
                     "repeats": {"least": reps.least, "most": reps.most, "target_bytes": reps.target_bytes,
                                 "fixed": reps.fixed},
                     "timing": "pinned: CUDA events; others: host clock around the copy and a synchronisation"},
        "results": [r.to_json() for r in results],
    }
