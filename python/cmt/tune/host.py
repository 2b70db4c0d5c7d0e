"""The h2h search: from which size splitting a host copy over cmt's threads (native/src/host_copy.hpp)
beats one thread's memcpy on this machine, and with how many threads and what pieces.

Pure logic, like search.py, whose machinery it reuses: `measure("h2h", nbytes, settings)` is one
sample of a host copy in GB/s, split as `settings` say (threads, and chunk_bytes as the piece each
thread takes; buffers and stores mean nothing here), or None for one thread's memcpy, which plays
the driver's part. Below the threshold found, copies keep libc's memcpy (a pass rule); where
splitting never wins, the rules are one pass rule, which turns the feature off.

The sizes are the feature's own, not the GPU directions' (--sizes): from 512 KiB, where one thread
always wins, to 64 MiB, past which the choice no longer changes and a sample only gets slower. The
full search measures a grid of thread counts and pieces per size; the instant one three thread
counts with 1 MiB pieces (the built-in rule's), side by side. Both bisect the threshold.
"""

from __future__ import annotations

from collections.abc import Callable

from ..config import Settings
from . import search

KIB, MIB = 1 << 10, 1 << 20
DIRECTION = "h2h"
SIZES = (512 * KIB, MIB, 2 * MIB, 4 * MIB, 8 * MIB, 16 * MIB, 32 * MIB, 64 * MIB)
PIECES = (256 * KIB, MIB, 4 * MIB)
INSTANT_PIECE = MIB
MAX_THREADS = 64  # the engine's limit (kMaxThreads)


def candidates(nbytes: int, cores: int, max_threads: int | None = None, instant: bool = False) -> list[Settings]:
    """Splits worth trying for one size: two threads or more, up to the usable cores, and pieces
    that give every thread of the smallest split at least one."""
    limit = max(1, min(cores, max_threads or cores, MAX_THREADS))
    if instant:
        threads = sorted({t for t in (2, max(2, limit // 2), limit) if 2 <= t <= limit})
        pieces = [min(INSTANT_PIECE, max(4 * KIB, nbytes // 2))]
    else:
        threads = [t for t in search.THREAD_STEPS if 2 <= t <= limit]
        pieces = [p for p in PIECES if p <= nbytes // 2] or [max(4 * KIB, nbytes // 2)]
    return [Settings(t, 1, p) for t in threads for p in pieces]


def planned_measurements(cores: int, max_threads: int | None, instant: bool, opts: search.Options) -> int:
    """Samples the search takes, about (the progress bar)."""
    total = 0
    for n in SIZES:
        k = len(candidates(n, cores, max_threads, instant))
        total += (opts.final_samples + k * opts.shortlist_samples + opts.final_samples if instant
                  else search.planned_measurements(k, opts) - opts.final_samples)
    return total + 2 * opts.final_samples * opts.threshold_steps


def search_threshold(measure: search.Measure, cores: int, max_threads: int | None = None, instant: bool = False,
                     opts: search.Options = search.DEFAULTS, tick: search.Tick | None = None,
                     sizes: tuple[int, ...] = SIZES) -> search.DirectionResult:
    """Per size the best split against one thread's memcpy, then the threshold (search.py's rules)."""
    grid: Callable[[int], list[Settings]] = lambda n: candidates(n, cores, max_threads, instant)  # noqa: E731
    if not instant:
        return search.search_direction(measure, DIRECTION, sizes, grid, opts, tick, stores=False)
    results = [search.pick_measured(measure, DIRECTION, n, grid(n), len(grid(n)), opts, tick, stores=False)
               for n in sorted(set(sizes))]
    return search.refine_threshold(measure, search.direction_result(DIRECTION, results, opts), opts, tick)
