"""explore_fill.cpp's JSON lines (stdin) as one table: fill GB/s per lanes (columns) for each
DMA load, staging, copy loop, source pages and source warmth (rows)."""

from __future__ import annotations

import json
import sys


def main() -> None:
    rows: dict[tuple, dict[int, float]] = {}
    for line in sys.stdin:
        if line.startswith("{"):
            r = json.loads(line)
            warmth = "warm" if r["warm"] else "cold"
            key = ("dma" if r.get("dma") else "-", r["staging"], r["copy"], r["source"], warmth)
            rows.setdefault(key, {})[r["lanes"]] = r["gbps"]
    lanes = sorted({n for v in rows.values() for n in v})
    print(f"{'':4}{'staging':14}{'copy':12}{'src':5}{'':6}" + "".join(f"{n:>6}" for n in lanes))
    for key, v in rows.items():
        print(f"{key[0]:4}{key[1]:14}{key[2]:12}{key[3]:5}{key[4]:6}" + "".join(f"{v.get(n, 0):6.1f}" for n in lanes))


if __name__ == "__main__":
    main()
