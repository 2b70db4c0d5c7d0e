"""`cmt bench copy`: measurement helpers, the result file, the plot, and a sweep against the stand-in
driver (host memory plays device memory, so the figures mean nothing; the plumbing does)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cmt import machine, native
from cmt.bench import copy_sweep, report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def bench_cmd(run_python, *args: str, env=None) -> subprocess.CompletedProcess:
    return run_python("import sys; from cmt.cli import main; sys.argv[0] = 'cmt'; main()",
                      args=("bench", *args), env=env)


# -- pure helpers ---------------------------------------------------------------------------------
def test_repeats_fall_with_size_within_bounds():
    reps = copy_sweep.Repetitions(warmup=1, least=3, most=50, target_bytes=64 << 20)
    assert reps.repeats(4096) == 50
    assert reps.repeats(16 << 20) == 4
    assert reps.repeats(1 << 30) == 3
    assert copy_sweep.Repetitions(fixed=7).repeats(4096) == 7


def test_cpu_thread_counts_double_up_to_the_cores():
    assert copy_sweep.cpu_thread_counts(1) == [1]
    assert copy_sweep.cpu_thread_counts(16) == [1, 2, 4, 8, 16]
    assert copy_sweep.cpu_thread_counts(12) == [1, 2, 4, 8, 12]


def test_tasks_cover_every_mode_and_skip_pinned_fresh():
    plan = copy_sweep.SweepPlan([4096, 1 << 20], list(copy_sweep.DIRECTIONS), list(copy_sweep.MODES), [1, 2])
    tasks = plan.tasks()
    assert len(tasks) == 2 * (3 + 3 + 2 + 2 + 1)
    assert not [t for t in tasks if t.mode == "pinned" and t.direction == "d2h-fresh"]
    assert {t.threads for t in tasks if t.mode == "cpu"} == {1, 2}
    assert [t.nbytes for t in tasks if t.mode == "cmt" and t.direction == "h2h"] == [4096, 1 << 20]


def test_random_pattern_blocks_differ():
    data = copy_sweep.random_pattern((16 << 20) + 5)
    assert len(data) == (16 << 20) + 5
    half = 8 << 20
    assert not np.array_equal(data[:half], data[half:2 * half])
    assert np.array_equal(data[:4096], copy_sweep.random_pattern(4096))  # same seed, same bytes


def test_result_median_and_spread():
    r = copy_sweep.Result("pinned", "h2d", 10**9, [1.0, 0.5, 0.25], warmup=1, verified=True)
    assert r.median_gbps == pytest.approx(2.0)
    q = r.gbps_quantiles()
    assert (q["min"], q["max"]) == (pytest.approx(1.0), pytest.approx(4.0))
    doc = r.to_json()
    assert doc["repeats"] == 3 and doc["verified"] is True and doc["min_gbps"] <= doc["median_gbps"] <= doc["max_gbps"]


def test_hardware_id_ignores_dates_and_versions():
    fp = {"gpu": "NVIDIA H200", "pcie_gen": 5, "pcie_width": 16, "cpu_model": "Xeon", "cpu_cores": 16,
          "numa_nodes": 1, "date": "2026-01-01", "driver_version": "580"}
    later = {**fp, "date": "2027-01-01", "driver_version": "590", "cmt_version": "9"}
    assert machine.hardware_id(fp) == machine.hardware_id(later)
    assert re.fullmatch(r"[0-9a-f]{12}", machine.hardware_id(fp))
    assert machine.hardware_id({**fp, "pcie_width": 8}) != machine.hardware_id(fp)
    assert machine.slug(fp).startswith("nvidia-h200-pcie5x16-")


def _synthetic_doc() -> dict:
    sizes = [4096, 1 << 20, 64 << 20]
    results = []
    for n in sizes:
        for d, modes in (("h2d", ("pageable", "pinned", "cmt")), ("d2h", ("pageable", "pinned", "cmt")),
                         ("d2h-fresh", ("pageable", "cmt"))):
            for i, m in enumerate(modes):
                results.append(copy_sweep.Result(m, d, n, [n / (1 + i) / 1e9] * 3, 1, verified=True,
                                                 outcome="accelerated" if m == "cmt" else None).to_json())
        for t in (1, 2):
            results.append(copy_sweep.Result("cpu", "h2h", n, [n / t / 1e9], 1, threads=t).to_json())
    plan = copy_sweep.SweepPlan(sizes, list(copy_sweep.DIRECTIONS), list(copy_sweep.MODES), [1, 2])
    machine = {"gpu": "Test GPU", "pcie_gen": 5, "pcie_width": 16, "cpu_cores": 2, "date": "2026-12-02T00:00:00"}
    return copy_sweep.document([], machine, {"plan": ""}, plan, copy_sweep.FULL, False) | {"results": results}


def test_plot_and_tables_from_a_document(tmp_path: Path):
    doc = _synthetic_doc()
    png = report.plot_copy(doc, tmp_path / "copy.png")
    assert png.read_bytes().startswith(PNG_MAGIC)
    tables = report.copy_tables(doc)
    assert [t.title.split(":")[0] for t in tables] == [
        "host to device", "device to host", "device to host, into fresh memory", "Host memcpy (pageable)"]


# -- the sweep against the stand-in driver ----------------------------------------------------------
def _load(out: Path) -> dict:
    return json.loads((out / "copy.json").read_text())


def test_quick_sweep_writes_verified_results_json_and_plot(run_python, tmp_path: Path):
    out = tmp_path / "out"
    proc = bench_cmd(run_python, "copy", "--sizes", "4K,1M", "--quick", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    doc = _load(out)
    assert (doc["format"], doc["version"]) == ("cmt-bench-copy", 1)
    m = doc["machine"]
    for key in ("gpu", "pcie_gen", "pcie_width", "cpu_model", "cpu_cores", "numa_nodes", "driver_version",
                "driver_cuda_version", "cmt_version", "date", "hardware_id"):
        assert key in m
    assert m["gpu"] == "Fake CUDA Device" and m["driver_cuda_version"] == "13.0"
    assert doc["cmt"]["plan"] and doc["cmt"]["version"]
    assert doc["settings"]["sizes"] == [4096, 1 << 20]
    results = doc["results"]
    seen = {(r["mode"], r["direction"], r["bytes"]) for r in results}
    for n in (4096, 1 << 20):
        for d in ("h2d", "d2h"):
            assert {("pageable", d, n), ("pinned", d, n), ("cmt", d, n)} <= seen
        assert {("pageable", "d2h-fresh", n), ("cmt", "d2h-fresh", n)} <= seen
        assert {r["threads"] for r in results if r["mode"] == "cpu" and r["bytes"] == n} == set(
            doc["settings"]["cpu_threads"])
    for r in results:
        assert r["verified"] is True
        assert 0 < r["min_gbps"] <= r["median_gbps"] <= r["max_gbps"]
        assert r["repeats"] >= 3
    assert all(r["outcome"] for r in results if r["mode"] == "cmt")
    assert (out / "copy.png").read_bytes().startswith(PNG_MAGIC)
    assert "host to device" in proc.stdout


def test_json_flag_prints_the_document_and_no_plot_skips_the_png(run_python, tmp_path: Path):
    out = tmp_path / "o"
    proc = bench_cmd(run_python, "--sizes", "64K", "--directions", "h2d", "--modes", "pageable,cmt",
                     "--repeats", "2", "--warmup", "0", "--json", "--no-plot", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == _load(out)
    assert not (out / "copy.png").exists()
    assert {(r["mode"], r["direction"]) for r in _load(out)["results"]} == {("pageable", "h2d"), ("cmt", "h2d")}
    assert all(r["repeats"] == 2 and r["warmup"] == 0 for r in _load(out)["results"])


def test_tuned_file_drives_the_cmt_mode(run_python, tmp_path: Path):
    tuned = tmp_path / "tuned.json"
    tuned.write_text(json.dumps({"format": "cmt-tuned-config", "version": 1,
                                 "h2d": [{"min_bytes": 0, "threads": 2, "buffers": 4, "chunk_bytes": 65536}],
                                 "d2h": [{"min_bytes": 0, "mode": "pass"}]}))
    out = tmp_path / "o"
    proc = bench_cmd(run_python, "copy", "--sizes", "256K", "--directions", "h2d,d2h", "--modes", "cmt",
                     "--quick", "--no-plot", "--config", str(tuned), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    doc = _load(out)
    assert doc["cmt"]["config"] == str(tuned)
    assert doc["cmt"]["plan"].startswith("h2d:0=threads:2,buffers:4,chunk_bytes:65536,stores:cached")
    outcome = {r["direction"]: r["outcome"] for r in doc["results"]}
    assert outcome == {"h2d": "accelerated", "d2h": "below_minimum"}


def test_engine_measurement_with_explicit_settings(run_python):
    """What `cmt tune` calls: measure() with explicit Settings on an open device."""
    code = """
