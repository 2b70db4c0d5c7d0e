"""Where 8 threads' copies to one GPU lose their time under `cmt run` (issue 22's threads criterion).

`cmt bench load` measured 8 threads x 64 MiB, each on its own stream, at 62% (h2d) / 68% (d2h) of
pinned on the H100, and the first copy of the 8 at 22-38 GB/s against 46-50 for a copy alone. This
times, per thread, when its call returned (the copy staged; its last DMAs may still run) and when
its stream had synchronised, relative to the start; then one thread's 8 copies back to back on one
stream, the same way. Copies taking turns show as returns spaced by one copy's staging; a gap
between one copy's return and the next one's is time lost between turns.

    python -m cmt run -- python research/threads_turns.py          # THREADS=8 MIB=64 REPEATS=5
"""

from __future__ import annotations

import os
import statistics
import threading
import time

import numpy as np

from cmt import cuda

MIB = 1 << 20


class Copies:
    """One pageable buffer, device buffer and stream per thread."""

    def __init__(self, n_threads: int, nbytes: int):
        self.drv = cuda.load()
        self.ctx = self.drv.open_device(0).context
        self.drv.set_current(self.ctx)
        self.nbytes = nbytes
        self.streams = [self.drv.stream_create() for _ in range(n_threads)]
        self.devs = [self.drv.mem_alloc(nbytes) for _ in range(n_threads)]
        self.hosts = [np.random.default_rng(i).integers(0, 255, nbytes, dtype=np.uint8) for i in range(n_threads)]

    def copy(self, direction: str, i: int) -> None:
        if direction == "h2d":
            self.drv.memcpy_htod_async(self.devs[i], self.hosts[i].ctypes.data, self.nbytes, self.streams[i])
        else:
            self.drv.memcpy_dtoh_async(self.hosts[i].ctypes.data, self.devs[i], self.nbytes, self.streams[i])


def spaced(marks: list[float]) -> str:
    return " ".join(f"{b - a:.2f}" for a, b in zip([0.0, *marks[:-1]], marks, strict=True))


def threads_at_once(c: Copies, direction: str, n: int) -> tuple[float, list[float], float]:
    """n threads copy at once: (seconds until every stream synchronised, returns in ms sorted, the
    last sync after the last return in ms)."""
    returned, synced = [0.0] * n, [0.0] * n
    barrier = threading.Barrier(n + 1)

    def work(i: int) -> None:
        c.drv.set_current(c.ctx)
        barrier.wait()
        c.copy(direction, i)
        returned[i] = time.monotonic()
        c.drv.stream_synchronize(c.streams[i])
        synced[i] = time.monotonic()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.monotonic()
    for t in threads:
        t.join()
    return max(synced) - t0, sorted((r - t0) * 1e3 for r in returned), (max(synced) - max(returned)) * 1e3


def one_thread(c: Copies, direction: str, n: int) -> tuple[float, list[float]]:
    """One thread's n copies back to back, each synchronised: (seconds, returns in ms)."""
    t0 = time.monotonic()
    marks = []
    for i in range(n):
        c.copy(direction, i)
        marks.append((time.monotonic() - t0) * 1e3)
        c.drv.stream_synchronize(c.streams[i])
    return time.monotonic() - t0, marks


def main() -> None:
    n = int(os.environ.get("THREADS", "8"))
    nbytes = int(os.environ.get("MIB", "64")) * MIB
    repeats = int(os.environ.get("REPEATS", "5"))
    c = Copies(n, nbytes)
    gb = n * nbytes / 1e9
    for direction in ("h2d", "d2h"):
        threads_at_once(c, direction, n)  # warm-up
        at_once, alone = [], []
        for rep in range(repeats):
            total, rets, tail = threads_at_once(c, direction, n)
            at_once.append(gb / total)
            print(f"{direction} {n} threads, rep {rep}: {at_once[-1]:5.1f} GB/s in {total * 1e3:.2f} ms; "
                  f"returns spaced {spaced(rets)} ms; last sync +{tail:.2f} ms", flush=True)
            total, marks = one_thread(c, direction, n)
            alone.append(gb / total)
            print(f"{direction} one thread, rep {rep}: {alone[-1]:5.1f} GB/s; returns spaced {spaced(marks)} ms",
                  flush=True)
        print(f"{direction} medians: {n} threads {statistics.median(at_once):.1f} GB/s, one thread "
              f"{statistics.median(alone):.1f} GB/s", flush=True)


if __name__ == "__main__":
    main()
