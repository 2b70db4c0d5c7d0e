"""GPU test (pytest -m gpu): `cmt profile` reports exactly the copies a real PyTorch program made."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mixed_copies.py"


def test_profile_counts_match_what_the_program_made(tmp_path):
    pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, "-m", "cmt", "profile", "--json", "--out", str(tmp_path / "p.cmtprof"),
                           "--", sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    # The program's own JSON line, then the report (stdout of both share the terminal).
    lines = proc.stdout.splitlines()
    made = json.loads(next(line for line in lines if line.startswith("[{")))
    report = json.loads(proc.stdout[proc.stdout.index("{\n"):])
    got = {(g["direction"], g["host_kind"], g["bucket_bytes"]): (g["count"], g["bytes"]) for g in report["groups"]}
    want = {(m["direction"], m["host_kind"], m["bytes_each"]): (m["count"], m["count"] * m["bytes_each"]) for m in made}
    assert got == want
    assert report["totals"]["copies"] == sum(c for c, _ in want.values())
