"""Maps the engine's settings space on a GPU machine: bandwidth per (direction, size, threads,
buffers, chunk), with pinned and default pageable copies of the same sizes alongside.
Its results chose the built-in default plan (native/src/plan.cpp); `cmt tune` searches the same
space per machine.

    python benchmarks/explore_engine.py --out engine-sweep.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from functools import partial

import torch
from core_acceptance import host_timed  # benchmarks/ is on sys.path when run as a script

from cmt import native

KIB, MIB = 1 << 10, 1 << 20


def timed(fn, repeat):
    return statistics.median(host_timed(fn, repeat))


def sweep_size(size, host, back, gpu, pinned) -> list[dict]:
    repeat = max(3, min(30, (256 * MIB) // size))
    h, b, g, dev, src, dst, pin = (host.data_ptr(), back.data_ptr(), gpu.data_ptr(), gpu[:size], host[:size],
                                   back[:size], pinned[:size])
    base = {
        "h2d_pinned": size / timed(partial(dev.copy_, pin, non_blocking=True), repeat) / 1e9,
        "d2h_pinned": size / timed(partial(pin.copy_, dev, non_blocking=True), repeat) / 1e9,
        "h2d_default": size / timed(partial(dev.copy_, src), repeat) / 1e9,
        "d2h_default": size / timed(partial(dst.copy_, dev), repeat) / 1e9,
    }
    print(f"size {size // MIB} MiB: " + " ".join(f"{k}={v:.1f}" for k, v in base.items()), flush=True)
    chunks = [c for c in (128 * KIB, 256 * KIB, 512 * KIB, MIB, 2 * MIB, 4 * MIB, 8 * MIB)
              if size // c >= 2 and c <= max(512 * KIB, size // 8)]
    rows = []
    for direction, threads, buffers, chunk in itertools.product(("h2d", "d2h"), (6, 10, 14), (4, 12), chunks):
        fn = partial(native.memcpy, direction, h if direction == "h2d" else b, g, size, 0, threads, buffers, chunk)
        r = fn()
        assert r == 0 and r.outcome == "accelerated", (r, r.outcome)
        rows.append({"direction": direction, "size": size, "threads": threads, "buffers": buffers, "chunk": chunk,
                     "gbps": size / timed(fn, repeat) / 1e9, "pinned": base[f"{direction}_pinned"],
                     "default": base[f"{direction}_default"]})
    assert torch.equal(dst, src) and torch.equal(dev.cpu(), src), "engine changed the bytes"
    for direction in ("h2d", "d2h"):
        best = max((r for r in rows if r["direction"] == direction), key=lambda r: r["gbps"])
        print(f"  best {direction}: {best['gbps']:.1f} GB/s with threads={best['threads']} "
              f"buffers={best['buffers']} chunk={best['chunk'] // KIB}K (pinned {best['pinned']:.1f})", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="engine-sweep.json")
    ap.add_argument("--sizes", default="1,4,16,64,256,1024", help="MiB")
    args = ap.parse_args()
    torch.cuda.init()
    sizes = [int(s) * MIB for s in args.sizes.split(",")]
    biggest = max(sizes)
    host = torch.randint(0, 256, (biggest,), dtype=torch.uint8)
    back = torch.empty(biggest, dtype=torch.uint8)
    back.fill_(0)
    gpu = torch.empty(biggest, dtype=torch.uint8, device="cuda")
    pinned = torch.empty(biggest, dtype=torch.uint8).pin_memory()
    rows: list[dict] = []
    for size in sizes:
        rows += sweep_size(size, host, back, gpu, pinned)
    with open(args.out, "w") as f:
        json.dump({"rows": rows}, f)


if __name__ == "__main__":
    main()
