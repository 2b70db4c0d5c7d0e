"""How fast a staged copy out of a warm file mapping runs, against the same copy out of memory
(issue 23's hf-load: under cmt, a from_pretrained's four loading threads kept a copy in flight for
163 ms to move 3.8 GB, 23 GB/s, while a copy out of memory runs at about 50; H100, 2026-12-07).

One thread copies a file, in the page cache, to the GPU in pieces of --piece MiB with `.to('cuda')`,
as a loader does tensor by tensor, from:
  fresh    a new mapping of the file (np.memmap, MAP_SHARED): the copies fault its pages in;
  touched  the same after MADV_POPULATE_READ over the whole mapping (its page tables filled);
  private  a new private mapping (mmap.MAP_PRIVATE, as safetensors maps a file);
  memory   anonymous memory holding the same bytes, written before.
Prints one JSON line per way: GB/s over all the pieces, and the slowest piece's. Run plain and under
`cmt run`, in processes taken in turn:

    python3 research/mapped_warm.py /tmp/cmt-io [--piece 32] [--gib 2]
    python3 -m cmt run -- python3 research/mapped_warm.py /tmp/cmt-io
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import time
from pathlib import Path

import numpy as np
import torch

MiB = 1 << 20
MADV_POPULATE_READ = 22


def copy_pieces(host: np.ndarray, gpu: torch.Tensor, piece: int) -> tuple[float, float]:
    """Seconds for all the pieces, and the slowest piece's."""
    src = torch.from_numpy(host)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    slowest = 0.0
    for off in range(0, host.size, piece):
        t = time.perf_counter()
        gpu[off:off + piece].copy_(src[off:off + piece])  # a pageable copy: returns when done
        slowest = max(slowest, time.perf_counter() - t)
    torch.cuda.synchronize()
    return time.perf_counter() - t0, slowest


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("folder", type=Path)
    p.add_argument("--piece", type=int, default=32, help="MiB per copy")
    p.add_argument("--gib", type=float, default=2.0)
    args = p.parse_args()
    size = int(args.gib * (1 << 30)) // MiB * MiB
    path = args.folder / f"mapped-warm-{size >> 20}m.bin"
    if not path.exists() or path.stat().st_size != size:
        args.folder.mkdir(parents=True, exist_ok=True)
        np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8).tofile(path)
    with open(path, "rb") as f:  # into the page cache
        while f.read(64 * MiB):
            pass
    gpu = torch.empty(size, dtype=torch.uint8, device="cuda")
    piece = args.piece * MiB
    libc = ctypes.CDLL(None, use_errno=True)
    for way in ("fresh", "touched", "private", "memory"):
        if way in ("fresh", "touched"):
            host = np.memmap(path, dtype=np.uint8, mode="r")
            if way == "touched":
                addr = host.ctypes.data & ~4095
                libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(size + (host.ctypes.data - addr)),
                             MADV_POPULATE_READ)
        elif way == "private":
            with open(path, "rb") as f:
                mm = mmap.mmap(f.fileno(), size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
            host = np.frombuffer(mm, dtype=np.uint8)
        else:
            host = np.fromfile(path, dtype=np.uint8)
        seconds, slowest = copy_pieces(host, gpu, piece)
        assert torch.equal(gpu[:MiB].cpu(), torch.from_numpy(np.array(host[:MiB])))
        print(json.dumps({"way": way, "piece_mib": args.piece, "gbps": round(size / seconds / 1e9, 2),
                          "slowest_piece_ms": round(slowest * 1e3, 2),
                          "under_cmt": "LD_PRELOAD" in os.environ}), flush=True)
        del host


if __name__ == "__main__":
    main()
