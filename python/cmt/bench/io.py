"""`cmt bench io`: a gdsio-style storage benchmark (file <-> host or GPU memory).

For each mode (read, write), each (threads, I/O size) and each cache state (warm: the file in the
page cache; cold: evicted with posix_fadvise), every transfer type of io_xfer.XFER_TYPES moves the
test file, `repeats` times, the types taken in turn. A run is `threads` threads, each with its own
share of the file (sequential) or its own random blocks, one I/O of `io size` at a time, for one
pass over the file or until `duration` ends; writes end with fdatasync, inside the time. The batch
scenario submits `batch` random reads of `batch size` at once from one thread where the type can
(cmt: cmt.io.Batch; KvikIO: pread futures), else spread over the threads. Each type's path is
checked byte for byte once per configuration before it is timed. Page-cache residency is measured before and after
every run, and the disk's own limit by O_DIRECT passes with several streams (io_files.probe_disk).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .. import cuda
from ..errors import CmtError
from . import io_files
from .io_files import ALIGN, GB, TestFile
from .io_xfer import GDSIO_NUMBERS, XFER_TYPES, Ctx, Xfer
from .sizes import format_size, parse_names, parse_size

MODES = ("read", "write")
CACHES = ("warm", "cold")
VERIFY_BYTES = 16 << 20
WARM_ENOUGH = 0.99  # residency at which the file counts as loaded
COLD_ENOUGH = 0.01
GDSIO_IO = {("read", "sequential"): "READ", ("write", "sequential"): "WRITE", ("read", "random"): "RANDREAD",
            ("write", "random"): "RANDWRITE", ("read", "batch"): "RANDREAD"}


@dataclass
class IoPlan:
    xfers: list[str]
    modes: list[str] = field(default_factory=lambda: ["read"])
    random: bool = False
    threads: list[int] = field(default_factory=lambda: [8])
    io_sizes: list[int] = field(default_factory=lambda: [1 << 20])  # 0: each thread's whole share
    caches: dict[str, list[str]] = field(default_factory=lambda: {"read": ["warm", "cold"], "write": ["cold"]})
    repeats: int = 3
    duration: float | None = None
    batch: int = 0
    batch_size: int = 64 << 10
    direct_streams: list[int] = field(default_factory=lambda: [4, 16])
    device: int = 0
    seed: int = 7

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def configs(self, mode: str) -> list[tuple[str, int, int]]:
        """(pattern, threads, io size) of a mode, the batch last."""
        pattern = "random" if self.random else "sequential"
        out = [(pattern, t, n) for t in self.threads for n in self.io_sizes]
        if mode == "read" and self.batch:
            out.append(("batch", max(self.threads), self.batch_size))
        return out


# gdsio's -I numbers: 2 and 3 are the random ones
_GDSIO_MODES = {"0": ("read", False), "1": ("write", False), "2": ("read", True), "3": ("write", True)}


def parse_io_sizes(text: str) -> list[int]:
    """Sizes, and `all` (0: each thread's whole share in one I/O)."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise CmtError("the I/O size list is empty (examples: -i 1M or -i 64K,16M,all)")
    return list(dict.fromkeys(0 if t.lower() == "all" else parse_size(t) for t in items))


def plan_from_options(xfer: str, modes: str, random: bool, threads: str, io_size: str, cache: str | None,
                      repeats: int, duration: float | None, batch: int, batch_size: str, direct_streams: str,
                      device: int) -> IoPlan:
    """The plan from the command line's texts (gdsio's numbers allowed for -x and -I); CmtError on
    anything that is not understood, before a file is made."""
    from .load import parse_counts

    items = [t.strip() for t in modes.split(",") if t.strip()]
    chosen = parse_names(",".join(_GDSIO_MODES.get(t, (t,))[0] for t in items), MODES, "I/O mode")
    caches = parse_names(cache, CACHES, "cache state") if cache is not None else None
    random = random or any(_GDSIO_MODES.get(t, ("", False))[1] for t in items)
    return IoPlan(
        xfers=parse_names(",".join(GDSIO_NUMBERS.get(t.strip(), t.strip()) for t in xfer.split(",")),
                          tuple(XFER_TYPES), "transfer type"),
        modes=[m for m in MODES if m in chosen], random=random,
        threads=parse_counts(threads, "thread count", 1), io_sizes=parse_io_sizes(io_size),
        caches={"read": caches or ["warm", "cold"], "write": caches or ["cold"]}, repeats=repeats, duration=duration,
        batch=batch, batch_size=parse_size(batch_size),
        direct_streams=[] if direct_streams.strip() == "off" else parse_counts(direct_streams, "stream count", 1),
        device=device)


class Failed(Exception):
    """A type failed in one configuration: recorded, and the bench goes on without it there."""


@dataclass
class RunResult:
    bytes: int
    ops: int
    seconds: float
    latencies_ns: np.ndarray


def slot_bytes(size: int, pattern: str, threads: int, io_size: int) -> int:
    """One I/O's bytes: the I/O size, at most a thread's share (sequential) or the file (random)."""
    if pattern == "sequential":
        share = max(hi - lo for lo, hi in io_files.shares(size, threads))
        return min(io_size, share) if io_size else share
    return min(io_size or size, size)


def stream_ops(size: int, pattern: str, threads: int, slot: int, rng: np.random.Generator) -> list[list[tuple]]:
    """Each thread's I/Os, (slot, file offset, bytes): its own contiguous share in order
    (sequential), or its part of a random order of the file's blocks (random)."""
    if pattern == "sequential":
        return [[(i, off, min(slot, hi - off)) for off in range(lo, hi, slot)]
                for i, (lo, hi) in enumerate(io_files.shares(size, threads))]
    blocks = rng.permutation(max(1, size // slot))
    return [[(i, int(b) * slot, min(slot, size - int(b) * slot)) for b in blocks[i::threads]] for i in range(threads)]


def batch_ops(size: int, count: int, nbytes: int, rng: np.random.Generator) -> list[tuple[int, int, int]]:
    """`count` random aligned reads of `nbytes`, op i into slot i (distinct blocks while the file has enough)."""
    blocks = max(1, size // nbytes)
    picks = rng.choice(blocks, count, replace=count > blocks)
    return [(i, int(b) * nbytes, min(nbytes, size - int(b) * nbytes)) for i, b in enumerate(picks)]


def timed_streams(x: Xfer, per_thread: list[list[tuple[int, int, int]]], duration: float | None,
                  sync_fd: int | None = None, since_start: bool = False) -> RunResult:
    """The threads start together; each makes its I/Os one at a time (again from the start of its
    list until `duration` ends, if given). Latency: each I/O's own time, or with `since_start` its
    completion since the start (a batch). With `sync_fd`, fdatasync ends the run inside the time."""
    n = len(per_thread)
    lat: list[list[int]] = [[] for _ in range(n)]
    moved, ends = [0] * n, [0.0] * n
    errors: list[BaseException] = []
    stop = threading.Event()
    barrier = threading.Barrier(n + 1)
    clock = {"t0": 0.0, "deadline": float("inf")}

    def worker(i: int) -> None:
        try:
            x.thread_start()
            barrier.wait()
        except threading.BrokenBarrierError:
            return
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            barrier.abort()
            return
        ops, k = per_thread[i], 0
        try:
            while ops and not stop.is_set() and (duration is not None or k < len(ops)):
                slot, off, nbytes = ops[k % len(ops)]
                t = time.perf_counter_ns()
                got = x.io(slot, off, nbytes)
                done = time.perf_counter_ns()
                lat[i].append(done - (int(clock["t0"] * 1e9) if since_start else t))
                moved[i] += got
                k += 1
                if got < nbytes:
                    raise Failed(f"moved {got} of {nbytes} bytes at offset {off} (the file shrank?)")
                if done / 1e9 >= clock["deadline"]:
                    break
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
            stop.set()
        ends[i] = time.perf_counter()

    x.before_run()
    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    clock["t0"] = time.perf_counter()
    clock["deadline"] = clock["t0"] + duration if duration is not None else float("inf")
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.2)  # a timed join, so that Ctrl-C gets through
    except BaseException:  # Ctrl-C: the threads finish their I/O before the buffers go
        stop.set()
        for t in threads:
            t.join(30)
        raise
    end = max(ends)
    if sync_fd is not None and not errors:
        os.fdatasync(sync_fd)
        end = time.perf_counter()
    if errors:
        raise Failed(_why(errors[0]))
    flat = np.array([v for per in lat for v in per], dtype=np.int64)
    return RunResult(sum(moved), len(flat), max(end - clock["t0"], 1e-9), flat)


def timed_batch(x: Xfer, ops: list[tuple[int, int, int]]) -> RunResult:
    """All I/Os submitted at once from this thread (the type's batch); latency: each one's
    completion since the submit."""
    x.thread_start()
    x.before_run()
    t0 = time.perf_counter_ns()
    done = x.batch(ops)
    wrong = next((_why(e) for _, _, e in done if e is not None), None)
    wrong = wrong or next((f"moved {got} of {n} bytes at offset {off}"
                           for (got, _, _), (_, off, n) in zip(done, ops, strict=True) if got < n), None)
    if wrong:
        raise Failed(wrong)
    lat = np.array([at - t0 for _, at, _ in done], dtype=np.int64)
    return RunResult(sum(got for got, _, _ in done), len(ops), max(int(lat.max()), 1) / 1e9, lat)


def _why(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror} ({type(e).__name__})"
    return str(e) or type(e).__name__


def verify(x: Xfer, tf: TestFile, ops_slot: int = 0, batch: bool = False) -> None:
    """One I/O through the type (through its batch with `batch`, where it has one), compared byte
    for byte with the file (reads: what the type brought; writes: what it wrote); at an offset that
    is not a multiple of the I/O size."""
    n = min(x.slot_bytes, VERIFY_BYTES, tf.size)
    off = 3 * ALIGN if tf.size >= n + 3 * ALIGN else 0
    x.thread_start()
    x.before_run()
    if batch and x.batch_api():
        got, _, error = x.batch([(ops_slot, off, n)])[0]
        if error is not None:
            raise error
    else:
        got = x.io(ops_slot, off, n)
    if got != n:
        raise Failed(f"check: moved {got} of {n} bytes")
    fd = os.open(tf.path, os.O_RDONLY)
    try:
        want = os.pread(fd, n, off)
    finally:
        os.close(fd)
    if x.fetch(ops_slot, n) != want:
        raise Failed(f"check: the bytes {'read' if x.ctx.mode == 'read' else 'written'} differ from the file's")


def available(names: list[str], gpu_missing: str | None) -> tuple[list[str], dict[str, str]]:
    """The types that can run here, and why each other one cannot."""
    ok, skipped = [], {}
    for name in names:
        t = XFER_TYPES[name]
        why = t.missing() or (gpu_missing if t.needs_gpu else None)
        if why:
            skipped[name] = why
        else:
            ok.append(name)
    return ok, skipped


class IoBench:
    """Runs the plan on the test file; each finished run goes to `emit`, each note to `note`."""

    def __init__(self, plan: IoPlan, tf: TestFile, names: list[str], drv: cuda.Driver | None,
                 dev: cuda.Device | None, emit: Callable[[dict[str, Any]], None], note: Callable[[str], None]):
        self.plan, self.tf, self.names, self.drv, self.dev = plan, tf, names, drv, dev
        self.emit, self.note = emit, note
        self.records: list[dict[str, Any]] = []
        self.failures: list[dict[str, Any]] = []
        self.details: dict[str, dict[str, Any]] = {}
        self.disk: dict[str, dict[str, Any]] = {}

    def run(self) -> None:
        p = self.plan
        for mode in p.modes:
            if p.direct_streams:
                self.note(f"O_DIRECT {mode}s with {','.join(map(str, p.direct_streams))} streams: the disk's limit")
                self.disk[mode] = io_files.probe_disk(self.tf, mode, p.direct_streams, p.repeats, p.duration)
                if not self.disk[mode]["available"]:
                    self.note(f"no disk limit for {mode}s: {self.disk[mode]['reason']}")
            for pattern, threads, io_size in p.configs(mode):
                self._config(mode, pattern, threads, io_size)

    def _fail(self, name: str, where: dict[str, Any], why: str) -> None:
        self.failures.append({"xfer": name, **where, "error": why})
        self.note(f"{name}: {why} ({where['mode']} {where['pattern']}, {where['threads']} threads, "
                  f"{format_size(where['io_size'])} per I/O)")

    @contextlib.contextmanager
    def _setups(self, mode: str, slots: int, nbytes: int, where: dict[str, Any]) -> Iterator[dict[str, Xfer]]:
        """Every type set up and checked for one configuration, and torn down after it."""
        ready: dict[str, Xfer] = {}
        try:
            for name in self.names:
                ctx = Ctx(self.tf.path, mode, self.drv, self.dev, where["threads"], self.plan.seed)
                try:
                    x = XFER_TYPES[name](ctx, slots, nbytes)
                except Exception as e:  # noqa: BLE001 - a type that cannot set up is a failure, not the end
                    self._fail(name, where, f"setup: {_why(e)}")
                    continue
                ready[name] = x
                try:
                    batch = where["pattern"] == "batch"
                    verify(x, self.tf, 1 if batch and slots > 1 else 0, batch=batch)
                    self.details.setdefault(name, {"xfer_type": x.label(), **x.details()})
                except Exception as e:  # noqa: BLE001
                    self._fail(name, where, _why(e))
                    self._close(ready.pop(name), name, where)
            yield ready
        finally:
            for name, x in ready.items():
                self._close(x, name, where)

    def _close(self, x: Xfer, name: str, where: dict[str, Any]) -> None:
        try:
            x.close()
        except Exception as e:  # noqa: BLE001
            self._fail(name, where, f"teardown: {_why(e)}")

    def _cache(self, state: str) -> None:
        if state == "cold":
            io_files.evict(self.tf.path)
        elif io_files.residency(self.tf.path) < WARM_ENOUGH:
            io_files.load(self.tf.path, self.tf.size)

    def _config(self, mode: str, pattern: str, threads: int, io_size: int) -> None:
        p, size = self.plan, self.tf.size
        batch = pattern == "batch"
        nbytes = min(io_size, size) if batch else slot_bytes(size, pattern, threads, io_size)
        slots = p.batch if batch else threads
        where = {"mode": mode, "pattern": pattern, "threads": threads, "io_size": nbytes,
                 "io_label": "all" if not io_size else None}
        each = (f"{p.batch} x {format_size(nbytes)} at once" if batch else
                f"{threads} thread{'s' if threads > 1 else ''}, {format_size(nbytes)} per I/O")
        self.note(f"{mode} {pattern}: {each}")
        with self._setups(mode, slots, nbytes, where) as ready:
            for cache in p.caches[mode]:
                for rep in range(p.repeats):
                    for name in list(ready):
                        rng = np.random.default_rng(p.seed + rep)
                        try:
                            self._one(ready[name], name, dict(where, cache=cache, repeat=rep), rng)
                        except Exception as e:  # noqa: BLE001 - this type stops here, the others go on
                            self._fail(name, where, _why(e))
                            self._close(ready.pop(name), name, where)

    def _one(self, x: Xfer, name: str, where: dict[str, Any], rng: np.random.Generator) -> None:
        p, tf = self.plan, self.tf
        mode, pattern, threads, nbytes = where["mode"], where["pattern"], where["threads"], where["io_size"]
        self._cache(where["cache"])
        before = io_files.residency(tf.path)
        sync_fd = os.open(tf.path, os.O_RDONLY) if mode == "write" else None
        try:
            if pattern == "batch":
                ops = batch_ops(tf.size, p.batch, nbytes, rng)
                result = (timed_batch(x, ops) if x.batch_api() else
                          timed_streams(x, [ops[i::threads] for i in range(threads)], None, since_start=True))
            else:
                result = timed_streams(x, stream_ops(tf.size, pattern, threads, nbytes, rng), p.duration, sync_fd)
        finally:
            if sync_fd is not None:
                os.close(sync_fd)
        if os.path.getsize(tf.path) < tf.size:  # a writer that truncated: the next runs need the whole file
            os.truncate(tf.path, tf.size)
        after = io_files.residency(tf.path)
        lat_us = result.latencies_ns / 1e3
        record = {
            "xfer": name, "xfer_type": x.label(), **where, "file_size": tf.size,
            "threads_used": 1 if pattern == "batch" and x.batch_api() else threads,
            "batch_api": (x.batch_api() or "threads") if pattern == "batch" else None,
            "bytes": result.bytes, "ops": result.ops, "seconds": result.seconds,
            "gbps": result.bytes / result.seconds / GB, "gib_per_s": result.bytes / result.seconds / (1 << 30),
            "avg_latency_us": float(lat_us.mean()) if len(lat_us) else None,
            "p50_latency_us": float(np.percentile(lat_us, 50)) if len(lat_us) else None,
            "p99_latency_us": float(np.percentile(lat_us, 99)) if len(lat_us) else None,
            "resident_before": before, "resident_after": after,
            "cache_as_asked": before <= COLD_ENOUGH if where["cache"] == "cold" else before >= WARM_ENOUGH,
            "synced": mode == "write",
        }
        record["gdsio"] = gdsio_line(record)
        self.records.append(record)
        self.emit(record)


def gdsio_line(r: dict[str, Any]) -> str:
    """gdsio's result line: sizes in KiB, throughput in GiB/s, latency in µs."""
    xfer = r["xfer_type"] + ("_BATCH" if r["pattern"] == "batch" else "")
    return (f"IoType: {GDSIO_IO[(r['mode'], r['pattern'])]} XferType: {xfer} Threads: {r['threads_used']} "
            f"DataSetSize: {r['bytes'] // 1024}/{r['file_size'] // 1024}(KiB) IOSize: {r['io_size'] // 1024}(KiB) "
            f"Throughput: {r['gib_per_s']:.6f} GiB/sec, Avg_Latency: {r['avg_latency_us'] or 0:.6f} usecs "
            f"ops: {r['ops']} total_time {r['seconds']:.6f} secs")
