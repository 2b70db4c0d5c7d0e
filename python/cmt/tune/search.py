"""The full search: which engine settings to use per direction and copy size, by measurement.

Pure logic. It is given `measure(direction, nbytes, settings) -> GB/s`, one noisy sample of one
copy size with explicit engine settings (None: the driver's own pageable copy), so the tests drive
it with a simulated pipeline and `cmt tune` with real copies (measure.py).

Per direction and size:
  1. Successive halving over a grid of (threads, buffers, chunk): every candidate gets one sample,
     the best third (by median) goes on to more samples, until a few finalists are measured well.
     Most candidates cost one sample; the measurement goes where the differences are small.
  2. The smallest resources within 1% of the best: the best is re-measured on new samples (the
     winner of a noisy selection is flattered by its own), then candidates whose estimate could be
     within 1% are re-measured in order of resource use (threads, then pinned bytes); the first one
     whose median holds up twice is chosen. Threads are cores taken from the program: they cost
     the most.
  3. Staging is used only where it beats the driver's pageable copy by a margin.
Across sizes, the size below which pass-through wins is narrowed by bisection between the largest
size that passes and the next, measuring exactly the rule that would apply there.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from ..config import Rule, Settings

Measure = Callable[[str, int, Settings | None], float]
Tick = Callable[[str], None]

KIB, MIB = 1 << 10, 1 << 20
THREAD_STEPS = (1, 2, 3, 4, 6, 8, 10, 12, 14, 16, 20, 24, 32, 48, 64)
BUFFER_STEPS = (2, 4, 8, 16)
CHUNK_RANGE = (64 * KIB, 16 * MIB)  # powers of two in between
MAX_BLOCKS = 2048  # smaller chunks than size/2048 only add per-DMA overhead


@dataclass(frozen=True)
class Options:
    eta: int = 3                     # successive halving keeps the best 1/eta of each rung
    schedule: tuple[int, ...] = (1, 2, 4, 8)  # samples per candidate after each rung
    finalists: int = 4               # halving stops at this many
    final_samples: int = 12          # samples behind every reported figure
    within: float = 0.01             # "as good as the best": within 1%
    noise: float = 0.05              # expected spread of one sample, to keep near-ties in play
    resource_checks: int = 12        # at most this many cheaper candidates re-measured
    win_margin: float = 0.03         # staging must beat pass-through by 3% to be used
    threshold_steps: int = 3         # bisection steps for the pass-through threshold
    shortlist_samples: int = 3       # instant search: samples per short-listed candidate


DEFAULTS = Options()
INSTANT = Options(final_samples=5)  # the instant search only confirms its choices
QUICK = Options(schedule=(1, 2), finalists=2, final_samples=3, resource_checks=4, threshold_steps=1)


def resource(s: Settings) -> tuple[int, int, int]:
    """What a configuration costs the program: threads (cores), then pinned bytes, then DMA size."""
    return (s.threads, s.buffers * s.chunk_bytes, s.chunk_bytes)


def candidates(nbytes: int, cores: int, max_threads: int | None = None) -> list[Settings]:
    """The grid for one copy size: threads up to the usable cores, chunks that give the copy at
    least two blocks (or one 64K block), at most as many buffers as blocks."""
    limit = max(1, min(cores, max_threads or cores))
    threads = [t for t in THREAD_STEPS if t <= limit] or [1]
    out = []
    chunk = CHUNK_RANGE[0]
    while chunk <= CHUNK_RANGE[1]:
        if (chunk <= max(CHUNK_RANGE[0], nbytes // 2)) and chunk * MAX_BLOCKS >= nbytes:
            blocks = -(-nbytes // chunk)
            buffers = [b for b in BUFFER_STEPS if b <= max(BUFFER_STEPS[0], blocks)]
            out += [Settings(t, b, chunk) for t in threads for b in buffers]
        chunk *= 2
    return out


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def choose(estimates: dict[Settings, float], within: float) -> Settings:
    """The least resources among the candidates within `within` of the best (exact estimates)."""
    best = max(estimates.values())
    return min((s for s, g in estimates.items() if g >= (1 - within) * best), key=resource)


@dataclass
class SizeResult:
    direction: str
    nbytes: int
    settings: Settings | None  # the chosen staging settings (None: nothing measured)
    gbps: float                      # their median
    pageable_gbps: float             # the driver's own copy, same size
    candidates: int = 0
    measurements: int = 0

    @property
    def stages(self) -> bool:
        return self.settings is not None and self.gbps > 0

    @property
    def gain(self) -> float:
        return self.gbps / self.pageable_gbps if self.pageable_gbps > 0 else math.inf


@dataclass
class DirectionResult:
    direction: str
    sizes: list[SizeResult]
    threshold: int | None  # copies from here up are staged; None: pass-through wins everywhere
    threshold_gbps: dict[str, float] = field(default_factory=dict)  # staged and pageable at the threshold
    measurements: int = 0


class _Samples:
    """Counts and keeps samples; `tick` reports each one (progress bar)."""

    def __init__(self, measure: Measure, direction: str, nbytes: int, tick: Tick | None):
        self.measure, self.direction, self.nbytes, self.tick = measure, direction, nbytes, tick
        self.seen: dict[Settings | None, list[float]] = {}
        self.count = 0

    def top_up(self, settings: Settings | None, n: int) -> float:
        got = self.seen.setdefault(settings, [])
        while len(got) < n:
            got.append(float(self.measure(self.direction, self.nbytes, settings)))
            self.count += 1
            if self.tick:
                self.tick(f"{self.direction} {_size(self.nbytes)}")
        return median(got)

    def median(self, settings: Settings | None) -> float:
        return median(self.seen.get(settings, []))

    def fresh(self, settings: Settings, n: int) -> float:
        """The median of n new samples, added to the others: the winner of a selection among noisy
        estimates is biased upwards; new samples of it are not."""
        got = self.seen[settings]
        self.top_up(settings, len(got) + n)
        return median(got[-n:])


def _halve(s: _Samples, alive: list[Settings], opts: Options) -> list[Settings]:
    rung = 0
    while len(alive) > opts.finalists:
        target = opts.schedule[min(rung, len(opts.schedule) - 1)]
        for c in alive:
            s.top_up(c, target)
        keep = max(opts.finalists, -(-len(alive) // opts.eta))
        alive = sorted(alive, key=lambda c: (-s.median(c), resource(c)))[:keep]
        rung += 1
    for c in alive:
        s.top_up(c, opts.final_samples)
    return alive


def _least_resources(s: _Samples, best: Settings, opts: Options) -> Settings:
    """Re-measures cheaper candidates that might be within `within` of the best; the first
    (cheapest) that is, wins. Estimates from few samples get slack for their noise."""
    top = s.fresh(best, opts.final_samples)

    def maybe(c: Settings) -> bool:
        n = len(s.seen[c])
        return s.median(c) >= (1 - opts.within - opts.noise / math.sqrt(n)) * top

    cheaper = sorted((c for c in s.seen if c is not None and resource(c) < resource(best) and maybe(c)),
                     key=resource)
    for c in cheaper[:opts.resource_checks]:
        # Checked twice, the second time on new samples of both: of many near-ties one passes a
        # single noisy check by luck far more often than a truly good one fails two.
        if s.top_up(c, opts.final_samples) >= (1 - opts.within) * top and \
                s.fresh(c, opts.final_samples) >= (1 - opts.within) * s.fresh(best, opts.final_samples):
            return c
    return best


def _store_mode(s: _Samples, best: Settings, opts: Options) -> Settings:
    """The winner again with the other store mode (streaming vs cached buffer fills): it depends on
    the machine's caches and the copy size, not on the rest of the settings, so one try suffices."""
    other = replace(best, stores="cached" if best.stores == "stream" else "stream")
    if s.top_up(other, opts.final_samples) > (1 + opts.within) * s.median(best):
        return other
    return best


