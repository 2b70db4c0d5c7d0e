"""The C++ loader of model-load-cpp-warm (cpp_read_copy.cpp): finding a CUDA runtime, building the
program, and its input, a plan of the model's tensors with a checksum of the file's data section."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from cmt.io.safetensors_format import read_header

SOURCE = Path(__file__).with_name("cpp_read_copy.cpp")


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


def build(work_dir: Path, runtime: tuple[str, str] | None = None) -> Path | str:
    """The program, built once into work_dir; or why it cannot be (a one-line reason). `runtime`:
    (include folder, libcudart file), found by cuda_runtime() unless given."""
    exe = work_dir / "cpp_read_copy"
    if exe.exists() and exe.stat().st_mtime >= SOURCE.stat().st_mtime:
        return exe
    cxx = shutil.which(os.environ.get("CXX", "g++"))
    runtime = runtime or cuda_runtime()
    if cxx is None or runtime is None:
        return "no C++ compiler" if cxx is None else "no CUDA runtime (cuda_runtime.h and libcudart) found"
    include, cudart = runtime
    cmd = [cxx, "-O2", "-std=c++17", "-I", include, str(SOURCE), "-o", str(exe), cudart,
           f"-Wl,-rpath,{os.path.dirname(cudart)}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return f"the C++ loader did not build: {(proc.stderr.strip().splitlines() or ['?'])[-1][:200]}"
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


def plan(model: Path) -> Path:
    """The program's input: the file, its data section and checksum, each tensor's range."""
    out = model.with_suffix(".cpp-plan")
    if not out.exists() or out.stat().st_mtime < model.stat().st_mtime:
        h = read_header(model)
        lines = [str(model), f"{h.data_start} {h.data_size} {checksum(model, h.data_start, h.data_size)}"]
        lines += [f"{t.begin} {t.end}" for t in h.tensors.values()]
        tmp = out.with_suffix(".cpp-plan.tmp")
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, out)
    return out
