"""The storage issue's two figures that `cmt bench io` does not time, on a real GPU:

- stream-ordered: how long `read_async` of 1 GiB takes to return to the host while its stream is
  busy, and that a kernel queued after it sees the file's bytes;
- setup: a process's first `cmt.io.open` plus a 64 MiB read against a later one in the same process
  (the engine's threads, staging and streams are made on first use), over --processes processes.

Each process is a child (benchmarks/child_result.py); the parent prints a table and writes JSON.
    python benchmarks/io_acceptance.py --dir /tmp/scratch --out io-acceptance.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import child_result  # noqa: E402

GIB = 1 << 30
CHILD_TIMEOUT_S = 90


def _evict_or_warm(path: str, *, warm: bool) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        if warm:
            while os.read(fd, 64 << 20):
                pass
        else:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def child_stream(path: str, rounds: int) -> None:
    import faulthandler

    import torch

    faulthandler.dump_traceback_later(CHILD_TIMEOUT_S - 10, exit=True)  # a hang says where, before it is stopped

    import cmt.io
    import cmt.io.buffers

    size = os.path.getsize(path)
    ref = torch.empty(size, dtype=torch.uint8, device="cuda")
    with cmt.io.open(path) as f:
        f.read(ref)
        s = torch.cuda.Stream()
        dst = torch.empty_like(ref)
        returns, totals, exact, resolves = [], [], [], []
        for _ in range(rounds):
            with torch.cuda.stream(s):
                torch.cuda._sleep(100_000_000)  # about 50-100 ms of a busy stream before the read
                dst.zero_()
                t0 = time.perf_counter()
                cmt.io.buffers.resolve(dst)  # the Python side's share of the return: finding the tensor's memory
                resolves.append((time.perf_counter() - t0) * 1e6)
                t0 = time.perf_counter()
                fut = f.read_async(dst, s)
                returns.append((time.perf_counter() - t0) * 1e6)
                same = torch.equal(dst, ref)  # a kernel after the read, on its stream
            s.synchronize()
            totals.append((time.perf_counter() - t0) * 1e3)
            fut.check_bytes_done()
            exact.append(bool(same))
    child_result.emit({"return_us": returns, "until_synchronized_ms": totals, "kernel_saw_file": exact,
                       "resolve_us": resolves})


def child_setup(path: str, repeats: int) -> None:
    import torch

    import cmt.io

    torch.cuda.init()
    dst = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()  # the CUDA context is made before the clock starts: cmt's setup alone
    times = []
    for _ in range(1 + repeats):
        t0 = time.perf_counter()
        with cmt.io.open(path) as f:
            n = f.read(dst)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
        assert n == dst.numel()
    child_result.emit({"first_ms": times[0], "later_ms": times[1:]})


def _spread(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/tmp", help="scratch folder for the test files")
    ap.add_argument("--processes", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--out", default="io-acceptance.json")
    ap.add_argument("--child", choices=["stream", "setup"], help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child == "stream":
        return child_stream(a.path, a.rounds)
    if a.child == "setup":
        return child_setup(a.path, a.rounds)

    big, small = os.path.join(a.dir, "cmt-io-acc-1g.bin"), os.path.join(a.dir, "cmt-io-acc-64m.bin")
    for path, size in ((big, GIB), (small, 64 << 20)):
        with open(path, "wb") as f:
            f.write(os.urandom(size))
    me = [sys.executable, os.path.abspath(__file__), "--rounds", str(a.rounds)]
    result: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "processes": a.processes}
    try:
        print("read_async on a busy stream ...", flush=True)
        res, proc = child_result.run(me + ["--child", "stream", "--path", big], timeout=CHILD_TIMEOUT_S)
        if res is None:
            raise SystemExit(f"stream child failed:\n{proc.stderr[-3000:]}")
        result["stream"] = {"return_us": _spread(res["return_us"]),
                            "until_synchronized_ms": _spread(res["until_synchronized_ms"]),
                            "resolve_us": _spread(res["resolve_us"]),
                            "kernel_saw_file": all(res["kernel_saw_file"]), "rounds": res}
        firsts, laters = [], []
        for _ in range(a.processes):  # warm: the same bytes for the first and the later reads
            _evict_or_warm(small, warm=True)
            print("first use, a process ...", flush=True)
            res, proc = child_result.run(me + ["--child", "setup", "--path", small], timeout=CHILD_TIMEOUT_S)
            if res is None:
                raise SystemExit(f"setup child failed:\n{proc.stderr[-3000:]}")
            firsts.append(res["first_ms"])
            laters.append(statistics.median(res["later_ms"]))
        result["setup"] = {"first_ms": _spread(firsts), "later_ms": _spread(laters),
                           "first_minus_later_ms": _spread([x - y for x, y in zip(firsts, laters, strict=True)])}
    finally:
        for p in (big, small):
            os.unlink(p)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    st = result["stream"]
    print(f"read_async 1 GiB on a busy stream: returns in {st['return_us']['median']:.0f} us "
          f"({st['return_us']['min']:.0f}-{st['return_us']['max']:.0f}; finding the tensor's memory "
          f"{st['resolve_us']['median']:.0f} us of it); a kernel after it saw the file: "
          f"{st['kernel_saw_file']}")
    s = result["setup"]
    print(f"setup, 64 MiB warm: first open+read {s['first_ms']['median']:.1f} ms, later {s['later_ms']['median']:.1f} "
          f"ms, difference {s['first_minus_later_ms']['median']:.1f} ms ({s['first_minus_later_ms']['min']:.1f}-"
          f"{s['first_minus_later_ms']['max']:.1f})")


if __name__ == "__main__":
    main()
