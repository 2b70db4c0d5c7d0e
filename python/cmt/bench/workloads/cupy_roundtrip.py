"""CuPy asarray (host to device) and get (device to host) of a 1 GiB pageable array."""

import numpy as np

from cmt.bench.workloads._common import GiB, Timer, emit, parse_args, prepared, require, skip

args = parse_args()
cp = require("cupy", "CuPy")
try:
    free, _total = cp.cuda.runtime.memGetInfo()
except Exception as e:  # CuPy raises its own CUDARuntimeError when there is no GPU
    skip(f"CuPy cannot use a GPU ({type(e).__name__})")
nbytes = GiB // 4 if args.quick else GiB
repeats = 2 if args.quick else 5
if free < 2 * nbytes:
    skip(f"needs {2 * nbytes / GiB:.1f} GiB of free GPU memory, {free / GiB:.1f} GiB free")
if args.prepare:
    prepared()

host = np.random.default_rng(0).random(nbytes // 8)
cp.asarray(host[:16])  # initialise untimed
calls = []  # each asarray: the first also sizes CuPy's pinned pool (cudaHostAlloc of the whole array)
for _ in range(repeats):
    with Timer() as one:
        dev = cp.asarray(host)
        cp.cuda.Device().synchronize()
    calls.append(one.seconds)
with Timer() as back:
    for _ in range(repeats):
        out = dev.get()
assert np.array_equal(out, host)
emit(sum(calls) + back.seconds, 2 * repeats * nbytes, f"asarray + get x{repeats}",
     parts={"asarray_s": sum(calls), "get_s": back.seconds, "asarray_calls_s": calls})
