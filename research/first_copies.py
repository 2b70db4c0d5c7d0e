"""Where a process's first staged copies lose their time (issue 22's first use), on a GPU machine.

Runs under `cmt run` with CMT_TRACE=1 and CMT_STATS=1: a 64 MiB copy to the GPU (it starts the
pipeline's setup), then, after GAP_MS (0 by default), a 64 MiB copy back, then each way once more.
Prints each copy's milliseconds and, for the copies the engine ran, the lanes' start and the span of
the engine's own steps, from its timeline.

    GAP_MS=300 python -m cmt run -- python research/first_copies.py
"""

from __future__ import annotations

import os
import time

import torch

from cmt import native

MIB = 1 << 20


def timed(name: str, fn) -> None:
    torch.cuda.synchronize()
    t0 = time.monotonic_ns()
    fn()
    torch.cuda.synchronize()
    t1 = time.monotonic_ns()
    line = f"{name:<10} {(t1 - t0) / 1e6:8.2f} ms"
    tl = native.last_timeline()
    if tl and tl["steps"] and tl["steps"][0][0] >= t0:
        steps = tl["steps"]
        first, last = steps[0][0], steps[-1][0]
        starts = sorted(ns for ns, lane, step, _ in steps if "start" in step.lower() and lane > 0)
        line += (f"  engine: from call +{(first - t0) / 1e6:.2f} ms, steps over {(last - first) / 1e6:.2f} ms, "
                 f"{tl['lanes']} lanes, last lane start +{((starts[-1] if starts else first) - first) / 1e6:.2f} ms")
    print(line, flush=True)


def main() -> None:
    gap = float(os.environ.get("GAP_MS", "0")) / 1e3
    torch.cuda.init()
    src = torch.randint(0, 256, (64 * MIB,), dtype=torch.uint8)
    dst = torch.empty(64 * MIB, dtype=torch.uint8)
    dst.fill_(1)
    gpu = torch.empty(64 * MIB, dtype=torch.uint8, device="cuda")
    timed("h2d first", lambda: gpu.copy_(src))
    time.sleep(gap)
    timed("d2h first", lambda: dst.copy_(gpu))
    time.sleep(0.05)
    timed("h2d later", lambda: gpu.copy_(src))
    timed("d2h later", lambda: dst.copy_(gpu))
    timed("d2h again", lambda: dst.copy_(gpu))
    assert torch.equal(dst, src)


if __name__ == "__main__":
    main()
