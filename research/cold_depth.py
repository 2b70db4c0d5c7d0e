"""Whether cmt.io's cold reads gain from more bytes in flight (issue 24: cold, fastsafetensors
loaded a 3.9 GB model in 1.34-1.65 s where cmt.io, with 4 staging buffers of 8 MiB in flight, took
1.88-2.11 s; H100, 2026-12-07). fastsafetensors 0.5 reads with 16 threads, each with two 512 KiB
pinned buffers: 512 KiB O_DIRECT reads claimed in file order, each sent on its own stream, 16 in flight.

Each configuration runs in fresh processes taken in turn, the file evicted (posix_fadvise) before
each read: cmt.io with N staging buffers of M MiB (its lanes read a buffer's bytes in pieces, one
read per lane in flight), and fastsafetensors' own load of the same file. Each round takes the
configurations in a turned order. Since 2026-12-07 the engine keeps at most 2 of N buffers in
flight for a read mostly from the disk (file_transfer.cpp): a cold NxM with N > 2 now measures 2xM,
unless the config sets the engine's test hooks after slashes: NxM/cold_buffers=0 keeps all N in flight,
and 32x0.5/piece=524288/cold_buffers=0 reads as fastsafetensors does (each 512 KiB block one lane's
piece, 32 in flight, a slow read holding up its own block only). M may be a fraction of a MiB.
Prints JSON lines (cmt.io's with the bytes it read O_DIRECT and
through the page cache), then each configuration's median GB/s.

    python3 research/cold_depth.py /tmp/cmt-io [--rounds 2]
        [--configs 4x8,16x8,4x8+30008,32x0.5/piece=524288/cold_buffers=0,fst]
    (PyTorch and a GPU; makes the 3.6 GiB file of research/load_setup.py if missing)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

MiB = 1 << 20


def one(model: Path, config: str) -> dict:
    """This process's cold read of the whole file with `config`: NxM (cmt.io), NxM+OFF (cmt.io from file
    offset OFF to the end, as load_safetensors reads a data section that starts unaligned), either with
    /HOOK=N test hooks after it, or fst."""
    import os

    ring_part, *hooks = config.split("/")
    if hooks:  # read by the engine when cmt loads, below
        os.environ["CMT_TEST_HOOKS"] = ",".join(hooks)
    import torch
    from load_setup import evict

    torch.empty(1, device="cuda")  # the context, outside the timer
    size = model.stat().st_size
    if config == "fst":
        from fastsafetensors import fastsafe_open

        evict(model)
        t0 = time.perf_counter()
        with fastsafe_open(str(model), framework="pt", device="cuda:0", nogds=True) as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        torch.cuda.synchronize()
        t = time.perf_counter() - t0
        done = sum(x.numel() * x.element_size() for x in tensors.values())
    else:
        import cmt.io
        from cmt.io._lib import counters

        ring, _, at = ring_part.partition("+")
        n, m = ring.split("x")
        buffers, chunk = int(n), int(float(m) * MiB)
        off = int(at or 0)
        buf = torch.empty(size, dtype=torch.uint8, device="cuda")
        with cmt.io.open(model, "r", settings={"buffers": buffers, "chunk_bytes": chunk}) as f:
            # the engine's setup for these settings (the whole ring), outside the timer
            f.read(buf, size=min(size, 2 * buffers * chunk))
            evict(model)
            before = counters()
            t0 = time.perf_counter()
            done = f.read(buf, size=size - off, file_offset=off)
            torch.cuda.synchronize()
            t = time.perf_counter() - t0
        after = counters()
        ways = {k: after[k] - before[k] for k in ("direct_bytes", "buffered_bytes")}
        return {"config": config, "seconds": round(t, 3), "gbps": round(done / t / 1e9, 3), **ways}
    return {"config": config, "seconds": round(t, 3), "gbps": round(done / t / 1e9, 3)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("folder", type=Path)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--configs", default="4x8,16x8,16x16,32x8,fst")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    model = args.folder / "load-setup.safetensors"
    if args.one:
        print(json.dumps(one(model, args.one)), flush=True)
        return
    if not model.exists():
        from load_setup import make_model

        args.folder.mkdir(parents=True, exist_ok=True)
        make_model(model, 3.6)
    runs: dict[str, list[float]] = {c: [] for c in args.configs.split(",")}
    order = list(runs)
    for r in range(args.rounds):
        for config in order[r % len(order):] + order[:r % len(order)]:
            try:
                out = subprocess.run([sys.executable, __file__, str(args.folder), "--one", config],
                                     capture_output=True, text=True, timeout=120)
            except subprocess.TimeoutExpired:
                print(json.dumps({"config": config, "failed": "over 120 s"}), flush=True)
                continue
            line = next((x for x in out.stdout.splitlines() if x.startswith("{")), None)
            if line is None:
                print(json.dumps({"config": config, "failed": out.stderr.strip()[-300:]}), flush=True)
                continue
            print(line, flush=True)
            runs[config].append(json.loads(line)["gbps"])
    for config, gbps in runs.items():
        if gbps:
            print(json.dumps({"config": config, "median_gbps": statistics.median(gbps), "runs": gbps}), flush=True)


if __name__ == "__main__":
    main()
