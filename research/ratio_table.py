"""cmt / pinned from `cmt bench copy` result files, both measured in the same run (cmt's GB/s where
the run has no pinned figure, as for `d2h-fresh`).

    python research/ratio_table.py LABEL copy.json           one line for one run
    python research/ratio_table.py --summary ab/*/run*/copy.json
                                                               per folder above run*: the median, min and max
                                                               over its runs, by direction and size
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from cmt.bench import report


def ratios(path: str) -> dict[tuple[str, int], float]:
    """(direction, bytes) -> cmt's median bandwidth over pinned's in the run that wrote `path`; for
    a direction the run measured no pinned copy of (`d2h-fresh`), cmt's GB/s."""
    with open(path) as f:
        data = report.results_by_key(json.load(f))
    out = {}
    for (mode, d), by_size in data.items():
        if mode != "cmt":
            continue
        pinned = data.get(("pinned", d), {})
        for n, r in by_size.items():
            out[(d, n)] = r["median_gbps"] / pinned[n]["median_gbps"] if n in pinned else r["median_gbps"]
    return out


def cell(direction: str, x: float) -> str:
    return f"{x:.1f} GB/s" if direction == "d2h-fresh" else f"{x:.0%}"


def line(label: str, rs: dict[tuple[str, int], float]) -> str:
    return label + " " + " ".join(f"{d} {n >> 20}M {cell(d, r)}" for (d, n), r in sorted(rs.items()))


def summary(paths: list[str]) -> None:
    groups: dict[str, list[dict]] = defaultdict(list)
    for p in paths:
        try:
            groups[Path(p).parent.parent.name].append(ratios(p))
        except (OSError, ValueError, KeyError):
            continue  # a failed run: its line said so
    for name, runs in groups.items():
        keys = sorted({k for r in runs for k in r})
        cells = []
        for d, n in keys:
            xs = [r[(d, n)] for r in runs if (d, n) in r]
            cells.append(f"{d} {n >> 20}M {cell(d, statistics.median(xs))} ({cell(d, min(xs))}-{cell(d, max(xs))})")
        print(f"{name} [{len(runs)} runs] " + "  ".join(cells))


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["--summary"]:
        summary(args[1:])
        return
    if len(args) != 2:
        sys.exit(__doc__)
    try:
        print(line(args[0], ratios(args[1])))
    except (OSError, ValueError, KeyError) as e:
        print(f"{args[0]}: no result ({e})")


if __name__ == "__main__":
    main()
