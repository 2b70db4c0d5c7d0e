"""A batch of reads and writes that complete out of order (cuFile's batch API, in shape): each op
starts as it is submitted, and poll() hands back completions as they finish.

Transfers of device memory run on the native library's workers (native/src/io_batch.hpp), so that a
batch of many small reads costs Python one call per op and not a thread's turn at the interpreter;
transfers of host memory run as futures (futures.py)."""

from __future__ import annotations

import ctypes
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import _lib
from .file import File
from .futures import IOFuture

_POLL_MAX = 64  # completions fetched from the native batch per call


@dataclass(frozen=True)
class Completion:
    """One finished op: its index (the order of submission, from 0), the bytes it read or wrote, and
    its error (None if it succeeded)."""

    index: int
    nbytes: int
    error: BaseException | None = None

    def result(self) -> int:
        """The bytes, or the op's error raised."""
        if self.error is not None:
            raise self.error
        return self.nbytes


class Batch:
    """Reads and writes submitted together, on any files, completing in any order::

        with cmt.io.Batch() as batch:
            batch.read(f, a, file_offset=0)
            batch.read(f, b, file_offset=1 << 30)
            for done in batch.poll(min_nr=1):
                print(done.index, done.result())
    """

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._finished: deque[Completion] = deque()
        self._submitted = 0
        self._returned = 0
        self._submit_lock = threading.Lock()  # an op's index is known before it starts
        self._native: int | None = None  # made with the first device transfer
        self._native_ops: dict[int, Any] = {}  # index -> its finisher, for the native ops running
        self._early: dict[int, Any] = {}  # results of native ops that finished before their finisher was kept
        self._drain_lock = threading.Lock()
        self._indices = (ctypes.c_int64 * _POLL_MAX)()
        self._results = (_lib.Result * _POLL_MAX)()

    def read(self, file: File, buf: Any, size: int | None = None, file_offset: int = 0, dev_offset: int = 0) -> int:
        """Submits a read (as File.read); returns its index. Bad input raises here, before any I/O."""
        return self._start(file, False, buf, size, file_offset, dev_offset)

    def write(self, file: File, buf: Any, size: int | None = None, file_offset: int | None = None,
              dev_offset: int = 0) -> int:
        """Submits a write (as File.write); returns its index."""
        return self._start(file, True, buf, size, file_offset, dev_offset)

    def read_many(self, file: File, buf: Any, sizes: Any, file_offsets: Any, dev_offsets: Any = 0) -> Sequence[int]:
        """Submits many reads into one buffer in one call (cuFileBatchIOSubmit's shape): each of
        sizes, file_offsets and dev_offsets is an int or a sequence with one per read (they broadcast,
        as numpy's arrays do). Returns their indices. Bad input raises here, before any I/O."""
        return self._start_many(file, False, buf, sizes, file_offsets, dev_offsets)

    def write_many(self, file: File, buf: Any, sizes: Any, file_offsets: Any, dev_offsets: Any = 0) -> Sequence[int]:
        """As read_many, for writes."""
        return self._start_many(file, True, buf, sizes, file_offsets, dev_offsets)

    def _start_many(self, file: File, write: bool, buf: Any, sizes: Any, file_offsets: Any,
                    dev_offsets: Any) -> Sequence[int]:
        import numpy as np

        ops = np.broadcast(np.asarray(sizes), np.asarray(file_offsets), np.asarray(dev_offsets))
        started, numbers = self._submit(ops.size, lambda first: file._batch_start_many(
            self._native, first, write, buf, sizes, file_offsets, dev_offsets))
        if started is not None:
            return numbers
        return [self._start(file, write, buf, int(n), int(off), int(dev)) for n, off, dev in ops]  # host memory

    def _start(self, file: File, write: bool, buf: Any, size: int | None, file_offset: int | None,
               dev_offset: int) -> int:
        _, numbers = self._submit(1, lambda index: file._batch_start(
            self._native, index, write, buf, size, file_offset, dev_offset))
        return numbers[0]

    def _submit(self, count: int, start: Any) -> tuple[Any, range]:
        """Numbers `count` ops and starts them with start(first number), which returns the finisher of
        native ops, one op's IOFuture (host memory), or None (nothing started: the caller's turn)."""
        with self._submit_lock:
            if self._native is None:
                self._native = _lib.lib().cmt_io_batch_new()
            first = self._submitted
            numbers = range(first, first + count)
            with self._cv:
                self._native_ops.update(dict.fromkeys(numbers))  # before they can finish
            started = None
            try:
                started = start(first)
            finally:
                with self._cv:
                    native = started is not None and not isinstance(started, IOFuture)
                    for i in numbers:
                        if not native:
                            del self._native_ops[i]
                        elif i in self._early:  # it finished already, and a poll found it
                            del self._native_ops[i]
                            self._finished.append(self._complete(i, started, self._early.pop(i)))
                        else:
                            self._native_ops[i] = started
                    if started is not None:
                        self._submitted += count
                        self._cv.notify_all()
        if isinstance(started, IOFuture):
            started.add_done_callback(lambda f: self._finish_future(first, f))
        return started, numbers

    def _finish_future(self, index: int, future: IOFuture) -> None:
        error = future.exception()
        done = Completion(index, 0 if error else future.get(), error)
        with self._cv:
            self._finished.append(done)
            self._cv.notify_all()

    def _drain_native(self, wait_s: float) -> None:
        """Moves the native ops that finished to the completions, waiting up to wait_s for one."""
        with self._drain_lock:
            with self._cv:
                if not self._native_ops:
                    return
            us = int(wait_s * 1e6)
            n = _lib.lib().cmt_io_batch_poll(self._native, 1 if us > 0 else 0, us, self._indices, self._results,
                                             _POLL_MAX)
            got = []
            for i in range(n):
                index, result = self._indices[i], _lib.Result.from_buffer_copy(self._results[i])
                with self._cv:
                    finish = self._native_ops.get(index)
                    if finish is None:  # its submit has not kept its finisher yet: it will
                        self._early[index] = result
                        continue
                    del self._native_ops[index]
                got.append(self._complete(index, finish, result))
            if got:
                with self._cv:
                    self._finished.extend(got)
                    self._cv.notify_all()

    @staticmethod
    def _complete(index: int, finish: Any, result: Any) -> Completion:
        try:
            return Completion(index, finish(result))
        except Exception as e:  # noqa: BLE001 - the op's error, handed back with it
            return Completion(index, 0, e)

    @property
    def outstanding(self) -> int:
        """Ops submitted and not yet handed back by poll()."""
        with self._cv:
            return self._submitted - self._returned

    def poll(self, min_nr: int = 1, timeout: float | None = None) -> list[Completion]:
        """Waits until at least `min_nr` ops have finished that poll() has not handed back yet (at
        most as many as are outstanding), or `timeout` seconds have passed (None: no limit); returns
        every such op finished by then, in the order they finished."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._drain_native(0)
            with self._cv:
                want = min(max(min_nr, 0), self._submitted - self._returned)
                left = None if deadline is None else deadline - time.monotonic()
                if len(self._finished) >= want or (left is not None and left <= 0):
                    out = list(self._finished)
                    self._finished.clear()
                    self._returned += len(out)
                    return out
                native = bool(self._native_ops)
                futures = self._submitted - self._returned - len(self._finished) - len(self._native_ops)
                if not native:
                    self._cv.wait(left)
                    continue
            # Native ops wait in the library (without the interpreter); in short turns while futures
            # of host transfers may finish meanwhile.
            slice_s = 0.001 if futures else 0.25
            self._drain_native(slice_s if left is None else max(min(slice_s, left), 1e-6))

    def wait(self, timeout: float | None = None) -> list[Completion]:
        """Waits for every outstanding op; returns them in the order they finished."""
        return self.poll(self.outstanding, timeout)

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.wait()

    def __del__(self) -> None:
        native, self._native = getattr(self, "_native", None), None
        if native:
            try:
                _lib.lib().cmt_io_batch_free(native)  # waits for its transfers still running
            except Exception:  # noqa: BLE001 - at interpreter exit the library may be gone already
                pass
