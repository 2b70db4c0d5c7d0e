"""The PNG chart: cumulative share of bytes by copy size, one line per direction."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import plotting
from ..errors import CmtError
from .report import fmt_bytes


def write_chart(model: dict[str, Any], path: Path) -> None:
    """Raises plotting.Unavailable without matplotlib."""
    plt = plotting.pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    try:
        lo, hi = None, None
        for direction, rows in model["share"].items():
            # Rises across each bucket (its sizes are not known closer than that), flat between buckets.
            first = max(rows[0]["bucket_bytes"], 1)
            xs, ys, prev = [], [], 0.0
            for r in rows:
                low = max(r["bucket_bytes"], 1)
                xs += [low, low * 2]
                ys += [prev, 100 * r["cumulative"]]
                prev = 100 * r["cumulative"]
            ax.plot(xs, ys, marker="o", markersize=3, label=direction, linewidth=2)
            lo, hi = min(lo or first, first), max(hi or xs[-1], xs[-1])
        ax.set_xscale("log", base=2)
        if lo is not None:
            exps = range(lo.bit_length() - 1, hi.bit_length())
            step = max(1, len(exps) // 12)
            ticks = [1 << e for e in exps][::step]
            ax.set_xticks(ticks, [fmt_bytes(t) for t in ticks], rotation=45, ha="right")
        ax.set_ylim(0, 101)
        ax.set_xlabel("copy size")
        ax.set_ylabel("cumulative share of bytes (%)")
        ax.set_title("Share of bytes by copy size")
        ax.grid(True, alpha=0.3)
        if model["share"]:
            ax.legend()
        fig.tight_layout()
        try:
            fig.savefig(path, format="png")
        except OSError as e:
            raise CmtError(f"cannot write chart {path}: {e.strerror or e}") from None
    finally:
        plt.close(fig)
