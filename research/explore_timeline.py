"""Shows where the time of one engine copy goes on a GPU machine, from the engine's own timeline
(CMT_TRACE=1): how long the worker lanes take to start, when each block's DMA is queued, when the
lanes finish, and, from GPU timestamps around every DMA, whether the copy engine was starved of
filled blocks (idle gaps) or slowed while the CPU was copying (low rate while the lanes run).

Each (environment, direction, size) runs in its own process, so that settings read once per
process (CMT_SPIN_US, CMT_CONFIG, ...) can be compared; each tries several engine settings.

    python research/explore_timeline.py --out timeline.json [--rotate 8] [--only h2d:64] [--settings 8:4:8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import child_result  # noqa: E402  (benchmarks/child_result.py: the parent/child protocol)

MIB = 1 << 20
# Environments --variants can name; any other is written VAR=VALUE[+VAR=VALUE...].
VARIANTS = {"default": {}, "spin": {"CMT_SPIN_US": "20000"}, "nospin": {"CMT_SPIN_US": "0"}}
# (threads, buffers, chunk, streaming stores) tried per direction and size.
GRID = {
    ("h2d", 16 * MIB): [(6, 4, 4 * MIB, True), (10, 4, 2 * MIB, True), (16, 4, 1 * MIB, True), (10, 4, 2 * MIB, False)],
    ("h2d", 64 * MIB): [(6, 4, 4 * MIB, False), (10, 4, 8 * MIB, False), (10, 12, 4 * MIB, False),
                        (6, 4, 4 * MIB, True), (10, 4, 4 * MIB, True), (10, 4, 8 * MIB, True),
                        (13, 4, 8 * MIB, False), (16, 4, 8 * MIB, False)],
    ("d2h", 16 * MIB): [(6, 16, 1 * MIB, False), (10, 4, 2 * MIB, False)],
    ("d2h", 64 * MIB): [(6, 4, 4 * MIB, False), (10, 4, 8 * MIB, False), (14, 8, 4 * MIB, False),
                        (12, 16, 2 * MIB, False)],
}


def us(ns: float) -> float:
    return round(ns / 1e3, 1)


def dma_analysis(tl: dict, lanes_done_us: float) -> dict:
    """From the GPU's [start, end] of every DMA (µs after the copy's start on the DMA stream):
    how long the copy engine was busy and idle, and its rate while the lanes were still copying
    and after (the two clocks are aligned at the copy's start, to a few µs)."""
    times = tl.get("dma_gpu") or []
    if not times:
        return {}
    # (start, end, bytes) of each DMA, in the order the copy engine ran them
    dmas = sorted((s, e, n) for (s, e), n in zip(times, tl["block_bytes"], strict=True))
    busy = sum(e - s for s, e, _ in dmas)

    def rate(part: list[tuple[float, float, int]]) -> float:
        t = sum(e - s for s, e, _ in part)
        return round(sum(n for *_, n in part) / t / 1e3, 1) if t > 0 else 0.0

    return {"dma_first_start": round(dmas[0][0], 1), "dma_last_end": round(dmas[-1][1], 1),
            "dma_busy": round(busy, 1), "dma_idle": round(dmas[-1][1] - dmas[0][0] - busy, 1),
            "dma_gbps_busy": rate(dmas), "dma_gbps_while_filling": rate([d for d in dmas if d[1] <= lanes_done_us]),
            "dma_gbps_after": rate([d for d in dmas if d[0] >= lanes_done_us]),
            "dma_gpu": [[round(s, 1), round(e, 1)] for s, e in times],
            "block_bytes": tl["block_bytes"], "block_fill": tl.get("block_fill")}


def summarise(tl: dict, t_call: int, t_synced: int, t_returned: int) -> dict:
    """Times in µs from the engine's start of the copy."""
    steps = tl["steps"]
    t0 = steps[0][0]
    at = lambda name: [ns - t0 for ns, _, step, _ in steps if step == name]  # noqa: E731
    lane_starts = sorted(ns - t0 for ns, lane, step, _ in steps if step == "lane_start" and lane > 0)
    queued = at("dma_queued")
    lanes_done = us(max(at("lane_end")))
    return {
        "call_to_engine": us(t0 - t_call),
        "lanes": tl["lanes"], "blocks": tl["blocks"],
        "lane_start_median": us(statistics.median(lane_starts)) if lane_starts else 0,
        "lane_start_max": us(max(lane_starts)) if lane_starts else 0,
        "first_dma_queued": us(queued[0]), "last_dma_queued": us(queued[-1]),
        "lanes_done": lanes_done, "copy_end": us(at("copy_end")[-1]),
        "returned": us(t_returned - t0), "synced": us(t_synced - t0),
        "dma_queued": [us(q) for q in queued],
        **dma_analysis(tl, lanes_done),
    }


def child(size: int, direction: str, repeats: int, rotate: int, grid: list[tuple]) -> list[dict]:
    import torch

    from cmt import native

    hosts = [torch.randint(0, 255, (size,), dtype=torch.uint8) for _ in range(rotate)]
    dev = torch.empty(size, dtype=torch.uint8, device="cuda")
    pinned = torch.empty(size, dtype=torch.uint8).pin_memory()

    def pinned_seconds() -> float:
        """The pinned copy, timed as the engine's copies are (host clock to synchronised), after two
        untimed ones (the first copies of a process, or of a machine's first process, run slow)."""
        times = []
        for _ in range(repeats + 2):
            torch.cuda.synchronize()
            t = time.monotonic_ns()
            dev.copy_(pinned) if direction == "h2d" else pinned.copy_(dev)
            torch.cuda.synchronize()
            times.append(time.monotonic_ns() - t)
        return statistics.median(times[2:]) / 1e9

    results = []
    for threads, buffers, chunk, nt in grid:
        pinned_s = pinned_seconds()  # alongside each setting: the link's rate drifts within a process
        runs = []
        for i in range(repeats + 2):
            host = hosts[i % rotate]
            t_call = time.monotonic_ns()
            settings = {"threads": threads, "buffers": buffers, "chunk_bytes": chunk,
                        "stores": "stream" if nt else "cached"}
            r = native.memcpy(direction, host.data_ptr(), dev.data_ptr(), size, settings=settings)
            t_returned = time.monotonic_ns()
            torch.cuda.synchronize()
            t_synced = time.monotonic_ns()
            assert r == 0, int(r)
            runs.append((t_synced - t_call, native.last_timeline(), t_call, t_synced, t_returned))
        runs = sorted(runs[2:], key=lambda x: x[0])
        dur, tl, t_call, t_synced, t_returned = runs[len(runs) // 2]
        results.append({"threads": threads, "buffers": buffers, "chunk": chunk, "stream_stores": nt,
                        "gbps": round(size / dur, 2), "pinned_gbps": round(size / pinned_s / 1e9, 2),
                        "ratio": round(size / dur / (size / pinned_s / 1e9), 3),
                        "pinned_us": round(pinned_s * 1e6, 1), **summarise(tl, t_call, t_synced, t_returned)})
    return results


def parse_settings(text: str) -> list[tuple]:
    """"8:4:8,16:4:8:nt" -> [(8, 4, 8 MiB, False), (16, 4, 8 MiB, True)]"""
    grid = []
    for item in text.split(","):
        try:
            t, b, c, *nt = item.split(":")
            grid.append((int(t), int(b), int(float(c) * MIB), nt == ["nt"]))
        except ValueError:
            raise SystemExit(f"--settings: {item!r} is not THREADS:BUFFERS:CHUNK_MIB[:nt]") from None
        if nt not in ([], ["nt"]):
            raise SystemExit(f"--settings: {item!r} is not THREADS:BUFFERS:CHUNK_MIB[:nt]")
    return grid


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--rotate", type=int, default=1,
                    help="host buffers used in turn (8: sources not in the CPU's caches)")
    ap.add_argument("--variants", default="default,spin",
                    help="environments to run: " + ", ".join(VARIANTS) + ", or VAR=VALUE[+VAR=VALUE...]")
    ap.add_argument("--only", help="directions and sizes in MiB, e.g. h2d:64,d2h:64")
    ap.add_argument("--settings", help="engine settings to try instead of GRID's, THREADS:BUFFERS:CHUNK_MIB[:nt] "
                    "separated by commas, e.g. 8:4:8,16:4:8:nt")
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        size, direction, repeats, rotate = int(args.child[0]), args.child[1], int(args.child[2]), int(args.child[3])
        child_result.emit(child(size, direction, repeats, rotate, json.loads(args.child[4])))
        return
    settings = parse_settings(args.settings) if args.settings else None
    out = []
    for variant in args.variants.split(","):
        extra = child_result.variant_env(variant, VARIANTS)
        name = ",".join(f"{k}={v}" for k, v in extra.items()) or "default"
        for direction, size in GRID:
            if args.only and f"{direction}:{size // MIB}" not in args.only.split(","):
                continue
            env = {**os.environ, "CMT_TRACE": "1", **extra}
            grid = settings or GRID[(direction, size)]
            results, proc = child_result.run([sys.executable, __file__, "--child", str(size), direction, "9",
                                              str(args.rotate), json.dumps(grid)], env)
            if results is None:
                print(name, direction, size, "FAILED", proc.stderr[-1500:])
                continue
            for res in results:
                out.append({"variant": name, "direction": direction, "size": size, "rotate": args.rotate, **res})
                print(f"{variant[-24:]:24} {direction} {size // MIB:3}M t{res['threads']:>2} b{res['buffers']:>2} "
                      f"c{res['chunk'] // MIB}M{' nt' if res['stream_stores'] else '   '} {res['gbps']:5.1f} GB/s "
                      f"({res['ratio']:.0%} of pinned {res['pinned_gbps']}) | start {res['lane_start_median']}"
                      f"/{res['lane_start_max']} q {res['first_dma_queued']}-{res['last_dma_queued']} "
                      f"lanes {res['lanes_done']} end {res['copy_end']} returned {res['returned']} "
                      f"synced {res['synced']} | dma {res.get('dma_first_start')}-"
                      f"{res.get('dma_last_end')} idle {res.get('dma_idle')} GB/s fill "
                      f"{res.get('dma_gbps_while_filling')} after {res.get('dma_gbps_after')}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
