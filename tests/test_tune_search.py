"""The search logic of `cmt tune` against a simulated machine: the pipeline model fitted to the H200
sweep (cmt.tune.model.H200) with seeded noise, and the sweep's own measurements. No GPU, no driver."""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from cmt import config as cfg
from cmt import machine, native
from cmt.config import Settings
from cmt.tune import model, search

REPO = Path(__file__).resolve().parent.parent
SWEEP = REPO / "benchmarks" / "results" / "h200-2026-12-02" / "engine-sweep.json"
KIB, MIB = 1 << 10, 1 << 20
SIZES = [64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB]


def pageable_gbps(nbytes: int) -> float:
    """The H200's driver copy from pageable memory, roughly (copy.json): slow for small copies,
    ~10-14 GB/s for large ones."""
    return 14.0 * nbytes / (nbytes + 300 * KIB)


class Simulated:
    """`measure` for the search: the model's GB/s times (1 + noise), counted per settings."""

    def __init__(self, noise: float = 0.0, seed: int = 0, pageable=pageable_gbps):
        self.noise, self.rng, self.pageable = noise, random.Random(seed), pageable
        self.calls: Counter = Counter()

    def truth(self, direction: str, nbytes: int, s: Settings | None) -> float:
        return self.pageable(nbytes) if s is None else model.H200[direction].gbps(nbytes, s)

    def __call__(self, direction: str, nbytes: int, s: Settings | None) -> float:
        self.calls[(direction, nbytes, s)] += 1
        return self.truth(direction, nbytes, s) * (1 + self.rng.gauss(0, self.noise))


def grid(nbytes: int) -> list[Settings]:
    return search.candidates(nbytes, 16)


def optimum(direction: str, nbytes: int) -> tuple[Settings, float]:
    estimates = {c: model.H200[direction].gbps(nbytes, c) for c in grid(nbytes)}
    return search.choose(estimates, 0.01), max(estimates.values())


