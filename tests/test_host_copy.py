"""Large host memcpy/memmove calls under `cmt run` (native/src/host_copy.hpp): split over cmt's
threads in a process that uses CUDA, exact in every case, counted, and off with one pass rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cmt.native import library_path

SOURCE = (Path(__file__).resolve().parent / "preloaded" / "host_copies.cpp").read_text()
MIB = 1 << 20
PLAN = "h2d:0=pass;d2h:0=pass;h2h:1048576=threads:4,buffers:1,chunk_bytes:262144"
CASES = ["small", "large", "large into never-touched pages", "large, odd size and alignment",
         "just below the threshold", "at the threshold", "memmove, apart", "memmove, overlapping forward",
         "memmove, overlapping backward", "eight threads at once", "in a signal handler",
         "copies interrupted by a handler that copies", "in a forked child"]


def run(run_c_program, tmp_path, plan: str, big: int = 8 * MIB, threshold: int = MIB,
        source: str = SOURCE) -> tuple[list[str], dict]:
    """Runs a test program of tests/preloaded under cmt: the cases it passed, and cmt's statistics."""
    proc = run_c_program(source, tmp_path, args=[str(big), str(threshold)], timeout=240,
                         env={"LD_PRELOAD": str(library_path()), "CMT_PLAN": plan})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    return [line[3:] for line in lines if line.startswith("ok ")], json.loads(lines[-1])


def test_large_host_copies_are_exact_in_every_case_and_go_over_the_threads(run_c_program, tmp_path):
    passed, stats = run(run_c_program, tmp_path, PLAN)
    assert passed == CASES
    host = {k: v for k, v in stats["h2h"].items() if v[0]}
    # Staged: most large copies. The handler's and the forked child's, overlapping memmoves and the
    # threads that found the pool taken took the plain path; none below the threshold was counted.
    assert host["accelerated"][0] >= 10, host
    # (the program's own large memsets are counted here too: `touched` where already faulted in)
    assert set(host) <= {"accelerated", "resources", "backed_off", "touched"}, host
    assert all(v[1] >= MIB * v[0] for v in host.values()), host


def test_one_pass_rule_turns_host_copies_off(run_c_program, tmp_path):
    passed, stats = run(run_c_program, tmp_path, "h2d:0=pass;d2h:0=pass;h2h:0=pass")
    assert passed == CASES
    assert not any(v[0] for k, v in stats["h2h"].items() if k != "below_minimum"), stats["h2h"]


@pytest.mark.parametrize("threshold", [MIB, 4 * MIB])
def test_the_threshold_is_the_first_staged_rule(run_c_program, tmp_path, threshold):
    plan = f"h2d:0=pass;d2h:0=pass;h2h:0=pass;h2h:{threshold}=threads:4,buffers:1,chunk_bytes:262144"
    passed, stats = run(run_c_program, tmp_path, plan, big=2 * threshold, threshold=threshold)
    assert "at the threshold" in passed
    counted = [v for v in stats["h2h"].values() if v[0]]
    assert counted and min(v[1] / v[0] for v in counted) >= threshold  # nothing smaller was seen
