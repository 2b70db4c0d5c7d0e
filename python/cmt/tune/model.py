"""The instant search: a model of cmt's staging pipeline, fitted from a few measurements.

The engine cuts a copy into blocks of `chunk_bytes`, one DMA each: the first blocks grow from
chunk/8 and, device-to-host only, the last ones shrink back, so that filling and draining the
pipeline costs less. The model reads those blocks from the engine itself (`blocks`, through
native.transfer_blocks: native/src/transfer_plan.cpp), so a model is for one direction. All T lanes
fill (host-to-device) or drain (device-to-host) a block together, while the copy engine works on
the blocks before it; `buffers` slots let the two stages run ahead of each other. Per block of c
bytes:

    t_cpu(c) = c / min(min(T, cores) * lane_gbps, memory_gbps)      lanes copy pageable<->pinned
               + block_overhead + lane_overhead * T                  claim pieces, sync, queue DMA
    t_dma(c) = c / link_gbps + dma_overhead

The slower stage sets the pace; with B buffers the faster one is hidden except for 1/B of it
(B = 1: the stages alternate; many buffers: they overlap fully, up to scheduling jitter). The
first block's fill and the last one's drain are not overlapped:

    seconds = copy_overhead + t_cpu(first) + t_dma(last)
              + sum over the other blocks of (max(t_cpu, t_dma) + min(t_cpu, t_dma) / B)

What each parameter is measured by (measure.py, `probe`): the link and DMA cost from pinned copies
at two sizes, lane and memory bandwidth from CPU memcpy with one and many threads, the per-block
costs from engine copies cut into many small blocks at two thread counts, the per-copy cost from a
one-block engine copy. The instant search evaluates the model over the same grid as the full search,
short-lists its choice (the least resources within 1% of the predicted best, search.choose), its
next best guesses with other staging rings and the settings in force, measures those few side by
side and keeps the best; that is then measured against the driver's copy, which decides
pass-through and gives `gbps`. (On the H200 the model alone chose 16 x 16 MiB rings for 256 MiB
and 1 GiB copies, which ran at 30 GB/s where 4 x 8 MiB runs at 52: the model has no term for a
ring that spills the caches.)
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from .. import native
from ..config import Settings
from . import search

GB = 1e9


@dataclass(frozen=True)
class PipelineModel:
    link_gbps: float          # DMA rate of large pinned copies
    dma_overhead_s: float     # per DMA command
    lane_gbps: float          # one lane's pageable<->pinned copy rate
    memory_gbps: float        # all lanes together
    block_overhead_s: float   # per block, CPU side
    lane_overhead_s: float    # per block and lane (synchronising more lanes costs more)
    copy_overhead_s: float    # per copy (waking lanes, the final synchronisation)
    cores: int = 64           # lanes beyond the cores add overhead, not bandwidth
    direction: str = "h2d"    # whose block geometry: host-to-device copies do not ramp down

    def seconds(self, nbytes: int, s: Settings) -> float:
        cut = blocks(self.direction, nbytes, s.chunk_bytes)
        buffers = max(1, min(s.buffers, sum(k for _, k in cut)))
        fill = min(min(s.threads, self.cores) * self.lane_gbps, self.memory_gbps) * GB
        per_block = self.block_overhead_s + self.lane_overhead_s * s.threads

        def t_cpu(c: int) -> float:
            return c / fill + per_block

        def t_dma(c: int) -> float:
            return c / (self.link_gbps * GB) + self.dma_overhead_s

        total = self.copy_overhead_s + t_cpu(cut[0][0]) + t_dma(cut[-1][0])
        for i, (c, k) in enumerate(cut):
            steady = max(t_cpu(c), t_dma(c)) + min(t_cpu(c), t_dma(c)) / buffers
            total += steady * (k - 1 if i == 0 else k)
        return total

    def gbps(self, nbytes: int, s: Settings) -> float:
        return nbytes / self.seconds(nbytes, s) / GB

    def to_json(self) -> dict[str, float]:
        """Bandwidths in GB/s, times in microseconds (`_us`)."""
        return {(k[:-2] + "_us" if k.endswith("_s") else k):
                round(v * 1e6 if k.endswith("_s") else v, 3) if isinstance(v, float) else v
                for k, v in asdict(self).items()}


@functools.lru_cache(maxsize=1 << 12)
def blocks(direction: str, nbytes: int, chunk_bytes: int) -> tuple[tuple[int, int], ...]:
    """The engine's blocks for such a copy (native.transfer_blocks), as (size, how many in a row),
    in order."""
    return tuple((size, len(list(run)))
                 for size, run in itertools.groupby(native.transfer_blocks(direction, nbytes, chunk_bytes)))


# Fitted (least squares on log bandwidth, 16% rms) to the H200 sweep in
# benchmarks/results/h200-2026-12-02/engine-sweep.json (16 cores, PCIe Gen5 x16), which was measured
# with blocks of equal size, before the engine's ramps were hard-wired; on the engine's ramped blocks
# the same parameters follow that sweep within 18% rms. The tests use these as the simulated
# machine; its choices of chunk per size are the sweep's best or next to it.
H200 = {
    "h2d": PipelineModel(55.5, 7.33e-6, 8.01, 49.8, 5.77e-6, 0.198e-6, 15.9e-6, cores=16, direction="h2d"),
    "d2h": PipelineModel(55.5, 6.46e-6, 7.51, 49.7, 4.89e-6, 0.170e-6, 14.7e-6, cores=16, direction="d2h"),
}


@dataclass(frozen=True)
class Probe:
    """What the instant search measures for one direction (seconds, one copy each, medians)."""

    pinned_small: tuple[int, float]      # (bytes, seconds) of a pinned DMA, small
    pinned_large: tuple[int, float]      # and large
    cpu_one: tuple[int, float]           # (bytes, seconds) of a 1-thread memcpy
    cpu_many: tuple[int, int, float]     # (threads, bytes, seconds) of the fastest many-thread memcpy
    small_blocks: tuple[tuple[Settings, int, float], ...]  # engine copies cut into many blocks
    one_block: tuple[Settings, int, float]                 # an engine copy of one block
    cores: int
    direction: str                       # h2d or d2h: the model's block geometry


def _solve_cpu_block(model: PipelineModel, nbytes: int, s: Settings, seconds: float) -> float:
    """The per-block CPU overhead that makes the model take `seconds` (bisection: the model's
    time grows with it)."""
    lo, hi = 0.0, 1e-3
    for _ in range(60):
        mid = (lo + hi) / 2
        trial = replace(model, block_overhead_s=mid, lane_overhead_s=0.0)
        if trial.seconds(nbytes, s) < seconds:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def fit(p: Probe) -> PipelineModel:
    """The model's parameters from one direction's probe."""
    (ns, ts), (nl, tl) = p.pinned_small, p.pinned_large
    link = nl / tl / GB
    dma = max(0.0, ts - ns / (link * GB))
    lane = p.cpu_one[0] / p.cpu_one[1] / GB
    memory = max(lane, p.cpu_many[1] / p.cpu_many[2] / GB)
    model = PipelineModel(link, dma, lane, memory, 0.0, 0.0, 0.0, cores=p.cores, direction=p.direction)
    for _ in range(2):  # the per-copy and per-block costs each hide in the other's measurement
        per_block = [(s.threads, _solve_cpu_block(model, n, s, t))
                     for s, n, t in p.small_blocks]
        (t1, o1), (t2, o2) = per_block[0], per_block[-1]
        lane_cost = max(0.0, (o2 - o1) / (t2 - t1)) if t2 != t1 else 0.0
        block_cost = max(0.0, o1 - lane_cost * t1)
        model = replace(model, block_overhead_s=block_cost, lane_overhead_s=lane_cost)
        s, n, t = p.one_block
        model = replace(model, copy_overhead_s=max(0.0, t - (model.seconds(n, s) - model.copy_overhead_s)))
    return model


SHORTLIST = 3  # the model's guesses measured per size (plus the settings in force)


def shortlist(estimates: dict[Settings, float], within: float, prior: Settings | None = None,
              size: int = SHORTLIST) -> list[Settings]:
    """What the instant search measures for one size: the model's choice (the least resources
    within `within` of its best), then its best predictions with a half, a quarter... of that
    staging ring (buffers x chunk): the model favours large rings, and a ring that spills the CPU
    caches is what it knows nothing about; then `prior` (the settings in force)."""
    if not estimates:
        return [prior] if prior else []
    picked = [search.choose(estimates, within)]
    ring = picked[0].buffers * picked[0].chunk_bytes
    while len(picked) < size:
        ring //= 2
        smaller = [c for c in estimates if c.buffers * c.chunk_bytes <= ring]
        if not smaller:
            break
        picked.append(search.choose({c: estimates[c] for c in smaller}, within))
    if prior is not None and prior not in picked:
        picked.append(prior)
    return picked


def search_direction(measure: search.Measure, probe: Probe, direction: str, sizes: list[int],
                     grid: Callable[[int], list[Settings]], opts: search.Options = search.DEFAULTS,
                     tick: search.Tick | None = None,
                     prior: Callable[[int], Settings | None] | None = None
                     ) -> tuple[search.DirectionResult, PipelineModel]:
    """The instant search for one direction: fit the model, let it short-list settings per size,
    measure those side by side (with `prior(size)`, the settings in force, if given) and take the
    best against the driver's copy (which decides pass-through and gives `gbps`)."""
    fitted = fit(probe)
    results = []
    for n in sorted(set(sizes)):
        candidates = grid(n)
        picks = shortlist({c: fitted.gbps(n, c) for c in candidates}, opts.within, prior(n) if prior else None)
        results.append(search.pick_measured(measure, direction, n, picks, len(candidates), opts, tick))
    return search.direction_result(direction, results, opts), fitted
