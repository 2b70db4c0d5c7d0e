"""`cmt doctor --path PATH`: the filesystem that holds PATH, and whether it takes O_DIRECT reads and
writes (what GPUDirect Storage and direct-I/O loaders need), tried for real with one aligned block."""

from __future__ import annotations

import errno
import mmap
import os
import tempfile
from pathlib import Path

from ..errors import CmtError
from . import sysfs
from .checks import Finding

BLOCK = 4096  # a multiple of every logical block size in use, and of the page size: aligned for all
_NETWORK = {"nfs", "nfs4", "cifs", "smb3", "9p", "ceph", "glusterfs", "lustre", "beegfs", "gpfs", "virtiofs"}


def validate(path: str) -> str:
    """The absolute, resolved form of a --path, or CmtError (exit 2) saying what is wrong with it."""
    if not os.path.lexists(path):
        raise CmtError(f"--path {path}: no such file or folder")
    if not os.path.exists(path):
        raise CmtError(f"--path {path}: a symbolic link to nothing")
    resolved = os.path.realpath(path)
    if not (os.path.isdir(resolved) or os.path.isfile(resolved)):
        raise CmtError(f"--path {path}: not a regular file or a folder")
    if not os.access(resolved, os.R_OK | (os.X_OK if os.path.isdir(resolved) else 0)):
        raise CmtError(f"--path {path}: not readable (permission denied)")
    return resolved


def _size(n: int) -> str:
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n >> 10} KiB"


def check_filesystem(path: str, mounts: list[sysfs.Mount]) -> Finding:
    name = f"filesystem {path}"
    mount = sysfs.mount_for(path, mounts)
    if mount is None:
        return Finding(name, "warn", "not found in /proc/self/mountinfo", None)
    detail = f"{mount.fstype} ({mount.source}) mounted at {mount.mount_point}"
    try:
        st = os.statvfs(path)
        detail += f"; {_size(st.f_bavail * st.f_frsize)} free of {_size(st.f_blocks * st.f_frsize)}"
    except OSError:
        pass
    if mount.fstype == "tmpfs":
        detail += "; memory-backed: its files are already in RAM"
    elif mount.fstype in _NETWORK or mount.fstype.startswith("fuse"):
        detail += "; a network or FUSE filesystem: reads run at its server's or daemon's pace"
    return Finding(name, "info", detail, None)


def probe_o_direct(path: str) -> tuple[bool | None, str]:
    """(True: O_DIRECT works, False: the filesystem refuses it, None: could not tell; in words).
    A folder gets a temporary file, written and read back, then removed; a file is only read."""
    buf = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT wants its memory
    try:
        return _probe_folder(path, buf) if os.path.isdir(path) else _probe_file(path, buf)
    finally:
        buf.close()


def _refused(e: OSError, what: str) -> tuple[bool | None, str]:
    if e.errno == errno.EINVAL:  # the one answer of a filesystem without direct I/O
        return False, f"{what} with O_DIRECT is refused (EINVAL)"
    return None, f"{what} failed: {e.strerror or e}"


def _probe_file(path: str, buf: mmap.mmap) -> tuple[bool | None, str]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError as e:
        return _refused(e, "opening the file")
    try:
        n = os.preadv(fd, [buf], 0)
    except OSError as e:
        return _refused(e, f"an aligned {BLOCK}-byte read")
    finally:
        os.close(fd)
    return True, f"an aligned {BLOCK}-byte O_DIRECT read of the file worked ({n} bytes read)"


def _probe_folder(path: str, buf: mmap.mmap) -> tuple[bool | None, str]:
    try:
        fd, name = tempfile.mkstemp(prefix=".cmt-doctor-", dir=path)
    except OSError as e:
        return None, f"cannot create a test file in the folder: {e.strerror or e}"
    os.close(fd)
    try:
        try:
            fd = os.open(name, os.O_RDWR | os.O_DIRECT)
        except OSError as e:
            return _refused(e, "opening a file")
        try:
            buf[:] = bytes(range(256)) * (BLOCK // 256)
            os.pwritev(fd, [buf], 0)
            buf[:] = bytes(BLOCK)
            n = os.preadv(fd, [buf], 0)
        except OSError as e:
            return _refused(e, f"an aligned {BLOCK}-byte write and read")
        finally:
            os.close(fd)
        if n != BLOCK or buf[:256] != bytes(range(256)):
            return None, f"an O_DIRECT read returned other bytes than were written ({n} bytes read)"
        return True, f"an aligned {BLOCK}-byte O_DIRECT write and read of a test file worked"
    finally:
        try:
            os.unlink(name)
        except OSError:
            pass


def check_o_direct(path: str, mounts: list[sysfs.Mount]) -> Finding:
    mount = sysfs.mount_for(path, mounts)
    fstype = mount.fstype if mount else "this filesystem"
    works, how = probe_o_direct(path)
    name = f"O_DIRECT {path}"
    if works:
        return Finding(name, "ok", f"supported on {fstype}: {how}", None)
    if works is False:
        return Finding(name, "warn", f"not supported on {fstype}: {how}; reads of its files go through the "
                                     "page cache, and GPUDirect Storage cannot read them directly",
                       "keep files that are read with O_DIRECT or GPUDirect Storage on a local block-device "
                       "filesystem (ext4, xfs)")
    return Finding(name, "warn", f"could not be tested: {how}",
                   "give a folder you may write to, or an existing file in it, as --path")


def check(path: str, root: Path = sysfs.ROOT) -> list[Finding]:
    """The findings of one validated path."""
    mounts = sysfs.mounts(root)
    return [check_filesystem(path, mounts), check_o_direct(path, mounts)]
