"""The C++ loader of the model-load-cpp-warm workload, built against a stand-in CUDA runtime (device
memory is host memory): it loads a safetensors file tensor by tensor and its checksum of the
"GPU's" bytes agrees with the Python one of the file, and it notices bytes that went wrong; the
runtime is found under CUDA_HOME. The workload scripts skip cleanly without PyTorch."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from cmt.bench import workloads
from cmt.bench.workloads import _cpp_loader

safetensors_numpy = pytest.importorskip("safetensors.numpy")

FAKE_HEADER = """
#include <cstddef>
typedef int cudaError_t;
enum { cudaSuccess = 0 };
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2 };
cudaError_t cudaMalloc(void** p, size_t n);
template <class T> cudaError_t cudaMalloc(T** p, size_t n) { return cudaMalloc(reinterpret_cast<void**>(p), n); }
cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaFree(void* p);
const char* cudaGetErrorString(cudaError_t e);
"""

FAKE_RUNTIME = """
#include "cuda_runtime.h"
#include <cstdlib>
#include <cstring>
// Device memory is host memory; CORRUPT_AT=N flips the byte copied to device offset N.
static char* base = nullptr;
cudaError_t cudaMalloc(void** p, size_t n) { *p = base = static_cast<char*>(std::malloc(n)); return *p ? 0 : 2; }
cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  std::memcpy(dst, src, n);
  const char* at = std::getenv("CORRUPT_AT");
  if (at && kind == cudaMemcpyHostToDevice) {
    size_t i = std::strtoull(at, nullptr, 10);
    char* d = static_cast<char*>(dst);
    if (d <= base + i && base + i < d + n) base[i] ^= 1;
  }
  return 0;
}
cudaError_t cudaDeviceSynchronize() { return 0; }
cudaError_t cudaFree(void* p) { std::free(p); return 0; }
const char* cudaGetErrorString(cudaError_t) { return "fake error"; }
"""


@pytest.fixture(scope="module")
def fake_cuda_home(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cuda")
    (root / "include").mkdir()
    (root / "lib64").mkdir()
    (root / "include" / "cuda_runtime.h").write_text(FAKE_HEADER)
    (root / "fake.cpp").write_text(FAKE_RUNTIME)
    subprocess.run(["g++", "-std=c++17", "-shared", "-fPIC", "-I", str(root / "include"), str(root / "fake.cpp"),
                    "-o", str(root / "lib64" / "libcudart.so.13")], check=True)
    return root


def test_the_runtime_is_found_under_cuda_home(fake_cuda_home, monkeypatch):
    monkeypatch.setenv("CUDA_HOME", str(fake_cuda_home))
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvcc to find it by
    found = _cpp_loader.cuda_runtime()
    if found and not found[0].startswith(str(fake_cuda_home)):
        pytest.skip(f"a real CUDA runtime comes first here: {found}")
    assert found == (str(fake_cuda_home / "include"), str(fake_cuda_home / "lib64" / "libcudart.so.13"))


def test_the_loader_checks_the_bytes_it_copied(fake_cuda_home, tmp_path):
    rng = np.random.default_rng(7)
    tensors = {f"w{i}": rng.integers(0, 256, n, dtype=np.uint8) for i, n in enumerate((4096, 1, 333, 70_001, 6))}
    tensors["f"] = rng.standard_normal((17, 3)).astype(np.float32)
    model = tmp_path / "m.safetensors"
    safetensors_numpy.save_file(tensors, str(model))
    runtime = (str(fake_cuda_home / "include"), str(fake_cuda_home / "lib64" / "libcudart.so.13"))
    exe = _cpp_loader.build(tmp_path, runtime)
    assert isinstance(exe, Path), exe
    plan = _cpp_loader.plan(model)
    lines = plan.read_text().splitlines()
    assert lines[0] == str(model) and len(lines) == 2 + len(tensors)
    good = subprocess.run([str(exe), str(plan)], capture_output=True, text=True)
    assert good.returncode == 0, good.stderr
    result = json.loads(good.stdout)
    assert result["checksum_ok"] is True and result["tensors"] == len(tensors) and result["seconds"] >= 0
    assert result["bytes"] % 4 != 0  # a last word short of 4 bytes: zero-padded on both sides
    for at in (0, result["bytes"] - 1, 5000):
        bad = subprocess.run([str(exe), str(plan)], capture_output=True, text=True, env={"CORRUPT_AT": str(at)})
        assert bad.returncode == 1 and json.loads(bad.stdout)["checksum_ok"] is False, at
    broken = tmp_path / "bad.plan"
    broken.write_text("nothing\n")
    assert subprocess.run([str(exe), str(broken)], capture_output=True).returncode == 2


def test_a_build_without_a_runtime_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(_cpp_loader, "cuda_runtime", lambda: None)
    assert _cpp_loader.build(tmp_path) == "no CUDA runtime (cuda_runtime.h and libcudart) found"


@pytest.mark.parametrize("name", ["model-load-cmt-io-cold", "model-load-cpp-warm"])
def test_without_pytorch_the_model_load_workloads_skip(name, tmp_path):
    w = next(w for w in workloads.WORKLOADS if w.name == name)
    code = textwrap.dedent(f"""
        import runpy, sys
        sys.modules["torch"] = None
        sys.argv = [{str(w.path)!r}, *{list(w.args)!r}, "--work-dir", {str(tmp_path)!r}, "--quick"]
        runpy.run_path(sys.argv[0], run_name="__main__")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"skip": "PyTorch is not installed"}
