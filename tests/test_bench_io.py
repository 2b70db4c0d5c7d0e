"""`cmt bench io`: the CPU type end to end, the page cache (eviction, residency), the O_DIRECT probe,
the gdsio line, the JSON, the GPU types against the stand-in driver (with stand-ins of KvikIO and of
cmt.io where those are missing), and every kind of bad input."""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from cmt.bench import io as io_bench
from cmt.bench import io_files, io_report
from cmt.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MiB = 1 << 20
GDSIO = re.compile(
    r"^IoType: (READ|WRITE|RANDREAD|RANDWRITE) XferType: (\S+) Threads: (\d+) DataSetSize: (\d+)/(\d+)\(KiB\) "
    r"IOSize: (\d+)\(KiB\) Throughput: (\d+\.\d{6}) GiB/sec, Avg_Latency: (\d+\.\d{6}) usecs ops: (\d+) "
    r"total_time (\d+\.\d{6}) secs$")
SMALL = ["-s", "4M", "-i", "256K,all", "-w", "2", "--repeats", "2", "--batch", "16", "--direct-streams", "2"]


def invoke(*args: str):
    return CliRunner().invoke(main, ["bench", "io", *args])


def _err(result) -> str:
    return getattr(result, "stderr", "") or result.output


def _memory_fs(path: Path) -> bool:
    return io_files.filesystem_type(path) in io_files.MEMORY_FILESYSTEMS


@pytest.fixture
def disk_dir(tmp_path: Path) -> Path:
    """A folder on a filesystem with a disk under it (page-cache eviction means something there)."""
    if _memory_fs(tmp_path):
        pytest.skip(f"{tmp_path} is on {io_files.filesystem_type(tmp_path)}: no page cache to evict")
    return tmp_path


def _doc(out: Path) -> dict:
    return json.loads((out / "io.json").read_text())


# -- the gdsio line -------------------------------------------------------------------------------
def test_gdsio_line_has_gdsio_format():
    r = {"mode": "read", "pattern": "sequential", "xfer_type": "CPUONLY", "threads_used": 8, "bytes": 10485760 * 1024,
         "file_size": 10485760 * 1024, "io_size": 4 * MiB, "gib_per_s": 0.9402, "avg_latency_us": 4153.464453,
         "ops": 2560, "seconds": 10.636039}
    line = io_bench.gdsio_line(r)
    assert line == ("IoType: READ XferType: CPUONLY Threads: 8 DataSetSize: 10485760/10485760(KiB) IOSize: 4096(KiB) "
                    "Throughput: 0.940200 GiB/sec, Avg_Latency: 4153.464453 usecs ops: 2560 total_time 10.636039 secs")
    assert GDSIO.match(line)
    rand = io_bench.gdsio_line({**r, "mode": "write", "pattern": "random"})
    assert rand.startswith("IoType: RANDWRITE XferType: CPUONLY ")
    batch = io_bench.gdsio_line({**r, "pattern": "batch", "xfer_type": "CMT"})
    assert batch.startswith("IoType: RANDREAD XferType: CMT_BATCH ")


