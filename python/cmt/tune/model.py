"""The instant search: a model of cmt's staging pipeline, fitted from a few measurements.

The engine (native/src/engine.cpp) cuts a copy into blocks of `chunk` bytes, one DMA each; with
ramping (CMT_RAMP, on by default) the first blocks grow from chunk/8 and, device-to-host (or with
CMT_RAMP_DOWN=1), the last ones shrink back, so that filling and draining the pipeline costs less
(`cut` below is its geometry). All T lanes fill (host-to-device) or drain (device-to-host) a block
together, while the copy engine works on the blocks before it; `buffers` slots let the two stages
run ahead of each other. Per block of c bytes:

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

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from ..bench.copy_sweep import EngineSettings
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
    ramp: bool = False        # the engine ramps block sizes (the H200 sweep was measured without)
    ramp_down: bool = True    # and ramps down at the end (device-to-host; host-to-device with CMT_RAMP_DOWN=1)

    def seconds(self, nbytes: int, s: EngineSettings) -> float:
        blocks = cut(nbytes, s.chunk, self.ramp, self.ramp_down)
        buffers = max(1, min(s.buffers, sum(k for _, k in blocks)))
        fill = min(min(s.threads, self.cores) * self.lane_gbps, self.memory_gbps) * GB
        per_block = self.block_overhead_s + self.lane_overhead_s * s.threads

        def t_cpu(c: int) -> float:
            return c / fill + per_block

        def t_dma(c: int) -> float:
            return c / (self.link_gbps * GB) + self.dma_overhead_s

        total = self.copy_overhead_s + t_cpu(blocks[0][0]) + t_dma(blocks[-1][0])
        for i, (c, k) in enumerate(blocks):
            steady = max(t_cpu(c), t_dma(c)) + min(t_cpu(c), t_dma(c)) / buffers
            total += steady * (k - 1 if i == 0 else k)
        return total

    def gbps(self, nbytes: int, s: EngineSettings) -> float:
        return nbytes / self.seconds(nbytes, s) / GB

    def to_json(self) -> dict[str, float]:
        """Bandwidths in GB/s, times in microseconds (`_us`)."""
        return {(k[:-2] + "_us" if k.endswith("_s") else k):
                round(v * 1e6 if k.endswith("_s") else v, 3) if isinstance(v, float) else v
                for k, v in asdict(self).items()}


def cut(nbytes: int, chunk: int, ramp: bool, down: bool = True) -> list[tuple[int, int]]:
    """The engine's blocks (Job::cut), as (size, how many in a row), in order; `down`: a ramped copy
    also ramps down."""
    piece = 64 << 10
    first = min(chunk, max(chunk // 8, piece)) if ramp else chunk
    out: list[tuple[int, int]] = []
    rem = nbytes

    def take(n: int, times: int = 1) -> None:
        nonlocal rem
        n = min(n, rem)
        if out and out[-1][0] == n:
            out[-1] = (n, out[-1][1] + times)
        else:
            out.append((n, times))
        rem -= n * times

    size = first
    while size < chunk and rem:  # ramp up
        take(size)
        size *= 2
    down = ramp and down
    if not down and rem >= chunk:  # full blocks to the end
        take(chunk, rem // chunk)
    elif down and rem > 2 * chunk:  # full blocks, leaving the ramp down its bytes
        take(chunk, -(-(rem - 2 * chunk) // chunk))
    while down and rem > first:  # ramp down: halve what is left
        take(min(chunk, (rem // 2 + piece - 1) // piece * piece))
    if rem:
        take(rem)
    return out


# Fitted (least squares on log bandwidth, 16% rms) to the H200 sweep in
# benchmarks/results/h200-2026-12-02/engine-sweep.json (16 cores, PCIe Gen5 x16). The tests use
# these as the simulated machine; its choices of chunk and threads match the sweep's best.
H200 = {
    "h2d": PipelineModel(55.5, 7.33e-6, 8.01, 49.8, 5.77e-6, 0.198e-6, 15.9e-6, cores=16),
    "d2h": PipelineModel(55.5, 6.46e-6, 7.51, 49.7, 4.89e-6, 0.170e-6, 14.7e-6, cores=16),
}


@dataclass(frozen=True)
class Probe:
    """What the instant search measures for one direction (seconds, one copy each, medians)."""

    pinned_small: tuple[int, float]      # (bytes, seconds) of a pinned DMA, small
    pinned_large: tuple[int, float]      # and large
    cpu_one: tuple[int, float]           # (bytes, seconds) of a 1-thread memcpy
    cpu_many: tuple[int, int, float]     # (threads, bytes, seconds) of the fastest many-thread memcpy
    small_blocks: tuple[tuple[EngineSettings, int, float], ...]  # engine copies cut into many blocks
    one_block: tuple[EngineSettings, int, float]                 # an engine copy of one block
    cores: int
    ramp: bool = True                    # whether the engine measured ramps its block sizes
    ramp_down: bool = True               # and ramps down at the end


def _solve_cpu_block(model: PipelineModel, nbytes: int, s: EngineSettings, seconds: float) -> float:
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
    model = PipelineModel(link, dma, lane, memory, 0.0, 0.0, 0.0, cores=p.cores, ramp=p.ramp,
                          ramp_down=p.ramp_down)
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


def shortlist(estimates: dict[EngineSettings, float], within: float, prior: EngineSettings | None = None,
              size: int = SHORTLIST) -> list[EngineSettings]:
    """What the instant search measures for one size: the model's choice (the least resources
    within `within` of its best), then its best predictions with a half, a quarter... of that
    staging ring (buffers x chunk): the model favours large rings, and a ring that spills the CPU
    caches is what it knows nothing about; then `prior` (the settings in force)."""
    if not estimates:
        return [prior] if prior else []
    picked = [search.choose(estimates, within)]
    ring = picked[0].buffers * picked[0].chunk
    while len(picked) < size:
        ring //= 2
        smaller = [c for c in estimates if c.buffers * c.chunk <= ring]
        if not smaller:
            break
        picked.append(search.choose({c: estimates[c] for c in smaller}, within))
    if prior is not None and prior not in picked:
        picked.append(prior)
    return picked


def search_direction(measure: search.Measure, probe: Probe, direction: str, sizes: list[int],
                     grid: Callable[[int], list[EngineSettings]], opts: search.Options = search.DEFAULTS,
                     tick: search.Tick | None = None,
                     prior: Callable[[int], EngineSettings | None] | None = None
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
