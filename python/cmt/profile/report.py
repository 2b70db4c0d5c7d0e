"""The report model (a JSON-able dict): host<->device copies grouped by direction, host memory kind
and power-of-two size bucket, with what cmt did with each group; the share of bytes by copy size;
processes; totals; the estimated saving; the large host copies by calling library (host_copies.py);
the calls that pin host memory, by calling library (pin_calls.py); cmt's setups of its staging.
`render` prints it, `--json` dumps it as is."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import __version__
from . import host_copies, pin_calls, saving
from .recording import Copies, Recording

REPORT_FORMAT = "cmt-profile-report"
REPORT_VERSION = 4  # 2: host_copies; 3: pin_calls, setups; 4: totals.in_flight
DIRECTIONS = ("h2d", "d2h")
KIND_ORDER = ("pageable", "pinned", "managed", "device", "unknown")


def bucket_of(sizes: np.ndarray) -> np.ndarray:
    """The power of two at or below each size (0 for empty copies); exact below 2**53 bytes."""
    exp = np.frexp(sizes.astype(np.float64))[1].astype(np.int64) - 1
    return np.where(sizes > 0, np.left_shift(np.ones_like(exp), np.maximum(exp, 0)), 0).astype(np.uint64)


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def bucket_label(b: int) -> str:
    return "0 B" if b == 0 else f"[{fmt_bytes(b)}, {fmt_bytes(2 * b)})"


def _sort_key(direction: str, kind: str) -> tuple:
    d = DIRECTIONS.index(direction) if direction in DIRECTIONS else len(DIRECTIONS)
    k = KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)
    return d, direction, k, kind


def groups(c: Copies) -> list[dict[str, Any]]:
    buckets = bucket_of(c.bytes)
    secs = c.seconds
    entries, entry_idx = np.unique(c.entry, return_inverse=True)
    is_async = np.array(["Async" in str(e) for e in entries], bool)[entry_idx]
    out = []
    for direction, kind in sorted({(d, k) for d, k in zip(c.direction, c.host_kind, strict=True)},
                                  key=lambda dk: _sort_key(*dk)):
        idx = np.nonzero((c.direction == direction) & (c.host_kind == kind))[0]
        bs, inv = np.unique(buckets[idx], return_inverse=True)
        count = np.bincount(inv, minlength=len(bs))
        nbytes = np.bincount(inv, weights=c.bytes[idx].astype(np.float64), minlength=len(bs))
        t = np.bincount(inv, weights=secs[idx], minlength=len(bs))
        n_async = np.bincount(inv, weights=is_async[idx], minlength=len(bs))
        names, name_idx = np.unique(c.outcome[idx], return_inverse=True)
        per_outcome = np.bincount(inv * len(names) + name_idx, minlength=len(bs) * len(names)).reshape(len(bs), -1)
        # An async copy of pinned memory returns once enqueued: its call time says nothing of bandwidth.
        enqueue_only = kind == "pinned"
        for i, b in enumerate(bs):
            outcomes = sorted(((str(n), int(k)) for n, k in zip(names, per_outcome[i], strict=True) if k),
                              key=lambda x: -x[1])
            out.append({
                "direction": direction, "host_kind": kind, "bucket_bytes": int(b), "count": int(count[i]),
                "async": int(n_async[i]), "bytes": int(c.bytes[idx][inv == i].sum()), "seconds": float(t[i]),
                "gbps": float(nbytes[i] / t[i] / 1e9) if t[i] > 0 and not (enqueue_only and n_async[i] == count[i])
                else None,
                "outcomes": dict(outcomes),
            })
    return out


def share(c: Copies) -> dict[str, list[dict[str, Any]]]:
    """Per direction, by increasing size bucket: bytes, share of the direction's bytes, cumulative."""
    buckets = bucket_of(c.bytes)
    out = {}
    for direction in DIRECTIONS:
        sel = c.direction == direction
        total = int(c.bytes[sel].sum())
        if not sel.any():
            continue
        rows, running = [], 0
        for b in np.unique(buckets[sel]):
            m = sel & (buckets == b)
            nbytes = int(c.bytes[m].sum())
            running += nbytes
            rows.append({"bucket_bytes": int(b), "count": int(m.sum()), "bytes": nbytes,
                         "share": nbytes / total if total else 0.0, "cumulative": running / total if total else 0.0})
        out[direction] = rows
    return out


