"""What `cmt profile`'s recording costs per copy on this machine's real driver: 10^5 copies of 0 B
(the driver returns at once, so the cost shows plainly) and of 4 KiB, each under the preloaded
library with and without recording, alternated over several runs; medians of the runs.

    python benchmarks/profile_overhead.py --out profile-overhead.json
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

from cmt import cuda, machine, native

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def build(out_dir: Path, cuda_lib: str) -> Path:
    exe = out_dir / "profile_overhead"
    subprocess.run(["g++", "-std=c++17", "-O2", "-I", str(REPO / "native" / "include"), "-o", str(exe),
                    str(HERE / "profile_overhead.cpp"), cuda_lib], check=True)
    return exe


def machine_record() -> dict:
    """The same fingerprint `cmt bench` writes (GPU, PCIe link, CPU, driver)."""
    drv = cuda.load()
    dev = drv.open_device(0)
    try:
        return machine.fingerprint(drv, dev)
    finally:
        drv.close_device(dev)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        raise SystemExit("no libcuda.so.1 found: this benchmark needs the NVIDIA driver") from None
    with open("/proc/self/maps") as maps:  # link the very driver the loader found
        cuda_lib = next(line.split()[-1] for line in maps if "/libcuda.so" in line)
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(Path(tmp), cuda_lib)
        env = {**os.environ, "LD_PRELOAD": str(native.library_path())}
        env.pop("CMT_PROFILE_DIR", None)
        results = {}
        for nbytes in (0, 4096):
            plain, recorded = [], []
            for run in range(args.runs):
                for extra, into in (({}, plain), ({"CMT_PROFILE_DIR": f"{tmp}/rec-{nbytes}-{run}"}, recorded)):
                    proc = subprocess.run([str(exe), "100000", str(nbytes)], capture_output=True, text=True,
                                          env={**env, **extra}, check=True)
                    into.append(float(proc.stdout))
            p, r = statistics.median(plain), statistics.median(recorded)
            results[f"h2d_{nbytes}B_x1e5"] = {"plain_ns_per_copy": round(p, 1), "recorded_ns_per_copy": round(r, 1),
                                              "overhead_ns_per_copy": round(r - p, 1), "runs": args.runs}
            print(f"{nbytes:5d} B copies: {p:8.1f} ns plain, {r:8.1f} ns recorded: {r - p:+.1f} ns per copy")
    doc = {"benchmark": "profile_overhead", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "machine": machine_record(), "results": results}
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
