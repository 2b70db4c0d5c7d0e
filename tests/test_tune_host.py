"""The h2h search of `cmt tune` (cmt.tune.host) against a synthetic cost model of host copies: one
thread's memcpy at a fixed rate, a split over T threads that pays for waking them and per piece
but moves up to the memory's limit. No GPU, no driver."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from cmt import config as cfg
from cmt.config import Settings
from cmt.tune import host, search

KIB, MIB = 1 << 10, 1 << 20


class HostMachine:
    """GB/s of a host copy: one thread at `one_gbps`; a split pays `wake_s` plus `piece_s` per piece
    its threads share, and moves at min(T * lane, memory) GB/s."""

    def __init__(self, one_gbps=8.0, lane_gbps=7.0, memory_gbps=45.0, wake_s=60e-6, piece_s=3e-6, noise=0.0,
                 seed=0):
        self.one, self.lane, self.memory, self.wake, self.piece = one_gbps, lane_gbps, memory_gbps, wake_s, piece_s
        self.noise, self.rng = noise, random.Random(seed)
        self.calls: Counter = Counter()

    def truth(self, nbytes: int, s: Settings | None) -> float:
        if s is None:
            return self.one
        pieces = math.ceil(nbytes / s.chunk_bytes)
        rate = min(s.threads * self.lane, self.memory) * 1e9
        seconds = self.wake + nbytes / rate + self.piece * math.ceil(pieces / s.threads)
        return nbytes / seconds / 1e9

    def __call__(self, direction: str, nbytes: int, s: Settings | None) -> float:
        assert direction == "h2h"
        self.calls[(nbytes, s)] += 1
        return self.truth(nbytes, s) * (1 + self.rng.gauss(0, self.noise))


def crossing(m: HostMachine, s: Settings) -> float:
    """The size from which `s` beats one thread by the search's margin (bisection on the truth)."""
    lo, hi = 4 * KIB, 1 << 30
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if m.truth(int(mid), s) >= (1 + search.DEFAULTS.win_margin) * m.one else (mid, hi)
    return hi


def test_candidates_split_over_two_threads_or_more_within_the_cores():
    for n in host.SIZES:
        full = host.candidates(n, 16)
        assert full and all(2 <= c.threads <= 16 and c.buffers == 1 and c.chunk_bytes <= max(4 * KIB, n // 2)
                            for c in full)
        assert all(c.threads <= 6 for c in host.candidates(n, 16, max_threads=6))
        instant = host.candidates(n, 16, instant=True)
        assert sorted({c.threads for c in instant}) == [2, 8, 16] and len(instant) == 3
    assert host.candidates(8 * MIB, 1) == [] and host.candidates(8 * MIB, 1, instant=True) == []


@pytest.mark.parametrize("instant", [False, True])
def test_the_threshold_is_where_splitting_starts_to_win(instant):
    m = HostMachine(noise=0.02)
    opts = search.INSTANT if instant else search.DEFAULTS
    r = host.search_threshold(m, 16, instant=instant, opts=opts)
    assert r.direction == "h2h" and r.threshold is not None
    rules = search.rules(r)
    assert rules[0] == cfg.Rule(0) and rules[1].min_bytes == r.threshold
    first = rules[1].settings
    assert first.threads >= 2 and first.buffers == 1
    # bisected towards the true crossing of the first rule's settings (within a step of the bisection)
    truth = crossing(m, first)
    assert truth / 1.5 <= r.threshold <= truth * 1.5, (r.threshold, truth)
    for rule in rules[1:]:
        assert rule.figures["gain"] > 1 and rule.figures["measured_bytes"] in host.SIZES
    # every rule is one the tuned file accepts
    doc = {"format": cfg.FORMAT, "version": cfg.VERSION, "h2h": [x.to_json() for x in rules]}
    assert cfg.parse(doc).rules["h2h"] == rules
    # the instant search stays small: three splits per size, a few samples each
    if instant:
        assert sum(m.calls.values()) <= host.planned_measurements(16, None, True, opts) * 1.2


def test_the_full_search_finds_more_threads_for_large_copies():
    m = HostMachine()
    r = host.search_threshold(m, 16)
    by_size = {x.nbytes: x.settings for x in r.sizes if x.settings is not None}
    # at 64 MiB the memory's limit is reached from ~7 threads: the least resources within 1% of it
    big = by_size[64 * MIB]
    assert m.truth(64 * MIB, big) >= 0.99 * max(m.truth(64 * MIB, c) for c in host.candidates(64 * MIB, 16))
    assert big.threads <= 10


def test_where_one_thread_always_wins_the_rules_turn_the_feature_off():
    memory_bound = HostMachine(one_gbps=12.0, lane_gbps=6.0, memory_gbps=12.0)
    for instant in (False, True):
        r = host.search_threshold(memory_bound, 16, instant=instant)
        assert r.threshold is None and search.rules(r) == [cfg.Rule(0)]
    single_core = host.search_threshold(HostMachine(), 1)
    assert single_core.threshold is None and search.rules(single_core) == [cfg.Rule(0)]
    assert cfg.TunedConfig({"h2h": [cfg.Rule(0)]}).to_plan() == "h2h:0=pass"
