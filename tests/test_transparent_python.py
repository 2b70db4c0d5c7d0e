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

# Each program ends by printing cmt's statistics (cmt_stats_json) as its last line.
PRINT_STATS = r"""
stats = ctypes.CDLL(None).cmt_stats_json
stats.restype = ctypes.c_int
out = ctypes.create_string_buffer(1 << 16)
stats(out, len(out))
print(out.value.decode())
"""


def run_under_cmt(program: str, fake_driver_dir, path: Path, **env: str) -> tuple[dict, str]:
    """Runs the program under `cmt run` with the stand-in driver; its statistics and its stderr."""
    env = {**os.environ, "LD_LIBRARY_PATH": str(fake_driver_dir), "PYTHONPATH": str(TESTS), **env}
    r = subprocess.run([sys.executable, "-m", "cmt", "run", "--", sys.executable, "-c", program + PRINT_STATS,
                        str(path)], capture_output=True, text=True, env=env, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.splitlines()[-1]), r.stderr


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
"""


def test_a_python_program_under_cmt_run_copies_mapped_files_and_reads_through_the_lanes(fake_driver_dir, tmp_path):
    stats, _ = run_under_cmt(PROGRAM, fake_driver_dir, tmp_path / "weights.bin",
                             CMT_TEST_HOOKS="wait_setup=1,rotational=0")
    assert stats["reads"]["split"] == [1, 32 << 20], stats["reads"]
    on_tmpfs = subprocess.run(["stat", "-f", "-c", "%T", str(tmp_path)], capture_output=True,
                              text=True).stdout.strip() == "tmpfs"
    if not on_tmpfs:  # a page cache that can be dropped: the copy came from the file
        assert stats["h2d"]["from_file"] == [1, 32 << 20], stats["h2d"]


SLOW_READS = r"""
import ctypes, json, os, sys
from fake_cuda.fake_client import Driver

path, n = sys.argv[1], 16 << 20
data = os.urandom(n)
with open(path, "wb") as f:
    f.write(data)
Driver().init_primary(0)  # the driver is there: large reads may be split
buf = bytearray(n)
for _ in range(24):
    with open(path, "rb", buffering=0) as f:
        assert f.readinto(buf) == n and buf == data
"""


def test_split_reads_that_lose_to_the_single_call_back_off(fake_driver_dir, tmp_path):
    # From the fifth split read on, every piece waits 40 ms (lanes a busy host deschedules): the rate
    # guard measures the single call, passes reads to it, and keeps probing now and then.
    stats, err = run_under_cmt(SLOW_READS, fake_driver_dir, tmp_path / "f.bin", CMT_LOG="debug",
                               CMT_TEST_HOOKS="wait_setup=1,rotational=0,read_slow_after=4,read_slow_us=40000")
    reads = stats["reads"]
    assert reads["split"][0] >= 4 and reads["guarded"] >= 12, reads
    assert reads["split"][0] + reads["alone"][0] + reads["guarded"] == 24, reads
    assert "large file reads of 16777216+ bytes back off to the single read" in err, err[-2000:]