def search_size(measure: Measure, direction: str, nbytes: int, grid: Iterable[Settings],
                opts: Options = Options(), tick: Tick | None = None, stores: bool = True) -> SizeResult:
    """`stores`: also try the winner with the other store mode (host copies have none)."""
    grid = list(grid)
    s = _Samples(measure, direction, nbytes, tick)
    pageable = s.top_up(None, opts.final_samples)
    if not grid:
        return SizeResult(direction, nbytes, None, 0.0, pageable, 0, s.count)
    finalists = _halve(s, grid, opts)
    best = max(finalists, key=lambda c: (s.median(c), [-x for x in resource(c)]))
    if stores:
        best = _store_mode(s, best, opts)
    chosen = _least_resources(s, best, opts)
    return SizeResult(direction, nbytes, chosen, s.median(chosen), pageable, len(grid), s.count)


def _wins(r: SizeResult, opts: Options) -> bool:
    return r.stages and r.gbps >= (1 + opts.win_margin) * r.pageable_gbps


def _refine_threshold(measure: Measure, lo: int, hi: SizeResult, opts: Options,
                      tick: Tick | None) -> tuple[int, dict[str, float], int]:
    """Bisects (in log size) between `lo`, where pass-through won, and `hi`, where staging did,
    measuring `hi`'s settings (the rule that would apply) against the driver at the midpoint."""
    top, figures, count = hi.nbytes, {"gbps": hi.gbps, "pageable_gbps": hi.pageable_gbps}, 0
    for _ in range(opts.threshold_steps):
        mid = int(math.sqrt(lo * top)) // 4096 * 4096
        if mid <= lo or mid >= top:
            break
        s = _Samples(measure, hi.direction, mid, tick)
        staged, pageable = s.top_up(hi.settings, opts.final_samples), s.top_up(None, opts.final_samples)
        count += s.count
        if staged >= (1 + opts.win_margin) * pageable:
            top, figures = mid, {"gbps": staged, "pageable_gbps": pageable}
        else:
            lo = mid
    return top, figures, count


