"""Futures of reads and writes that run in the background (File.pread, File.pwrite, Batch).

They run on one small pool of threads shared by the process: each thread only calls into the native
library (which lets go of the GIL), where the engine's lanes do the work. Many futures at once queue
on the pool; none starts a thread of its own. The engine carries one transfer at a time per GPU, so
more threads than these would only wait."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

_POOL_THREADS = 8
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=_POOL_THREADS, thread_name_prefix="cmt-io")
        return _pool


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


def submit(work: Callable[[], int], keep: Any = None) -> IOFuture:
    """Runs `work` on the shared pool."""
    return IOFuture(_executor().submit(work), keep)
