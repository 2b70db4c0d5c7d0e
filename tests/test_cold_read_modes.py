"""research/cold_read_modes.cpp: builds, measures a small file in its --quick matrix, writes the JSON the
GPU session's `coldread` mode brings back, and reports (does not crash on) what a machine lacks: O_DIRECT
on a file system that keeps files in memory, io_uring, the time budget."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "research" / "cold_read_modes.cpp"
CXX = os.environ.get("CXX") or "g++"
QUICK = {"buffered t2 2M", "O_DIRECT t2 1M", "io_uring O_DIRECT qd8 1M", "buffered+seq t2 2M",
         "buffered+readahead t2 2M"}
RUN_KEYS = {"gbps", "seconds", "bytes", "partial", "resident_before", "resident_after", "cpu_s", "load_before",
            "load_after"}

pytestmark = pytest.mark.skipif(shutil.which(CXX) is None, reason=f"no C++ compiler ({CXX})")


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> Path:
    exe = tmp_path_factory.mktemp("cold_read_modes") / "cold_read_modes"
    res = subprocess.run([CXX, "-O2", "-std=c++17", "-pthread", "-Wall", "-Wextra", "-o", str(exe), str(SOURCE)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return exe


def run(program: Path, *args, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([str(program), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def check_report(report: dict, path: Path, size: int) -> dict:
    machine = report["machine"]
    assert machine["uname"].startswith("Linux") and machine["nproc"] >= 1 and machine["date"].endswith("Z")
    assert report["file"]["path"] == str(path) and report["file"]["size"] == size
    assert report["residency_method"] in ("cachestat", "mincore")
    assert isinstance(report["o_direct"]["available"], bool) and isinstance(report["io_uring"]["available"], bool)
    assert report["finished"] is True and report["settings"]["quick"] is True
    results = {r["name"]: r for r in report["results"]}
    assert set(results) == QUICK
    for r in results.values():
        assert r["status"] in ("ok", "skipped"), r
        if r["status"] == "ok":
            assert len(r["runs"]) == report["settings"]["repeats"] == len(r["gbps"])
            assert r["median_gbps"] > 0 and all(g > 0 for g in r["gbps"])
            for x in r["runs"]:
                assert set(x) == RUN_KEYS and x["bytes"] == size and not x["partial"]
                assert 0 <= x["resident_before"] <= 1 and 0 <= x["resident_after"] <= 1
        else:
            assert r["reason"] and not r["runs"] and r["median_gbps"] is None
    return results


def test_quick_matrix_on_disk(program, tmp_path):
    path = tmp_path / "cold.bin"
    out = tmp_path / "cold.json"
    res = run(program, path, "--make", "32M", "--quick", "--json", out)
    assert res.returncode == 0, res.stdout + res.stderr
    assert path.stat().st_size == 32 << 20 and not list(tmp_path.glob("*.making"))
    report = json.loads(out.read_text())
    results = check_report(report, path, 32 << 20)
    for name in ("buffered t2 2M", "buffered+seq t2 2M", "buffered+readahead t2 2M"):
        assert results[name]["status"] == "ok"  # buffered reads work on every file system
    direct = results["O_DIRECT t2 1M"]
    assert (direct["status"] == "ok") == report["o_direct"]["available"]
    uring = results["io_uring O_DIRECT qd8 1M"]
    if report["io_uring"]["available"] and report["o_direct"]["available"]:
        assert uring["status"] == "ok"
    else:
        assert uring["status"] == "skipped" and uring["reason"]
    for line in ("configuration", "buffered t2 2M", f"io_uring: {report['io_uring']['status']}"):
        assert line in res.stdout
    # --make again with the same size reuses the file
    again = run(program, path, "--make", "32M", "--quick", "--repeats", "1", "--seconds-max", "0")
    assert again.returncode == 0 and "reused" in again.stderr


def test_io_uring_unavailable_is_reported(program, tmp_path):
    """io_uring_setup refusing (gVisor, a seccomp filter, io_uring_disabled) leaves the rest to run."""
    path = tmp_path / "cold.bin"
    out = tmp_path / "cold.json"
    res = run(program, path, "--make", "8M", "--quick", "--json", out, env={"COLD_READ_URING_ENTRIES": "0"})
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads(out.read_text())
    results = check_report(report, path, 8 << 20)
    assert report["io_uring"]["available"] is False and report["io_uring"]["errno"] > 0
    assert report["io_uring"]["status"].startswith("unavailable (io_uring_setup: errno ")
    assert "io_uring: unavailable (io_uring_setup: errno" in res.stdout
    assert results["io_uring O_DIRECT qd8 1M"]["status"] == "skipped"
    assert results["buffered t2 2M"]["status"] == "ok"


def tmpfs_dir() -> Path | None:
    mounts = Path("/proc/mounts").read_text().splitlines() if Path("/proc/mounts").exists() else []
    for line in mounts:
        fields = line.split()
        if len(fields) > 2 and fields[2] == "tmpfs" and fields[1] in ("/dev/shm", "/run/user", "/tmp"):
            if os.access(fields[1], os.W_OK):
                return Path(fields[1])
    return None


def test_o_direct_on_tmpfs_is_skipped(program, tmp_path):
    """tmpfs refuses O_DIRECT (before Linux 6.6) or accepts it without a disk under it: either way the
    O_DIRECT and io_uring configurations are skipped with the reason, the buffered ones run."""
    base = tmpfs_dir()
    if base is None:
        pytest.skip("no writable tmpfs")
    folder = Path(subprocess.check_output(["mktemp", "-d", str(base / "cold_read_modes.XXXXXX")], text=True).strip())
    try:
        path = folder / "cold.bin"
        out = tmp_path / "cold.json"
        res = run(program, path, "--make", "8M", "--quick", "--json", out)
        assert res.returncode == 0, res.stdout + res.stderr
        report = json.loads(out.read_text())
        results = check_report(report, path, 8 << 20)
        assert report["file"]["fs_type"] == "tmpfs" and report["o_direct"]["available"] is False
        for name in ("O_DIRECT t2 1M", "io_uring O_DIRECT qd8 1M"):
            assert results[name]["status"] == "skipped"
            assert results[name]["reason"].startswith("O_DIRECT refused: ")
        assert results["buffered t2 2M"]["status"] == "ok"
        assert results["buffered t2 2M"]["runs"][0]["resident_before"] > 0.5  # tmpfs cannot be evicted
        assert "NOT COLD" in res.stdout
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_budget_and_arguments(program, tmp_path):
    path = tmp_path / "cold.bin"
    out = tmp_path / "cold.json"
    res = run(program, path, "--make", "4M", "--quick", "--seconds-max", "0", "--json", out)
    assert res.returncode == 0, res.stderr
    report = json.loads(out.read_text())
    assert report["budget_hit"] is True
    assert {r["status"] for r in report["results"]} <= {"not run", "skipped"}
    assert "--seconds-max reached" in res.stdout
    # a run past --run-seconds-max (here at once) stops issuing reads and is marked partial
    cut = run(program, path, "--quick", "--repeats", "1", "--run-seconds-max", "0", "--json", out)
    assert cut.returncode == 0, cut.stderr
    runs = [x for r in json.loads(out.read_text())["results"] for x in r["runs"]]
    assert runs and all(x["partial"] and x["bytes"] < 4 << 20 for x in runs)
    assert run(program).returncode == 2
    assert run(program, path, "--bogus").returncode == 2
    assert run(program, path, "--make", "lots").returncode == 2
    missing = run(program, tmp_path / "missing.bin")
    assert missing.returncode == 1 and "No such file" in missing.stderr
