"""The estimated saving: how long the recorded pageable copies would take at the bandwidth the
active tuned configuration reaches for their sizes, against what they took.

The bandwidth comes from the tuned file's rules (a measured ``gbps`` per staging rule, as `cmt tune`
writes them) or from a `cmt bench copy` result JSON. Pinned and managed copies are unchanged by cmt,
and so are sizes whose rule passes copies to the driver.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import config as cfg
from ..errors import CmtError
from .recording import Copies

PASS = 0.0  # gbps value meaning "cmt passes these to the driver: time unchanged"


class NoEstimate(Exception):
    """No bandwidth to estimate with; the message says why (shown in the report)."""


@dataclass
class Bandwidth:
    source: str
    config: cfg.TunedConfig | None = None
    curves: dict[str, tuple[np.ndarray, np.ndarray]] | None = None  # direction -> (log2 sizes, gbps)

    def gbps(self, direction: str, sizes: np.ndarray) -> np.ndarray:
        """Per size: GB/s (> 0), PASS, or NaN when nothing was measured for it."""
        if self.config is not None:
            rules = self.config.rules.get(direction, [])
            mins = np.array([r.min_bytes for r in rules], np.uint64)
            values = np.array([PASS if r.passes else _number(r.figures.get("gbps")) for r in rules] + [PASS])
            idx = np.searchsorted(mins, sizes.astype(np.uint64), side="right") - 1
            return values[idx]  # idx -1 (below the first rule) picks the trailing PASS
        if self.curves is None or direction not in self.curves:
            return np.full(len(sizes), math.nan)
        xs, ys = self.curves[direction]
        return np.interp(np.log2(np.maximum(sizes.astype(np.float64), 1.0)), xs, ys)


def _number(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else math.nan


def from_config(config: cfg.TunedConfig | None, source: str) -> Bandwidth:
    if config is None:
        raise NoEstimate("the active configuration is cmt's built-in defaults, which carry no measured bandwidth; "
                         "pass --config with a tuned file from `cmt tune`, or --bench with a `cmt bench copy` JSON")
    staged = [r for rules in config.rules.values() for r in rules if not r.passes]
    if not staged:
        raise NoEstimate(f"the tuned file ({source}) passes every copy to the driver: nothing to save")
    if not any(not math.isnan(_number(r.figures.get("gbps"))) for r in staged):
        raise NoEstimate(f"the tuned file ({source}) has no measured `gbps` in its rules; "
                         "pass --bench with a `cmt bench copy` JSON")
    return Bandwidth(f"tuned file {source}", config=config)


def from_bench(path: str | Path) -> Bandwidth:
    """A `cmt bench copy` JSON (format cmt-bench-copy: results with mode, direction, bytes and
    median_gbps); only cmt's own rows (mode "cmt") count. Between measured sizes the bandwidth is
    interpolated on log size; outside them the nearest measurement holds."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        raise CmtError(f"bench result {p} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise CmtError(f"cannot read bench result {p}: {getattr(e, 'strerror', None) or e}") from None
    except json.JSONDecodeError as e:
        raise CmtError(f"bench result {p} is not valid JSON (line {e.lineno}: {e.msg})") from None
    if not isinstance(doc, dict) or doc.get("format") != "cmt-bench-copy":
        raise CmtError(f"{p} is not a `cmt bench copy` result")
    best: dict[str, dict[int, float]] = {}
    for r in doc.get("results") or []:
        if not isinstance(r, dict) or r.get("mode") != "cmt" or r.get("direction") not in ("h2d", "d2h"):
            continue
        n, g = r.get("bytes"), _number(r.get("median_gbps"))
        if isinstance(n, int) and n > 0 and not math.isnan(g):
            points = best.setdefault(r["direction"], {})
            points[n] = max(g, points.get(n, 0.0))
    if not best:
        raise CmtError(f"bench result {p} has no measurements of cmt's copies (mode cmt); "
                       "run `cmt bench copy` with the cmt mode")
    curves = {}
    for d, points in best.items():
        sizes = sorted(points)
        curves[d] = (np.log2(np.array(sizes, np.float64)), np.array([points[s] for s in sizes]))
    return Bandwidth(f"bench result {p}", curves=curves)


def estimate(copies: Copies, bandwidth: Bandwidth, bucket_of) -> dict[str, Any]:
    """Per direction and size bucket of the pageable copies: what they took, what they would take."""
    pageable = copies.host_kind == "pageable"
    rows, not_estimated = [], 0
    took_total = est_total = 0.0
    for direction in ("h2d", "d2h"):
        sel = pageable & (copies.direction == direction)
        sizes, secs = copies.bytes[sel], copies.seconds[sel]
        if not len(sizes):
            continue
        gbps = bandwidth.gbps(direction, sizes)
        known = ~np.isnan(gbps)
        not_estimated += int(sizes[~known].sum())
        est = np.where(gbps > 0, sizes / np.where(gbps > 0, gbps, 1.0) / 1e9, secs)
        buckets = bucket_of(sizes)
        for b in np.unique(buckets[known]):
            m = known & (buckets == b)
            took, would = float(secs[m].sum()), float(est[m].sum())
            rows.append({"direction": direction, "bucket_bytes": int(b), "count": int(m.sum()),
                         "bytes": int(sizes[m].sum()), "took_s": took, "estimated_s": would, "saving_s": took - would})
            took_total += took
            est_total += would
    return {"available": True, "source": bandwidth.source, "rows": rows, "took_s": took_total,
            "estimated_s": est_total, "saving_s": took_total - est_total, "not_estimated_bytes": not_estimated}


def unavailable(reason: str) -> dict[str, Any]:
    return {"available": False, "reason": reason}