import json
import time
from cmt import cuda
from cmt.bench import copy_sweep
from cmt.config import Settings
drv = cuda.load()
dev = drv.open_device(0)
with copy_sweep.CopyBench(drv, dev, 1 << 20) as b:
    r = copy_sweep.measure(b, "cmt", "d2h", 1 << 20, repeats=3, warmup=1, settings=Settings(2, 4, 128 << 10))
print(json.dumps(r.to_json()))
"""
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["outcome"] == "accelerated" and r["verified"] and r["repeats"] == 3
    assert r["settings"] == {"threads": 2, "buffers": 4, "chunk_bytes": 128 << 10, "stores": "cached"}


# -- bad input and missing hardware ----------------------------------------------------------------
@pytest.mark.parametrize("env, message", [
    ({"FAKE_CUDA_DEVICES": "0"}, "no NVIDIA GPU / driver found"),
])
def test_no_gpu_is_a_clear_error(run_python, tmp_path: Path, env, message):
    proc = bench_cmd(run_python, "copy", "--quick", "--out", str(tmp_path / "o"), env=env)
    assert proc.returncode == 1
    assert f"cmt: {message}" in proc.stderr and "Traceback" not in proc.stderr


def test_missing_gpu_ordinal(run_python, tmp_path: Path):
    proc = bench_cmd(run_python, "copy", "--quick", "--device", "3", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2
    assert "cmt: GPU 3 does not exist: 1 GPU found" in proc.stderr and "Traceback" not in proc.stderr


def test_refuses_to_run_under_cmt_run(run_python, tmp_path: Path):
    from cmt import native

    proc = bench_cmd(run_python, "copy", "--quick", "--out", str(tmp_path / "o"),
                     env={"LD_PRELOAD": str(native.library_path())})
    assert proc.returncode == 2
    assert "must not run under `cmt run`" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.gpu
def test_real_gpu_quick_sweep(tmp_path: Path):
    proc = subprocess.run([sys.executable, "-m", "cmt", "bench", "copy", "--quick", "--sizes", "1M,64M",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = _load(tmp_path)
    assert all(r["verified"] for r in doc["results"])
    pinned = [r for r in doc["results"] if r["mode"] == "pinned" and r["bytes"] == 64 << 20]
    assert all(r["median_gbps"] > 1 for r in pinned)


def test_engine_timeline_shows_the_lanes_and_every_block(run_python):
    """CMT_TRACE=1: the last copy's steps, as used to tune the engine on a GPU machine."""
    code = """
import json, time
from cmt import cuda, native
from cmt.bench import copy_sweep
from cmt.config import Settings
drv = cuda.load()
dev = drv.open_device(0)
with copy_sweep.CopyBench(drv, dev, 8 << 20) as b:
    t0 = time.monotonic_ns()
    for direction in ("h2d", "d2h"):
        b.copy_seconds("cmt", direction, 8 << 20, Settings(3, 4, 1 << 20))
        tl = native.last_timeline()
        tl["t0"] = t0
        print(json.dumps(tl))
"""
    proc = run_python(code, env={"CMT_TRACE": "1"})
    assert proc.returncode == 0, proc.stderr
    for direction, line in enumerate(proc.stdout.strip().splitlines()[-2:]):
        tl = json.loads(line)
        # 8 MiB in 1 MiB blocks, ramped (see test_only_device_to_host_copies_ramp_down)
        blocks = native.transfer_blocks(("h2d", "d2h")[direction], 8 << 20, 1 << 20)
        n = len(blocks)
        assert tl["direction"] == direction and tl["bytes"] == 8 << 20 and tl["blocks"] == n and tl["lanes"] == 3
        assert tl["block_bytes"] == blocks and tl["block_fill"] == [0] * n
        steps = tl["steps"]
        names = [s[2] for s in steps]
        assert names[0] == "copy_start" and names[-1] == "copy_end"
        # The calling thread always works; a worker only if it entered before every piece was claimed
        # (on a loaded machine the caller may claim the last piece first), and then it starts and ends.
        started = sorted(s[1] for s in steps if s[2] == "lane_start")
        assert started[0] == 0 and set(started) <= {0, 1, 2} and len(set(started)) == len(started)
        assert started == sorted(s[1] for s in steps if s[2] == "lane_end")
        assert sorted(s[3] for s in steps if s[2] == "dma_queued") == list(range(n))
        times = [s[0] for s in steps]
        assert tl["t0"] <= times[0] <= times[-1] <= time.monotonic_ns()
        # The DMA stream's own times, one [start, end] per block: one stream, so they never overlap
        # (blocks may be queued out of order when lanes finish them out of order).
        gpu = sorted(tl["dma_gpu"])
        assert len(gpu) == n and all(0 <= s <= e for s, e in gpu)
        assert all(gpu[i][1] <= gpu[i + 1][0] for i in range(n - 1)), gpu
    untraced = run_python("from cmt import native; print(native.last_timeline())")
    assert untraced.returncode == 0 and untraced.stdout.strip() == "None", untraced.stderr


