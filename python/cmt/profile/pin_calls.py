"""The report's pinning calls: the program's calls that pin host memory (cuMemHostAlloc,
cuMemAllocHost, cuMemHostRegister) or let it go (cuMemFreeHost, cuMemHostUnregister), by the library
that made them (native/src/pin_record.hpp). Pinning costs milliseconds per 16 MiB, and cmt cannot
speed it up: a library that pins a fresh buffer for each transfer spends its time here, not in its
copies. cmt's own staging is not among them."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .recording import Copies

PINNING = ("cuMemHostAlloc", "cuMemAllocHost", "cuMemHostRegister")


def by_caller(c: Copies) -> list[dict[str, Any]]:
    """Per calling object and call, most time first: calls, bytes (asked for; a release's, of the pinning
    it ends), time, GB/s (pinning calls only), failed calls."""
    secs = c.seconds
    rows = []
    for caller, call in sorted({(str(a), str(b)) for a, b in zip(c.caller, c.entry, strict=True)}):
        m = (c.caller == caller) & (c.entry == call)
        nbytes, t = int(c.bytes[m].sum()), float(secs[m].sum())
        rows.append({"caller": caller, "library": os.path.basename(caller) or caller, "call": call,
                     "count": int(m.sum()), "bytes": nbytes, "seconds": t,
                     "gbps": nbytes / t / 1e9 if t > 0 and nbytes and call in PINNING else None,
                     "failed": int((c.result[m] != 0).sum())})
    return sorted(rows, key=lambda r: (-r["seconds"], r["caller"], r["call"]))


RELEASING = ("cuMemFreeHost", "cuMemHostUnregister")
REPEATED = 3  # pinnings let go again by the same library, from which it looks like a buffer per transfer


def repeated(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Libraries that pinned memory and let it go again at least REPEATED times: what pinning a
    buffer once and reusing it would save, about all of their pinning time but the first call's."""
    out = []
    for caller in sorted({r["caller"] for r in rows}):
        mine = [r for r in rows if r["caller"] == caller]
        pins = [r for r in mine if r["call"] in PINNING]
        count = sum(r["count"] - r["failed"] for r in pins)
        released = sum(r["count"] - r["failed"] for r in mine if r["call"] in RELEASING)
        if min(count, released) >= REPEATED:
            seconds = sum(r["seconds"] for r in pins)
            out.append({"caller": caller, "library": mine[0]["library"], "pinned": count, "released": released,
                        "seconds": seconds, "saving_s": seconds * (1 - 1 / count)})
    return sorted(out, key=lambda r: -r["seconds"])


def section(c: Copies) -> dict[str, Any]:
    """`c`: the recording's pinning calls (Recording.pin_calls)."""
    pinning = np.isin(c.entry, PINNING) & (c.result == 0)
    rows = by_caller(c)
    return {"calls": len(c), "bytes_pinned": int(c.bytes[pinning].sum()), "seconds": float(c.seconds.sum()),
            "by_caller": rows, "repeated": repeated(rows)}