# -- the candidate grid ------------------------------------------------------------------------------
def test_candidates_respect_cores_blocks_and_limits():
    for n in SIZES:
        for c in search.candidates(n, 6, max_threads=4):
            assert 1 <= c.threads <= 4
            assert c.chunk_bytes <= max(64 * KIB, n // 2) and c.chunk_bytes * search.MAX_BLOCKS >= n
            assert c.buffers <= max(2, -(-n // c.chunk_bytes))
    assert {c.threads for c in search.candidates(MIB, 16)} == {1, 2, 3, 4, 6, 8, 10, 12, 14, 16}
    assert {c.threads for c in search.candidates(MIB, 1)} == {1}
    assert search.resource(Settings(2, 16, 8 * MIB)) < search.resource(Settings(3, 2, 64 * KIB))


def test_choose_takes_the_least_resources_within_one_percent():
    a, b, c = Settings(8, 4, MIB), Settings(4, 4, MIB), Settings(2, 4, MIB)
    assert search.choose({a: 10.0, b: 9.95, c: 9.8}, 0.01) == b
    assert search.choose({a: 10.0, b: 9.95, c: 9.8}, 0.03) == c


# -- the model --------------------------------------------------------------------------------------
def test_model_follows_the_h200_sweep():
    rows = json.loads(SWEEP.read_text())["rows"]
    errors = [math.log(model.H200[r["direction"]].gbps(r["size"], Settings(r["threads"], r["buffers"],
                                                                                r["chunk"])) / r["gbps"])
              for r in rows]
    assert math.sqrt(sum(e * e for e in errors) / len(errors)) < 0.2
    # its best chunk per (direction, size) is the sweep's best chunk, or next to it
    for d in ("h2d", "d2h"):
        for n in sorted({r["size"] for r in rows}):
            here = [r for r in rows if r["direction"] == d and r["size"] == n]
            measured = max(here, key=lambda r: r["gbps"])["chunk"]
            predicted = max(here, key=lambda r: model.H200[d].gbps(n, Settings(r["threads"], r["buffers"],
                                                                                      r["chunk"])))["chunk"]
            assert predicted in (measured // 2, measured, measured * 2), (d, n)


def test_model_pipeline_shape():
    m = model.H200["h2d"]
    big = 256 * MIB
    # more lanes help until memory bandwidth is reached, then cost overhead
    assert m.gbps(big, Settings(1, 8, 4 * MIB)) < m.gbps(big, Settings(6, 8, 4 * MIB))
    assert m.gbps(big, Settings(8, 8, 4 * MIB)) > m.gbps(big, Settings(64, 8, 4 * MIB))
    # tiny blocks pay per-block overhead; one buffer serialises the stages
    assert m.gbps(big, Settings(8, 8, 64 * KIB)) < 0.5 * m.gbps(big, Settings(8, 8, 4 * MIB))
    assert m.gbps(big, Settings(8, 1, 4 * MIB)) < m.gbps(big, Settings(8, 4, 4 * MIB))
    assert m.gbps(big, Settings(8, 8, 8 * MIB)) < m.link_gbps


def test_model_blocks_are_the_engines_per_direction():
    """The model reads the engine's own block geometry (native.transfer_blocks), grouped."""
    # device-to-host: up from chunk/8, full blocks, then down by halving what is left (64 KiB multiples)
    assert model.blocks("d2h", 16 * MIB, 2 * MIB) == (
        (256 * KIB, 1), (512 * KIB, 1), (MIB, 1), (2 * MIB, 6), (1152 * KIB, 1), (576 * KIB, 1), (320 * KIB, 1),
        (256 * KIB, 1))
    assert model.blocks("d2h", 64 * MIB, 4 * MIB)[-3:] == ((576 * KIB, 1), (320 * KIB, 1), (256 * KIB, 1))
    # host-to-device: up, then full blocks to the end
    assert model.blocks("h2d", 16 * MIB + KIB, 2 * MIB) == (
        (256 * KIB, 1), (512 * KIB, 1), (MIB, 1), (2 * MIB, 7), (256 * KIB + KIB, 1))
    assert model.blocks("h2d", 100, 4096) == model.blocks("d2h", 100, 4096) == ((100, 1),)
    for d in ("h2d", "d2h"):
        for n in (4096, 1000003, 64 * MIB + 5):
            for chunk in (4 * KIB, 64 * KIB, 2 * MIB):
                blocks = model.blocks(d, n, chunk)
                assert [c for c, k in blocks for _ in range(k)] == native.transfer_blocks(d, n, chunk)
                assert sum(c * k for c, k in blocks) == n and all(0 < c <= chunk for c, _ in blocks)
    assert model.H200["h2d"].direction == "h2d" and model.H200["d2h"].direction == "d2h"


def test_ramping_shortens_fill_and_drain(monkeypatch):
    m = model.H200["h2d"]
    s = Settings(8, 8, 8 * MIB)
    ramped = m.gbps(64 * MIB, s)
    monkeypatch.setattr(model, "blocks", lambda d, n, c: ((c, n // c),))  # blocks of equal size
    assert ramped > m.gbps(64 * MIB, s)


def _probe_from(m: model.PipelineModel) -> model.Probe:
    """What measure.probe would see on a machine that behaves exactly like the model."""
    small, large = 256 * KIB, 64 * MIB
    pin = lambda n: n / (m.link_gbps * 1e9) + m.dma_overhead_s  # noqa: E731
    blocks = [Settings(2, 16, 64 * KIB), Settings(8, 16, 64 * KIB)]
    one = Settings(1, 1, 64 * KIB)
    return model.Probe((small, pin(small)), (large, pin(large)), (large, large / (m.lane_gbps * 1e9)),
                       (16, large, large / (m.memory_gbps * 1e9)),
                       tuple((s, 8 * MIB, m.seconds(8 * MIB, s)) for s in blocks),
                       (one, 64 * KIB, m.seconds(64 * KIB, one)), m.cores, m.direction)


@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_fit_recovers_the_model_from_its_probe(direction):
    truth = model.H200[direction]
    fitted = model.fit(_probe_from(truth))
    for name in ("link_gbps", "lane_gbps", "memory_gbps", "dma_overhead_s", "copy_overhead_s"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=0.02), name
    # the two per-block costs trade off against each other; their sum at 8 lanes is what matters
    per_block = lambda m: m.block_overhead_s + 8 * m.lane_overhead_s  # noqa: E731
    assert per_block(fitted) == pytest.approx(per_block(truth), rel=0.05)
    for n in SIZES:
        s = optimum(direction, n)[0]
        assert fitted.gbps(n, s) == pytest.approx(truth.gbps(n, s), rel=0.02)


def test_instant_search_gives_valid_rules_near_the_optimum():
    sim = Simulated(noise=0.02, seed=3)
    config_rules = {}
    for d in ("h2d", "d2h"):
        result, fitted = model.search_direction(sim, _probe_from(model.H200[d]), d, SIZES, grid, search.INSTANT)
        for r in result.sizes:
            _, best = optimum(d, r.nbytes)
            assert sim.truth(d, r.nbytes, r.settings) >= 0.98 * best
            assert sum(sim.calls[(d, r.nbytes, s)] for s in (r.settings, None)) == 2 * search.INSTANT.final_samples
        # With the engine's ramped blocks the grid's best at 1 MiB (chunks up to 512K, cut into five
        # or six blocks) is about 10.3 GB/s, under the driver's 10.8: staging starts at 4 MiB.
        assert result.threshold is not None and MIB < result.threshold <= 4 * MIB
        config_rules[d] = search.rules(result)
    doc = cfg.TunedConfig(config_rules, "instant", {"hardware_id": "x"}).to_json()
    native.configure(cfg.parse(doc).to_plan())  # the native parser accepts it too


def test_shortlist_halves_the_ring_and_adds_the_settings_in_force():
    n = 1 << 30
    estimates = {c: model.H200["h2d"].gbps(n, c) for c in grid(n)}
    prior = Settings(10, 4, 8 * MIB)
    picks = model.shortlist(estimates, 0.01, prior)
    assert picks[0] == search.choose(estimates, 0.01) and picks[-1] == prior
    rings = [c.buffers * c.chunk_bytes for c in picks[:-1]]
    assert len(picks) == model.SHORTLIST + 1 and all(b <= a // 2 for a, b in zip(rings, rings[1:], strict=False))
    assert model.shortlist(estimates, 0.01, picks[1]) == picks[:model.SHORTLIST]  # no duplicates
    assert model.shortlist({}, 0.01, prior) == [prior] and model.shortlist({}, 0.01) == []


def test_instant_search_measures_past_what_the_model_misses():
    """The machine punishes staging rings over 64 MiB (they spill the caches, as on the H200);
    the model knows nothing of it, but its short-list is measured, so the search still lands close
    to the real best."""

    class Spilling(Simulated):
        def truth(self, direction, nbytes, s):
            g = super().truth(direction, nbytes, s)
            return g * 0.6 if s is not None and s.buffers * s.chunk_bytes > 64 * MIB else g

    sim = Spilling(noise=0.02, seed=5)
    sizes = [256 * MIB, 1 << 30]
    result, _ = model.search_direction(sim, _probe_from(model.H200["h2d"]), "h2d", sizes, grid, search.INSTANT)
    for r in result.sizes:
        best = max(sim.truth("h2d", r.nbytes, c) for c in grid(r.nbytes))
        assert r.settings.buffers * r.settings.chunk_bytes <= 64 * MIB
        assert sim.truth("h2d", r.nbytes, r.settings) >= 0.95 * best


def test_instant_search_tries_the_other_store_mode():
    """Streaming stores fill the staging buffers 40% faster on this simulated machine (as for
    host-to-device at 16 MiB on the H200); the model cannot see it, the measured short-list does."""

    class Streaming(Simulated):
        def truth(self, direction, nbytes, s):
            return super().truth(direction, nbytes, s) * (1.4 if s is not None and s.stores == "stream" else 1.0)

    sim = Streaming(noise=0.02, seed=11)
    result, _ = model.search_direction(sim, _probe_from(model.H200["h2d"]), "h2d", [16 * MIB, 64 * MIB], grid,
                                       search.INSTANT)
    assert all(r.settings.stores == "stream" for r in result.sizes)
    plain = Simulated(noise=0.02, seed=11)
    result, _ = model.search_direction(plain, _probe_from(model.H200["h2d"]), "h2d", [16 * MIB], grid, search.INSTANT)
    assert result.sizes[0].settings.stores == "cached"  # no gain, no switch


# -- the full search --------------------------------------------------------------------------------
@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_noiseless_search_finds_exactly_the_least_resources_within_one_percent(direction):
    sim = Simulated()
    for n in SIZES:
        r = search.search_size(sim, direction, n, grid(n))
        assert r.settings == optimum(direction, n)[0]


@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_noisy_search_is_within_two_percent_and_prunes(direction):
    """2% noise per sample (a median of several copies on a real machine is steadier than that)."""
    ratios = []
    for seed in range(12):
        sim = Simulated(noise=0.02, seed=seed)
        for n in (MIB, 16 * MIB, 256 * MIB):
            r = search.search_size(sim, direction, n, grid(n))
            chosen_opt, best = optimum(direction, n)
            ratios.append(sim.truth(direction, n, r.settings) / best)
            assert ratios[-1] >= 0.975, (seed, n, r.settings)
            # no more threads than the least within 1% needs, give or take a step of the grid
            assert r.settings.threads <= chosen_opt.threads + 4
            exhaustive = len(grid(n)) * search.DEFAULTS.final_samples
            assert r.measurements == sum(v for k, v in sim.calls.items() if k[:2] == (direction, n))
            assert r.measurements < 0.25 * exhaustive
            once = sum(1 for k, v in sim.calls.items() if k[:2] == (direction, n) and k[2] is not None and v == 1)
            assert once > 0.5 * len(grid(n))  # most candidates were dropped after one sample
    assert sum(ratios) / len(ratios) >= 0.99


def test_planned_measurements_matches_the_halving():
    sim = Simulated()
    n = 16 * MIB
    search.search_size(sim, "h2d", n, grid(n), search.Options(resource_checks=0))
    fresh = search.DEFAULTS.final_samples  # the winner's unbiased re-measurement
    assert sum(sim.calls.values()) == search.planned_measurements(len(grid(n))) + fresh
    assert search.planned_measurements(len(grid(n))) < 0.2 * len(grid(n)) * search.DEFAULTS.final_samples


@pytest.mark.parametrize("driver", [1.0, 1.5])
def test_pass_through_threshold_is_found_by_bisection(driver):
    """The threshold is bisected between the largest size that passes and the first staged one,
    measuring the first staged rule's settings. With the driver's copy 1.5 times as fast, those
    settings cross it in between; as it is, they beat it at the size below already (a 1 MiB chunk,
    cut into the engine's ramped blocks, beats the driver at 1 MiB, where that size's own grid,
    chunks up to half the copy, does not), and the bisection closes in on that size."""
    pageable = lambda n: driver * pageable_gbps(n)  # noqa: E731
    sim = Simulated(noise=0.0, pageable=pageable)
    result = search.search_direction(sim, "h2d", SIZES, grid)
    assert result.threshold is not None
    staged = [r for r in result.sizes if r.nbytes >= result.threshold]
    first = staged[0]
    # the true crossing of the first staged rule's settings with the driver's copy
    def margin(n):
        return sim.truth("h2d", n, first.settings) / pageable(n) - (1 + search.DEFAULTS.win_margin)
    below = [r.nbytes for r in result.sizes if r.nbytes < first.nbytes][-1]
    assert margin(first.nbytes) > 0 and (margin(below) < 0) == (driver > 1)
    lo, hi = below, first.nbytes
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if margin(int(mid)) > 0 else (mid, hi)
    assert hi / 1.25 <= result.threshold <= hi * 1.25
    assert below < result.threshold <= first.nbytes
    rules = search.rules(result)
    assert rules[0].passes and rules[0].min_bytes == 0
    assert rules[1].min_bytes == result.threshold and not rules[1].passes
    assert [r.min_bytes for r in rules[2:]] == [r.nbytes for r in staged[1:]]
    for r in rules[1:]:
        assert r.figures["gain"] > 1 and r.figures["gbps"] > 0 and r.figures["measured_bytes"] in SIZES


def test_pass_through_everywhere_and_nowhere():
    never = Simulated(pageable=lambda n: 1000.0)
    r = search.search_direction(never, "d2h", [MIB, 16 * MIB], grid)
    assert r.threshold is None and search.rules(r) == [cfg.Rule(0)]
    always = Simulated(pageable=lambda n: 0.1)
    r = search.search_direction(always, "d2h", [MIB, 16 * MIB], grid)
    assert r.threshold == MIB and [x.min_bytes for x in search.rules(r)] == [0, MIB, 16 * MIB]


def test_search_on_the_real_h200_sweep():
    """The sweep's own measurements (with noise on top) as the machine, on the sweep's grid."""
    rows = json.loads(SWEEP.read_text())["rows"]
    table = {(r["direction"], r["size"], Settings(r["threads"], r["buffers"], r["chunk"])): r["gbps"]
             for r in rows}
    default = {(r["direction"], r["size"]): r["default"] for r in rows}
    rng = random.Random(7)

    def measure(d, n, s):
        # The sweep measured cached stores only: the other store mode is taken to be the same.
        s = s if s is None else replace(s, stores="cached")
        return (default[(d, n)] if s is None else table[(d, n, s)]) * (1 + rng.gauss(0, 0.02))

    for (d, n), _ in default.items():
        here = {s: g for (dd, nn, s), g in table.items() if (dd, nn) == (d, n)}
        r = search.search_size(measure, d, n, list(here))
        assert here[replace(r.settings, stores="cached")] >= 0.97 * max(here.values()), (d, n)


# -- the shipped profile -----------------------------------------------------------------------------
def test_shipped_h200_profile_is_the_full_search_found_there():
    """The known H200 profile is the tuned file `cmt tune --search full` wrote on that machine,
    committed with the benchmark results, with the same rules."""
    path = cfg.PROFILES_DIR / "nvidia-h200-pcie5x16-1a2c1d17dfe9.json"
    conf = cfg.load(path)
    found = cfg.load(REPO / conf.extra["source"])
    assert conf.search == found.search == "full"
    hw = conf.machine
    assert (hw["gpu"], hw["pcie_gen"], hw["pcie_width"], hw["cpu_cores"], hw["numa_nodes"]) == ("NVIDIA H200", 5, 16,
                                                                                                  16, 1)
    assert machine.hardware_id(hw) == hw["hardware_id"] == "1a2c1d17dfe9"
    assert machine.slug(hw) == path.stem
    for d in cfg.DIRECTIONS:
        assert [r.to_json() for r in conf.rules[d]] == [r.to_json() for r in found.rules[d]]
    native.configure(conf.to_plan())