# -- the CPU type end to end ------------------------------------------------------------------------
def test_cpu_reads_and_writes_sequential(disk_dir: Path):
    out = disk_dir / "out"
    result = invoke("-D", str(disk_dir), "-x", "cpu", *SMALL, "--out", str(out))
    assert result.exit_code == 0, _err(result)
    lines = [line.split("  (")[0] for line in result.output.splitlines() if line.startswith("IoType:")]
    assert lines and all(GDSIO.match(line) for line in lines)
    doc = _doc(out)
    assert doc["format"] == "cmt-bench-io" and doc["machine"]["cpu_cores"] >= 1
    assert doc["file"]["size"] == 4 * MiB and doc["file"]["removed_at_end"] is True
    assert not Path(doc["file"]["path"]).exists()  # made in -D's folder: removed
    runs = doc["runs"]
    # read: 2 I/O sizes x (warm, cold) x 2 repeats + the batch x (warm, cold) x 2; write: 2 sizes x cold x 2
    assert len(runs) == 8 + 4 + 4
    assert {r["gdsio"] for r in runs} == set(lines)
    for r in runs:
        if r["pattern"] == "batch":
            assert r["bytes"] == 16 * 64 * 1024 and r["ops"] == 16
        else:
            assert r["bytes"] == 4 * MiB  # one pass over the file
            assert r["ops"] == (2 if r["io_label"] == "all" else 16)
        assert r["gbps"] > 0 and r["seconds"] > 0 and r["avg_latency_us"] > 0
        assert 0 <= r["resident_before"] <= 1 and 0 <= r["resident_after"] <= 1
    cold = [r for r in runs if r["mode"] == "read" and r["cache"] == "cold"]
    warm = [r for r in runs if r["mode"] == "read" and r["cache"] == "warm"]
    assert all(r["resident_before"] < 0.05 for r in cold) and all(r["cache_as_asked"] for r in cold)
    assert all(r["resident_before"] > 0.99 for r in warm)
    assert all(r["synced"] for r in runs if r["mode"] == "write")
    assert {(s["mode"], s["pattern"], s["cache"]) for s in doc["summaries"]} == {
        ("read", "sequential", "warm"), ("read", "sequential", "cold"), ("read", "batch", "warm"),
        ("read", "batch", "cold"), ("write", "sequential", "cold")}
    for s in doc["summaries"]:
        assert s["repeats"] == 2 and s["min_gbps"] <= s["median_gbps"] <= s["max_gbps"]
    assert doc["ratios"] == []  # no cmt, nothing to compare it with
    assert doc["disk"]["read"]["available"] and doc["disk"]["read"]["limit_gbps"] > 0
    cold_summary = next(s for s in doc["summaries"] if s["cache"] == "cold" and s["pattern"] == "sequential")
    assert cold_summary["vs_disk"] == pytest.approx(cold_summary["median_gbps"] / doc["disk"]["read"]["limit_gbps"])
    assert list(doc["xfer_types"]) == ["cpu"]
    assert doc["xfer_types"]["cpu"]["status"] == "ran" and doc["xfer_types"]["cpu"]["xfer_type"] == "CPUONLY"
    assert (out / "io.png").read_bytes().startswith(PNG_MAGIC)


def test_cpu_random_and_a_given_file_is_kept(disk_dir: Path):
    given = disk_dir / "data.bin"
    given.write_bytes(os.urandom(2 * MiB))
    out = disk_dir / "out"
    result = invoke("-f", str(given), "-x", "1", "-I", "2,3", "--overwrite", "-i", "64K", "-w", "3", "--repeats", "1",
                    "--batch", "0", "--direct-streams", "off", "--json", "--no-plot", "--out", str(out))
    assert result.exit_code == 0, _err(result)
    doc = json.loads(result.stdout)
    assert given.exists() and given.stat().st_size == 2 * MiB and doc["file"]["removed_at_end"] is False
    assert doc["plan"]["random"] is True and doc["disk"] == {}
    assert {r["pattern"] for r in doc["runs"]} == {"random"}
    assert {r["gdsio"].split()[1] for r in doc["runs"]} == {"RANDREAD", "RANDWRITE"}
    assert all(r["bytes"] == 2 * MiB and r["ops"] == 32 for r in doc["runs"])  # every block once
    assert not (out / "io.png").exists()
    assert "IoType: RANDREAD" in result.stderr  # with --json the gdsio lines go to stderr


def test_duration_limit_keeps_going_around(tmp_path: Path):
    out = tmp_path / "out"
    result = invoke("-D", str(tmp_path), "-x", "cpu", "-s", "1M", "-i", "64K", "-w", "1", "-T", "0.3", "-I", "read",
                    "--cache", "warm", "--repeats", "1", "--batch", "0", "--direct-streams", "off", "--no-plot",
                    "--out", str(out))
    assert result.exit_code == 0, _err(result)
    (run,) = _doc(out)["runs"]
    assert run["seconds"] >= 0.3
    assert run["bytes"] > MiB and run["bytes"] % (64 << 10) == 0


