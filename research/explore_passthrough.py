"""Do copies cmt passes through run at their speed? Pinned 64 MiB cudaMemcpy (the runtime's, through
CuPy) each way, timed on the host clock, in alternating plain and `cmt run` processes: the core
acceptance run of 2026-12-03 15:09 UTC measured them 4% slower under cmt in one process pair
(core-acceptance-ninth-cudamemcpy.json), more than the spread it saw elsewhere.

    python research/explore_passthrough.py [--pairs 4] [--out passthrough.jsonl]
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

SIZE = 64 << 20


def child() -> dict:
    import cupy as cp
    import numpy as np
    from cupy.cuda import runtime

    host = cp.cuda.alloc_pinned_memory(SIZE)
    arr = np.frombuffer(host, dtype=np.uint8, count=SIZE)
    arr.fill(7)
    dev = cp.empty(SIZE, dtype=cp.uint8)
    out = {}
    for name, args in (("h2d", (dev.data.ptr, arr.ctypes.data, SIZE, runtime.memcpyHostToDevice)),
                       ("d2h", (arr.ctypes.data, dev.data.ptr, SIZE, runtime.memcpyDeviceToHost))):
        times = []
        for i in range(25):
            runtime.deviceSynchronize()
            t = time.perf_counter()
            runtime.memcpy(*args)
            runtime.deviceSynchronize()
            if i >= 5:
                times.append(time.perf_counter() - t)
        out[name] = round(SIZE / statistics.median(times) / 1e9, 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--out", default="passthrough.jsonl")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child_result.emit(child())
        return
    with open(args.out, "w") as f:
        for pair in range(args.pairs):
            for side, prefix in (("plain", []), ("cmt", child_result.UNDER_CMT)):
                env = {"CMT_STATS": "1"} if side == "cmt" else {}
                gbps, proc = child_result.run([*prefix, sys.executable, __file__, "--child"], {**os.environ, **env})
                if gbps is None:
                    print(side, "FAILED", proc.stderr[-800:])
                    continue
                row = {"pair": pair, "side": side, "pinned_cudamemcpy_gbps": gbps,
                       "stats": proc.stderr.splitlines()[-8:],
                       "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
                f.write(json.dumps(row) + "\n")
                print(side, row["pinned_cudamemcpy_gbps"], flush=True)


if __name__ == "__main__":
    main()
