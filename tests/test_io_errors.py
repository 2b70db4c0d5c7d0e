"""cmt.io's bad input and failures: each is a clear Python exception (with the file, the offset and the
OS error where there is one) before any I/O where it can be found before, and a failed write leaves
the file at the size it had, not half-written looking whole."""

from __future__ import annotations

import os

import pytest
from io_scenario import run_scenario


def test_a_missing_file_a_directory_and_a_missing_folder(run_python, tmp_path):
    run_scenario(run_python, f'''
        root = {str(tmp_path)!r}
        for path, mode, kind in ((os.path.join(root, "nope.bin"), "r", FileNotFoundError),
                                 (os.path.join(root, "no", "dir.bin"), "w", FileNotFoundError),
                                 (root, "r", IsADirectoryError), (root, "w", IsADirectoryError)):
            try:
                cmt.io.open(path, mode)
                raise AssertionError(f"{{path}} opened with {{mode}}")
            except kind as e:
                assert e.filename == path, e
        try:
            cmt.io.open(os.path.join(root, "x"), "rw")
            raise AssertionError("a bad mode was taken")
        except ValueError as e:
            assert "invalid mode 'rw'" in str(e)
        assert os.listdir(root) == []
    ''')


def test_permission_denied_to_read_and_an_unwritable_target(run_python):
    # As root, the child drops to nobody once the driver and the library are loaded: root reads anything.
    run_scenario(run_python, '''
        import tempfile
        root = tempfile.mkdtemp(prefix="cmt-io-perm-")
        os.chmod(root, 0o755)
        secret = os.path.join(root, "secret.bin")
        make_file(secret, b"x" * 4096)
        os.chmod(secret, 0o000)
        locked = os.path.join(root, "locked")
        os.mkdir(locked, 0o555)
        d = drv.mem_alloc(4096)
        cmt.io.default_settings()  # the library is loaded before privileges go
        try:
            if os.getuid() == 0:
                os.setuid(65534)
            for path, mode in ((secret, "r"), (secret, "r+"), (os.path.join(locked, "new.bin"), "w")):
                try:
                    cmt.io.open(path, mode).read((d, 4096))
                    raise AssertionError(f"{path} opened with {mode}")
                except PermissionError as e:
                    assert e.filename == path and e.errno == errno.EACCES, e
        finally:
            if os.getuid() == 0:
                os.chmod(locked, 0o755)
    ''')


def test_the_wrong_direction_for_the_handles_mode(run_python, tmp_path):
    run_scenario(run_python, f'''
        path = os.path.join({str(tmp_path)!r}, "f.bin")
        data = pattern(MiB, 1)
        make_file(path, data)
        d = drv.mem_alloc(MiB)
        with cmt.io.open(path, "r") as f:
            for call in (lambda: f.write((d, MiB)), lambda: f.pwrite((d, MiB)), lambda: f.write_async((d, MiB), 0)):
                try:
                    call()
                    raise AssertionError("a read-only handle took a write")
                except io.UnsupportedOperation as e:
                    assert "cannot write" in str(e) and path in str(e)
        with cmt.io.open(path, "a") as f:
            try:
                f.read((d, MiB))
                raise AssertionError("a write-only handle took a read")
            except io.UnsupportedOperation as e:
                assert "cannot read" in str(e)
        assert open(path, "rb").read() == data
    ''')


def test_a_buffer_smaller_than_the_size_is_refused_before_any_io(run_python, tmp_path):
    run_scenario(run_python, f'''
        path = os.path.join({str(tmp_path)!r}, "f.bin")
        data = pattern(MiB, 2)
        make_file(path, data)
        d = device_with(b"\\x44" * MiB)
        with cmt.io.open(path, "r+") as f:
            for call in (lambda: f.read((d, MiB), size=MiB + 1), lambda: f.write((d, MiB), size=MiB, dev_offset=1),
                         lambda: f.pread(bytearray(10), size=11), lambda: f.read_async((d, 100), 0, size=101),
                         lambda: f.read((d, MiB), file_offset=-1), lambda: f.read((d, MiB), dev_offset=MiB + 1)):
                try:
                    call()
                    raise AssertionError("a transfer larger than its buffer was taken")
                except ValueError as e:
                    assert "buffer holds" in str(e) or "negative" in str(e), e
            try:
                f.read(b"read-only bytes")
                raise AssertionError("bytes were read into")
            except ValueError as e:
                assert "read-only" in str(e)
            # A range the driver does not know as one device allocation: found before any I/O too.
            try:
                f.read((d + MiB - 10, 100))
                raise AssertionError("a range past its allocation was taken")
            except ValueError as e:
                assert "not device memory" in str(e)
        assert open(path, "rb").read() == data and drv.peek(d, MiB) == b"\\x44" * MiB
    ''')


