"""Where JAX's np.asarray(device_array) spends its time (issue 23: 616 MB took 270-380 ms both with
and without cmt, while the copies inside took about 20 ms). For each of 3 distinct device arrays of
308 MB: the call's time and the page faults it took (minor faults: a fresh 4 KiB page each; a huge
page is one), its parts (copy_to_host_async, then np.asarray), and for scale the host's own rate
of faulting fresh memory in (np.empty + fill). Prints JSON lines.

    python3 research/jax_asarray.py [--mib 294]        (needs jax with a GPU; run plain and under cmt run)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path

import numpy as np


def faults() -> tuple[int, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_minflt, r.ru_majflt


def timed(fn):
    f0, t0 = faults(), time.perf_counter()
    out = fn()
    t, f1 = time.perf_counter() - t0, faults()
    return out, round(t * 1e3, 2), f1[0] - f0[0]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=294)
    args = p.parse_args()
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax

    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    print(json.dumps({"thp": thp.read_text().strip() if thp.exists() else None,
                      "cmt": "LD_PRELOAD" in os.environ}), flush=True)
    n = args.mib * (1 << 20) // 4
    gpu = jax.devices("gpu")[0]
    jax.device_put(np.zeros(16, np.float32), gpu).block_until_ready()
    xs = [jax.device_put(np.full(n, k, np.float32), gpu).block_until_ready() for k in range(6)]
    for k, x in enumerate(xs[:3]):
        c, ms, flt = timed(lambda x=x: np.asarray(x))
        assert c[0] == k
        print(json.dumps({"asarray_ms": ms, "minor_faults": flt, "gbps": round(n * 4 / ms / 1e6, 2),
                          "aligned_2m": c.ctypes.data % (2 << 20) == 0}), flush=True)
    for x in xs[3:]:
        _, ms_async, f_async = timed(lambda x=x: x.copy_to_host_async())
        _, ms_ready, f_ready = timed(lambda x=x: x.block_until_ready())
        c, ms_arr, f_arr = timed(lambda x=x: np.asarray(x))
        print(json.dumps({"copy_to_host_async_ms": ms_async, "faults": f_async, "then_asarray_ms": ms_arr,
                          "faults_asarray": f_arr, "ready_ms": ms_ready}), flush=True)
    for _ in range(2):
        a, ms_empty, _f = timed(lambda: np.empty(n, np.float32))
        _, ms_fill, f_fill = timed(lambda a=a: a.fill(1.0))
        print(json.dumps({"host_fill_fresh_ms": ms_fill, "faults": f_fill,
                          "fault_gbps": round(n * 4 / ms_fill / 1e6, 2)}), flush=True)
        del a


if __name__ == "__main__":
    main()
