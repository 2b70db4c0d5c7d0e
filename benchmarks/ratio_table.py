"""One line per `cmt bench copy` result file: cmt / pinned of the same run, by direction and size.

    python benchmarks/ratio_table.py copy.json [LABEL]
"""

from __future__ import annotations

import json
import sys


def ratios(doc: dict) -> dict[tuple[str, int], float]:
    """(direction, bytes) -> cmt's median bandwidth over pinned's, both measured in this run."""
    by = {(r["mode"], r["direction"], r["bytes"]): r["median_gbps"] for r in doc["results"]}
    return {(d, n): g / by[("pinned", d, n)] for (m, d, n), g in by.items() if m == "cmt" and ("pinned", d, n) in by}


def main() -> None:
    try:
        with open(sys.argv[1]) as f:
            doc = json.load(f)
    except (OSError, ValueError, IndexError) as e:
        sys.exit(f"ratio_table: {e}")
    label = sys.argv[2] if len(sys.argv) > 2 else sys.argv[1]
    print(label, " ".join(f"{d} {n >> 20}M {r:.0%}" for (d, n), r in sorted(ratios(doc).items())))


if __name__ == "__main__":
    main()