def confirm(measure: Measure, direction: str, nbytes: int, settings: Settings | None, n_candidates: int,
            opts: Options = Options(), tick: Tick | None = None) -> SizeResult:
    """Measures given settings against the driver's copy (the instant search's chosen ones)."""
    s = _Samples(measure, direction, nbytes, tick)
    pageable = s.top_up(None, opts.final_samples)
    staged = s.top_up(settings, opts.final_samples) if settings is not None else 0.0
    return SizeResult(direction, nbytes, settings, staged, pageable, n_candidates, s.count)


def pick_measured(measure: Measure, direction: str, nbytes: int, shortlist: Sequence[Settings],
                  n_candidates: int, opts: Options = Options(), tick: Tick | None = None,
                  stores: bool = True) -> SizeResult:
    """The instant search's last step: a few candidates measured side by side (the model's best
    guesses and the settings in force), the best median wins, is tried with the other store mode,
    and is measured against the driver's copy. A model misses what it does not describe (a staging
    ring that spills the CPU caches, say); a few samples of each guess catch that for little time."""
    s = _Samples(measure, direction, nbytes, tick)
    pageable = s.top_up(None, opts.final_samples)
    if not shortlist:
        return SizeResult(direction, nbytes, None, 0.0, pageable, n_candidates, s.count)
    for c in shortlist:
        s.top_up(c, opts.shortlist_samples)
    best = max(shortlist, key=lambda c: (s.median(c), [-x for x in resource(c)]))
    if stores:
        best = _store_mode(s, best, opts)  # the model has no term for it: measured, as in the full search
    staged = s.top_up(best, max(opts.final_samples, opts.shortlist_samples))
    return SizeResult(direction, nbytes, best, staged, pageable, n_candidates, s.count)


def first_staged(results: Sequence[SizeResult], opts: Options) -> int:
    """Index of the lowest size from which staging wins at every size above (len: none wins)."""
    first = len(results)
    while first > 0 and _wins(results[first - 1], opts):
        first -= 1
    return first


def direction_result(direction: str, results: list[SizeResult], opts: Options = Options()) -> DirectionResult:
    """Sizes below the first staged one pass through (no bisection)."""
    first = first_staged(results, opts)
    threshold = results[first].nbytes if first < len(results) else None
    return DirectionResult(direction, results, threshold, {}, sum(r.measurements for r in results))


def search_direction(measure: Measure, direction: str, sizes: Sequence[int],
                     grid: Callable[[int], list[Settings]], opts: Options = Options(),
                     tick: Tick | None = None, stores: bool = True) -> DirectionResult:
    """Every size, then the pass-through threshold: the lowest size from which staging wins at
    every measured size above, narrowed by bisection towards the largest size that passes."""
    results = [search_size(measure, direction, n, grid(n), opts, tick, stores) for n in sorted(set(sizes))]
    return refine_threshold(measure, direction_result(direction, results, opts), opts, tick)


def refine_threshold(measure: Measure, found: DirectionResult, opts: Options = Options(),
                     tick: Tick | None = None) -> DirectionResult:
    """The threshold of `found` narrowed by bisection towards the largest size that passes."""
    first = first_staged(found.sizes, opts)
    if found.threshold is None or first == 0:
        return found
    threshold, figures, extra = _refine_threshold(measure, found.sizes[first - 1].nbytes, found.sizes[first], opts,
                                                  tick)
    return DirectionResult(found.direction, found.sizes, threshold, figures, found.measurements + extra)


def rules(result: DirectionResult) -> list[Rule]:
    """Pass-through below the threshold; from there each measured size's settings, starting at
    that size (the first at the threshold), with what was measured: `gbps`, `gain` over the
    driver's pageable copy, and the size it was measured at."""
    out = [Rule(0)]
    if result.threshold is None:
        return out
    staged = [r for r in result.sizes if r.nbytes >= result.threshold]
    for i, r in enumerate(staged):
        if r.settings is None:  # cannot happen: every size from the threshold up staged
            continue
        start = result.threshold if i == 0 else r.nbytes
        figures = {"gbps": round(r.gbps, 2), "gain": round(r.gain, 2), "pageable_gbps": round(r.pageable_gbps, 2),
                   "measured_bytes": r.nbytes}
        out.append(Rule(start, r.settings, figures))
    return out


def planned_measurements(n_candidates: int, opts: Options = Options()) -> int:
    """Samples one size's search takes before the resource pass (for the progress bar)."""
    total, alive, have, rung = 2 * opts.final_samples, n_candidates, 0, 0  # + the store-mode try
    if n_candidates == 0:
        return total
    while alive > opts.finalists:
        target = opts.schedule[min(rung, len(opts.schedule) - 1)]
        total += alive * (target - have)
        have, alive, rung = target, max(opts.finalists, -(-alive // opts.eta)), rung + 1
    return total + alive * (opts.final_samples - have)


def _size(n: int) -> str:
    from ..bench.sizes import format_size

    return format_size(n)