# -- page cache and disk ------------------------------------------------------------------------------
def test_residency_after_write_evict_and_load(disk_dir: Path):
    path = disk_dir / "f.bin"
    io_files.create_file(path, 8 * MiB)
    assert path.stat().st_size == 8 * MiB
    assert io_files.residency(path) > 0.95  # just written
    io_files.evict(path)
    assert io_files.residency(path) < 0.05
    with path.open("rb") as f:  # half of it read back
        f.read(4 * MiB)
    assert 0.45 < io_files.residency(path) <= 1.0
    io_files.evict(path)
    io_files.load(path, 8 * MiB)
    assert io_files.residency(path) > 0.99
    with path.open("r+b") as f:  # dirty pages are written back first, then dropped
        f.write(b"x" * MiB)
    io_files.evict(path)
    assert io_files.residency(path) < 0.05


def test_created_blocks_differ(tmp_path: Path):
    path = tmp_path / "f.bin"
    io_files.create_file(path, 32 * MiB + 4096)
    data = path.read_bytes()
    assert len(data) == 32 * MiB + 4096
    assert data[:16 * MiB] != data[16 * MiB:32 * MiB]  # stamped with their offsets


def test_direct_probe_on_a_disk(disk_dir: Path):
    tf = io_files.TestFile(disk_dir / "f.bin", 8 * MiB, True, io_files.filesystem_type(disk_dir))
    io_files.create_file(tf.path, tf.size)
    for mode in ("read", "write"):
        got = io_files.probe_disk(tf, mode, [1, 3], repeats=2, duration=None, block=MiB)
        assert got["available"], got["reason"]
        assert [r["streams"] for r in got["runs"]] == [1, 3]
        assert all(len(r["gbps"]) == 2 and r["min_gbps"] <= r["median_gbps"] <= r["max_gbps"] for r in got["runs"])
        assert got["limit_gbps"] == max(r["median_gbps"] for r in got["runs"])
    assert tf.path.stat().st_size == 8 * MiB  # O_DIRECT writes stay inside the file


