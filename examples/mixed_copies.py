"""A PyTorch program that mixes pinned and pageable copies of several sizes in both directions
and prints, as JSON, exactly which host<->device copies it made: what `cmt profile` should report.

    cmt profile -- python examples/mixed_copies.py
"""

import json
import sys
from collections import Counter

try:
    import torch
except ImportError:
    sys.exit("this example needs PyTorch with CUDA (pip install torch)")

if not torch.cuda.is_available():
    sys.exit("no CUDA GPU visible to PyTorch")

# (direction, host memory, bytes, how many): powers of two, so each size is its own bucket.
PLAN = [
    ("h2d", "pageable", 4 << 10, 200),
    ("h2d", "pageable", 1 << 20, 20),
    ("h2d", "pageable", 64 << 20, 3),
    ("h2d", "pinned", 256 << 10, 50),
    ("h2d", "pinned", 16 << 20, 4),
    ("d2h", "pageable", 64 << 10, 100),
    ("d2h", "pageable", 32 << 20, 5),
    ("d2h", "pinned", 8 << 20, 6),
]

made = Counter()
gpu = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
for direction, kind, size, count in PLAN:
    host = torch.ones(size, dtype=torch.uint8)
    if kind == "pinned":
        host = host.pin_memory()
    for _ in range(count):
        if direction == "h2d":
            gpu[:size].copy_(host, non_blocking=kind == "pinned")
        else:
            host.copy_(gpu[:size], non_blocking=kind == "pinned")
        made[(direction, kind, size)] += 1
torch.cuda.synchronize()
print(json.dumps([{"direction": d, "host_kind": k, "bytes_each": s, "count": n} for (d, k, s), n in made.items()]))
