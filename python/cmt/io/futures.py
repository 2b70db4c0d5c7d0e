"""Futures of reads and writes that run in the background (File.pread, File.pwrite, Batch).

They run on two small pools of threads shared by the process: each thread only calls into the
native library (which lets go of the GIL). Many futures at once queue on the pools; none starts a
thread of its own. Small transfers (up to _lib.small_bytes(), 1 MiB) have a pool of their own: each
is a pread into a pinned bounce buffer and one DMA, many run at once, and none waits behind a bulk
transfer queued before it. Larger ones go through the engine's lanes, and the engine carries one
transfer at a time per GPU, so more threads than these would only wait."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

_POOL_THREADS = 8  # bulk transfers: the engine's, one at a time per GPU
# Small ones: reads in flight at once (the disk's queue, or copies out of the page cache on as many
# CPUs), as many as KvikIO's pool in `cmt bench io`; each holds one of its GPU's bounce buffers.
_SMALL_THREADS = 8
_pools: dict[bool, ThreadPoolExecutor] = {}
_pool_lock = threading.Lock()


def _executor(small: bool) -> ThreadPoolExecutor:
    with _pool_lock:
        pool = _pools.get(small)
        if pool is None:
            pool = _pools[small] = ThreadPoolExecutor(max_workers=_SMALL_THREADS if small else _POOL_THREADS,
                                                      thread_name_prefix="cmt-io-small" if small else "cmt-io")
        return pool


class IOFuture:
    """The bytes a background read or write did, once it is done (KvikIO's IOFuture): ``get()``
    waits and returns them, or raises the transfer's error."""

    __slots__ = ("_future", "_keep")

    def __init__(self, future: Future, keep: Any = None):
        self._future = future
        self._keep = keep  # the buffer, alive until the transfer is done

    def get(self) -> int:
        """Waits for the transfer; returns the bytes read or written, or raises its error."""
        return self._future.result()

    def result(self, timeout: float | None = None) -> int:
        """As get(), waiting at most `timeout` seconds (TimeoutError after)."""
        return self._future.result(timeout)

    def done(self) -> bool:
        return self._future.done()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self._future.exception(timeout)

    def add_done_callback(self, fn: Callable[[IOFuture], None]) -> None:
        """Calls fn(self) once the transfer is done (at once if it is), in the thread that ran it."""
        self._future.add_done_callback(lambda _f: fn(self))


def submit(work: Callable[[], int], keep: Any = None, small: bool = False) -> IOFuture:
    """Runs `work` on the shared pool: the small transfers' pool if `small`."""
    return IOFuture(_executor(small).submit(work), keep)
