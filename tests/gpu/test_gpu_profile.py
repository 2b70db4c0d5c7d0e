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


def _profile_report(code: str) -> dict:
    """`cmt profile --json` of a Python program: its report (after whatever the program printed)."""
    proc = subprocess.run([sys.executable, "-m", "cmt", "profile", "--json", "--", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout[proc.stdout.index("{\n"):])


def test_profile_names_the_library_of_host_copies_with_the_real_driver(tmp_path):
    """A process that uses CUDA copies 64 MiB between host buffers four times through ctypes: the
    copies are split (accelerated) and attributed to the object that called memmove."""
    code = ("import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n"
            "a = ctypes.create_string_buffer(64 << 20)\nb = ctypes.create_string_buffer(64 << 20)\n"
            "for _ in range(4): ctypes.memmove(a, b, 64 << 20)\n")
    host = _profile_report(code)["host_copies"]
    print(json.dumps(host, indent=1))
    (row,) = [r for r in host["by_caller"] if r["bytes"] >= 4 * (64 << 20)]
    assert row["count"] >= 4 and row["outcomes"].get("accelerated", 0) >= 4 and row["library"] != "unknown"


def test_profile_lists_the_pinning_calls_of_a_torch_program(tmp_path):
    """PyTorch pins 64 MiB (pin_memory=True goes through its host allocator to the driver), and
    copies a pageable 64 MiB tensor, which cmt stages through staging of its own: the report lists
    the program's pinning, at least 64 MiB in at least one call, and none of cmt's own."""
    pytest.importorskip("torch")
    code = ("import torch\nx = torch.empty(64 << 20, dtype=torch.uint8, pin_memory=True)\n"
            "y = torch.ones(64 << 20, dtype=torch.uint8).to('cuda')\ntorch.cuda.synchronize()\nprint(int(y.sum()))\n")
    pins = _profile_report(code)["pin_calls"]
    print(json.dumps(pins, indent=1))
    pinning = [r for r in pins["by_caller"] if r["call"] in ("cuMemHostAlloc", "cuMemAllocHost", "cuMemHostRegister")]
    assert pinning and pins["bytes_pinned"] >= 64 << 20 and sum(r["failed"] for r in pinning) == 0
    # cmt's staging (at least 80 MiB, registered) is not the program's: torch rounds 64 MiB up to at most 128
    assert pins["bytes_pinned"] <= 128 << 20
