"""An open file for reads into and writes from device or host memory (KvikIO's CuFile, in shape).

Device buffers go through cmt's engine (native/src/file_transfer.hpp): the engine's threads read
the file into its pinned staging buffers while the copy engine moves them to the GPU, and the other
way round; transfers of up to 1 MiB go through a pinned bounce buffer of their own instead, many at
once. Host buffers need no GPU: they are read and written here with preadv/pwritev."""

from __future__ import annotations

import ctypes
import errno
import io
import operator
import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import _lib, buffers, futures
from . import stream as stream_io
from .errors import FileIOError, check

# mode -> (open flags, readable, writable). "a": created if missing and never truncated; a write
# without a file offset goes to the end (each such write after the one before).
_MODES = {
    "r": (os.O_RDONLY, True, False),
    "r+": (os.O_RDWR, True, True),
    "w": (os.O_WRONLY | os.O_CREAT | os.O_TRUNC, False, True),
    "w+": (os.O_RDWR | os.O_CREAT | os.O_TRUNC, True, True),
    "a": (os.O_WRONLY | os.O_CREAT, False, True),
    "a+": (os.O_RDWR | os.O_CREAT, True, True),
}


def _address(array: Any) -> int:
    """Where a ctypes array's or a numpy array's items lie."""
    return ctypes.addressof(array) if isinstance(array, ctypes.Array) else array.ctypes.data


@dataclass(frozen=True)
class _Transfer:
    write: bool
    buf: buffers.Buffer
    size: int
    file_offset: int
    dev_offset: int

    @property
    def verb(self) -> str:
        return "writing" if self.write else "reading"