def test_a_full_disk_raises_with_the_file_the_offset_and_the_os_error(run_python):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    run_scenario(run_python, '''
        d = device_with(pattern(2 * MiB, 3))
        s = drv.stream_create()
        with cmt.io.open("/dev/full", "w") as full:
            for name, call in (("write", lambda: full.write((d, 2 * MiB), file_offset=8192)),
                               ("host write", lambda: full.write(bytearray(2 * MiB), file_offset=8192)),
                               ("pwrite", lambda: full.pwrite((d, 2 * MiB), file_offset=8192).get()),
                               ("write_async", lambda: full.write_async((d, 2 * MiB), s, file_offset=8192)
                                                           .check_bytes_done(timeout=60))):
                try:
                    call()
                    raise AssertionError(f"{name} to /dev/full succeeded")
                except cmt.io.FileIOError as e:
                    assert isinstance(e, OSError) and e.errno == errno.ENOSPC, (name, e)
                    assert e.filename == "/dev/full" and e.offset == 8192, (name, e)
                    assert "No space left on device (writing at offset 8192)" in str(e), (name, str(e))
    ''')


def test_a_write_past_the_file_size_limit_leaves_the_file_as_it_was(run_python, tmp_path):
    # RLIMIT_FSIZE with SIGXFSZ ignored: a write past the limit fails with EFBIG once it has written
    # up to the limit; the file goes back to its size before the write.
    run_scenario(run_python, f'''
        import resource, signal
        path = os.path.join({str(tmp_path)!r}, "f.bin")
        before = pattern(6 * MiB, 4)
        make_file(path, before)
        d = device_with(pattern(10 * MiB, 5))
        s = drv.stream_create()
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (8 * MiB, 8 * MiB))
        with cmt.io.open(path, "r+") as f:
            for name, call in (("device write", lambda: f.write((d, 10 * MiB), file_offset=4 * MiB)),
                               ("host write", lambda: f.write(np.zeros(10 * MiB, np.uint8), file_offset=4 * MiB)),
                               ("pwrite", lambda: f.pwrite((d, 10 * MiB), file_offset=4 * MiB).get()),
                               ("write_async", lambda: f.write_async((d, 10 * MiB), s, file_offset=4 * MiB)
                                                        .check_bytes_done(timeout=60))):
                try:
                    call()
                    raise AssertionError(f"{{name}} past the limit succeeded")
                except cmt.io.FileIOError as e:
                    assert e.errno == errno.EFBIG and e.filename == path, (name, e)
                    assert 4 * MiB <= e.offset <= 8 * MiB, (name, e.offset)
                assert os.path.getsize(path) == 6 * MiB, (name, os.path.getsize(path))
        with cmt.io.open(path, "a") as f:  # an append past the limit: cut back to where it began
            try:
                f.write((d, 4 * MiB))
                raise AssertionError("an append past the limit succeeded")
            except cmt.io.FileIOError as e:
                assert e.errno == errno.EFBIG
        assert os.path.getsize(path) == 6 * MiB
        assert open(path, "rb").read(4 * MiB) == before[:4 * MiB]  # bytes before the writes are untouched
    ''')


def test_a_closed_file_refuses_transfers(run_python, tmp_path):
    run_scenario(run_python, f'''
        path = os.path.join({str(tmp_path)!r}, "f.bin")
        make_file(path, b"abc")
        f = cmt.io.open(path)
        f.close()
        f.close()  # twice is fine
        assert f.closed
        try:
            f.read(bytearray(3))
            raise AssertionError("a closed file took a read")
        except ValueError as e:
            assert "closed file" in str(e)
    ''')
