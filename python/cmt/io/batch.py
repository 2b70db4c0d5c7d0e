"""A batch of reads and writes that complete out of order (cuFile's batch API, in shape): each op
starts as it is submitted, and poll() hands back completions as they finish."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from .file import File


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

    def read(self, file: File, buf: Any, size: int | None = None, file_offset: int = 0, dev_offset: int = 0) -> int:
        """Submits a read (as File.read); returns its index. Bad input raises here, before any I/O."""
        return self._add(file.pread(buf, size, file_offset, dev_offset))

    def write(self, file: File, buf: Any, size: int | None = None, file_offset: int | None = None,
              dev_offset: int = 0) -> int:
        """Submits a write (as File.write); returns its index."""
        return self._add(file.pwrite(buf, size, file_offset, dev_offset))

    def _add(self, future: Any) -> int:
        with self._cv:
            index = self._submitted
            self._submitted += 1
        future.add_done_callback(lambda f: self._finish(index, f))
        return index

    def _finish(self, index: int, future: Any) -> None:
        error = future.exception()
        done = Completion(index, 0 if error else future.get(), error)
        with self._cv:
            self._finished.append(done)
            self._cv.notify_all()

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
        with self._cv:
            want = min(max(min_nr, 0), self._submitted - self._returned)
            while len(self._finished) < want:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cv.wait(left)
            out = list(self._finished)
            self._finished.clear()
            self._returned += len(out)
            return out

    def wait(self, timeout: float | None = None) -> list[Completion]:
        """Waits for every outstanding op; returns them in the order they finished."""
        return self.poll(self.outstanding, timeout)

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.wait()
