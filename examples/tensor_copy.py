"""Copies a 1 GiB pageable tensor to the GPU and back and prints the bandwidth of each direction.

    python examples/tensor_copy.py            # CUDA's own pageable copies
    cmt run -- python examples/tensor_copy.py # the same program under cmt
"""

import sys
import time

try:
    import torch
except ImportError:
    sys.exit("this example needs PyTorch with CUDA (pip install torch)")

if not torch.cuda.is_available():
    sys.exit("no CUDA GPU visible to PyTorch")

size = 1 << 30
host = torch.randint(0, 255, (size,), dtype=torch.uint8)  # pageable, not pinned
gpu = torch.empty(size, dtype=torch.uint8, device="cuda")


def timed(fn, repeat=5):
    best = float("inf")
    for _ in range(repeat):
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return out, size / best / 1e9


_, h2d = timed(lambda: gpu.copy_(host))
back, d2h = timed(lambda: gpu.cpu())  # a fresh, never-touched pageable tensor each time
assert torch.equal(back, host), "round trip changed the bytes"
print(f"host-to-device {h2d:6.1f} GB/s   device-to-host {d2h:6.1f} GB/s   (1 GiB, pageable, best of 5)")
