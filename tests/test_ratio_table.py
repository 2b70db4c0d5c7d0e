"""research/ratio_table.py: cmt / pinned per run, and the median over runs per environment."""

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("ratio_table", ROOT / "research" / "ratio_table.py")
ratio_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ratio_table)


def write_run(path: Path, cmt: float, pinned: float) -> str:
    path.mkdir(parents=True)
    results = [{"mode": m, "direction": "h2d", "bytes": 64 << 20, "median_gbps": g}
               for m, g in (("pinned", pinned), ("cmt", cmt), ("pageable", 7.0))]
    (path / "copy.json").write_text(json.dumps({"results": results}))
    return str(path / "copy.json")


def test_ratio_is_cmt_over_pinned_of_the_same_run(tmp_path):
    assert ratio_table.ratios(write_run(tmp_path / "a", 40.0, 50.0)) == {("h2d", 64 << 20): 0.8}


def test_summary_groups_runs_by_environment(tmp_path, capsys, monkeypatch):
    runs = [write_run(tmp_path / "ab" / "X=1" / f"run{i}", g, 50.0) for i, g in enumerate((40.0, 45.0, 30.0))]
    runs.append(str(tmp_path / "ab" / "X=1" / "run9" / "copy.json"))  # a failed run left no file
    monkeypatch.setattr(sys, "argv", ["ratio_table.py", "--summary", *runs])
    ratio_table.main()
    assert capsys.readouterr().out.strip() == "X=1 [3 runs] h2d 64M 80% (60%-90%)"