def traced_copies(run_python, directions: tuple[str, ...], threads: int, env: dict[str, str] | None = None,
                  stores: str = "cached") -> list[dict]:
    """The engine's timeline (CMT_TRACE=1) of one 8 MiB copy per direction, in 1 MiB blocks over
    four slots, in a fresh process with `env`."""
    code = f"""
import json
from cmt import cuda, native
from cmt.bench import copy_sweep
from cmt.config import Settings
drv = cuda.load()
with copy_sweep.CopyBench(drv, drv.open_device(0), 8 << 20) as b:
    for direction in {directions!r}:
        b.copy_seconds("cmt", direction, 8 << 20, Settings({threads}, 4, 1 << 20, stores={stores!r}))
        print(json.dumps(native.last_timeline()))
"""
    proc = run_python(code, env={"CMT_TRACE": "1", **(env or {})})
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.strip().splitlines()[-len(directions):]]


def test_only_device_to_host_copies_ramp_down(run_python):
    """Both directions ramp up from chunk/8; device-to-host copies then ramp down, host-to-device
    ones run full blocks to the end. The engine runs along its exported geometry
    (native.transfer_blocks, what `cmt tune`'s model reads)."""
    h2d, d2h = traced_copies(run_python, ("h2d", "d2h"), threads=3)
    up, down = [128 << 10, 256 << 10, 512 << 10], [576 << 10, 320 << 10, 128 << 10, 128 << 10]
    assert d2h["block_bytes"] == up + [1 << 20] * 6 + down == native.transfer_blocks("d2h", 8 << 20, 1 << 20)
    assert h2d["block_bytes"] == up + [1 << 20] * 7 + [128 << 10] == native.transfer_blocks("h2d", 8 << 20, 1 << 20)


