"""The core's acceptance measurements (issue 2), side by side in one run on a GPU machine.

Runs the same PyTorch measurement program plainly and under `cmt run`, in --processes pairs of
processes taken in turn (3 by default: single processes on the H200 machine spread by up to 20
points as the host's load moves), and writes one JSON with each side's medians over its processes,
each process's figures, and the ratios (each the median over the cmt processes of the ratio within
the process, with their spread): pageable copies of 64 MiB and 1 GiB each way, device-to-host into
never-touched memory, pinned copies (the link's limit, measured in both runs), PyTorch
`.to('cuda')`/`.cpu()` of 1 GiB, 10^5 copies of 4 KiB (below the pass-through size), and the
process's first 64 MiB copy each way with one 50 ms later (first use). The
pageable copies are PyTorch's `copy_`, and (where CuPy is installed) the runtime's `cudaMemcpy`
with its pinned counterpart.

    python benchmarks/core_acceptance.py --out benchmarks/results/core-h200.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import child_result

GIB, MIB = 1 << 30, 1 << 20


def host_timed(fn, repeat: int) -> list[float]:
    """Seconds per call, host clock around fully synchronised work (pageable copies block anyway)."""
    import torch

    times = []
    for _ in range(repeat):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return times


def host_memcpy_gbps(size: int = 64 * MIB, repeat: int = 5) -> float:
    """One CPU thread's memcpy rate, a gauge of how busy the host's memory is while this process runs."""
    import numpy as np

    src = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
    dst = np.empty_like(src)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t)
    return size / statistics.median(times) / 1e9


def measure(first_use_only: bool = False) -> dict:
    import torch

    torch.cuda.init()
    results: dict[str, dict] = {"host_memcpy_64MiB": {"bytes": 64 * MIB, "gbps": host_memcpy_gbps()}}

    def event_timed(fn, repeat):
        times = []
        for _ in range(repeat):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        return times

    def put(name, size, times):
        med = statistics.median(times)
        results[name] = {"bytes": size, "median_s": med, "gbps": size / med / 1e9,
                         "min_gbps": size / max(times) / 1e9, "max_gbps": size / min(times) / 1e9}

    def copies(size, repeat):
        tag = "64MiB" if size == 64 * MIB else "1GiB"
        src = torch.randint(0, 256, (size,), dtype=torch.uint8)
        gpu = torch.empty(size, dtype=torch.uint8, device="cuda")
        pinned = torch.empty(size, dtype=torch.uint8).pin_memory()
        pinned.copy_(src)
        dst = torch.empty(size, dtype=torch.uint8)
        dst.fill_(1)  # touched: no page faults

        gpu.copy_(src)  # warm-up and byte check of each path
        dst.copy_(gpu)
        assert torch.equal(dst, src), f"pageable round trip {tag}"
        put(f"h2d_pageable_{tag}", size, host_timed(lambda: gpu.copy_(src), repeat))
        put(f"d2h_pageable_{tag}", size, host_timed(lambda: dst.copy_(gpu), repeat))
        assert torch.equal(dst, src)

        def fresh():
            out = torch.empty(size, dtype=torch.uint8)  # > mmap threshold: never-touched pages
            out.copy_(gpu)
            return out

        assert torch.equal(fresh(), src)
        put(f"d2h_fresh_{tag}", size, host_timed(fresh, repeat))

        gpu.copy_(pinned, non_blocking=True)
        put(f"h2d_pinned_{tag}", size, event_timed(lambda: gpu.copy_(pinned, non_blocking=True), repeat))
        put(f"d2h_pinned_{tag}", size, event_timed(lambda: pinned.copy_(gpu, non_blocking=True), repeat))
        # The same pinned copies timed as the pageable ones are (host clock, device synchronisation
        # on both sides): a synchronisation right after a copy costs 20-45 µs on the H200 machine
        # whatever the copy (research/explore_sync.py), which the GPU's events leave out.
        put(f"h2d_pinned_host_{tag}", size, host_timed(lambda: gpu.copy_(pinned, non_blocking=True), repeat))
        put(f"d2h_pinned_host_{tag}", size, host_timed(lambda: pinned.copy_(gpu, non_blocking=True), repeat))
        torch.cuda.synchronize()
        assert torch.equal(pinned, src)
        runtime_copies(tag, size, repeat, src, dst, gpu, pinned)

    def runtime_copies(tag, size, repeat, src, dst, gpu, pinned):
        # The CUDA runtime's own cudaMemcpy (through CuPy, where installed), pageable and pinned, each
        # timed on the host clock: the call the product is named after, without PyTorch's copy_ around it.
        try:
            from cupy.cuda import runtime
        except ImportError:
            return
        g = gpu.data_ptr()
        for d, pageable in (("h2d", src), ("d2h", dst)):
            for way, host in (("pageable", pageable), ("pinned", pinned)):
                h = host.data_ptr()
                args = ((g, h, size, runtime.memcpyHostToDevice) if d == "h2d"
                        else (h, g, size, runtime.memcpyDeviceToHost))
                put(f"{d}_cudamemcpy_{way}_{tag}", size, host_timed(lambda a=args: runtime.memcpy(*a), repeat))
        assert torch.equal(dst, src) and torch.equal(pinned, src)

    def framework():
        x = torch.randint(0, 256, (GIB,), dtype=torch.uint8)
        y = x.to("cuda")
        assert torch.equal(y.cpu(), x)
        put("torch_to_cuda_1GiB", GIB, host_timed(lambda: x.to("cuda"), 5))
        put("torch_cpu_1GiB", GIB, host_timed(lambda: y.cpu(), 5))

    def first_use():
        # The process's first 64 MiB copy each way, its context made and nothing copied yet; then one
        # each way 50 ms later. cmt passes copies to the driver while a GPU's pipeline is set up in
        # the background, so its first copies should cost what plain ones do, and the later ones
        # run at the steady rate.
        src = torch.randint(0, 256, (64 * MIB,), dtype=torch.uint8)
        dst = torch.empty(64 * MIB, dtype=torch.uint8)
        dst.fill_(1)
        gpu = torch.empty(64 * MIB, dtype=torch.uint8, device="cuda")
        put("h2d_first_64MiB", 64 * MIB, host_timed(lambda: gpu.copy_(src), 1))
        put("d2h_first_64MiB", 64 * MIB, host_timed(lambda: dst.copy_(gpu), 1))
        time.sleep(0.05)
        put("h2d_after_50ms_64MiB", 64 * MIB, host_timed(lambda: gpu.copy_(src), 1))
        put("d2h_after_50ms_64MiB", 64 * MIB, host_timed(lambda: dst.copy_(gpu), 1))
        assert torch.equal(dst, src)

    first_use()
    if first_use_only:
        return results
    copies(64 * MIB, 20)
    copies(GIB, 5)
    framework()

    return results


def measure_small() -> dict:
    """10^5 blocking pageable H2D copies of 4 KiB (below cmt's pass-through size): µs per copy."""
    import torch

    small = torch.randint(0, 256, (4096,), dtype=torch.uint8)
    g = torch.empty(4096, dtype=torch.uint8, device="cuda")
    for _ in range(1000):
        g.copy_(small)
    torch.cuda.synchronize()
    runs = []
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(100_000):
            g.copy_(small)
        torch.cuda.synchronize()
        runs.append(time.perf_counter() - t)
    assert torch.equal(g.cpu(), small)
    return {"h2d_4KiB_x1e5": {"bytes": 4096, "count": 100_000, "median_s": statistics.median(runs),
                              "us_per_copy": statistics.median(runs) / 1e5 * 1e6}}


def medians(runs: list[dict]) -> dict:
    """One side's figures over its processes: per measurement, the median GB/s and the processes'
    range and values."""
    out = {}
    for key, first in runs[0].items():
        gbps = [r[key]["gbps"] for r in runs]
        med = statistics.median(gbps)
        out[key] = {**first, "gbps": med, "median_s": first["bytes"] / med / 1e9, "min_gbps": min(gbps),
                    "max_gbps": max(gbps), "runs_gbps": [round(x, 2) for x in gbps]}
    return out


def ratio_fields(name: str, runs: list[dict], got: str, pinned: str) -> dict:
    """got / pinned within each process (each process measured both), as the median over the
    processes, with each process's ratio."""
    ratios = [r[got]["gbps"] / r[pinned]["gbps"] for r in runs]
    return {name: round(statistics.median(ratios), 3), f"{name}_runs": [round(x, 3) for x in ratios]}


def machine() -> dict:
    info = {"host": platform.node(), "cpu_count": os.cpu_count(), "python": platform.python_version()}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,pcie.link.gen.current,"
                              "pcie.link.width.current", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
        info["gpu"] = out
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        import torch

        info["torch"] = torch.__version__
    except ImportError:
        pass
    return info


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="core-acceptance.json")
    ap.add_argument("--processes", type=int, default=3,
                    help="plain and cmt processes for the large copies, taken in turn (default 3)")
    ap.add_argument("--first-use", action="store_true",
                    help="only each process's first copies (seconds, not minutes), with CMT_STATS's counts")
    ap.add_argument("--small-only", action="store_true",
                    help="only the 4 KiB pass-through copies, in --small-pairs plain and cmt processes taken in turn")
    ap.add_argument("--small-pairs", type=int, default=5, help="process pairs for the 4 KiB copies (default 5)")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--inner-small", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--inner-first", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner or args.inner_small or args.inner_first:
        child_result.emit(measure_small() if args.inner_small else measure(first_use_only=args.inner_first))
        return
    if args.first_use:
        os.environ["CMT_STATS"] = "1"  # which way each first copy went, in the cmt processes' stderr

    def run(prefix, what="--inner"):
        result, proc = child_result.run([*prefix, sys.executable, __file__, what])
        if result is None:
            sys.exit(f"measurement failed ({prefix or 'plain'}):\n{proc.stdout}\n{proc.stderr}")
        return result, proc.stderr

    under_cmt = child_result.UNDER_CMT
    runs: dict[str, list[dict]] = {"plain": [], "cmt": []}
    inner = "--inner-first" if args.first_use else "--inner"
    stats_lines = []
    for _ in range(0 if args.small_only else args.processes):
        runs["plain"].append(run([], inner)[0])
        result, cmt_stderr = run(under_cmt, inner)
        runs["cmt"].append(result)
        stats_lines.append([x for x in cmt_stderr.splitlines() if "stats" in x or "copies" in x])
    plain, cmt = (medians(runs["plain"]), medians(runs["cmt"])) if runs["plain"] else ({}, {})
    # Small copies differ by less than processes do from one another (8.6-12.2 µs per copy for the
    # same side on the H200 machine): alternate plain and cmt processes, keep each side's median,
    # and the median of the pairs' ratios.
    if not args.first_use:
        small = {"plain": [], "cmt": []}
        for _ in range(args.small_pairs):
            for side, prefix in (("plain", []), ("cmt", under_cmt)):
                small[side].append(run(prefix, "--inner-small")[0]["h2d_4KiB_x1e5"])
        for side, into in (("plain", plain), ("cmt", cmt)):
            per_run = [r["us_per_copy"] for r in small[side]]
            into["h2d_4KiB_x1e5"] = {**small[side][0], "us_per_copy": statistics.median(per_run),
                                     "runs_us_per_copy": [round(x, 3) for x in per_run]}
    rows = {}
    for key in plain:
        p, c = plain[key], cmt[key]
        if key == "host_memcpy_64MiB":  # not a copy cmt makes: how busy the host was in each side's processes
            rows[key] = {"default_process_gbps": p["runs_gbps"], "cmt_process_gbps": c["runs_gbps"]}
        elif "gbps" in p:
            rows[key] = {"default_gbps": round(p["gbps"], 2), "cmt_gbps": round(c["gbps"], 2),
                         "speedup": round(c["gbps"] / p["gbps"], 2)}
        else:
            rows[key] = {"default_us_per_copy": round(p["us_per_copy"], 3),
                         "cmt_us_per_copy": round(c["us_per_copy"], 3),
                         "slowdown_pct": round((c["us_per_copy"] / p["us_per_copy"] - 1) * 100, 2)}
            if "runs_us_per_copy" in p:
                pairs = [b / a for a, b in zip(p["runs_us_per_copy"], c["runs_us_per_copy"], strict=True)]
                rows[key]["pair_slowdown_pct"] = round((statistics.median(pairs) - 1) * 100, 2)
    # (first use, small only: no steady copies to compare)
    for tag in () if args.first_use or args.small_only else ("64MiB", "1GiB"):
        for d in ("h2d", "d2h"):
            if f"{d}_cudamemcpy_pinned_{tag}" in cmt:  # cudaMemcpy against cudaMemcpy, in the cmt run
                rows[f"{d}_cudamemcpy_pageable_{tag}"].update(ratio_fields(
                    "cmt_vs_pinned_cudamemcpy", runs["cmt"], f"{d}_cudamemcpy_pageable_{tag}",
                    f"{d}_cudamemcpy_pinned_{tag}"))
            row = rows[f"{d}_pageable_{tag}"]
            row["pinned_gbps_same_run"] = round(cmt[f"{d}_pinned_{tag}"]["gbps"], 2)  # GPU events: the DMA alone
            row.update(ratio_fields("cmt_vs_pinned", runs["cmt"], f"{d}_pageable_{tag}", f"{d}_pinned_{tag}"))
            # pinned copies timed as the pageable copies are
            row["pinned_host_timed_gbps"] = round(cmt[f"{d}_pinned_host_{tag}"]["gbps"], 2)
            row.update(ratio_fields("cmt_vs_pinned_host_timed", runs["cmt"], f"{d}_pageable_{tag}",
                                    f"{d}_pinned_host_{tag}"))
    doc = {"benchmark": "core_acceptance", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "machine": machine(), "config": os.environ.get("CMT_CONFIG", "automatic (cmt config show)"),
           "processes": args.processes, "summary": rows, "plain": plain, "cmt": cmt, "runs": runs,
           "cmt_stats": stats_lines}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=2)
    width = max(len(k) for k in rows)
    for k, v in rows.items():
        print(f"{k:<{width}}  " + "  ".join(f"{a}={b}" for a, b in v.items()))


if __name__ == "__main__":
    main()
