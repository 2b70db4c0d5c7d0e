"""Real measurements for `cmt tune`, through cmt.bench.copy_sweep: the same buffers, engine entry
point and timing as `cmt bench copy` (host clock around the copy and a synchronisation; pinned
copies by CUDA events).

`Measurer` is the search's `measure(direction, nbytes, settings) -> GB/s`: one sample is the
median of a few copies (enough to move ~32 MiB, at most 16), so that every sample costs about the
same whatever the size, after a warm-up copy when the settings changed (small copies only: a large
copy is long against waking the lanes). Host copies (direction h2h) are timed here: one thread's
libc memmove (settings None) or cmt's engine split as given (native.host_copy), each copy between
the next windows of the bench's buffers, so that a small copy does not run from the caches as the
same copy repeated would, while a program's copies of fresh data do not.
"""

from __future__ import annotations

import ctypes
import statistics
import time
from dataclasses import replace

from .. import cuda, native
from ..bench import copy_sweep
from ..config import Settings
from ..errors import CmtError
from . import model as pipeline

GB = 1e9
SAMPLE_BYTES = 32 << 20
MAX_COPIES = 16
WARMUP_BELOW = 64 << 20


class Measurer:
    """Buffers for copies up to `capacity` bytes on an open device; a context manager."""

    def __init__(self, drv: cuda.Driver, device: cuda.Device, capacity: int, largest: Settings,
                 max_copies: int = MAX_COPIES):
        self.max_copies = max_copies
        self.bench = copy_sweep.CopyBench(drv, device, capacity)
        self.count = 0  # timed copies
        self._window = 0  # the next host copy's window in the buffers
        self._last: tuple[str, Settings | None] | None = None
        try:
            # One copy with the most lanes and the largest ring allocates every staging buffer now,
            # not in the middle of some candidate's timing.
            first = replace(largest, chunk_bytes=min(largest.chunk_bytes, max(4096, capacity // 2)))
            r = native.memcpy("h2d", copy_sweep.address(self.bench.src), self.bench.dev, capacity,
                              self.bench.stream, first.as_dict())
            if r != cuda.CUDA_SUCCESS:
                raise cuda.CudaError("cmt_memcpy", int(r), drv.error_name(int(r)))
            drv.synchronize()
        except BaseException:
            self.bench.close()
            raise

    def close(self) -> None:
        self.bench.close()

    def __enter__(self) -> Measurer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __call__(self, direction: str, nbytes: int, settings: Settings | None) -> float:
        mode = "pageable" if settings is None else "cmt"
        copies = max(1, min(self.max_copies, SAMPLE_BYTES // nbytes))
        warmup = 0 if self._last == (direction, settings) or nbytes >= WARMUP_BELOW else 1
        self._last = (direction, settings)
        if direction == "h2h":
            self.count += copies + warmup
            return self._host_copies(nbytes, settings, copies, warmup)
        r = copy_sweep.measure(self.bench, mode, direction, nbytes, copies, warmup, settings, verify=False)
        if mode == "cmt" and r.outcome != "accelerated":
            raise CmtError(f"cmt's engine did not stage a {direction} copy of {nbytes} bytes ({r.outcome})",
                           exit_code=1)
        self.count += copies + warmup
        return r.median_gbps

    def _host_copies(self, nbytes: int, settings: Settings | None, copies: int, warmup: int) -> float:
        """GB/s of the median of `copies` host copies, each between the next windows of the buffers."""
        b = self.bench
        if nbytes > b.capacity:
            raise CmtError(f"a host copy of {nbytes} bytes does not fit the {b.capacity}-byte buffers")
        src, dst = copy_sweep.address(b.src), copy_sweep.address(b.dst)
        windows = max(1, b.capacity // nbytes)
        seconds = []
        for i in range(warmup + copies):
            at = (self._window % windows) * nbytes
            self._window += 1
            t0 = time.perf_counter()
            if settings is None:
                ctypes.memmove(dst + at, src + at, nbytes)
            else:
                outcome = native.host_copy(dst + at, src + at, nbytes, settings.as_dict())
                if outcome != "accelerated":
                    raise CmtError(f"cmt's engine did not split a host copy of {nbytes} bytes ({outcome})",
                                   exit_code=1)
            if i >= warmup:
                seconds.append(time.perf_counter() - t0)
        return nbytes / statistics.median(seconds) / GB

    def verify(self, direction: str, nbytes: int, settings: Settings | None) -> None:
        """Random data through these settings, checked byte for byte (VerificationError if wrong)."""
        self.bench.verify("pageable" if settings is None else "cmt", direction, nbytes, settings)

    # -- the instant search's probe -------------------------------------------------------------
    def _seconds(self, fn, repeats: int = 5) -> float:
        fn()  # warm-up
        return statistics.median(fn() for _ in range(repeats))

    def probe(self, direction: str, cores: int) -> pipeline.Probe:
        """The few measurements the pipeline model is fitted from (model.py says what each is for)."""
        b, cap = self.bench, self.bench.capacity
        small, large = min(256 << 10, cap), min(64 << 20, cap)
        pinned_small = self._seconds(lambda: b.copy_seconds("pinned", direction, small))
        pinned_large = self._seconds(lambda: b.copy_seconds("pinned", direction, large))
        cpu_one = self._seconds(lambda: b.cpu_copy_seconds(1, large))
        many = sorted({max(1, cores // 2), cores})
        cpu_many = max(((t, large, self._seconds(lambda t=t: b.cpu_copy_seconds(t, large))) for t in many),
                       key=lambda x: x[1] / x[2])
        blocks_at = min(8 << 20, cap)
        tiny_chunk = max(4096, min(64 << 10, blocks_at // 64))
        small_blocks = tuple(
            (s, blocks_at, self._seconds(lambda s=s: b.copy_seconds("cmt", direction, blocks_at, s)))
            for s in sorted({Settings(min(2, cores), 16, tiny_chunk),
                             Settings(max(min(2, cores), min(8, cores)), 16, tiny_chunk)},
                            key=lambda s: s.threads))
        one = min(64 << 10, cap)
        one_block = Settings(1, 1, one)
        one_block_s = self._seconds(lambda: b.copy_seconds("cmt", direction, one, one_block))
        self.count += 6 * (6 + len(many) + len(small_blocks))
        return pipeline.Probe((small, pinned_small), (large, pinned_large), (large, cpu_one), cpu_many,
                              small_blocks, (one_block, one, one_block_s), cores, direction)