def test_direct_probe_falls_back_on_tmpfs(tmp_path: Path):
    shm = Path("/dev/shm")
    if not shm.is_dir() or io_files.filesystem_type(shm) != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm")
    tf = io_files.prepare(None, str(shm), MiB, MiB, writes=True, overwrite=False)
    try:
        got = io_files.probe_disk(tf, "read", [2], repeats=1, duration=None)
        assert not got["available"] and got["limit_gbps"] is None and got["runs"] == []
        assert "tmpfs, which keeps files in memory" in got["reason"]
    finally:
        tf.discard()
    assert not tf.path.exists()
    result = invoke("-D", str(shm), "-x", "cpu", "-s", "1M", "-i", "256K", "-w", "1", "--repeats", "1", "--batch", "0",
                    "--no-plot", "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, _err(result)
    doc = _doc(tmp_path / "out")
    assert not doc["disk"]["read"]["available"] and doc["file"]["filesystem"] == "tmpfs"
    cold = [s for s in doc["summaries"] if s["cache"] == "cold"]
    assert cold and not any(s["cache_as_asked"] for s in cold)  # tmpfs cannot be evicted: said, not hidden
    assert all(s["vs_disk"] is None for s in doc["summaries"])


def test_direct_probe_when_o_direct_is_refused(tmp_path: Path, monkeypatch):
    tf = io_files.TestFile(tmp_path / "f.bin", MiB, True, "somefs")
    io_files.create_file(tf.path, tf.size)
    real_open = os.open

    def no_direct(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(io_files.os, "open", no_direct)
    got = io_files.probe_disk(tf, "read", [2], repeats=1, duration=None)
    assert not got["available"] and got["reason"] == "the filesystem (somefs) refuses O_DIRECT: Invalid argument"


# -- types that cannot run ----------------------------------------------------------------------------
def test_kvikio_reported_unavailable_when_not_installed(tmp_path: Path):
    if importlib.util.find_spec("kvikio") is not None:
        pytest.skip("kvikio is installed here")
    ok, skipped = io_bench.available(["cpu", "kvikio", "cufile"], None)
    assert ok == ["cpu"] and skipped["kvikio"] == "kvikio is not installed"
    assert "cuda.bindings.cufile" in skipped["cufile"]
    out = tmp_path / "out"
    result = invoke("-D", str(tmp_path), "-x", "cpu,kvikio", "-s", "1M", "-w", "1", "-i", "256K", "-I", "read",
                    "--repeats", "1", "--batch", "0", "--direct-streams", "off", "--no-plot", "--out", str(out))
    assert result.exit_code == 0, _err(result)
    assert "skipping kvikio: kvikio is not installed" in _err(result)
    doc = _doc(out)
    assert doc["xfer_types"]["kvikio"]["status"] == "skipped"
    assert {r["xfer"] for r in doc["runs"]} == {"cpu"}


def test_only_unavailable_types_is_an_error(tmp_path: Path):
    if importlib.util.find_spec("kvikio") is not None:
        pytest.skip("kvikio is installed here")
    result = invoke("-D", str(tmp_path), "-x", "kvikio", "--out", str(tmp_path / "out"))
    assert result.exit_code == 1
    assert "cmt: no transfer type can run here (kvikio: kvikio is not installed" in _err(result)
    assert not list(tmp_path.glob("cmt-bench-io-*"))  # nothing made


# -- bad input -------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["-x", "cpu,warp"], "unknown transfer type 'warp'"),
    (["-I", "sideways"], "unknown I/O mode 'sideways'"),
    (["-i", "4K,banana"], "'banana' is not a size"),
    (["-i", ","], "the I/O size list is empty"),
    (["-w", "0"], "thread count '0' is below 1"),
    (["--cache", "tepid"], "unknown cache state 'tepid'"),
    (["--direct-streams", "x"], "stream count 'x' is not a whole number"),
    (["-s", "1G:4K"], "'1G:4K' is not a size"),
])
def test_bad_options(tmp_path: Path, args, message):
    result = invoke("-D", str(tmp_path), *args, "--out", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    assert f"cmt: {message}" in _err(result)
    assert "Traceback" not in _err(result)


@pytest.mark.parametrize("where, message", [
    ("missing", "folder {p} does not exist"),
    ("a-file", "{p} is not a folder"),
    ("/proc", "cannot write to folder /proc"),
])
def test_bad_folders(tmp_path: Path, where, message):
    p = {"missing": tmp_path / "nope", "a-file": tmp_path / "a-file", "/proc": Path("/proc")}[where]
    if where == "a-file":
        p.write_text("")
    result = invoke("-D", str(p), "-x", "cpu", "--out", str(tmp_path / "out"))
    assert result.exit_code == 2 and f"cmt: {message.format(p=p)}" in _err(result), _err(result)


def test_unwritable_folder_by_permissions(tmp_path: Path):
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    result = invoke("-D", str(locked), "-x", "cpu", "--out", str(tmp_path / "out"))
    assert result.exit_code == 2 and f"cmt: cannot write to folder {locked}: Permission denied" in _err(result)


def test_bad_files(tmp_path: Path):
    small = tmp_path / "small.bin"
    small.write_bytes(b"x" * 4096)
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    cases = [
        (["-f", str(small), "-s", "1M"], f"{small} holds 4K, less than --file-size 1M"),
        (["-f", str(empty)], f"{empty} is empty"),
        (["-f", str(tmp_path)], f"{tmp_path} is not a regular file"),
        (["-f", str(small), "-I", "write"], f"writing would overwrite {small}: add --overwrite"),
        (["-f", str(small), "-D", str(tmp_path)], "give the test file (-f/--file FILE) or a folder to make it in "
                                                  "(-D/--dir FOLDER), not both"),
        ([], "give the test file (-f/--file FILE) or a folder to make it in (-D/--dir FOLDER)"),
    ]
    for args, message in cases:
        result = invoke(*args, "-x", "cpu", "--out", str(tmp_path / "out"))
        assert result.exit_code == 2 and f"cmt: {message}" in _err(result), (args, _err(result))
    assert small.read_bytes() == b"x" * 4096


def test_not_enough_free_space(tmp_path: Path, monkeypatch):
    real = os.statvfs

    class Full:
        def __init__(self, st):
            self.f_frsize, self.f_bavail = st.f_frsize, 10

    monkeypatch.setattr(io_files.os, "statvfs", lambda p: Full(real(p)))
    result = invoke("-D", str(tmp_path), "-x", "cpu", "-s", "1M", "--out", str(tmp_path / "out"))
    assert result.exit_code == 2 and f"cmt: not enough free space in {tmp_path} for a 1M test file" in _err(result)
    assert not list(tmp_path.glob("cmt-bench-io-*"))


def test_disk_full_while_creating(tmp_path: Path, monkeypatch):
    real = os.pwrite
    written = [0]

    def fills_up(fd, data, offset):
        if written[0] >= 3 * MiB:
            raise OSError(errno.ENOSPC, "No space left on device")
        written[0] += len(data)
        return real(fd, data, offset)

    monkeypatch.setattr(io_files, "CHUNK", MiB)
    monkeypatch.setattr(io_files.os, "pwrite", fills_up)
    result = invoke("-D", str(tmp_path), "-x", "cpu", "-s", "8M", "--out", str(tmp_path / "out"))
    assert result.exit_code == 2
    assert "cmt: disk full while creating the test file" in _err(result) and "3M of 8M written" in _err(result)
    assert not list(tmp_path.glob("cmt-bench-io-*"))  # the partial file is gone


# -- GPU types against the stand-in driver ----------------------------------------------------------------
STAND_INS = '''
import ctypes, os, sys, types

def _ptr(buf):
    return buf.__cuda_array_interface__["data"][0]

class _Done:
    def __init__(self, n): self.n = n
    def get(self): return self.n

def _io(fd, write, ptr, size, off, wrong=False):
    # "device" memory of the stand-in driver is reached through its copies, as real device memory is
    from cmt import cuda
    drv = cuda.load()
    host = ctypes.create_string_buffer(size)
    if write:
        drv.memcpy_dtoh(ctypes.addressof(host), ptr, size)
        return os.pwrite(fd, host.raw, off)
    data = os.pread(fd, size, off)
    if wrong and data:
        data = bytes([data[0] ^ 0xFF]) + data[1:]
    ctypes.memmove(host, data, len(data))
    drv.memcpy_htod(ptr, ctypes.addressof(host), len(data))
    return len(data)

# KvikIO's Python surface, new (defaults.get/set) or old (num_threads_reset, a bool compat_mode)
kv = types.ModuleType("kvikio")
kv.__version__ = "0.stand-in"
state = {"num_threads": 1}
class _Defaults:
    pass
d = _Defaults()
if os.environ.get("STAND_IN_KVIKIO") == "old":
    d.num_threads_reset = lambda n: state.update(num_threads=n)
    d.get_num_threads = lambda: state["num_threads"]
    d.compat_mode = lambda: True
else:
    d.set = lambda cfg: state.update(cfg)
    d.get = lambda name: state[name]
    d.is_compat_mode_preferred = lambda: False
kv.defaults = d
class CuFile:
    def __init__(self, path, flags="r"):
        assert flags in ("r", "r+"), flags
        self.fd = os.open(path, os.O_RDWR if flags == "r+" else os.O_RDONLY)
    def pread(self, buf, size, file_offset=0):
        assert state["num_threads"] >= 1
        return _Done(_io(self.fd, False, _ptr(buf), size, file_offset))
    def pwrite(self, buf, size, file_offset=0):
        return _Done(_io(self.fd, True, _ptr(buf), size, file_offset))
    def close(self): os.close(self.fd)
kv.CuFile = CuFile
sys.modules["kvikio"] = kv

# cmt.io as its brief has it, where the real one is not there yet
import cmt
if os.environ.get("STAND_IN_CMT_IO") == "1":
    cio = types.ModuleType("cmt.io")
    class _File:
        def __init__(self, path, mode):
            assert mode in ("r", "r+"), mode
            self.fd = os.open(path, os.O_RDWR if mode == "r+" else os.O_RDONLY)
        def read(self, buf, size=None, file_offset=0, dev_offset=0):
            return _io(self.fd, False, buf[0] + dev_offset, size, file_offset,
                       wrong=bool(os.environ.get("STAND_IN_CMT_IO_WRONG")))
        def write(self, buf, size=None, file_offset=0, dev_offset=0):
            return _io(self.fd, True, buf[0] + dev_offset, size, file_offset)
        def pread(self, buf, size, file_offset=0, dev_offset=0):
            return _Done(self.read(buf, size, file_offset, dev_offset))
        def close(self): os.close(self.fd)
    cio.open = lambda path, mode="r": _File(path, mode)
    sys.modules["cmt.io"] = cio
    cmt.io = cio

from cmt.cli import main
sys.argv[0] = "cmt"
main()
'''
GPU_SMALL = ["-s", "2M", "-i", "256K,all", "-w", "2", "--repeats", "1", "--batch", "8", "--direct-streams", "off"]


def _real_cmt_io() -> bool:
    try:
        import cmt.io
    except ImportError:
        return False
    return callable(getattr(cmt.io, "open", None))


def _cmt_io_env() -> dict[str, str]:
    """The stand-in cmt.io where the real one is not there yet."""
    return {} if _real_cmt_io() else {"STAND_IN_CMT_IO": "1"}


def bench_io(run_python, *args: str, env=None) -> subprocess.CompletedProcess:
    return run_python(STAND_INS, args=("bench", "io", *args), env={"FAKE_CUDA_PAGEABLE_GBPS": "0", **(env or {})})


def test_gpu_types_against_the_stand_in_driver(run_python, tmp_path: Path):
    out = tmp_path / "out"
    proc = bench_io(run_python, "-D", str(tmp_path), "-x", "cpu,cpu-gpu,cpu-pinned-gpu,cmt,kvikio", *GPU_SMALL,
                    "--out", str(out), env=_cmt_io_env())
    assert proc.returncode == 0, proc.stderr
    doc = _doc(out)
    assert doc["machine"]["gpu"] == "Fake CUDA Device"
    assert doc["failures"] == []
    ran = {name: info for name, info in doc["xfer_types"].items() if info["status"] == "ran"}
    assert set(ran) == {"cpu", "cpu-gpu", "cpu-pinned-gpu", "cmt", "kvikio"}
    assert ran["kvikio"]["xfer_type"] == "KVIKIO_GDS" and ran["kvikio"]["path"] == "GDS"
    assert ran["cpu-pinned-gpu"]["xfer_type"] == "CPU_GPU"
    for name in ran:  # every scenario, every type, each byte checked before it was timed
        mine = [r for r in doc["runs"] if r["xfer"] == name]
        assert {(r["mode"], r["pattern"]) for r in mine} == {("read", "sequential"), ("read", "batch"),
                                                            ("write", "sequential")}
    batch = [r for r in doc["runs"] if r["pattern"] == "batch"]
    assert {r["threads_used"] for r in batch if r["xfer"] in ("cmt", "kvikio")} == {1}  # futures from one thread
    assert {r["threads_used"] for r in batch if r["xfer"] == "cpu-gpu"} == {2}
    apis = {r["xfer"]: r["batch_api"] for r in batch}
    assert apis["kvikio"] == "pread futures" and apis["cpu-gpu"] == "threads"
    assert apis["cmt"] == ("cmt.io.Batch" if _real_cmt_io() else "pread futures")  # the stand-in has no Batch
    scenarios = {io_report.scenario_key(s) for s in doc["summaries"]}
    assert {(r["other"]) for r in doc["ratios"]} == {"cpu", "cpu-gpu", "cpu-pinned-gpu", "kvikio"}
    assert {io_report.scenario_key(r) for r in doc["ratios"]} == scenarios
    for r in doc["ratios"]:
        assert r["cmt_over_other"] == pytest.approx(r["cmt_gbps"] / r["other_gbps"])
    assert "XferType: KVIKIO_GDS_BATCH" in proc.stdout and "XferType: CMT " in proc.stdout
    assert (out / "io.png").read_bytes().startswith(PNG_MAGIC)


def test_old_kvikio_api_in_compat_mode(run_python, tmp_path: Path):
    out = tmp_path / "out"
    proc = bench_io(run_python, "-D", str(tmp_path), "-x", "kvikio", *GPU_SMALL, "-I", "read", "--no-plot",
                    "--out", str(out), env={"STAND_IN_KVIKIO": "old"})
    assert proc.returncode == 0, proc.stderr
    doc = _doc(out)
    assert doc["xfer_types"]["kvikio"]["xfer_type"] == "KVIKIO_COMPAT"
    assert {r["xfer_type"] for r in doc["runs"]} == {"KVIKIO_COMPAT"}


def test_a_type_that_moves_wrong_bytes_fails_alone(run_python, tmp_path: Path):
    out = tmp_path / "out"
    proc = bench_io(run_python, "-D", str(tmp_path), "-x", "cpu-gpu,cmt", *GPU_SMALL, "-I", "read", "--batch", "0",
                    "--no-plot", "--out", str(out), env={"STAND_IN_CMT_IO": "1", "STAND_IN_CMT_IO_WRONG": "1"})
    assert proc.returncode == 1
    assert "cmt: 2 failures, the first: cmt: check: the bytes read differ from the file's" in proc.stderr
    doc = _doc(out)
    assert {r["xfer"] for r in doc["runs"]} == {"cpu-gpu"}
    assert not list(tmp_path.glob("cmt-bench-io-*"))


def test_without_a_gpu_only_the_cpu_type_runs(run_python, tmp_path: Path):
    out = tmp_path / "out"
    proc = bench_io(run_python, "-D", str(tmp_path), "-x", "cpu,cpu-gpu", *GPU_SMALL, "-I", "read", "--no-plot",
                    "--out", str(out), env={"FAKE_CUDA_DEVICES": "0"})
    assert proc.returncode == 0, proc.stderr
    assert "skipping cpu-gpu: no NVIDIA GPU / driver found" in proc.stderr
    doc = _doc(out)
    assert doc["machine"]["gpu"] == "no GPU" and {r["xfer"] for r in doc["runs"]} == {"cpu"}


def test_missing_gpu_ordinal(run_python, tmp_path: Path):
    proc = bench_io(run_python, "-D", str(tmp_path), "-x", "cpu-gpu", "-d", "3", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "cmt: GPU 3 does not exist" in proc.stderr


def test_help_lists_the_gdsio_flags():
    result = CliRunner().invoke(main, ["bench", "io", "--help"])
    assert result.exit_code == 0
    for opt in ("-f, --file", "-D, --dir", "-d, --device", "-w, --threads", "-s, --file-size", "-i, --io-size",
                "-x, --xfer", "-I, --mode", "--random / --sequential", "-T, --duration", "--cache", "--repeats",
                "--batch", "--direct-streams", "--out", "--json", "--no-plot", "--quick"):
        assert opt in result.output, opt
