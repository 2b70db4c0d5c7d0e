"""Build the stand-in ``libcuda.so.1`` (the "fake driver") used by tests on machines without a GPU.

Usable from conftest (``build_fake_driver(out_dir)``) or as a script::

    python tests/fake_cuda/build.py [OUT_DIR]     # default: build/fake_cuda
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
INCLUDE = REPO / "native" / "include"
SOURCES = [HERE / "fake_cuda.cpp"]
LIB_NAME = "libcuda.so.1"


def _inputs() -> list[Path]:
    deps = list(SOURCES) + sorted(HERE.glob("*.hpp")) + [INCLUDE / "cmt" / "cuda_types.hpp", Path(__file__)]
    return [p for p in deps if p.exists()]


def build_fake_driver(out_dir: str | os.PathLike[str], force: bool = False) -> Path:
    """Compile fake_cuda.cpp into ``out_dir/libcuda.so.1`` (if any source is newer) and add the
    ``libcuda.so -> libcuda.so.1`` link. Returns the path of ``libcuda.so.1``."""
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    lib = out / LIB_NAME
    newest = max(p.stat().st_mtime for p in _inputs())
    if force or not lib.exists() or lib.stat().st_mtime < newest:
        cxx = os.environ.get("CXX") or shutil.which("g++") or "g++"
        tmp = out / (LIB_NAME + f".tmp{os.getpid()}")
        cmd = [
            cxx, "-O2", "-g", "-std=c++17", "-shared", "-fPIC", "-pthread",
            "-Wl,-soname," + LIB_NAME, "-I", str(INCLUDE), "-o", str(tmp), *map(str, SOURCES),
        ]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise RuntimeError(f"building the fake driver failed:\n{' '.join(cmd)}\n{res.stdout}{res.stderr}")
        os.replace(tmp, lib)  # atomic: concurrent builders never see a half-written library
    link = out / "libcuda.so"
    if not (link.is_symlink() and os.readlink(link) == LIB_NAME):
        tmp_link = out / f"libcuda.so.tmp{os.getpid()}"
        tmp_link.unlink(missing_ok=True)
        tmp_link.symlink_to(LIB_NAME)
        os.replace(tmp_link, link)
    return lib


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else str(REPO / "build" / "fake_cuda")
    print(build_fake_driver(target, force="--force" in sys.argv[2:]))
