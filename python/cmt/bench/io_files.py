"""The test file of `cmt bench io`: made or checked, evicted from the page cache or loaded into it,
its page-cache residency measured (mmap + mincore), and the disk's own limit probed with O_DIRECT.

Only the standard library and numpy: nothing here touches the GPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import itertools
import mmap
import os
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CmtError
from .sizes import format_size

PAGE = mmap.PAGESIZE
ALIGN = 4096  # O_DIRECT and cuFile want offsets, sizes and buffers aligned to this
CHUNK = 16 << 20  # creating, loading: bytes per call
DIRECT_BLOCK = 4 << 20  # the O_DIRECT probe's request size: many of them in flight reach the disk's limit
# Filesystems that keep files in memory: nothing to evict, no disk under them to probe.
MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "hugetlbfs", "devtmpfs"})
GB = 1e9


@dataclass
class TestFile:
    path: Path
    size: int
    remove: bool  # the bench made it in -D's folder: it goes at the end
    filesystem: str

    def discard(self) -> None:
        if self.remove:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
            except OSError as e:
                raise CmtError(f"cannot remove the test file {self.path}: {e.strerror}", exit_code=1) from None


def filesystem_type(path: str | os.PathLike) -> str:
    """The type of the filesystem holding `path` ('ext4', 'tmpfs', ...): the longest mount point
    of /proc/self/mounts above it; 'unknown' where that cannot be read."""
    target = os.path.realpath(path)
    best, kind = "", "unknown"
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return kind
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        mount = fields[1].replace("\\040", " ")
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, kind = mount, fields[2]
    return kind


# -- making and checking the file ---------------------------------------------------------------
def _check_folder(folder: Path) -> None:
    if not folder.exists():
        raise CmtError(f"folder {folder} does not exist")
    if not folder.is_dir():
        raise CmtError(f"{folder} is not a folder")
    probe = folder / f".cmt-bench-io-test-{os.getpid()}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        probe.unlink()
    except OSError as e:
        raise CmtError(f"cannot write to folder {folder}: {e.strerror or e}") from None


def _check_space(folder: Path, size: int) -> None:
    st = os.statvfs(folder)
    free = st.f_bavail * st.f_frsize
    if free < size:
        raise CmtError(f"not enough free space in {folder} for a {format_size(size)} test file "
                       f"({format_size(free)} free; choose a smaller --file-size)")


def create_file(path: Path, size: int, seed: int = 1) -> None:
    """Writes `size` bytes of random data (each 16 MiB block stamped with its offset, so no two
    blocks are alike) and syncs them, so that the pages can be evicted. A disk that fills up
    leaves no partial file behind."""
    _check_space(path.parent, size)
    block = np.random.default_rng(seed).integers(0, 256, min(size, CHUNK), dtype=np.uint8)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError as e:
        raise CmtError(f"cannot create the test file {path}: {e.strerror or e}") from None
    done = 0
    try:
        while done < size:
            n = min(CHUNK, size - done)
            block[:8] = np.frombuffer(done.to_bytes(8, "little"), np.uint8)
            done += os.pwrite(fd, memoryview(block)[:n], done)
        os.fdatasync(fd)
    except OSError as e:
        os.close(fd)
        path.unlink(missing_ok=True)
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise CmtError(f"disk full while creating the test file {path}: {format_size(done)} of "
                           f"{format_size(size)} written (removed; choose a smaller --file-size)") from None
        raise CmtError(f"cannot write the test file {path}: {e.strerror or e}") from None
    os.close(fd)


def prepare(file: str | None, folder: str | None, size: int | None, default_size: int, writes: bool,
            overwrite: bool) -> TestFile:
    """The test file: -f FILE (used as it is, made if missing, kept at the end) or -D FOLDER (a new
    file made there and removed at the end)."""
    if (file is None) == (folder is None):
        raise CmtError("give the test file (-f/--file FILE) or a folder to make it in (-D/--dir FOLDER), not both"
                       if file else "give the test file (-f/--file FILE) or a folder to make it in (-D/--dir FOLDER)")
    if folder is not None:
        where = Path(folder)
        _check_folder(where)
        path = next(p for k in itertools.count() if not (p := where / f"cmt-bench-io-{os.getpid()}-{k}.dat").exists())
        create_file(path, size or default_size)
        return TestFile(path, size or default_size, True, filesystem_type(path))
    path = Path(file)
    if not path.exists():
        _check_folder(path.parent)
        create_file(path, size or default_size)
        return TestFile(path, size or default_size, False, filesystem_type(path))
    if not path.is_file():
        raise CmtError(f"{path} is not a regular file")
    have = path.stat().st_size
    if have == 0:
        raise CmtError(f"{path} is empty")
    if size is not None and have < size:
        raise CmtError(f"{path} holds {format_size(have)}, less than --file-size {format_size(size)}")
    if not os.access(path, os.R_OK | (os.W_OK if writes else 0)):
        raise CmtError(f"cannot {'write' if writes else 'read'} {path}: permission denied")
    if writes and not overwrite:
        raise CmtError(f"writing would overwrite {path}: add --overwrite, or give -D FOLDER for a scratch file")
    return TestFile(path, size or have, False, filesystem_type(path))


# -- the page cache -----------------------------------------------------------------------------
def evict(path: Path) -> None:
    """Drops the file's pages from the page cache (what drop_caches does for one file, without
    root): dirty pages are written first, since the kernel keeps those."""
    fd = os.open(path, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):  # a read-only filesystem has nothing dirty
            os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def load(path: Path, size: int) -> None:
    """Reads the file through the page cache, so that a warm run finds it there."""
    buf = bytearray(min(size, CHUNK))
    view = memoryview(buf)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        done = 0
        while done < size and (got := os.preadv(fd, [view], done)) > 0:
            done += got
    finally:
        os.close(fd)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_MAP_FAILED = ctypes.c_void_p(-1).value
_WINDOW = 1 << 30  # mapped and asked at a time


def residency(path: Path) -> float:
    """The share of the file's pages in the page cache (0..1), by mincore(2) on a read-only mapping
    (mapping reads nothing in)."""
    size = os.path.getsize(path)
    if size == 0:
        return 1.0
    resident = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        for start in range(0, size, _WINDOW):
            length = min(_WINDOW, size - start)
            addr = _libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, start)
            if addr in (None, _MAP_FAILED):
                raise CmtError(f"cannot map {path}: {os.strerror(ctypes.get_errno())}", exit_code=1)
            try:
                vec = np.zeros((length + PAGE - 1) // PAGE, np.uint8)
                if _libc.mincore(addr, length, vec.ctypes.data) != 0:
                    raise CmtError(f"mincore failed on {path}: {os.strerror(ctypes.get_errno())}", exit_code=1)
                resident += int(np.count_nonzero(vec & 1))
            finally:
                _libc.munmap(addr, length)
    finally:
        os.close(fd)
    return resident / ((size + PAGE - 1) // PAGE)


# -- the disk's own limit -----------------------------------------------------------------------
def shares(size: int, parts: int, align: int = ALIGN) -> list[tuple[int, int]]:
    """[start, end) of `parts` contiguous, aligned pieces of a file (the last may be shorter; a
    piece may be empty when the file is small)."""
    share = -(-size // parts)
    share = -(-share // align) * align
    return [(min(size, i * share), min(size, (i + 1) * share)) for i in range(parts)]


def _direct_pass(path: Path, size: int, mode: str, streams: int, block: int,
                 duration: float | None) -> tuple[int, float]:
    """One timed pass: `streams` threads, each O_DIRECT-reading (or writing) its own share of the
    file in aligned `block`s into page-aligned buffers; writes end with fdatasync. (bytes, seconds)."""
    flags = (os.O_RDONLY if mode == "read" else os.O_WRONLY) | os.O_DIRECT
    fd = os.open(path, flags)
    end_all = size // ALIGN * ALIGN  # O_DIRECT moves whole aligned blocks only
    moved = [0] * streams
    errors: list[BaseException] = []
    barrier = threading.Barrier(streams + 1)
    deadline: list[float] = [0.0]

    def stream(i: int, lo: int, hi: int) -> None:
        buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT wants
        if mode == "write":
            buf.write(os.urandom(block))
        try:
            barrier.wait()
            off = lo
            while off < hi:
                n = min(block, hi - off)
                view = memoryview(buf)[:n]
                got = os.preadv(fd, [view], off) if mode == "read" else os.pwritev(fd, [view], off)
                view.release()
                if got <= 0:
                    break
                moved[i] += got
                off += got
                if duration is not None:
                    if time.perf_counter() >= deadline[0]:
                        break
                    if off >= hi:
                        off = lo  # around again until the time is up
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)
        finally:
            buf.close()

    threads = [threading.Thread(target=stream, args=(i, lo, min(hi, end_all)), daemon=True)
               for i, (lo, hi) in enumerate(shares(end_all, streams, block))]
    try:
        for t in threads:
            t.start()
        t0 = time.perf_counter()
        deadline[0] = t0 + (duration or 0)
        barrier.wait()
        for t in threads:
            t.join()
        if mode == "write":
            os.fdatasync(fd)
        seconds = time.perf_counter() - t0
    finally:
        os.close(fd)
    if errors:
        raise errors[0]
    return sum(moved), seconds


def direct_unavailable(path: Path, filesystem: str) -> str | None:
    """Why the O_DIRECT probe cannot measure a disk here, or None."""
    if filesystem in MEMORY_FILESYSTEMS:
        return f"{path.parent} is on {filesystem}, which keeps files in memory: there is no disk to measure"
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
    except OSError as e:
        return f"the filesystem ({filesystem}) refuses O_DIRECT: {e.strerror}"
    return None


def probe_disk(tf: TestFile, mode: str, streams: list[int], repeats: int, duration: float | None,
               block: int = DIRECT_BLOCK) -> dict[str, Any]:
    """The disk's own rate for `mode`: O_DIRECT passes over the test file with each number of
    streams, `repeats` times each; the limit is the best median. Unavailable (with the reason) on
    filesystems without a disk or without O_DIRECT."""
    out: dict[str, Any] = {"mode": mode, "block": block, "available": False, "reason": None, "runs": [],
                           "limit_gbps": None, "limit_streams": None}
    out["reason"] = direct_unavailable(tf.path, tf.filesystem)
    if out["reason"]:
        return out
    for n in streams:
        rates = []
        for _ in range(repeats):
            if mode == "read":
                evict(tf.path)
            try:
                moved, seconds = _direct_pass(tf.path, tf.size, mode, n, block, duration)
            except OSError as e:
                out["reason"] = f"O_DIRECT {mode} with {n} streams failed: {e.strerror or e}"
                return out
            rates.append(moved / seconds / GB)
        out["runs"].append({"streams": n, "gbps": rates, "median_gbps": statistics.median(rates),
                            "min_gbps": min(rates), "max_gbps": max(rates)})
    best = max(out["runs"], key=lambda r: r["median_gbps"])
    out.update(available=True, limit_gbps=best["median_gbps"], limit_streams=best["streams"])
    return out
