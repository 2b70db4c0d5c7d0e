"""`cmt profile` lists the program's calls that pin host memory or let it go (cuMemHostAlloc,
cuMemAllocHost, cuMemHostRegister, cuMemFreeHost, cuMemHostUnregister) by the library that made
them, with their time: a small shared library and the program itself pin known amounts through the
stand-in driver, whose pinning takes 5 ms a call; cmt's own staging, pinned meanwhile for the
program's pageable copy, is not among them."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from test_profile import cmt_profile, lib  # noqa: F401  (fixtures)

from cmt.profile import recording

MIB = 1 << 20
INCLUDE = Path(__file__).resolve().parent.parent / "native" / "include"

# Each call is followed by other work: a tail call would return to the library's caller.
LIBRARY = r"""
#include "cmt/cuda_types.hpp"
#include <cstdlib>
extern "C" CUresult cuMemHostAlloc(void**, size_t, unsigned int);
extern "C" CUresult cuMemFreeHost(void*);
extern "C" CUresult cuMemHostRegister_v2(void*, size_t, unsigned int);
extern "C" CUresult cuMemHostUnregister(void*);
extern "C" int lib_pin_and_free(size_t n) {
  void* p = nullptr;
  int bad = cuMemHostAlloc(&p, n, 0) != CUDA_SUCCESS;
  bad += cuMemFreeHost(p) != CUDA_SUCCESS;
  return bad;
}
extern "C" int lib_register(size_t n) {
  void* p = aligned_alloc(4096, n);
  int bad = cuMemHostRegister_v2(p, n, 0) != CUDA_SUCCESS;
  bad += cuMemHostUnregister(p) != CUDA_SUCCESS;
  bad += cuMemHostRegister_v2(nullptr, n, 0) == CUDA_SUCCESS;  // refused by the driver: counted as failed
  free(p);
  return bad;
}
"""

PROGRAM = r"""
#include "cmt/cuda_types.hpp"
#include <cstdio>
#include <vector>
extern "C" CUresult cuInit(unsigned);
extern "C" CUresult cuDeviceGet(CUdevice*, int);
extern "C" CUresult cuCtxCreate_v2(CUcontext*, unsigned, CUdevice);
extern "C" CUresult cuMemAllocHost_v2(void**, size_t);
extern "C" CUresult cuMemFreeHost(void*);
extern "C" CUresult cuMemAlloc_v2(CUdeviceptr*, size_t);
extern "C" CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void*, size_t);
extern "C" int lib_pin_and_free(size_t);
extern "C" int lib_register(size_t);
int main() {
  CUdevice dev;
  CUcontext ctx;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate_v2(&ctx, 0, dev)) return 90;
  const size_t mib = 1 << 20;
  int bad = 0;
  for (int i = 0; i < 3; ++i) bad += lib_pin_and_free(16 * mib);
  bad += lib_register(8 * mib);
  void* p = nullptr;
  bad += cuMemAllocHost_v2(&p, 4 * mib) != CUDA_SUCCESS;
  bad += cuMemFreeHost(p) != CUDA_SUCCESS;
  std::vector<char> host(32 * mib, 1);  // a pageable copy: cmt stages it, pinning its own buffers
  CUdeviceptr d = 0;
  bad += cuMemAlloc_v2(&d, host.size()) != CUDA_SUCCESS;
  bad += cuMemcpyHtoD_v2(d, host.data(), host.size()) != CUDA_SUCCESS;
  printf("%d\n", bad);
  return bad;
}
"""


@pytest.fixture(scope="module")
def profiled(fake_driver_dir, cmt_profile, tmp_path_factory) -> tuple[dict, Path]:  # noqa: F811
    out = tmp_path_factory.mktemp("pin_calls")
    cxx = os.environ.get("CXX", "g++")
    (out / "pinner.cpp").write_text(LIBRARY)
    (out / "main.cpp").write_text(PROGRAM)
    for cmd in ([cxx, "-std=c++17", "-O2", "-shared", "-fPIC", "-I", str(INCLUDE), "-o", str(out / "libpinner.so"),
                 str(out / "pinner.cpp"), "-L", str(fake_driver_dir), "-lcuda"],
                [cxx, "-std=c++17", "-O2", "-I", str(INCLUDE), "-o", str(out / "pinner"), str(out / "main.cpp"),
                 "-L", str(out), "-lpinner", f"-Wl,-rpath,{out}", "-L", str(fake_driver_dir), "-lcuda"]):
        res = subprocess.run(cmd, capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
    env = {"FAKE_CUDA_HOST_ALLOC_US": "5000", "CMT_TEST_HOOKS": "wait_setup=1"}
    res = cmt_profile("--out", out / "run.cmtprof", "--trace", out / "trace.json", "--json", "--", out / "pinner",
                      env=env)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout[res.stdout.index("{"):]), out


def test_each_library_s_pinning_calls_with_their_bytes_and_time(profiled):
    model, out = profiled
    pins = model["pin_calls"]
    rows = {(r["library"], r["call"]): r for r in pins["by_caller"]}
    assert set(rows) == {("libpinner.so", "cuMemHostAlloc"), ("libpinner.so", "cuMemFreeHost"),
                         ("libpinner.so", "cuMemHostRegister"), ("libpinner.so", "cuMemHostUnregister"),
                         ("pinner", "cuMemAllocHost"), ("pinner", "cuMemFreeHost")}, rows
    alloc = rows[("libpinner.so", "cuMemHostAlloc")]
    assert (alloc["count"], alloc["bytes"], alloc["failed"]) == (3, 3 * 16 * MIB, 0)
    assert alloc["seconds"] >= 3 * 0.005 and alloc["caller"] == str(out / "libpinner.so")
    # a release is counted in the bytes of the pinning it ends
    assert (rows[("libpinner.so", "cuMemFreeHost")]["count"], rows[("libpinner.so", "cuMemFreeHost")]["bytes"]) == \
        (3, 3 * 16 * MIB)
    reg = rows[("libpinner.so", "cuMemHostRegister")]
    assert (reg["count"], reg["failed"], reg["bytes"]) == (2, 1, 2 * 8 * MIB)
    assert rows[("libpinner.so", "cuMemHostUnregister")]["bytes"] == 8 * MIB
    assert (rows[("pinner", "cuMemAllocHost")]["bytes"], rows[("pinner", "cuMemFreeHost")]["bytes"]) == \
        (4 * MIB, 4 * MIB)
    # cmt's own staging (registered for the program's staged copy) is not the program's
    assert pins["calls"] == 3 + 3 + 2 + 1 + 1 + 1 and pins["bytes_pinned"] == 3 * 16 * MIB + 8 * MIB + 4 * MIB
    assert model["totals"]["copies"] == 1 and model["processes"][0]["pin_calls"] == 11
    # the library pinned and let go 3 + 1 times: a buffer per transfer, by the look of it; the program once
    (again,) = pins["repeated"]
    assert (again["library"], again["pinned"], again["released"]) == ("libpinner.so", 4, 4)
    assert 0 < again["saving_s"] < again["seconds"] and again["seconds"] >= 4 * 0.005
    assert model["groups"][0]["outcomes"] == {"accelerated": 1}
    # cmt's own setup of that staging is shown apart from the program's pinning
    (setup,) = model["setups"]
    assert setup["ok"] and setup["buffers"] >= 1 and setup["bytes"] > 0 and setup["passed"] == 0


def test_the_text_report_and_the_trace_show_them(profiled, cmt_profile):  # noqa: F811
    _, out = profiled
    res = cmt_profile("--report", out / "run.cmtprof")
    assert res.returncode == 0, res.stderr
    assert "Calls that pin host memory or let it go, by calling library" in res.stdout
    line = next(line for line in res.stdout.splitlines() if "libpinner.so" in line and "cuMemHostAlloc" in line)
    assert "│     3 │" in line and "48 MiB" in line
    assert "11 calls that pin host memory or let it go" in res.stdout and "60 MiB pinned" in res.stdout
    assert "libpinner.so pinned memory 4 times and let it go 4 times" in res.stdout
    trace = json.loads((out / "trace.json").read_text())
    pins = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "pin"]
    assert len(pins) == 11 and sum(e["name"] == "cuMemHostAlloc 16 MiB" for e in pins) == 3
    assert all(e["dur"] >= 5000 for e in pins if e["name"].startswith("cuMemHostAlloc"))  # 5 ms each, in µs


def test_the_recording_keeps_them_apart_from_copies(profiled):
    _, out = profiled
    rec = recording.read(out / "run.cmtprof")
    # the copy, and the fill of its never-touched 32 MiB source (a large memset: h2h)
    assert sorted(rec.copies().direction) == ["h2d", "h2h"] and len(rec.pin_calls()) == 11
    assert set(rec.pin_calls().entry) == {"cuMemHostAlloc", "cuMemFreeHost", "cuMemHostRegister",
                                          "cuMemHostUnregister", "cuMemAllocHost"}
