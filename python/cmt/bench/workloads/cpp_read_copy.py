"""model-load-cpp-warm: a C++ loader (cpp_read_copy.cpp) that std::ifstream::reads the model-load
family's 4.0 GB safetensors file (--quick 0.5 GB), in the page cache, tensor by tensor into one
reused pageable buffer and cudaMemcpys each to the GPU; it checks the GPU's bytes against a checksum
of the file. Built with g++ against the CUDA runtime (found beside nvcc, under CUDA_HOME or
/usr/local/cuda, or in the nvidia pip packages); without one the workload is a skip. The program's
own timer is the inner time; under `cmt run` its copies are cmt's."""

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from cmt.bench.workloads import _model
from cmt.bench.workloads._common import emit, need_gpu_memory, parse_args, prepared, require, skip, torch_cuda
from cmt.io.safetensors_format import read_header

SOURCE = Path(__file__).with_suffix(".cpp")


def cuda_runtime() -> tuple[str, str] | None:
    """(include folder, libcudart file) of a CUDA runtime, or None."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.insert(0, str(Path(os.path.realpath(nvcc)).parent.parent))
    for site in sys.path:  # the nvidia-cuda-runtime wheels (CUDA 12: nvidia/cuda_runtime, 13: nvidia/cu13)
        roots += glob.glob(os.path.join(site, "nvidia", "cu1*")) + [os.path.join(site, "nvidia", "cuda_runtime")]
    for root in filter(None, roots):
        if not os.path.isfile(os.path.join(root, "include", "cuda_runtime.h")):
            continue
        libs = sorted(glob.glob(os.path.join(root, "lib*", "libcudart.so*"))
                      + glob.glob(os.path.join(root, "lib*", "*", "libcudart.so*")))
        if libs:
            return os.path.join(root, "include"), libs[0]
    return None


def build(work_dir: Path) -> Path:
    exe = work_dir / "cpp_read_copy"
    if exe.exists() and exe.stat().st_mtime >= SOURCE.stat().st_mtime:
        return exe
    cxx = shutil.which(os.environ.get("CXX", "g++"))
    runtime = cuda_runtime()
    if cxx is None or runtime is None:
        skip("no C++ compiler" if cxx is None else "no CUDA runtime (cuda_runtime.h and libcudart) found")
    include, cudart = runtime
    cmd = [cxx, "-O2", "-std=c++17", "-I", include, str(SOURCE), "-o", str(exe), cudart,
           f"-Wl,-rpath,{os.path.dirname(cudart)}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        skip(f"the C++ loader did not build: {(proc.stderr.strip().splitlines() or ['?'])[-1][:200]}")
    return exe


def checksum(path: Path, start: int, size: int) -> int:
    """The program's checksum of the data section: sum of its 32-bit words times their 1-based
    index, mod 2^64 (numpy's uint64 arithmetic wraps, as C++'s does)."""
    total, index, piece = 0, 1, 64 << 20
    with open(path, "rb") as f:
        f.seek(start)
        left = size
        while left:
            raw = f.read(min(piece, left))
            left -= len(raw)
            raw += b"\0" * (-len(raw) % 4)
            words = np.frombuffer(raw, dtype="<u4").astype(np.uint64)
            total += int((words * np.arange(index, index + len(words), dtype=np.uint64)).sum(dtype=np.uint64))
            index += len(words)
    return total % (1 << 64)


def plan(work_dir: Path, model: Path) -> Path:
    """The program's input: the file, its data section and checksum, each tensor's range."""
    out = model.with_suffix(".cpp-plan")
    if not out.exists() or out.stat().st_mtime < model.stat().st_mtime:
        h = read_header(model)
        lines = [str(model), f"{h.data_start} {h.data_size} {checksum(model, h.data_start, h.data_size)}"]
        lines += [f"{t.begin} {t.end}" for t in h.tensors.values()]
        tmp = out.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, out)
    return out


args = parse_args()
torch = torch_cuda()  # makes the model
require("safetensors")
need_gpu_memory(torch, int(1.2 * _model.model_bytes(args.quick)))
exe = build(args.work_dir)
model = _model.ensure_model(torch, args.work_dir, args.quick)
plan_file = plan(args.work_dir, model)
if args.prepare:
    prepared(file_bytes=model.stat().st_size)

_model.warm(model)
resident = _model.resident_fraction(model)
proc = subprocess.run([str(exe), str(plan_file)], capture_output=True, text=True)
if proc.returncode != 0:
    sys.exit(f"the C++ loader failed (exit {proc.returncode}): {proc.stderr.strip()[-300:]} {proc.stdout.strip()}")
result = json.loads(proc.stdout.strip().splitlines()[-1])
assert result["checksum_ok"], result
emit(result["seconds"], result["bytes"], "ifstream::read + cudaMemcpy, tensor by tensor", tensors=result["tensors"],
     cache="warm", resident_before=None if resident is None else round(resident, 3))
