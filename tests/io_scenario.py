"""Runs a storage-path scenario (cmt.io) in a child process against the stand-in driver: the engine
is process-wide, so each scenario gets a process of its own. The scenario's code asserts what it
checks; the child's exit status and output come back to the test."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable

PRELUDE = textwrap.dedent('''
    import ctypes, errno, io, json, os, sys, threading, time
    import numpy as np
    from fake_cuda.fake_client import Driver
    import cmt.io

    drv = Driver("libcuda.so.1")
    drv.init_primary(0)
    MiB = 1 << 20

    def pattern(n, seed=0):
        return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()

    def evict(path):
        """Out of the page cache (written back first: dirty pages cannot be dropped)."""
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)

    def make_file(path, data, cached=True):
        with open(path, "wb") as f:
            f.write(data)
        if not cached:
            evict(path)

    def file_and_buffer(folder, name, n, seed, cached=True):
        """A file of n pattern bytes (in the page cache or out of it), and a device buffer for them:
        (path, bytes, buffer)."""
        path = os.path.join(folder, name)
        data = pattern(n, seed)
        make_file(path, data, cached=cached)
        return path, data, drv.mem_alloc(n)

    def cold_file(folder, name, n, seed):
        return file_and_buffer(folder, name, n, seed, cached=False)

    def engine_events():
        """The engine's event counters (CMT_STATS' events: taken_over, ...)."""
        from cmt import native
        return json.loads(native._read_string(native.load().cmt_stats_json))["events"]

    def device_with(data, extra=0):
        d = drv.mem_alloc(len(data) + extra)
        if data:
            drv.poke(d, data)
        return d

    def transfer_setup(path, n, seed, direction):
        """A file and a device buffer for a transfer of n bytes: the file holds the bytes (a read) or
        the buffer does (a write, to an empty file); and a stream. Returns (bytes, buffer, stream)."""
        data = pattern(n, seed)
        make_file(path, data if direction == "read" else b"")
        d = drv.mem_alloc(n)
        if direction == "write":
            drv.poke(d, data)
        return data, d, drv.stream_create()

    def counted(fn):
        """fn()'s result and the storage counters it moved."""
        before = cmt.io.counters()
        out = fn()
        after = cmt.io.counters()
        return out, {k: after[k] - before[k] for k in after}

    def supports_o_direct(path):
        try:
            os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
            return True
        except OSError:
            return False
''')


def run_scenario(run_python: Callable, body: str, timeout: float = 240, **env: str):
    """Runs PRELUDE + body in a child; fails the test with the child's output if it fails."""
    child_env = {"PYTHONUNBUFFERED": "1", **env}
    proc = run_python(PRELUDE + textwrap.dedent(body), env=child_env, timeout=timeout)
    assert proc.returncode == 0, f"scenario failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def o_direct_works(directory: str | os.PathLike) -> bool:
    """Whether files in `directory` open with O_DIRECT (not on tmpfs)."""
    probe = os.path.join(directory, ".o_direct_probe")
    with open(probe, "wb") as f:
        f.write(b"x" * 4096)
    try:
        os.close(os.open(probe, os.O_RDONLY | os.O_DIRECT))
        return True
    except OSError:
        return False
    finally:
        os.unlink(probe)