@pytest.mark.parametrize("stores", ["cached", "stream"])
def test_the_rules_stores_fill_or_drain_every_block(run_python, stores):
    """The rule's `stores` applies to every block of a copy, ramps included, in both directions."""
    for tl in traced_copies(run_python, ("h2d", "d2h"), threads=3, stores=stores):
        assert tl["block_fill"] == [int(stores == "stream")] * tl["blocks"]


def test_cmt_mode_below_the_plans_minimum_makes_the_programs_own_call(run_python):
    """Under `cmt run` a copy the plan passes through reaches the driver as the program made it:
    the benchmark's cmt mode must then time that same call, not the C API's asynchronous one."""
    code = """
import ctypes, json
from cmt import cuda, native
from cmt.bench import copy_sweep
drv = cuda.load()
fake = ctypes.CDLL("libcuda.so.1")
fake.fakecuda_call_count.restype = ctypes.c_longlong
dev = drv.open_device(0)
print(json.dumps([native.plan_stages("h2d", 4096), native.plan_stages("h2d", 64 << 20)]))
with copy_sweep.CopyBench(drv, dev, 1 << 20) as b:
    for direction, sync_call in (("h2d", b"cuMemcpyHtoD_v2"), ("d2h", b"cuMemcpyDtoH_v2")):
        before = [fake.fakecuda_call_count(n) for n in (sync_call, b"cuMemcpyHtoDAsync_v2", b"cuMemcpyDtoHAsync_v2")]
        b.copy_seconds("cmt", direction, 4096)
        after = [fake.fakecuda_call_count(n) for n in (sync_call, b"cuMemcpyHtoDAsync_v2", b"cuMemcpyDtoHAsync_v2")]
        print(json.dumps([b.last_outcome, [a - c for a, c in zip(after, before)]]))
"""
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(x) for x in proc.stdout.strip().splitlines()[-3:]]
    assert lines[0] == [False, True]
    assert lines[1] == ["below_minimum", [1, 0, 0]] and lines[2] == ["below_minimum", [1, 0, 0]]


