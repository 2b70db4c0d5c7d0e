"""The report's host copies: the large memcpy/memmove (and memset) calls cmt splits over its threads (direction
h2h, native/src/host_copy.hpp), grouped by the library that made them. Only copies from the plan's
h2h threshold up are recorded: below it the interposed function is one compare and libc's own."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .recording import Copies, Recording


def _counts(values: np.ndarray) -> dict[str, int]:
    names, counts = np.unique(values.astype(str), return_counts=True)
    return dict(sorted(((str(n), int(k)) for n, k in zip(names, counts, strict=True)), key=lambda x: (-x[1], x[0])))


def by_caller(c: Copies) -> list[dict[str, Any]]:
    """Per calling object, most bytes first: copies, bytes, time, GB/s, what cmt did, which functions."""
    secs = c.seconds
    rows = []
    for caller in np.unique(c.caller.astype(str)):
        m = c.caller == caller
        nbytes, t = int(c.bytes[m].sum()), float(secs[m].sum())
        rows.append({"caller": caller, "library": os.path.basename(caller) or caller, "count": int(m.sum()),
                     "bytes": nbytes, "seconds": t, "gbps": nbytes / t / 1e9 if t > 0 else None,
                     "outcomes": _counts(c.outcome[m]), "functions": _counts(c.entry[m])})
    return sorted(rows, key=lambda r: (-r["bytes"], r["caller"]))


def section(rec: Recording, c: Copies) -> dict[str, Any]:
    """`c`: the recording's h2h copies."""
    thresholds = [p.h2h_from for p in rec.processes if p.h2h_from is not None]
    return {"recorded_from": min(thresholds) if thresholds else None, "copies": len(c), "bytes": int(c.bytes.sum()),
            "seconds": float(c.seconds.sum()), "by_caller": by_caller(c)}
