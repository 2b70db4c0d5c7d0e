"""Shows where the time of one engine copy goes on a GPU machine, from the engine's own timeline
(CMT_TRACE=1): how long the worker lanes take to start, when each block's DMA is queued, when the
lanes finish, when the copy returns and when its last DMA is done. One process per environment
variant, so that switches read once (CMT_SPIN_US, CMT_RAMP, ...) can be compared.

    python benchmarks/explore_timeline.py --out timeline.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MIB = 1 << 20
SIZES = (4 * MIB, 16 * MIB, 64 * MIB)
VARIANTS = ({}, {"CMT_SPIN_US": "20000"}, {"CMT_RAMP": "0"})


def us(ns: int) -> float:
    return round(ns / 1e3, 1)


def summarise(tl: dict, t_call: int, t_synced: int) -> dict:
    """Times in µs from the engine's start of the copy."""
    steps = tl["steps"]
    t0 = steps[0][0]
    at = lambda name: [ns - t0 for ns, _, step, _ in steps if step == name]  # noqa: E731
    lane_starts = sorted(ns - t0 for ns, lane, step, _ in steps if step == "lane_start" and lane > 0)
    queued = at("dma_queued")
    return {
        "call_to_engine": us(t0 - t_call),
        "lanes": tl["lanes"], "blocks": tl["blocks"],
        "lane_start_median": us(statistics.median(lane_starts)) if lane_starts else 0,
        "lane_start_max": us(max(lane_starts)) if lane_starts else 0,
        "first_dma_queued": us(queued[0]), "last_dma_queued": us(queued[-1]),
        "lanes_done": us(max(at("lane_end"))), "copy_end": us(at("copy_end")[-1]),
        "synced": us(t_synced - t0),
        "dma_queued": [us(q) for q in queued],
        "dma_done": [us(q) for q in at("dma_done")],
    }


def child(size: int, direction: str, repeats: int) -> dict:
    import torch

    from cmt import native

    host = torch.randint(0, 255, (size,), dtype=torch.uint8)
    dev = torch.empty(size, dtype=torch.uint8, device="cuda")
    pinned = torch.empty(size, dtype=torch.uint8).pin_memory()
    torch.cuda.synchronize()
    runs = []
    for _ in range(repeats + 2):
        t_call = time.monotonic_ns()
        r = native.memcpy(direction, host.data_ptr(), dev.data_ptr(), size)
        torch.cuda.synchronize()
        t_synced = time.monotonic_ns()
        assert r == 0, int(r)
        runs.append((t_synced - t_call, native.last_timeline(), t_call, t_synced))
    runs = sorted(runs[2:], key=lambda x: x[0])
    dur, tl, t_call, t_synced = runs[len(runs) // 2]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        (dev.copy_(pinned, non_blocking=True) if direction == "h2d" else pinned.copy_(dev, non_blocking=True))
    end.record()
    end.synchronize()
    pinned_s = start.elapsed_time(end) / 5 / 1e3
    return {"gbps": round(size / dur, 2), "pinned_gbps": round(size / pinned_s / 1e9, 2),
            "pinned_us": round(pinned_s * 1e6, 1), **summarise(tl, t_call, t_synced)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        size, direction, repeats = int(args.child[0]), args.child[1], int(args.child[2])
        print("RESULT " + json.dumps(child(size, direction, repeats)))
        return
    out = []
    for extra in VARIANTS:
        name = ",".join(f"{k}={v}" for k, v in extra.items()) or "default"
        for direction in ("h2d", "d2h"):
            for size in SIZES:
                env = {**os.environ, "CMT_TRACE": "1", **extra}
                proc = subprocess.run([sys.executable, __file__, "--child", str(size), direction, "15"],
                                      capture_output=True, text=True, env=env)
                if proc.returncode:
                    print(name, direction, size, "FAILED", proc.stderr[-1500:])
                    continue
                res = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
                out.append({"variant": name, "direction": direction, "size": size, **res})
                print(f"{name:18} {direction} {size // MIB:3}M {res['gbps']:5.1f} GB/s (pinned {res['pinned_gbps']}, "
                      f"{res['pinned_us']} us) call->engine {res['call_to_engine']} lanes {res['lanes']} start "
                      f"med {res['lane_start_median']} max {res['lane_start_max']} | dma first "
                      f"{res['first_dma_queued']} last {res['last_dma_queued']} | lanes done {res['lanes_done']} "
                      f"end {res['copy_end']} synced {res['synced']}", flush=True)
                if size == 16 * MIB:
                    print("   queued", res["dma_queued"], "\n   done", res["dma_done"])
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
