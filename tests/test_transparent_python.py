"""Transparent storage end to end: a Python program under `cmt run` (the stand-in driver) that copies a
cold mmapped file to the device and reads a file with FileIO.readinto gets the file's bytes, and
CMT_STATS shows a copy 'from_file' and a read split over the lanes (docs/storage.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

PROGRAM = r"""
import ctypes, json, mmap, os, sys
from fake_cuda.fake_client import Driver

path, n = sys.argv[1], 32 << 20
data = bytes((i * 2654435761 >> 13) & 0xFF for i in range(1 << 16)) * (n >> 16)
with open(path, "wb") as f:
    f.write(data)
    f.flush()
    os.fsync(f.fileno())
fd = os.open(path, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
drv = Driver()
drv.init_primary(0)
dev = drv.mem_alloc(n)
with open(path, "r+b") as f:
    m = mmap.mmap(f.fileno(), n, access=mmap.ACCESS_WRITE)
    src = ctypes.c_char.from_buffer(m)
    drv.memcpy("cuMemcpyHtoD_v2", dev, ctypes.addressof(src), n)
    back = ctypes.create_string_buffer(n)
    drv.memcpy("cuMemcpyDtoH_v2", ctypes.addressof(back), dev, n)
    assert back.raw == data, "the device got other bytes than the mapping's"
    del src
    m.close()
buf = bytearray(n + 4096)
with open(path, "rb", buffering=0) as f:
    assert f.readinto(buf) == n and bytes(buf[:n]) == data and f.tell() == n
stats = ctypes.CDLL(None).cmt_stats_json
stats.restype = ctypes.c_int
out = ctypes.create_string_buffer(1 << 16)
stats(out, len(out))
print(out.value.decode())
"""


def test_a_python_program_under_cmt_run_copies_mapped_files_and_reads_through_the_lanes(fake_driver_dir, tmp_path):
    env = {**os.environ, "LD_LIBRARY_PATH": str(fake_driver_dir), "PYTHONPATH": str(TESTS),
           "CMT_TEST_HOOKS": "wait_setup=1,rotational=0"}
    r = subprocess.run([sys.executable, "-m", "cmt", "run", "--", sys.executable, "-c", PROGRAM,
                        str(tmp_path / "weights.bin")], capture_output=True, text=True, env=env, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    stats = json.loads(r.stdout.splitlines()[-1])
    assert stats["reads"]["split"] == [1, 32 << 20], stats["reads"]
    on_tmpfs = subprocess.run(["stat", "-f", "-c", "%T", str(tmp_path)], capture_output=True,
                              text=True).stdout.strip() == "tmpfs"
    if not on_tmpfs:  # a page cache that can be dropped: the copy came from the file
        assert stats["h2d"]["from_file"] == [1, 32 << 20], stats["h2d"]