def covered(starts: np.ndarray, ends: np.ndarray) -> tuple[Any, Any]:
    """The time that intervals [start, end) cover, overlaps counted once, and the span from the
    earliest start to the latest end, in the intervals' unit (there is at least one)."""
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)  # the latest end so far: a start beyond it opens a new stretch
    opens = np.concatenate(([True], starts[1:] > reach[:-1]))
    first = np.nonzero(opens)[0]
    last = np.concatenate((first[1:] - 1, [len(starts) - 1]))
    return (reach[last] - starts[first]).sum(), reach[-1] - starts[0]


def in_flight(c: Copies) -> dict[str, Any]:
    """When copies ran: the time with at least one copy call in flight (the union of the calls, every
    thread's), the span from the first call's start to the last one's end, and how many threads made
    them. Calls that overlap (threads copying at once) count once: where the in-flight time is near
    the sum of the calls, the threads took turns; where it is a small part of the span, the program's
    time is elsewhere."""
    if len(c) == 0:
        return {"seconds": 0.0, "span_seconds": 0.0, "threads": 0}
    busy, span = covered(c.start_ns.astype(np.int64), c.end_ns.astype(np.int64))
    threads = len({(int(p), int(t)) for p, t in zip(c.pid, c.tid, strict=True)})
    return {"seconds": int(busy) / 1e9, "span_seconds": int(span) / 1e9, "threads": threads}


def processes(rec: Recording) -> list[dict[str, Any]]:
    """Per process: its host<->device copies and bytes, its recorded host copies and pinning calls."""
    out = []
    for p in sorted(rec.processes, key=lambda p: p.monotonic_ns):
        host = p.is_host_copy()
        out.append({"pid": p.pid, "ppid": p.ppid, "forked": p.forked, "argv": p.argv, "cmt_version": p.cmt_version,
                    "copies": int((~host).sum()), "bytes": int(p.records["bytes"][~host].sum()),
                    "host_copies": int(host.sum()), "pin_calls": len(p.pins), "dropped": p.dropped})
    return out


def setups(rec: Recording, c: Copies) -> list[dict[str, Any]]:
    """The engine's setups of staging: how long each took, and the copies of its process that went to
    the driver because it was still running (outcome `warming`)."""
    out = []
    for s in rec.setups():
        passed = (c.pid == s["pid"]) & (c.outcome == "warming")
        out.append({"pid": s["pid"], "seconds": (s["end_ns"] - s["start_ns"]) / 1e9, "bytes": s["bytes"],
                    "buffers": s["buffers"], "ok": s["ok"], "passed": int(passed.sum()),
                    "passed_bytes": int(c.bytes[passed].sum())})
    return out


def build(rec: Recording, bandwidth: saving.Bandwidth | None, no_estimate_reason: str = "") -> dict[str, Any]:
    every = rec.copies()
    c = every.select(np.isin(every.direction, DIRECTIONS))
    if bandwidth is not None:
        est = saving.estimate(c, bandwidth, bucket_of)
    else:
        est = saving.unavailable(no_estimate_reason or "no bandwidth to estimate with")
    secs = c.seconds
    return {
        "format": REPORT_FORMAT, "version": REPORT_VERSION, "cmt_version": __version__,
        "command": rec.manifest.get("command"), "exit_code": rec.manifest.get("exit_code"),
        "processes": processes(rec),
        "totals": {"copies": len(c), "bytes": int(c.bytes.sum()), "seconds": float(secs.sum()),
                   "dropped": sum(p.dropped for p in rec.processes),
                   "by_direction": {d: {"copies": int((c.direction == d).sum()),
                                        "bytes": int(c.bytes[c.direction == d].sum()),
                                        "seconds": float(secs[c.direction == d].sum())} for d in DIRECTIONS},
                   "in_flight": in_flight(c)},
        "groups": groups(c),
        "share": share(c),
        "saving": est,
        "host_copies": host_copies.section(rec, every.select(every.direction == "h2h")),
        "pin_calls": pin_calls.section(rec.pin_calls()),
        "setups": setups(rec, c),
        "outcome_texts": rec.outcome_texts(),
    }
