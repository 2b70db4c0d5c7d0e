"""`cmt bench load` against the stand-in driver: every scenario plainly and under `cmt run`, the result
file, the burners and probes gone afterwards (also on Ctrl-C and SIGTERM), bad input, no GPU.

Host memory plays device memory here, so the figures mean nothing, and until the engine runs copies
concurrently cmt takes one copy at a time per process: the tests check that copies are right, made
through cmt on the cmt side, and measured, never that concurrency is faster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cmt.bench import load, load_children
from cmt.cli import main
from cmt.errors import CmtError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# Tiny copies, staged by the built-in plan (it passes copies under 1 MiB to the driver).
TINY = ("--quick", "--sizes", "1M", "--busy", "0,1", "--copy-size", "1M", "--thread-size", "1M",
        "--threads", "3", "--counts", "1,2")


def start_bench(fake_driver_dir: Path, *args: str, env: dict[str, str] | None = None, prelude: str = "",
                cwd: Path | None = None) -> subprocess.Popen:
    """`cmt bench load ARGS` against the stand-in driver, as a process of its own (its id names its
    children); `prelude` is Python run first in it."""
    ld = [str(fake_driver_dir), *([os.environ["LD_LIBRARY_PATH"]] if os.environ.get("LD_LIBRARY_PATH") else [])]
    full = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(ld), **(env or {})}
    code = prelude + "import sys; from cmt.cli import main; sys.argv[0] = 'cmt'; main()"
    return subprocess.Popen([sys.executable, "-c", code, "bench", "load", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=full, cwd=cwd)


def run_bench(fake_driver_dir: Path, *args: str, env: dict[str, str] | None = None, prelude: str = "",
              cwd: Path | None = None, timeout: float = 120) -> tuple[subprocess.CompletedProcess, int]:
    proc = start_bench(fake_driver_dir, *args, env=env, prelude=prelude, cwd=cwd)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), proc.pid


def left_behind(bench_pid: int) -> list[str]:
    """Burners and probes of the bench process `bench_pid` still alive (their command lines name it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        burner = any(load_children._BURNER_MARK in a for a in argv) and str(bench_pid) in argv
        probe = "cmt.bench.load_probe" in argv and str(bench_pid) in argv
        if (burner or probe) and state != "Z":
            found.append(f"{entry.name}: {' '.join(argv)[:120]}")
    return found


def rows_of(doc: dict, scenario: str) -> list[dict]:
    return [r for r in doc["results"] if r["scenario"] == scenario]


# -- the whole bench, plain and under cmt ---------------------------------------------------------------
def test_every_scenario_runs_plain_and_under_cmt(fake_driver_dir: Path, tmp_path: Path):
    out = tmp_path / "out"
    proc, pid = run_bench(fake_driver_dir, *TINY, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert not left_behind(pid)
    doc = json.loads((out / "load.json").read_text())
    assert (doc["format"], doc["version"]) == ("cmt-bench-load", 1)
    for key in ("gpu", "pcie_gen", "cpu_model", "cpu_cores", "usable_cpus", "driver_cuda_version", "cmt_version",
                "date", "hardware_id"):
        assert key in doc["machine"]
    assert doc["machine"]["gpu"] == "Fake CUDA Device" and doc["date"]
    assert doc["cmt"]["version"] and doc["cmt"]["plan"]
    plan = doc["plan"]
    assert plan["scenarios"] == list(load.SCENARIOS) and plan["rounds"] == 1 and plan["busy"] == [0, 1]
    assert (plan["sizes"], plan["copy_bytes"], plan["thread_bytes"], plan["threads"], plan["counts"]) == (
        [1 << 20], 1 << 20, 1 << 20, 3, [1, 2])
    assert plan["quick"] is True and doc["failures"] == [] and doc["timing"]

    keys = {"busy": {(r["busy_threads"], r["direction"]) for r in rows_of(doc, "busy")},
            "duplex": {r["direction"] for r in rows_of(doc, "duplex")},
            "processes": {(r["processes"], tuple(r["gpus"])) for r in rows_of(doc, "processes")},
            "threads": {(r["direction"], tuple(r["gpus"])) for r in rows_of(doc, "threads")}}
    assert keys == {"busy": {(0, "h2d"), (0, "d2h"), (1, "h2d"), (1, "d2h")}, "duplex": {"both"},
                    "processes": {(1, (0,)), (2, (0,))}, "threads": {("h2d", (0,)), ("d2h", (0,))}}
    for row in doc["results"]:
        assert row["staged"] is True, row
        for side in ("plain", "cmt"):
            s = row[side]
            assert s["errors"] == [] and len(s["runs"]) == 1, (row["scenario"], side, s)
            assert 0 < s["min_gbps"] <= s["median_gbps"] <= s["max_gbps"]
            assert s["pinned_median_gbps"] > 0 and s["vs_pinned"] > 0
            run = s["runs"][0]
            assert run["gbps"] > 0 and run["pinned_gbps"] > 0
            outcomes = run["pageable"]["cmt_outcomes"] if row["scenario"] == "busy" else run["cmt_outcomes"]
            if side == "plain":
                assert outcomes is None and "lanes_most" not in run  # no cmt in the plain processes
            elif row["scenario"] == "processes":  # each process's copies (a warm-up, 2 timed) went through cmt
                assert len(outcomes) == row["processes"]
                # the node's segment counted lanes while they copied (sampled: a copy of under a
                # millisecond may be missed), never over its budget
                assert 0 <= run["lanes_most"] <= run["node_budget"] and run["node_budget"] >= 1, run
                for o in outcomes:
                    assert sum(o["pageable"]["h2d"].values()) == 3 and o["pageable"]["h2d"].get("accelerated"), o
                    assert o["pinned"]["h2d"] == {"pinned_host": 3}, o
            else:
                # (copies at once of 4 MiB or less that find the GPU's pipeline busy go to the driver)
                seen = outcomes[row["direction"] if row["direction"] != "both" else "h2d"]
                assert seen.get("accelerated", 0) + seen.get("pipelines_busy", 0) >= 1, outcomes
        assert row["cmt_vs_plain"] > 0 and len(row["cmt_vs_plain_pairs"]) == 1

    for row in rows_of(doc, "busy"):
        for side in ("plain", "cmt"):
            run = row[side]["runs"][0]
            assert run["pageable"]["verified"] and run["pinned"]["verified"]
            assert run["burners_running"] == row["busy_threads"]  # they burned until the probe ended
            assert run["pageable"]["repeats"] == len(run["pageable"]["seconds"]) >= 2
            assert run["pinned"]["repeats"] == len(run["pinned"]["seconds"]) >= 2
    for row in rows_of(doc, "duplex") + rows_of(doc, "threads") + rows_of(doc, "processes"):
        for side in ("plain", "cmt"):
            run = row[side]["runs"][0]
            assert run["verified"] is True
            copies = 2 if row["scenario"] == "duplex" else row.get("processes") or row["threads"]
            assert len(run["devices"]) == copies and set(run["devices"]) == {0}
            for mode in ("pageable", "pinned"):
                assert len(run[mode]["seconds"]) == 2 and all(x > 0 for x in run[mode]["seconds"])
                assert len(run[mode]["copy_gbps"]) == copies
    pids = {r[s]["runs"][0]["pid"] for r in rows_of(doc, "duplex") + rows_of(doc, "threads") for s in ("plain", "cmt")}
    assert len(pids) == 4  # a process per side and scenario

    assert (out / "load.png").read_bytes().startswith(PNG_MAGIC)
    for title in ("busy host", "both directions at once", "processes copying at once", "threads of one process"):
        assert title in proc.stdout
    assert "lanes" in proc.stdout
    assert "wrote" in proc.stderr and "Traceback" not in proc.stderr


def test_rounds_json_on_stdout_and_no_plot(fake_driver_dir: Path, tmp_path: Path):
    out = tmp_path / "o"
    proc, _ = run_bench(fake_driver_dir, *TINY, "--scenarios", "duplex", "--processes", "2", "--repeats", "3",
                        "--json", "--no-plot", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc == json.loads((out / "load.json").read_text())
    assert not (out / "load.png").exists()
    (row,) = doc["results"]
    assert doc["plan"]["rounds"] == 2 and doc["plan"]["groups"]["timed"] == 3
    for side in ("plain", "cmt"):
        assert [r["round"] for r in row[side]["runs"]] == [0, 1]
        assert all(len(r["pageable"]["seconds"]) == 3 for r in row[side]["runs"])
    assert len(row["cmt_vs_plain_pairs"]) == 2


def test_default_folder_and_no_matplotlib(fake_driver_dir: Path, tmp_path: Path):
    """Without --out the files go to ./cmt-bench-DATE, as `cmt bench copy`'s do; without matplotlib the
    plot is skipped with one line and the JSON is written all the same."""
    proc, _ = run_bench(fake_driver_dir, *TINY, "--scenarios", "threads", cwd=tmp_path,
                        prelude="import sys; sys.modules['matplotlib'] = None; ")
    assert proc.returncode == 0, proc.stderr
    assert ("cmt: PNG plot skipped: matplotlib is not installed (pip install 'cudamemcpy-tuner[plot]')"
            in proc.stderr.splitlines())
    (folder,) = tmp_path.glob("cmt-bench-*")
    assert sorted(p.name for p in folder.iterdir()) == ["load.json"]


def test_two_gpus_round_robin(fake_driver_dir: Path, tmp_path: Path):
    out = tmp_path / "o"
    proc, pid = run_bench(fake_driver_dir, *TINY, "--scenarios", "processes,threads", "--no-plot",
                          "--out", str(out), env={"FAKE_CUDA_DEVICES": "2"})
    assert proc.returncode == 0, proc.stderr
    assert not left_behind(pid)
    doc = json.loads((out / "load.json").read_text())
    assert doc["plan"]["gpus"] == [0, 1]
    processes = {(r["processes"], tuple(r["gpus"])): r for r in rows_of(doc, "processes")}
    assert set(processes) == {(1, (0,)), (2, (0,)), (2, (0, 1))}  # one process on two GPUs is one GPU
    assert processes[(2, (0, 1))]["cmt"]["runs"][0]["devices"] == [0, 1]
    threads = {(r["direction"], tuple(r["gpus"])): r for r in rows_of(doc, "threads")}
    assert set(threads) == {(d, g) for d in ("h2d", "d2h") for g in ((0,), (0, 1))}
    for (_d, gpus), row in threads.items():
        for side in ("plain", "cmt"):
            run = row[side]["runs"][0]
            assert run["devices"] == [gpus[i % len(gpus)] for i in range(3)] and run["verified"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stopped_run_leaves_no_process_and_no_folder(fake_driver_dir: Path, tmp_path: Path, sig):
    out = tmp_path / "o"
    proc = start_bench(fake_driver_dir, "--quick", "--scenarios", "busy", "--busy", "2", "--sizes", "64M",
                       "--processes", "20", "--out", str(out))
    try:
        deadline = time.monotonic() + 60
        while len([x for x in left_behind(proc.pid) if load_children._BURNER_MARK in x]) < 2:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the burners never started"
            time.sleep(0.02)
        time.sleep(0.2)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == (1 if sig == signal.SIGINT else 128 + sig), err
    assert "Traceback" not in err
    if sig == signal.SIGTERM:
        assert "cmt: stopped by SIGTERM; nothing written" in err
    assert not left_behind(proc.pid)
    assert not out.exists()


# -- probes that fail or hang --------------------------------------------------------------------------
def test_a_failing_or_silent_probe_is_an_error_not_a_hang(fake_driver_dir: Path, monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", str(fake_driver_dir))
    with load_children.Children() as children:
        runner = load.Runner(children, None, timeout_s=30)
        got = runner.run("plain", {"kind": "driven", "jobs": [{"device": 5, "direction": "h2d", "bytes": 4096}]})
        assert got.result is None and "GPU 5 does not exist" in got.error
        got = runner.run_processes("plain", [{"kind": "driven", "jobs": [{"device": d, "direction": "h2d",
                                                                          "bytes": 4096}]} for d in (0, 5)],
                                   load.Repeats(0, 1))
        assert got.result is None and "process 2 of 2" in got.error and "GPU 5 does not exist" in got.error
        silent = load.Runner(children, None, timeout_s=1)
        monkeypatch.setattr(silent, "argv", lambda side, spec: [sys.executable, "-c", "import time; time.sleep(60)"])
        t0 = time.monotonic()
        got = silent.run_processes("plain", [{}, {}], load.Repeats(0, 1))
        assert "said nothing for 1 s" in got.error and time.monotonic() - t0 < 20
        got = silent.run("cmt", {})
        assert got.error == "cmt probe ran past 1 s (killed)"
        assert not children.procs


def test_a_probe_on_the_wrong_side_is_refused(fake_driver_dir: Path, monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", str(fake_driver_dir))
    with load_children.Children() as children:
        runner = load.Runner(children, None)
        runner.prefix["cmt"] = []  # a "cmt" probe that is not under cmt
        spec = {"kind": "groups", "groups": [{"name": "g", "warmup": 0, "repeats": 1,
                                              "jobs": [{"device": 0, "direction": "d2h", "bytes": 4096}]}]}
        assert runner.run("plain", spec).result["under_cmt"] is False
        assert "ran without cmt on the cmt side" in runner.run("cmt", spec).error


# -- bad input, no GPU, under cmt run ------------------------------------------------------------------
def invoke(*args: str):
    return CliRunner().invoke(main, ["bench", "load", *args])


@pytest.mark.parametrize("args, message", [
    (["--scenarios", "busy,idle"], "unknown scenario 'idle'"),
    (["--scenarios", ","], "no scenario given"),
    (["--busy", "4,x"], "busy 'x' is not a whole number"),
    (["--busy", "-1"], "busy '-1' is below 0"),
    (["--busy", ""], "the busy list is empty"),
    (["--counts", "0,2"], "process count '0' is below 1"),
    (["--sizes", "1M,huge"], "'huge' is not a size"),
    (["--copy-size", "0"], "'0' is not a whole, positive number of bytes"),
])
def test_bad_input_is_a_usage_error(args, message):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert f"cmt: {message}" in (getattr(result, "stderr", "") or result.output)


def test_click_usage_errors_exit_2():
    assert invoke("--processes", "0").exit_code == 2
    assert invoke("--threads", "0").exit_code == 2
    assert invoke("--frobnicate").exit_code == 2


def test_help_lists_the_command_and_its_options():
    result = CliRunner().invoke(main, ["bench", "--help"])
    assert result.exit_code == 0 and "load" in result.output
    result = invoke("--help")
    for opt in ("--scenarios", "--processes", "--busy", "--sizes", "--counts", "--threads", "--copy-size",
                "--thread-size", "--gpus", "--repeats", "--quick", "--out", "--json", "--no-plot", "--config"):
        assert opt in result.output


def test_no_gpu_is_one_clear_line_and_no_folder(fake_driver_dir: Path, tmp_path: Path):
    out = tmp_path / "a" / "b"
    proc, _ = run_bench(fake_driver_dir, "--quick", "--out", str(out), env={"FAKE_CUDA_DEVICES": "0"})
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "cmt: no NVIDIA GPU / driver found: cuInit failed with CUDA_ERROR_NO_DEVICE"]
    assert not (tmp_path / "a").exists()


def test_missing_gpu_in_the_list(fake_driver_dir: Path, tmp_path: Path):
    proc, _ = run_bench(fake_driver_dir, "--quick", "--gpus", "0,3", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "cmt: GPU 3 does not exist: 1 GPU found" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_refuses_to_run_under_cmt_run(fake_driver_dir: Path, tmp_path: Path):
    from cmt import native

    proc, _ = run_bench(fake_driver_dir, "--quick", "--out", str(tmp_path / "o"),
                        env={"LD_PRELOAD": str(native.library_path())})
    assert proc.returncode == 2
    assert "cmt bench load must not run under `cmt run`" in proc.stderr and "Traceback" not in proc.stderr


# -- pieces ------------------------------------------------------------------------------------------------
def test_parse_counts():
    assert load.parse_counts("0, 4,8,4", "busy", 0) == [0, 4, 8]
    with pytest.raises(CmtError, match="more than 1024"):
        load.parse_counts("2000", "busy", 0)


def test_rows_take_medians_over_processes_and_pair_the_rounds():
    row = load.new_row("duplex", True, direction="both", bytes=1)
    for rnd, (plain, cmt) in enumerate([(10, 30), (12, 20), (8, 40)]):
        row["plain"]["runs"].append({"round": rnd, "gbps": plain, "pinned_gbps": 50})
        row["cmt"]["runs"].append({"round": rnd, "gbps": cmt, "pinned_gbps": 40})
    load.finish_row(row)
    assert (row["plain"]["median_gbps"], row["plain"]["min_gbps"], row["plain"]["max_gbps"]) == (10, 8, 12)
    assert row["cmt"]["median_gbps"] == 30 and row["cmt"]["vs_pinned"] == 0.75
    assert row["cmt_vs_plain"] == 3.0 and row["cmt_vs_plain_pairs"] == [3.0, 1.667, 5.0]
    assert "outcome" not in row["cmt"]
    assert load.finish_row(load.new_row("busy", False))["cmt"].get("median_gbps") is None


def test_shares_against_the_mean_rate():
    # two copies of 3 GB: one took 3 s, the other 1 s; then both 2 s
    got = load._shares([([0.0, 0.0], [3.0, 1.0]), ([5.0, 5.0], [7.0, 7.0])], [3 * 10**9] * 2)
    assert (got["share_min"], got["share_max"]) == (0.75, 1.25)  # medians of (0.5, 1) and (1.5, 1)
    assert got["copy_gbps"] == [1.25, 2.25]


def test_no_child_survives_its_parent(fake_driver_dir: Path, tmp_path: Path):
    """A bench killed outright (SIGKILL: no clean-up runs) still takes its burners and probes with it."""
    proc = start_bench(fake_driver_dir, "--quick", "--scenarios", "busy", "--busy", "2", "--sizes", "64M",
                       "--processes", "20", "--out", str(tmp_path / "o"))
    try:
        deadline = time.monotonic() + 60
        while len(left_behind(proc.pid)) < 3:  # two burners and a probe
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()
    deadline = time.monotonic() + 10
    while left_behind(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left_behind(proc.pid)
