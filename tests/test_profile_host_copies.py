"""`cmt profile` lists the large host copies cmt splits (h2h) by the library that made them: a small
shared library and the program itself copy known amounts through memcpy, memmove and the fortified
forms, under a tuned file whose h2h rules start at 4 MiB; the report names each caller's file with
its count, bytes and outcome (text, JSON, trace); a process without CUDA shows its copies as
no_driver; older recordings still read."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from test_profile import build, cmt_profile, lib  # noqa: F401  (fixtures)

from cmt.profile import recording

MIB = 1 << 20

# The library's copies are not its functions' last calls: a tail call to memcpy would return to
# the library's caller, and the copy would be counted there.
LIBRARY = r"""
#include <cstring>
#include <cstddef>
extern "C" int lib_copy(void* d, const void* s, size_t n) {
  memcpy(d, s, n);
  return static_cast<const char*>(d)[n - 1];
}
extern "C" int lib_move(void* d, const void* s, size_t n) {
  memmove(d, s, n);
  return static_cast<const char*>(d)[0];
}
"""

PROGRAM = r"""
#include "cmt/cuda_types.hpp"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <sys/wait.h>
#include <unistd.h>
extern "C" CUresult cuInit(unsigned);
extern "C" int lib_copy(void*, const void*, size_t);
extern "C" int lib_move(void*, const void*, size_t);
static void* (*volatile copy_fn)(void*, const void*, size_t) = memcpy;  // not inlined, not elided
int main(int argc, char** argv) {
  if (cuInit(0)) return 90;  // a process that uses CUDA: its large host copies are cmt's
  const size_t mib = 1 << 20;
  std::vector<char> a(16 * mib, 1), b(16 * mib, 2);
  int sum = 0;
  for (int i = 0; i < 3; ++i) sum += lib_copy(b.data(), a.data(), 16 * mib);  // 3 x 16 MiB
  for (int i = 0; i < 2; ++i) sum += lib_move(a.data(), b.data(), 5 * mib);   // 2 x 5 MiB
  sum += lib_copy(b.data(), a.data(), 3 * mib);                                // below 4 MiB: not seen
  copy_fn(a.data(), b.data(), 6 * mib);                                        // the program's own
  lib_move(a.data() + mib, a.data(), 8 * mib);                                 // overlapping
  if (argc > 1) {  // a forked child names the library again in its own recording
    pid_t child = fork();
    if (child == 0) {
      lib_copy(b.data(), a.data(), 16 * mib);
      _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
  }
  printf("%d\n", sum);
  return 0;
}
"""

TUNED = {"format": "cmt-tuned-config", "version": 1, "h2d": [{"min_bytes": 0, "mode": "pass"}],
         "d2h": [{"min_bytes": 0, "mode": "pass"}],
         "h2h": [{"min_bytes": 0, "mode": "pass"},
                 {"min_bytes": 4 * MIB, "threads": 4, "buffers": 1, "chunk_bytes": 1 << 20}]}


@pytest.fixture(scope="module")
def program(fake_driver_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("host_copies")
    cxx = os.environ.get("CXX", "g++")
    (out / "bigcopy.cpp").write_text(LIBRARY)
    (out / "main.cpp").write_text(PROGRAM)
    for cmd in ([cxx, "-std=c++17", "-O2", "-shared", "-fPIC", "-o", str(out / "libbigcopy.so"),
                 str(out / "bigcopy.cpp")],
                [cxx, "-std=c++17", "-O2", "-I", str(Path(__file__).resolve().parent.parent / "native" / "include"),
                 "-o", str(out / "copier"), str(out / "main.cpp"), "-L", str(out), "-lbigcopy",
                 f"-Wl,-rpath,{out}", "-L", str(fake_driver_dir), "-lcuda"]):
        res = subprocess.run(cmd, capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
    (out / "tuned.json").write_text(json.dumps(TUNED))
    return out


@pytest.fixture(scope="module")
def profiled(program, cmt_profile) -> tuple[dict, Path]:  # noqa: F811
    res = cmt_profile("--config", program / "tuned.json", "--out", program / "run.cmtprof", "--trace",
                      program / "trace.json", "--json", "--", program / "copier")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout[res.stdout.index("{"):]), program


def test_the_report_names_each_calling_library_with_its_copies(profiled):
    model, program = profiled
    host = model["host_copies"]
    rows = {r["library"]: r for r in host["by_caller"]}
    assert set(rows) == {"libbigcopy.so", "copier"}, rows
    lib_row = rows["libbigcopy.so"]
    assert lib_row["caller"] == str(program / "libbigcopy.so")
    assert (lib_row["count"], lib_row["bytes"]) == (6, 3 * 16 * MIB + 2 * 5 * MIB + 8 * MIB)
    assert lib_row["outcomes"] == {"accelerated": 5, "overlapping": 1}
    assert lib_row["functions"] == {"memcpy": 3, "memmove": 3}
    assert lib_row["seconds"] > 0 and lib_row["gbps"] > 0
    # the program's own copy, and the fills of its two vectors' never-touched pages
    assert (rows["copier"]["count"], rows["copier"]["bytes"]) == (3, 6 * MIB + 2 * 16 * MIB)
    assert rows["copier"]["functions"] == {"memcpy": 1, "memset": 2}
    assert rows["copier"]["caller"] == str(program / "copier")
    assert host["recorded_from"] == 4 * MIB and host["copies"] == 9
    assert model["processes"][0]["host_copies"] == 9 and model["processes"][0]["copies"] == 0
    assert model["totals"]["copies"] == 0 and model["groups"] == []  # host<->device copies: none


def test_the_text_report_and_the_trace_show_them(profiled, cmt_profile):  # noqa: F811
    _, program = profiled
    res = cmt_profile("--report", program / "run.cmtprof")
    assert res.returncode == 0, res.stderr
    assert "Host copies from 4 MiB (h2h), by calling library" in res.stdout
    line = next(line for line in res.stdout.splitlines() if "libbigcopy.so" in line)
    assert "│      6 │" in line and "66 MiB" in line and "accelerated 5" in line and "overlapping 1" in line
    assert "9 large host copies" in res.stdout
    trace = json.loads((program / "trace.json").read_text())
    host = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"].startswith("h2h")]
    assert len(host) == 9  # once each, on its thread's track (no stream)
    assert sum(e["args"]["caller"].endswith("libbigcopy.so") for e in host) == 6


def test_a_forked_child_names_its_callers_in_its_own_recording(program, cmt_profile, tmp_path):  # noqa: F811
    res = cmt_profile("--config", program / "tuned.json", "--out", tmp_path / "fork.cmtprof", "--",
                      program / "copier", "fork")
    assert res.returncode == 0, res.stderr
    parent, child = sorted(recording.read(tmp_path / "fork.cmtprof").processes, key=lambda p: p.forked)
    assert child.forked and child.ppid == parent.pid
    c = recording.Recording([child]).copies()
    assert list(c.caller) == [str(program / "libbigcopy.so")] and list(c.outcome) == ["forked_child"]
    assert sorted(set(parent.callers.values())) == [str(program / "copier"), str(program / "libbigcopy.so")]


def test_a_process_without_cuda_shows_its_host_copies_as_left_to_libc(cmt_profile, tmp_path):  # noqa: F811
    (tmp_path / "tuned.json").write_text(json.dumps(TUNED))
    code = "import ctypes\na = ctypes.create_string_buffer(5 << 20)\nb = ctypes.create_string_buffer(5 << 20)\n" \
           "for _ in range(2): ctypes.memmove(a, b, 5 << 20)\n"
    res = cmt_profile("--config", tmp_path / "tuned.json", "--json", "--", sys.executable, "-c", code)
    assert res.returncode == 0, res.stderr
    host = json.loads(res.stdout[res.stdout.index("{"):])["host_copies"]
    assert host["copies"] >= 2 and host["bytes"] >= 2 * (5 << 20)
    assert {o for r in host["by_caller"] for o in r["outcomes"]} == {"no_driver"}
    assert all(r["library"] != "unknown" for r in host["by_caller"])


def test_a_pass_rule_records_no_host_copies(program, cmt_profile, tmp_path):  # noqa: F811
    off = {**TUNED, "h2h": [{"min_bytes": 0, "mode": "pass"}]}
    (tmp_path / "off.json").write_text(json.dumps(off))
    res = cmt_profile("--config", tmp_path / "off.json", "--json", "--", program / "copier")
    assert res.returncode == 0, res.stderr
    model = json.loads(res.stdout[res.stdout.index("{"):])
    assert model["host_copies"]["copies"] == 0 and model["host_copies"]["recorded_from"] is None


def test_a_version_1_recording_still_reads(tmp_path):
    """Recorded before host copies existed: no h2h records, no name slots."""
    meta = b"cmt_version=0.9\ndirections=h2d,d2h\nhost_kinds=unknown,pageable\noutcomes=accelerated\n" \
           b"entries=cuMemcpyHtoD_v2\n"
    header_bytes = (64 + len(meta) + 7) & ~7
    head = struct.pack("<8sIIIIIIQQIIQ", b"CMTPROF\0", 1, header_bytes, 48, 7, 1, 0, 0, 0, len(meta), 0, 0)
    rec = struct.pack("<QQQQiIBBBBI", 10, 20, 4096, 0, 0, 7, 0, 1, 0, 0, 0)
    (tmp_path / "cmt-7.rec").write_bytes((head + meta).ljust(header_bytes, b"\0") + rec * 3)
    proc = recording.read(tmp_path / "cmt-7.rec").processes[0]
    assert len(proc.records) == 3 and proc.h2h_from is None and not proc.is_host_copy().any()
    c = recording.read(tmp_path / "cmt-7.rec").copies()
    assert list(c.direction) == ["h2d"] * 3 and list(c.caller) == [""] * 3
