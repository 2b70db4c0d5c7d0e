"""`cmt bench` options, bad input (clear message, non-zero exit, no traceback), and the workload
runner with stand-in workload scripts."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from cmt.bench import report, sizes, workload_runner, workloads
from cmt.cli import main
from cmt.errors import CmtError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def invoke(*args: str):
    return CliRunner().invoke(main, ["bench", *args])


def _err(result) -> str:
    return getattr(result, "stderr", "") or result.output


# -- sizes and names ----------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("4K,1M,64M", [4096, 1 << 20, 64 << 20]),
    ("4K:64K", [4096, 8192, 16384, 32768, 65536]),
    ("1M, 4096 ,1M", [4096, 1 << 20]),
    ("1KiB,2kb,1.5M", [1024, 2048, 3 << 19]),
    ("4K:4K,1G", [4096, 1 << 30]),
])
def test_parse_sizes(text, expected):
    assert sizes.parse_sizes(text) == expected


@pytest.mark.parametrize("text, message", [
    ("", "empty"), ("4X", "not a size"), ("1M,,x", "not a size"), ("0", "positive"),
    ("1G:4K", "runs backwards"), ("0.3K", "whole"), ("128G", "larger than"), ("-4K", "not a size"),
])
def test_parse_sizes_rejects(text, message):
    with pytest.raises(CmtError, match=message):
        sizes.parse_sizes(text)


def test_format_size():
    got = [sizes.format_size(n) for n in (4096, 1 << 20, 3 << 19, 1 << 30, 1000)]
    assert got == ["4K", "1M", "1536K", "1G", "1000"]


# -- command line ---------------------------------------------------------------------------------
def test_bench_help_lists_subcommands():
    result = invoke("--help")
    assert result.exit_code == 0
    assert "copy" in result.output and "workloads" in result.output


def test_copy_help_shows_every_option():
    result = invoke("copy", "--help")
    assert result.exit_code == 0
    for opt in ("--sizes", "--directions", "--modes", "--quick", "--out", "--json", "--no-plot", "--config",
                "--device", "--repeats", "--warmup"):
        assert opt in result.output


@pytest.mark.parametrize("args, message", [
    (["--sizes", "4K,banana"], "'banana' is not a size"),
    (["copy", "--sizes", "1G:4K"], "size range '1G:4K' runs backwards"),
    (["copy", "--directions", "h2d,sideways"], "unknown direction 'sideways'"),
    (["copy", "--modes", "warp"], "unknown mode 'warp'"),
    (["copy", "--modes", ","], "no mode given"),
])
def test_bad_copy_options_exit_2_with_a_message(args, message):
    result = invoke(*args)
    assert result.exit_code == 2
    assert f"cmt: {message}" in _err(result)
    assert "Traceback" not in _err(result)


def test_unwritable_output_folder(tmp_path: Path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = invoke("copy", "--sizes", "4K", "--out", str(blocker / "sub"))
    assert result.exit_code == 2
    assert f"cmt: cannot write to output folder {blocker / 'sub'}" in _err(result)


def test_bad_tuned_file(tmp_path: Path):
    bad = tmp_path / "t.json"
    bad.write_text("{nope")
    result = invoke("copy", "--config", str(bad), "--out", str(tmp_path / "o"))
    assert result.exit_code == 2 and "is not valid JSON" in _err(result)


def test_click_usage_errors_exit_2():
    assert invoke("copy", "--repeats", "0").exit_code == 2
    assert invoke("copy", "--device", "-1").exit_code == 2


def test_workloads_list():
    result = invoke("workloads", "--list")
    assert result.exit_code == 0
    listed = [line.split()[0] for line in result.output.splitlines()]
    assert listed == workloads.names()
    for name in ("torch-tensor", "seed-torch", "seed-jax", "cupy", "hf-load", "torch-save-load", "dcp-async-save",
                 "activation-offload", "dataloader"):
        assert name in listed


def test_every_listed_workload_has_its_script():
    for w in workloads.WORKLOADS:
        assert w.path.is_file(), w.path
        assert "parse_args(" in w.path.read_text()


def test_a_workloads_own_options_are_its_scripts():
    """Each entry's args are options its script takes (its --help lists each value), and the
    model-load family covers every loader warm and cold, plus the C++ loader."""
    with_args = [w for w in workloads.WORKLOADS if w.args]
    for script in {w.path for w in with_args}:
        proc = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        for w in (w for w in with_args if w.path == script):
            for value in w.args[1::2]:
                assert value in proc.stdout, (w.name, value)
    family = [w.name for w in workloads.WORKLOADS if w.family == "model-load"]
    for loader in ("st-cuda", "st-cpu", "fastsafetensors", "runai", "instanttensor", "cmt-io", "torch-mmap",
                   "np-memmap"):
        assert f"model-load-{loader}-warm" in family and f"model-load-{loader}-cold" in family
    assert "model-load-cpp-warm" in family


@pytest.mark.parametrize("only, message", [("nope", "unknown workload 'nope'"), (",", "--only names no workload")])
def test_unknown_workload(only, message):
    result = invoke("workloads", "--only", only, "--list")
    assert result.exit_code == 2 and f"cmt: {message}" in _err(result)


def test_only_keeps_the_suite_order():
    assert [w.name for w in workloads.select("dataloader,torch-tensor")] == ["torch-tensor", "dataloader"]


def test_quick_selects_the_smoke_workloads_unless_named():
    smoke = [w.name for w in workloads.select(None, quick=True)]
    assert smoke and set(smoke) < set(workloads.names())
    assert [w.name for w in workloads.select("hf-load", quick=True)] == ["hf-load"]
    listed = [line.split()[0] for line in invoke("workloads", "--list", "--quick").output.splitlines()]
    assert listed == smoke


def test_workloads_no_gpu(run_python, tmp_path: Path):
    proc = run_python("import sys; from cmt.cli import main; sys.argv[0] = 'cmt'; main()",
                      args=("bench", "workloads", "--quick", "--out", str(tmp_path)), env={"FAKE_CUDA_DEVICES": "0"})
    assert proc.returncode == 1 and "cmt: no NVIDIA GPU / driver found" in proc.stderr


def test_workloads_missing_framework_is_a_skip(run_python, tmp_path: Path):
    missing = next((w for w, mod in (("seed-jax", "jax"), ("cupy", "cupy"), ("hf-load", "transformers"),
                                     ("torch-tensor", "torch")) if importlib.util.find_spec(mod) is None), None)
    if missing is None:
        pytest.skip("every framework is installed here")
    proc = run_python("import sys; from cmt.cli import main; sys.argv[0] = 'cmt'; main()",
                      args=("bench", "workloads", "--quick", "--only", missing, "--out", str(tmp_path)))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "workloads.json").read_text())
    (entry,) = doc["workloads"]
    assert entry["status"] == "skip" and "not installed" in entry["skip"]
    assert "\n" not in entry["skip"]
    assert (tmp_path / "workloads.png").read_bytes().startswith(PNG_MAGIC)
    assert doc["machine"]["gpu"] == "Fake CUDA Device"


# -- the runner, with stand-in scripts ------------------------------------------------------------
SCRIPTS = {
    "fast": """
        import json, sys, time
        t = time.perf_counter(); time.sleep(0.01)
        print("noise before the result")
        print(json.dumps({"inner_s": time.perf_counter() - t, "bytes": 123, "inner_label": "sleep"}))
    """,
    "skipper": """
        import json
        print(json.dumps({"skip": "FancyLib is not installed"}))
    """,
    "crasher": """
        import sys
        if "--prepare" not in sys.argv:
            raise SystemExit("boom: out of luck")
        print('{"prepared": true}')
    """,
    "silent": """
        print("no json here")
    """,
}


@pytest.fixture
def fake_workloads(tmp_path: Path) -> list[workloads.Workload]:
    out = []
    for name, body in SCRIPTS.items():
        path = tmp_path / f"{name}.py"
        path.write_text(textwrap.dedent(body))
        out.append(workloads.Workload(name, str(path), f"the {name} script"))
    return out


def test_runner_statuses_and_speedups(fake_workloads, tmp_path: Path):
    opts = workload_runner.SuiteOptions(timeout_s=60, work_dir=tmp_path)
    phases = []
    entries = workload_runner.run_suite(fake_workloads, opts, lambda w, p: phases.append((w.name, p)))
    by_name = {e["name"]: e for e in entries}
    fast = by_name["fast"]
    assert fast["status"] == "ok"
    assert fast["plain"]["inner_s"] > 0 and fast["cmt"]["inner_s"] > 0 and fast["bytes"] == 123
    # both walls are rounded to 0.1 ms, so their ratio is only that exact
    assert fast["speedup_wall"] == pytest.approx(fast["plain"]["wall_s"] / fast["cmt"]["wall_s"], rel=1e-2)
    assert fast["speedup_inner"] > 0
    assert by_name["skipper"] == {"name": "skipper", "description": "the skipper script", "status": "skip",
                                  "skip": "FancyLib is not installed"}
    assert by_name["crasher"]["status"] == "error" and "boom: out of luck" in by_name["crasher"]["error"]
    assert by_name["crasher"]["error"].startswith("plain run:")
    assert by_name["silent"]["status"] == "error" and "no JSON result line" in by_name["silent"]["error"]
    assert ("fast", "cmt") in phases and ("skipper", "cmt") not in phases
    assert ("fast", "prepare") in phases and ("crasher", "prepare") not in phases  # only the first prepares

    doc = workload_runner.document(entries, {"gpu": "Test GPU", "date": "2026-12-02"}, {"plan": ""}, True)
    json.dumps(doc)  # serialisable
    png = report.plot_workloads(doc, tmp_path / "w.png")
    assert png.read_bytes().startswith(PNG_MAGIC)
    table = report.workloads_table(doc)
    assert table.row_count == len(fake_workloads)


def test_rounds_take_plain_and_cmt_in_turn_and_report_medians(tmp_path: Path):
    # Each run reports the next value of a counter kept in a file, as its inner time: the runs' order
    # is then plain 1, cmt 2, plain 3, cmt 4, plain 5, cmt 6.
    script = tmp_path / "counter.py"
    script.write_text(textwrap.dedent(f"""
        import json, os
        path = {str(tmp_path / "n")!r}
        n = int(open(path).read()) + 1 if os.path.exists(path) else 1
        open(path, "w").write(str(n))
        print(json.dumps({{"inner_s": float(n), "bytes": 1}}))
    """))
    phases = []
    entry = workload_runner.run_workload(workloads.Workload("counter", str(script), "counts"),
                                         workload_runner.SuiteOptions(timeout_s=60, rounds=3), tmp_path,
                                         phases.append, prepare=False)
    assert phases == ["plain", "cmt"] * 3
    assert entry["plain"]["rounds_inner_s"] == [1.0, 3.0, 5.0] and entry["cmt"]["rounds_inner_s"] == [2.0, 4.0, 6.0]
    assert entry["plain"]["inner_s"] == 3.0 and entry["cmt"]["inner_s"] == 4.0
    assert entry["speedup_inner"] == 0.75 and entry["speedup_inner_rounds"] == [0.5, 0.75, round(5 / 6, 4)]
    assert len(entry["plain"]["rounds_wall_s"]) == 3 and entry["rounds"] == 3


def test_runner_passes_args_and_shares_a_familys_folder(tmp_path: Path):
    script = tmp_path / "args.py"
    script.write_text(textwrap.dedent("""
        import json, sys
        from pathlib import Path
        work = Path(sys.argv[sys.argv.index("--work-dir") + 1])
        (work / (sys.argv[2] + ".mark")).write_text("x")
        print(json.dumps({"inner_s": 0.001, "bytes": 1, "inner_label": " ".join(sys.argv[1:3]),
                          "seen": sorted(p.name for p in work.glob("*.mark"))}))
    """))
    family = [workloads.Workload(n, str(script), n, args=("--tag", n), family="fam") for n in ("a", "b")]
    alone = workloads.Workload("c", str(script), "c", args=("--tag", "c"))
    entries = workload_runner.run_suite([*family, alone], workload_runner.SuiteOptions(timeout_s=60, work_dir=tmp_path))
    assert [e["status"] for e in entries] == ["ok"] * 3, entries
    assert [e["inner_label"] for e in entries] == ["--tag a", "--tag b", "--tag c"]
    assert [e["plain"]["seen"] for e in entries] == [["a.mark"], ["a.mark", "b.mark"], ["c.mark"]]


def test_runner_timeout(tmp_path: Path):
    script = tmp_path / "slow.py"
    script.write_text("import time; time.sleep(30)\n")
    entry = workload_runner.run_workload(workloads.Workload("slow", str(script), "sleeps"),
                                         workload_runner.SuiteOptions(timeout_s=1), tmp_path)
    assert entry["status"] == "timeout" and "ran past 1 s" in entry["error"]


def test_plain_env_drops_only_cmt_from_preload():
    env = workload_runner.plain_env({"LD_PRELOAD": "/x/libcmt.so /y/libother.so", "CMT_PLAN": "h2d:0=pass"})
    assert env["LD_PRELOAD"] == "/y/libother.so" and env["CMT_PLAN"] == "h2d:0=pass"
    assert "LD_PRELOAD" not in workload_runner.plain_env({"LD_PRELOAD": "/x/libcmt.so"})