class File:
    """A file opened for transfers with device or host memory. Modes: 'r' (read), 'r+' (read and
    write), 'w' (write, created or truncated), 'w+', 'a' (write, created if missing, writes without
    an offset go to the end), 'a+'; a 'b' is accepted and ignored. `settings`: the engine's settings
    for this file's transfers (a dict of some of threads, buffers, chunk_bytes, stores, or a
    cmt.config.Settings), over cmt.io.default_settings()."""

    def __init__(self, path: str | os.PathLike, mode: str = "r", settings: Any = None):
        self.path = os.fsdecode(os.fspath(path))
        self.mode = mode
        key = mode.replace("b", "")
        if key not in _MODES:
            raise ValueError(f"invalid mode {mode!r}: use 'r', 'r+', 'w', 'w+', 'a' or 'a+'")
        self._settings = _lib.settings_struct(settings)  # before opening: a bad setting truncates nothing
        self._settings_ptr = ctypes.cast(self._settings, ctypes.c_void_p)
        flags, self._readable, self._writable = _MODES[key]
        self._fd = os.open(self.path, flags | os.O_CLOEXEC, 0o666)
        try:
            st = os.fstat(self._fd)
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), self.path)
            err = ctypes.c_int(0)
            self._native = _lib.lib().cmt_io_attach(self._fd, ctypes.byref(err))
            if not self._native:
                raise OSError(err.value, os.strerror(err.value), self.path)
        except BaseException:
            os.close(self._fd)
            raise
        self._append_at = st.st_size if key.startswith("a") else None
        self._lock = threading.Lock()
        self._closed = False
        self._users = 0  # transfers submitted and not done: the file stays open for them

    # -- the handle ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Closes the file once the transfers already submitted are done (at once if none is)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._users == 0:
                self._close_now()

    def _close_now(self) -> None:
        _lib.lib().cmt_io_detach(self._native)
        os.close(self._fd)

    @property
    def closed(self) -> bool:
        return self._closed

    def fileno(self) -> int:
        return self._fd

    def nbytes(self) -> int:
        """The file's size now."""
        return os.fstat(self._fd).st_size

    def __enter__(self) -> File:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_lock", None) is not None:
            try:
                self.close()
            except Exception:  # noqa: BLE001 - at interpreter exit the library may be gone already
                pass

    def __repr__(self) -> str:
        return f"<cmt.io.File {self.path!r} mode={self.mode!r}{' closed' if self._closed else ''}>"

    # -- reads and writes ----------------------------------------------------------------------------
    def read(self, buf: Any, size: int | None = None, file_offset: int = 0, dev_offset: int = 0) -> int:
        """Reads `size` bytes (all of buf from dev_offset if None) at file_offset into buf; returns
        the bytes read: fewer at the end of the file, 0 at or past it."""
        return self._run(self._prepare(False, buf, size, file_offset, dev_offset))

    def write(self, buf: Any, size: int | None = None, file_offset: int | None = None, dev_offset: int = 0) -> int:
        """Writes `size` bytes of buf (from dev_offset) at file_offset (None: 0, or the end in 'a'
        modes); returns the bytes written. On failure (a full disk, the file size limit) the file
        is cut back to the larger of its former size and file_offset, unless another write has
        meanwhile put bytes beyond this one's."""
        return self._run(self._prepare(True, buf, size, file_offset, dev_offset))

    def pread(self, buf: Any, size: int | None = None, file_offset: int = 0, dev_offset: int = 0) -> futures.IOFuture:
        """As read(), in the background: returns a future of the bytes read."""
        return self._future(self._prepare(False, buf, size, file_offset, dev_offset))

    def pwrite(self, buf: Any, size: int | None = None, file_offset: int | None = None,
               dev_offset: int = 0) -> futures.IOFuture:
        """As write(), in the background: returns a future of the bytes written."""
        return self._future(self._prepare(True, buf, size, file_offset, dev_offset))

    def read_async(self, buf: Any, stream: Any, size: int | None = None, file_offset: int = 0,
                   dev_offset: int = 0) -> stream_io.StreamFuture:
        """Stream-ordered read into device memory (cuFile's stream API): returns at once; the read
        runs once the stream's earlier work is done, and its later work waits for the read. The
        stream: a handle (int, 0 or None for the legacy default stream), a torch.cuda.Stream, a CuPy
        stream, or anything with __cuda_stream__."""
        return self._stream(self._prepare(False, buf, size, file_offset, dev_offset), stream)

    def write_async(self, buf: Any, stream: Any, size: int | None = None, file_offset: int | None = None,
                    dev_offset: int = 0) -> stream_io.StreamFuture:
        """Stream-ordered write of device memory: runs once the stream's earlier work (the kernels
        that make the bytes) is done; the stream's later work waits for it."""
        return self._stream(self._prepare(True, buf, size, file_offset, dev_offset), stream)

    # -- internals -----------------------------------------------------------------------------------
    def _prepare(self, write: bool, buf: Any, size: int | None, file_offset: int | None,
                 dev_offset: int) -> _Transfer:
        """Checks a transfer before any I/O and holds the file open for it (released by _run)."""
        if write and not self._writable:
            raise io.UnsupportedOperation(f"{self.path} is open with mode {self.mode!r}, which cannot write: "
                                          "open it with 'r+', 'w' or 'a' to write")
        if not write and not self._readable:
            raise io.UnsupportedOperation(f"{self.path} is open with mode {self.mode!r}, which cannot read: "
                                          "open it with 'r', 'r+' or 'w+' to read")
        b = buffers.resolve(buf)
        if not write and b.readonly:
            raise ValueError("the buffer is read-only: nothing can be read into it")
        dev_offset = operator.index(dev_offset)
        if dev_offset < 0 or (file_offset is not None and operator.index(file_offset) < 0):
            raise ValueError("offsets cannot be negative")
        size = b.nbytes - dev_offset if size is None else operator.index(size)
        if size < 0 or dev_offset + size > b.nbytes:
            raise ValueError(f"the buffer holds {b.nbytes} bytes: too few for {size} bytes at offset {dev_offset}")
        with self._lock:
            if self._closed:
                raise ValueError("I/O operation on closed file")
            if file_offset is None and write and self._append_at is not None:
                file_offset, self._append_at = self._append_at, self._append_at + size
            self._users += 1
        return _Transfer(write, b, size, int(file_offset or 0), dev_offset)

    def _done(self) -> None:
        with self._lock:
            self._users -= 1
            if self._closed and self._users == 0:
                self._close_now()

    def _run(self, t: _Transfer) -> int:
        try:
            if t.size == 0:
                return 0
            if not t.buf.device:
                return self._host_transfer(t)
            result = _lib.Result()
            fn = _lib.lib().cmt_io_write if t.write else _lib.lib().cmt_io_read
            ptr = t.buf.ptr + t.dev_offset
            fn(self._native, ptr, t.size, t.file_offset, self._settings_ptr,
               ctypes.byref(result))
            return check(result, self.path, t.verb, ptr)
        finally:
            self._done()

    def _future(self, t: _Transfer) -> futures.IOFuture:
        try:
            return futures.submit(lambda: self._run(t), keep=t.buf.keep, small=t.size <= _lib.small_bytes())
        except BaseException:
            self._done()
            raise

    def _batch_start(self, native_batch: int, index: int, write: bool, buf: Any, size: int | None,
                     file_offset: int | None, dev_offset: int) -> futures.IOFuture | Callable[[Any], int]:
        """For Batch: starts a transfer of device memory on the native batch as its op `index`, and
        returns what turns its result into bytes (or raises its error) once it has finished. A
        transfer of host memory (or of nothing) runs as a future instead, which is returned."""
        t = self._prepare(write, buf, size, file_offset, dev_offset)
        if not t.buf.device or t.size == 0:
            return self._future(t)
        return self._batch_submit(native_batch, index, write, t.buf, t.size, t.file_offset, t.dev_offset)

    def _batch_start_many(self, native_batch: int, first_index: int, write: bool, buf: Any, sizes: Any,
                          file_offsets: Any, dev_offsets: Any) -> Callable[[Any], int] | None:
        """For Batch: starts many transfers between the device buffer `buf` and this file on the
        native batch in one call, numbered from first_index; each of sizes, file_offsets and
        dev_offsets is an int or one per transfer. Returns what turns each one's result into bytes (or
        raises its error), or None if buf is host memory (the caller submits those one by one)."""
        b = buffers.resolve(buf)
        if not b.device:
            return None
        self._prepare(write, buf, 0, 0, 0)  # the mode and the file's state; the users count one more
        return self._batch_submit(native_batch, first_index, write, b, sizes, file_offsets, dev_offsets)

    def _batch_submit(self, native_batch: int, first_index: int, write: bool, b: buffers.Buffer, sizes: Any,
                      file_offsets: Any, dev_offsets: Any) -> Callable[[Any], int]:
        """The native submission of _batch_start (one transfer, ints that _prepare checked) and
        _batch_start_many (ints or sequences, checked here), once _prepare counted one user: one per
        transfer from here, each given back as it finishes; all of them if none starts."""
        import numpy as np

        if all(isinstance(v, int) for v in (sizes, file_offsets, dev_offsets)):  # Batch.read: no numpy, 10 us less
            size, file_off = (ctypes.c_int64 * 1)(sizes), (ctypes.c_int64 * 1)(file_offsets)
            device = (ctypes.c_uint64 * 1)(b.ptr + max(dev_offsets, 0))
            negative = min(sizes, file_offsets, dev_offsets) < 0
            too_far = dev_offsets + sizes > b.nbytes
        else:
            columns = np.broadcast_arrays(*(np.asarray(v, dtype=np.int64) for v in (sizes, file_offsets, dev_offsets)))
            size, file_off, dev_off = (np.ascontiguousarray(c.ravel()) for c in columns)
            device = (dev_off + b.ptr).astype(np.uint64)
            negative = bool((size < 0).any() or (file_off < 0).any() or (dev_off < 0).any())
            too_far = bool((dev_off + size > b.nbytes).any())
        n, status, failed = len(size), None, _lib.Result()
        with self._lock:
            self._users += n - 1
        try:
            if negative:
                raise ValueError("sizes and offsets cannot be negative")
            if too_far:
                raise ValueError(f"the buffer holds {b.nbytes} bytes: too few for a transfer at its offset")
            status = _lib.lib().cmt_io_batch_submit_many(
                native_batch, self._native, int(write), n, _address(device), _address(size), _address(file_off),
                self._settings_ptr, first_index, ctypes.byref(failed))
        finally:
            if status != _lib.OK:  # none started
                with self._lock:
                    self._users -= n - 1
                self._done()
        verb = "writing" if write else "reading"
        if status != _lib.OK:
            check(failed, self.path, verb, b.ptr)

        def finish(result: Any, keep: Any = b.keep) -> int:  # the buffer lives as long as this does
            try:
                return check(result, self.path, verb, b.ptr)
            finally:
                self._done()

        return finish

    def _stream(self, t: _Transfer, stream: Any) -> stream_io.StreamFuture:
        try:
            if not t.buf.device:
                raise ValueError("stream-ordered reads and writes need device memory; use pread/pwrite for "
                                 "host buffers")
            return stream_io.submit(self._native, t.write, t.buf, t.buf.ptr + t.dev_offset, t.size, t.file_offset,
                                    stream_io.handle(stream), self._settings, self.path)
        finally:
            self._done()  # a stream-ordered transfer holds the native file itself

    def _host_transfer(self, t: _Transfer) -> int:
        view = t.buf.view[t.dev_offset:t.dev_offset + t.size]
        done = 0
        size_before = os.fstat(self._fd).st_size if t.write else 0
        try:
            while done < t.size:
                at = t.file_offset + done
                n = os.pwritev(self._fd, [view[done:]], at) if t.write else os.preadv(self._fd, [view[done:]], at)
                if n == 0:
                    if t.write:
                        raise OSError(errno.EIO, os.strerror(errno.EIO))
                    break  # the end of the file
                done += n
        except OSError as e:
            if t.write:
                self._cut_back(size_before, t.file_offset, t.size)
            raise FileIOError(e.errno or errno.EIO, f"{e.strerror} ({t.verb} at offset {t.file_offset + done})",
                              self.path, t.file_offset + done) from None
        return done

    def _cut_back(self, size_before: int, offset: int, size: int) -> None:
        """After a failed write: the file back to the larger of its former size and the write's
        offset, unless some other write has put bytes beyond this one's (as the native path does)."""
        st = os.fstat(self._fd)
        target = max(size_before, offset)
        if stat.S_ISREG(st.st_mode) and target < st.st_size <= offset + size:
            os.ftruncate(self._fd, target)
