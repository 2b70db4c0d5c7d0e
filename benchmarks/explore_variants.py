"""Compares engine variants on a GPU machine, each in its own process under `cmt run`: where a
copy waits for prior work on its stream (CMT_ENTRY), block ramps (CMT_RAMP), streaming vs plain
memcpy (CMT_COPY), piece size (CMT_PIECE) and the destination pre-fault strategy (CMT_PREFAULT),
using the acceptance measurements of core_acceptance.py.

    python benchmarks/explore_variants.py
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import child_result

HERE = Path(__file__).resolve().parent
KEYS = ("h2d_pageable_64MiB", "d2h_pageable_64MiB", "h2d_pageable_1GiB", "d2h_pageable_1GiB", "d2h_fresh_64MiB",
        "d2h_fresh_1GiB", "torch_cpu_1GiB", "torch_to_cuda_1GiB")
VARIANTS = [{}, {"CMT_ENTRY": "stream"}, {"CMT_RAMP": "0"}, {"CMT_PREFAULT": "populate"}, {"CMT_COPY": "stream"},
            {"CMT_PIECE": str(128 << 10)}]


def main() -> None:
    out = {}
    print("variant".ljust(28) + "".join(k.replace("_pageable", "").ljust(20) for k in KEYS))
    for extra in VARIANTS:
        env = {**os.environ, **extra}
        res, proc = child_result.run([*child_result.UNDER_CMT, sys.executable, str(HERE / "core_acceptance.py"),
                                      "--inner"], env)
        name = ",".join(f"{k}={v}" for k, v in extra.items()) or "default"
        if res is None:
            print(name, "FAILED", proc.stderr[-2000:])
            continue
        out[name] = res
        print(name.ljust(28) + "".join(f"{res[k]['gbps']:<20.1f}" for k in KEYS), flush=True)
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