def test_never_touched_destinations_get_more_lanes(run_python):
    """A device-to-host copy into memory not faulted in yet runs on at least min(16, usable CPUs)
    lanes; one into touched memory keeps the rule's thread count."""
    fresh, touched = traced_copies(run_python, ("d2h-fresh", "d2h"), threads=2)
    assert fresh["lanes"] == max(2, min(16, len(os.sched_getaffinity(0))))
    assert touched["lanes"] == 2


def test_lanes_spin_through_the_dma_tail(run_python):
    """A host-to-device copy returns while its last blocks still wait for the copy engine; the lanes
    spin through that estimated tail (here 64 MiB queued: the 2 ms cap), so that a program which
    waits for the copy and calls again finds them awake (CMT_SPIN_US=0: no spinning otherwise).
    Only samples read within 1.5 ms of the copy's return (as Python saw it) count."""
    code = """
import ctypes, json, os, time
from fake_cuda.fake_client import Driver
from cmt import native
from cmt.config import Settings
drv = Driver()
drv.init_primary(0)
n = 64 << 20
src = ctypes.create_string_buffer(b"\\x5a" * n, n)
dev = drv.mem_alloc(n)
s = drv.stream_create()

def lane_states():
    states = []
    for t in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{t}/comm") as f:
            if not f.read().startswith("cmt-copy"):
                continue
        with open(f"/proc/self/task/{t}/stat") as f:
            states.append(f.read().rsplit(")", 1)[1].split()[0])
    return "".join(sorted(states))

seen = []
for _ in range(40):
    r = native.memcpy("h2d", ctypes.addressof(src), dev, n, s, Settings(4, 4, 16 << 20).as_dict())
    returned = time.monotonic()
    assert int(r) == 0 and r.outcome == "accelerated", (int(r), r.outcome)
    time.sleep(0.0005)  # long enough for idle workers to fall asleep, well inside a 2 ms spin
    states = lane_states()
    if time.monotonic() - returned < 0.0015:
        seen.append(states)
    drv.stream_sync(s)
    for _ in range(1000):  # asleep soon after, either way
        if lane_states() == "SSS":
            break
    else:
        raise SystemExit("lanes still running: " + lane_states())
    if len(seen) == 7:
        break
assert drv.peek(dev, n) == b"\\x5a" * n
print(json.dumps(seen))
"""
    proc = run_python(code, env={"CMT_SPIN_US": "0"})
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(seen) >= 3, seen
    awake = sum(s == "RRR" for s in seen)
    # Unloaded, every sample says it: all awake. A loaded machine can still preempt the program
    # between the copy's end and its clock: a margin of two samples.
    assert awake >= len(seen) - 2, seen


def test_a_copy_does_not_wait_for_workers_that_start_late(run_python):
    """Workers that start after the calling thread has claimed every piece are not waited for: with
    every worker 300 ms late, a copy of 8 MiB over 4 lanes is done by the calling thread alone, long
    before, and its bytes are right. (The engine used to wait for every lane to check in.)"""
    code = """
import json, time
from cmt import cuda, native
from cmt.bench import copy_sweep
from cmt.config import Settings
drv = cuda.load()
with copy_sweep.CopyBench(drv, drv.open_device(0), 8 << 20) as b:
    s = Settings(4, 4, 1 << 20)
    seconds = []
    for direction in ("h2d", "d2h"):
        for _ in range(3):
            seconds.append(b.copy_seconds("cmt", direction, 8 << 20, s))
            tl = native.last_timeline()
            assert [st[1] for st in tl["steps"] if st[2] == "lane_start"] == [0], tl["steps"][:8]
        b.verify("cmt", direction, 8 << 20, s)
print(json.dumps(seconds))
"""
    proc = run_python(code, env={"CMT_TRACE": "1", "CMT_TEST_HOOKS": "late_start_us=300000"})
    assert proc.returncode == 0, proc.stderr
    seconds = json.loads(proc.stdout.strip().splitlines()[-1])
    assert max(seconds) < 0.15, seconds
