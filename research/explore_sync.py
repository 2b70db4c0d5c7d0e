"""What a synchronisation costs right after a copy, on a GPU machine: the engine's copy (through
the C API, as `cmt bench copy` makes it), the driver's pinned and pageable copies. Each copy is
followed by a stream synchronisation, then two device-wide ones (torch.cuda.synchronize), each
timed on the host clock. On the H200 machine (2026-12-03, results/h200-2026-12-03/sync.jsonl) the
first device-wide synchronisation after any copy, pinned ones included, took 18-45 µs with the GPU
idle and the second 5-10: a cost of synchronising, not of cmt.

    python research/explore_sync.py [--size-mib 64]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

SETTINGS = {"threads": 10, "buffers": 4, "chunk_bytes": 8 << 20, "stores": "cached"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    import torch

    from cmt import native

    n = args.size_mib << 20
    host = torch.randint(0, 255, (n,), dtype=torch.uint8)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    pinned = torch.empty(n, dtype=torch.uint8).pin_memory()
    stream = torch.cuda.current_stream()
    ops = {
        "cmt_d2h": lambda: native.memcpy("d2h", host.data_ptr(), dev.data_ptr(), n, settings=SETTINGS),
        "cmt_h2d": lambda: native.memcpy("h2d", host.data_ptr(), dev.data_ptr(), n, settings=SETTINGS),
        "pinned_d2h": lambda: pinned.copy_(dev, non_blocking=True),
        "pinned_h2d": lambda: dev.copy_(pinned, non_blocking=True),
        "pageable_d2h": lambda: host.copy_(dev),
    }
    for name, op in ops.items():
        rows = []
        for _ in range(args.repeats + 2):
            torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            op()
            t1 = time.perf_counter_ns()
            stream.synchronize()
            t2 = time.perf_counter_ns()
            torch.cuda.synchronize()
            t3 = time.perf_counter_ns()
            torch.cuda.synchronize()
            t4 = time.perf_counter_ns()
            rows.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3))
        rows = rows[2:]
        med = [round(statistics.median(r[i] for r in rows) / 1e3, 1) for i in range(4)]
        print(json.dumps({"op": name, "bytes": n, "call_us": med[0], "stream_sync_us": med[1],
                          "device_sync_us": med[2], "second_device_sync_us": med[3]}), flush=True)


if __name__ == "__main__":
    main()
