"""The seed article's example through JAX: jax.device_put of np.zeros((1024, 3, 224, 224)), np.asarray back."""

import os

import numpy as np

from cmt.bench.workloads._common import GiB, Timer, emit, parse_args, prepared, require, skip

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # share the GPU politely
args = parse_args()
jax = require("jax", "JAX")
try:
    gpu = jax.devices("gpu")[0]
except RuntimeError:
    skip("JAX has no GPU backend (install jax[cuda12] or jax[cuda13])")
shape = (256 if args.quick else 1024, 3, 224, 224)
repeats = 2 if args.quick else 5
nbytes = int(np.prod(shape)) * 4
stats = gpu.memory_stats() or {}
free = stats.get("bytes_limit", 0) - stats.get("bytes_in_use", 0)
if stats and free < (repeats + 1) * nbytes:
    skip(f"needs {(repeats + 1) * nbytes / GiB:.1f} GiB of free GPU memory, {free / GiB:.1f} GiB free")
if args.prepare:
    prepared()

jax.device_put(np.zeros(16, np.float32), gpu).block_until_ready()  # initialise the backend untimed
xs, puts, gets = [], [], []
for _ in range(repeats):
    a = np.zeros(shape, dtype=np.float32)  # fresh each time, as a program building batches does
    with Timer() as t:
        xs.append(jax.device_put(a, gpu).block_until_ready())
    puts.append(t.seconds)
for x in xs:  # distinct arrays: np.asarray caches a host copy per array
    with Timer() as t:
        c = np.asarray(x)
    gets.append(t.seconds)
assert c.shape == shape and not c.any()
# Each call's time too: whether a call's cost is the first one's (a pool that grows once) or each one's.
emit(sum(puts) + sum(gets), 2 * repeats * nbytes, f"device_put + np.asarray x{repeats}",
     parts={"device_put_s": sum(puts), "asarray_s": sum(gets), "device_put_calls_s": puts, "asarray_calls_s": gets})
