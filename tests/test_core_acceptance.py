"""benchmarks/core_acceptance.py's parent side: several plain and cmt processes, each side's medians,
and ratios taken within each cmt process (its children measure on a GPU, here they are stood in for)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # core_acceptance imports child_result, as when run as a script
spec = importlib.util.spec_from_file_location("core_acceptance", ROOT / "benchmarks" / "core_acceptance.py")
core_acceptance = importlib.util.module_from_spec(spec)
spec.loader.exec_module(core_acceptance)

MIB = 1 << 20


def child_figures(pageable_h2d_64: float, pinned_h2d_64: float) -> dict:
    """What one --inner child reports, GB/s; every copy not under test at 50 (pinned 55)."""
    out = {"host_memcpy_64MiB": {"bytes": 64 * MIB, "gbps": 9.0}}
    for tag, size in (("64MiB", 64 * MIB), ("1GiB", 1024 * MIB)):
        for d in ("h2d", "d2h"):
            for name, gbps in ((f"{d}_pageable_{tag}", 50.0), (f"{d}_pinned_{tag}", 55.0),
                               (f"{d}_pinned_host_{tag}", 55.0), (f"{d}_fresh_{tag}", 25.0),
                               (f"{d}_cudamemcpy_pageable_{tag}", 50.0), (f"{d}_cudamemcpy_pinned_{tag}", 55.0)):
                out[name] = {"bytes": size, "gbps": gbps, "median_s": size / gbps / 1e9}
    out["h2d_pageable_64MiB"]["gbps"] = pageable_h2d_64
    out["h2d_pinned_64MiB"]["gbps"] = pinned_h2d_64
    return out


def test_rows_are_medians_over_processes_and_ratios_are_taken_within_each(tmp_path, monkeypatch):
    # cmt processes: 45/50, 30/40 (a busy host: its pinned copies slow too), 49/54; plain ones: 10 each
    cmt = iter([child_figures(45.0, 50.0), child_figures(30.0, 40.0), child_figures(49.0, 54.0)])
    small = iter([10.0, 10.2] * 5)

    def fake_run(cmd, env=None):
        proc = subprocess.CompletedProcess(cmd, 0, "", "")
        if cmd[-1] == "--inner-small":
            return {"h2d_4KiB_x1e5": {"bytes": 4096, "count": 100_000, "us_per_copy": next(small)}}, proc
        under_cmt = cmd[: len(core_acceptance.child_result.UNDER_CMT)] == core_acceptance.child_result.UNDER_CMT
        return (next(cmt) if under_cmt else child_figures(10.0, 55.0)), proc

    monkeypatch.setattr(core_acceptance.child_result, "run", fake_run)
    out = tmp_path / "core.json"
    monkeypatch.setattr(sys, "argv", ["core_acceptance.py", "--out", str(out), "--processes", "3"])
    core_acceptance.main()
    doc = json.loads(out.read_text())
    row = doc["summary"]["h2d_pageable_64MiB"]
    assert doc["processes"] == 3 and len(doc["runs"]["cmt"]) == 3
    assert row["cmt_gbps"] == 45.0 and row["default_gbps"] == 10.0
    # within each process 0.9, 0.75, 0.907: the median is 0.9 (a ratio of medians would say 45 / 50)
    assert row["cmt_vs_pinned_runs"] == [0.9, 0.75, 0.907] and row["cmt_vs_pinned"] == 0.9
    assert doc["cmt"]["h2d_pageable_64MiB"]["runs_gbps"] == [45.0, 30.0, 49.0]
    assert doc["summary"]["d2h_cudamemcpy_pageable_1GiB"]["cmt_vs_pinned_cudamemcpy"] == round(50 / 55, 3)
    assert doc["summary"]["host_memcpy_64MiB"] == {"default_process_gbps": [9.0] * 3, "cmt_process_gbps": [9.0] * 3}
    assert doc["summary"]["h2d_4KiB_x1e5"]["pair_slowdown_pct"] == 2.0
