"""Where a warm `cmt.io.load_safetensors` spends its time: the same page-cached model loaded three
times in one process, each load timed in parts (the GPU allocation and the read), and a fresh
process's first 64 MiB read beside a later one (the engine's setup). Prints JSON lines.
With --first-buffers N, only a fresh process's first whole-file read with N staging buffers (the
setup pins N and 2 spares: fewer buffers, a shorter setup) and a second one: what a program's first
load gets, setup included, for each ring size; with --cold, the file evicted from the page cache
(posix_fadvise) before each of the two.

    python3 research/load_setup.py /tmp/cmt-io [--gib 3.6] [--first-buffers N [--cold]]   (PyTorch, a GPU)
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import time
from pathlib import Path

import numpy as np

MiB = 1 << 20


def make_model(path: Path, gib: float) -> None:
    """A safetensors file of 128 MiB BF16 tensors with random bytes (no framework needed)."""
    count = max(1, int(gib * 1024 / 128))
    header = {f"t{i}": {"dtype": "BF16", "shape": [64 * MiB], "data_offsets": [i * 128 * MiB, (i + 1) * 128 * MiB]}
              for i in range(count)}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    rng = np.random.default_rng(0)
    with open(path.with_suffix(".making"), "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for _ in range(count):
            f.write(rng.bytes(128 * MiB))
    os.replace(path.with_suffix(".making"), path)


def warm(path: Path) -> None:
    """Reads the file once, so that it is in the page cache."""
    chunk = bytearray(64 * MiB)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(chunk):
            pass


def evict(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def first_loads(model: Path, size: int, buffers: int, cold: bool) -> None:
    """The process's first whole-file read (the engine's setup included) and a second, both with
    `buffers` staging buffers (cold: each from the disk)."""
    import torch

    import cmt.io

    buf = torch.empty(size, dtype=torch.uint8, device="cuda")
    for n in range(2):
        if cold:
            evict(model)
        t0 = time.perf_counter()
        with cmt.io.open(model, "r", settings={"buffers": buffers}) as f:
            done = f.read(buf, size=size)
        torch.cuda.synchronize()
        t = time.perf_counter() - t0
        print(json.dumps({"buffers": buffers, "cold": cold, "n": n, "read_ms": round(t * 1e3, 2),
                          "read_gbps": round(done / t / 1e9, 2)}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("folder", type=Path)
    p.add_argument("--gib", type=float, default=3.6)
    p.add_argument("--first-buffers", type=int, default=0)
    p.add_argument("--cold", action="store_true")
    args = p.parse_args()
    args.folder.mkdir(parents=True, exist_ok=True)
    model = args.folder / "load-setup.safetensors"
    if not model.exists():
        make_model(model, args.gib)
    warm(model)

    import torch

    import cmt.io

    torch.cuda.init()
    torch.empty(1, device="cuda")  # the context, outside every timer
    size = model.stat().st_size
    if args.first_buffers:
        first_loads(model, size, args.first_buffers, args.cold)
        return
    small = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    for n in range(2):  # the engine's setup: a first 64 MiB read against a later one
        t0 = time.perf_counter()
        with cmt.io.open(model, "r") as f:
            f.read(small, size=64 * MiB, file_offset=4096)
        torch.cuda.synchronize()
        print(json.dumps({"read_64mib_ms": round((time.perf_counter() - t0) * 1e3, 2), "n": n}), flush=True)
    for n in range(3):
        t0 = time.perf_counter()
        buf = torch.empty(size, dtype=torch.uint8, device="cuda")
        t1 = time.perf_counter()
        with cmt.io.open(model, "r") as f:
            done = f.read(buf, size=size)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        del buf
        t3 = time.perf_counter()
        tensors = cmt.io.load_safetensors(model, device="cuda:0")
        torch.cuda.synchronize()
        t4 = time.perf_counter()
        del tensors
        torch.cuda.empty_cache()
        print(json.dumps({"n": n, "bytes": size, "alloc_ms": round((t1 - t0) * 1e3, 2),
                          "read_ms": round((t2 - t1) * 1e3, 2), "read_gbps": round(done / (t2 - t1) / 1e9, 2),
                          "load_safetensors_ms": round((t4 - t3) * 1e3, 2),
                          "load_gbps": round(size / (t4 - t3) / 1e9, 2)}), flush=True)


if __name__ == "__main__":
    main()
