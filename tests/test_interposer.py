"""The interposer and engine against the stand-in driver: bytes, doors, ordering, pass-through.

A copy server (tests/preloaded/copy_server.py) runs under LD_PRELOAD=libcmt.so with the fake
libcuda; tests send it requests. Every reply carries cmt's statistics for that request, so each
test also checks what cmt did (accelerated, or passed through for the right reason).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cmt.native import library_path
from preloaded.client import CopyServer, outcome

TESTS = Path(__file__).resolve().parent
MIB = 1 << 20

# Stage everything from 1 byte, in 4 KiB chunks over 3 threads: many chunk boundaries.
AGGRESSIVE_PLAN = ";".join(f"{d}:{m}=threads:3,buffers:{b},chunk_bytes:{c}"
                           for d in ("h2d", "d2h") for m, b, c in ((1, 6, 4096), (1048576, 9, 65536)))


@pytest.fixture(scope="module")
def server(fake_driver_dir):
    s = CopyServer(fake_driver_dir)
    yield s
    s.close()


# Ramped blocks (128K, 256K, 512K, then 1M; device-to-host down to 128K at the end; the ramp starts at chunk/8
# but at 64 KiB or more) of 4 KiB pieces (CMT_TEST_HOOKS) over 3 threads.
RAMPED_PLAN = ";".join(f"{d}:1=threads:3,buffers:5,chunk_bytes:1048576,stores:{{0}}" for d in ("h2d", "d2h"))
MANY_PIECES = "piece=4096,guard=0,wait_setup=1"


@pytest.fixture(scope="module")
def eager_servers(fake_driver_dir):
    servers = {"uniform": CopyServer(fake_driver_dir, CMT_PLAN=AGGRESSIVE_PLAN),
               # filled and drained with streaming stores
               "ramped": CopyServer(fake_driver_dir, CMT_PLAN=RAMPED_PLAN.format("stream"), CMT_TEST_HOOKS=MANY_PIECES),
               # consecutive device-to-host copies use the two ends of slots twice their blocks' size (a rule
               # for larger copies makes the slots 4 MiB)
               "window-flip": CopyServer(fake_driver_dir, CMT_PLAN=RAMPED_PLAN.format("stream") +
                                         ";d2h:1073741824=threads:3,buffers:4,chunk_bytes:4194304",
                                         CMT_TEST_HOOKS=MANY_PIECES),
               # cached stores: the last blocks' lines demoted by the lanes once out of work
               "ramped-cached": CopyServer(fake_driver_dir, CMT_PLAN=RAMPED_PLAN.format("cached"),
                                           CMT_TEST_HOOKS=MANY_PIECES)}
    yield servers
    for s in servers.values():
        s.close()



# ---- bytes ------------------------------------------------------------------------------------

SIZES = st.one_of(
    st.integers(1, 64 * 1024),
    st.integers(64 * 1024, 8 * MIB),
    st.sampled_from([1, 4095, 4096, 4097, 65535, 65536, 65537, MIB - 1, MIB, MIB + 1, 3 * MIB + 17]),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=SIZES, host_off=st.integers(0, 63), dev_off=st.integers(0, 63),
       pair=st.sampled_from([("cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2"),
                             ("cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2"),
                             ("cuMemcpyHtoD_v2_ptds", "cuMemcpyDtoH_v2_ptds"),
                             ("cuMemcpyHtoDAsync_v2_ptsz", "cuMemcpyDtoHAsync_v2_ptsz"),
                             ("cuMemcpy", "cuMemcpy"), ("cuMemcpyAsync_ptsz", "cuMemcpyAsync")]),
       stream=st.sampled_from(["null", "legacy", "per_thread", "blocking", "nonblocking"]),
       seed=st.integers(0, 2**32),
       geometry=st.sampled_from(["uniform", "ramped", "window-flip", "ramped-cached"]))
def test_bytes_exact_at_any_size_and_offset(eager_servers, size, host_off, dev_off, pair, stream, seed, geometry):
    r = eager_servers[geometry]("roundtrip", size=size, host_off=host_off, dev_off=dev_off, h2d=pair[0], d2h=pair[1],
                     stream=stream, seed=seed)
    assert r["device_ok"] and r["host_ok"]
    assert outcome(r, "h2d") == {"accelerated": 1} and outcome(r, "d2h") == {"accelerated": 1}


@pytest.mark.parametrize("geometry", ["ramped", "window-flip", "ramped-cached"])
def test_bytes_exact_through_every_kind_of_block(eager_servers, geometry):
    """A size that ramps up, runs full blocks and ramps down, with data unlike what the slots held:
    a block staged at the wrong place in its slot cannot pass."""
    for seed in (1, 2, 3):  # window-flip: one end of the slots, the other, the first again
        r = eager_servers[geometry]("roundtrip", size=5 * MIB + 4097, host_off=1, dev_off=2, seed=seed)
        assert r["device_ok"] and r["host_ok"]


@pytest.mark.parametrize("size", [64 * MIB + 3, 256 * MIB])
def test_bytes_exact_large(server, size):
    r = server("roundtrip", size=size, host_off=5, dev_off=3, seed=size)
    assert r["device_ok"] and r["host_ok"]
    assert outcome(r, "h2d") == {"accelerated": 1} and outcome(r, "d2h") == {"accelerated": 1}


@pytest.mark.parametrize("size", [5 * MIB + 123, 40 * MIB])
def test_device_to_host_into_never_touched_memory(server, size):
    # The destination starts 3 bytes into a fresh mapping, and the server touches its first page
    # (as malloc does with its chunk header): cmt must still see that the memory is fresh.
    r = server("roundtrip", size=size, dst_kind="fresh", h2d="cuMemcpyHtoD_v2", d2h="cuMemcpyDtoHAsync_v2",
               stream="blocking")
    assert r["device_ok"] and r["host_ok"]
    assert outcome(r, "d2h") == {"accelerated": 1}


# ---- every entry point through every door -------------------------------------------------------

PAIRS = [("cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2"), ("cuMemcpyHtoD_v2_ptds", "cuMemcpyDtoH_v2_ptds"),
         ("cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2"),
         ("cuMemcpyHtoDAsync_v2_ptsz", "cuMemcpyDtoHAsync_v2_ptsz"),
         ("cuMemcpy", "cuMemcpy_ptds"), ("cuMemcpyAsync", "cuMemcpyAsync_ptsz")]


@pytest.mark.parametrize("door", ["dlsym", "gpa_v2", "gpa_v2_ptsz", "gpa_v1"])
@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: p[0])
def test_every_entry_point_through_every_door(server, door, pair):
    r = server("roundtrip", size=2 * MIB + 7, h2d=pair[0], d2h=pair[1], door=door, stream="blocking")
    assert r["device_ok"] and r["host_ok"]
    assert outcome(r, "h2d") == {"accelerated": 1} and outcome(r, "d2h") == {"accelerated": 1}


def test_direct_symbols_of_a_program_linked_with_libcuda(run_c_program, tmp_path):
    source = (TESTS / "preloaded" / "direct_calls.cpp").read_text()
    proc = run_c_program(source, tmp_path, env={"LD_PRELOAD": str(library_path()), "CMT_STATS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK" in proc.stdout
    # 6 H2D and 6 D2H entry points (typed, _ptds/_ptsz, cuMemcpy[Async]) each staged once.
    assert re.search(r"h2d accelerated\s+6 copies", proc.stderr), proc.stderr
    assert re.search(r"d2h accelerated\s+6 copies", proc.stderr), proc.stderr


# ---- stream ordering ------------------------------------------------------------------------------

@pytest.mark.parametrize("stream", ["blocking", "nonblocking", "per_thread"])
def test_copies_wait_for_prior_work_and_later_work_waits_for_them(server, stream):
    r = server("ordering", size=3 * MIB, stream=stream)
    assert r["d2h_waited"], "D2H read device memory before the earlier write on its stream finished"
    assert r["h2d_ordered"], "H2D was overtaken by earlier work, or later work did not wait for it"


def test_the_caller_waits_for_prior_work_before_staging(server):
    """As the driver's own staged copy does: the stream's earlier work (0.2 s here) comes first."""
    assert server("ordering", size=3 * MIB, stream="nonblocking")["h2d_call_s"] >= 0.15


def test_legacy_stream_copy_waits_for_blocking_streams(server):
    r = server("ordering", size=3 * MIB, stream="blocking", copy_stream="legacy")
    assert r["d2h_waited"] and r["h2d_ordered"]


# ---- pass-through cases -------------------------------------------------------------------------

@pytest.mark.parametrize("host_kind,reason", [("pinned", "pinned_host"), ("registered", "pinned_host")])
def test_pinned_and_registered_memory_pass_through(server, host_kind, reason):
    r = server("roundtrip", size=4 * MIB, host_kind=host_kind, dst_kind=host_kind, h2d="cuMemcpyHtoDAsync_v2",
               d2h="cuMemcpyDtoHAsync_v2", stream="blocking")
    assert r["device_ok"] and r["host_ok"]
    assert outcome(r, "h2d") == {reason: 1} and outcome(r, "d2h") == {reason: 1}


def test_small_copies_pass_through(server):
    r = server("roundtrip", size=4096)
    assert r["device_ok"] and r["host_ok"]
    assert outcome(r, "h2d") == {"below_minimum": 1}


def test_managed_memory_passes_through(server):
    r = server("call", entry="cuMemcpyHtoD_v2", size=4 * MIB, managed=True)
    assert r["rc"] == 0 and outcome(r, "h2d") == {"managed": 1}


def test_capturing_stream_passes_through_with_the_drivers_error(server):
    r = server("call", entry="cuMemcpyHtoDAsync_v2", size=4 * MIB, stream="blocking", capture=True)
    assert r["rc"] == 900 and outcome(r, "h2d") == {"capturing": 1}


def test_no_context_passes_through_with_the_drivers_error(server):
    r = server("call", entry="cuMemcpyHtoD_v2", size=4 * MIB, no_context=True)
    assert r["rc"] == 201 and outcome(r, "h2d") == {"no_context": 1}


def test_out_of_range_device_copy_gets_the_drivers_error(server):
    r = server("call", entry="cuMemcpyHtoD_v2", size=4 * MIB, dev_off=4096)
    assert r["rc"] == 1 and outcome(r, "h2d") == {"device_range": 1}


@pytest.mark.parametrize("case", ["both_host", "both_device"])
def test_uva_copies_that_are_not_host_device_are_left_alone(server, case):
    r = server("call", entry="cuMemcpy", size=4 * MIB, **{case: True})
    assert r["rc"] == 0 and r["stats"] == {}


def test_old_32bit_abi_entry_points_are_not_wrapped(server):
    r = server("call", entry="cuMemcpyHtoD", size=4 * MIB)
    assert r["stats"] == {}


# ---- concurrency, fork, switches ----------------------------------------------------------------

def staged_or_busy(r: dict, direction: str) -> int:
    """Copies staged, or (4 MiB or less, finding their GPU's pipeline busy) passed to the driver;
    -1 if any went elsewhere."""
    counts = outcome(r, direction)
    return sum(counts.values()) if set(counts) <= {"accelerated", "pipelines_busy"} else -1


def test_eight_threads_four_streams_at_once(server):
    r = server("concurrent", threads=8, streams=4, rounds=6)
    assert r["errors"] == []
    assert staged_or_busy(r, "h2d") == 48 and staged_or_busy(r, "d2h") == 48, r


def test_several_devices_and_threads_share_the_engine(fake_driver_dir):
    s = CopyServer(fake_driver_dir, FAKE_CUDA_DEVICES="2")
    try:
        r = s("multi_device", threads=6, rounds=5)
        assert r["devices"] == 2 and r["errors"] == []
        assert staged_or_busy(r, "h2d") == 30 and staged_or_busy(r, "d2h") == 30, r
    finally:
        s.close()


def test_legacy_stream_copy_during_another_streams_capture(server):
    r = server("legacy_during_capture", size=4 * MIB)
    assert r["rc"] == 906 and outcome(r, "h2d") == {"capturing": 1}


def test_forked_child_passes_everything_through(server):
    r = server("fork", size=4 * MIB)
    assert outcome(r["child"], "h2d") == {"forked_child": 1}
    assert r["parent"]["device_ok"] and r["parent"]["host_ok"]
    assert outcome(r["parent"], "h2d") == {"accelerated": 1}


def test_cmt_disable_turns_everything_off(fake_driver_dir):
    s = CopyServer(fake_driver_dir, CMT_DISABLE="1")
    try:
        r = s("roundtrip", size=8 * MIB)
        assert r["device_ok"] and r["host_ok"]
        assert outcome(r, "h2d") == {"disabled": 1} and outcome(r, "d2h") == {"disabled": 1}
    finally:
        s.close()


def test_debug_log_explains_each_decision_once(fake_driver_dir):
    s = CopyServer(fake_driver_dir, CMT_LOG="debug")
    for _ in range(3):
        s("roundtrip", size=8 * MIB)
        s("roundtrip", size=1000)
        s("roundtrip", size=8 * MIB, dst_kind="fresh")
    err = s.close()
    assert err.count("d2h into memory not faulted in yet") == 1, err
    assert err.count("h2d copy of 8388608 bytes: accelerated") == 1, err
    assert err.count("below_minimum") == 2, err  # once per direction


@pytest.mark.parametrize("name,value", [("CMT_LOG", "bogus"), ("CMT_PREFAULT", "bogus"), ("CMT_SPIN_US", "abc"),
                                        ("CMT_STATS", "maybe"), ("CMT_TEST_HOOKS", "piece=x")])
def test_a_setting_that_is_not_understood_is_warned_about_once(fake_driver_dir, name, value):
    s = CopyServer(fake_driver_dir, **{name: value})
    r = s("roundtrip", size=8 * MIB)
    err = s.close()
    assert r["device_ok"] and r["host_ok"]
    assert err.count(f"ignoring {name}") == 1, err
    assert "expected" in err


def test_valid_settings_are_taken_silently(fake_driver_dir):
    s = CopyServer(fake_driver_dir, CMT_LOG="warn", CMT_PREFAULT="populate", CMT_SPIN_US="0", CMT_STATS="0")
    r = s("roundtrip", size=8 * MIB, dst_kind="fresh")
    err = s.close()
    assert r["device_ok"] and r["host_ok"] and "warning" not in err, err


def test_an_invalid_hand_set_plan_keeps_the_defaults(fake_driver_dir):
    s = CopyServer(fake_driver_dir, CMT_PLAN="h2d:1=threads:3,buffers:99,chunk_bytes:4096")
    r = s("roundtrip", size=8 * MIB)
    err = s.close()
    assert r["device_ok"] and r["host_ok"] and outcome(r, "h2d") == {"accelerated": 1}
    assert "ignoring invalid CMT_PLAN (expected 'pass' or settings: buffers must be 1..64" in err, err



# ---- copies at once -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def slow_link_server(fake_driver_dir):
    """A link of 0.1 GB/s in the stand-in driver: 8 MiB take 84 ms per DMA stream, so whether copies ran
    at once or one after another shows in their wall time."""
    s = CopyServer(fake_driver_dir, FAKE_CUDA_COPY_GBPS="0.1", FAKE_CUDA_DEVICES="2",
                   CMT_PLAN=";".join(f"{d}:1=threads:2,buffers:4,chunk_bytes:1048576" for d in ("h2d", "d2h")))
    yield s
    s.close()


@pytest.mark.parametrize("jobs", [
    [["h2d", 0], ["h2d", 1]],                           # two GPUs
    [["h2d", 0], ["d2h", 1], ["h2d", 1], ["d2h", 0]],   # both ways on both
], ids=["two-devices", "both-ways-on-two-devices"])
def test_copies_to_different_gpus_run_at_once(slow_link_server, jobs):
    r = slow_link_server("overlap", size=8 * MIB, jobs=jobs)
    assert r["errors"] == []
    count = {d: sum(1 for j in jobs if j[0] == d) for d in ("h2d", "d2h")}
    assert {d: v["accelerated"] for d, v in r["stats"].items()} == {d: c for d, c in count.items() if c}
    one = max(r["alone_s"])
    # one after another they would take len(jobs) times as long as one alone; each GPU's copies take turns
    per_gpu = max(sum(1 for j in jobs if j[1] == g) for g in (0, 1))
    assert r["together_s"] < one * (per_gpu + len(jobs)) / 2, r


def test_a_small_copy_does_not_wait_behind_a_large_one(slow_link_server):
    """A 1 MiB copy that finds the GPU's pipeline busy with a 16 MiB one (168 ms on the slow link)
    goes to the driver at once; a 16 MiB one waits its turn."""
    r = slow_link_server("overlap", size=16 * MIB, jobs=[["h2d", 1], ["h2d", 1, MIB, 0.03], ["d2h", 1, 16 * MIB, 0.03]])
    assert r["errors"] == [] and r["stats"] == {"h2d": {"accelerated": 1, "pipelines_busy": 1},
                                                "d2h": {"accelerated": 1}}, r
    assert r["end_s"][1] < r["end_s"][0] < r["end_s"][2], r


# ---- never slower than the driver -------------------------------------------------------------------

def test_staging_slower_than_the_driver_backs_off_and_comes_back(fake_driver_dir):
    """The stand-in's DMAs from pinned memory (cmt's) are made slower than its pageable copies (the
    driver's own): cmt passes copies through while staging loses, and stages again once it wins."""
    s = CopyServer(fake_driver_dir, CMT_LOG="debug", CMT_STATS="1", CMT_TEST_HOOKS="wait_setup=1",
                   CMT_PLAN=";".join(f"{d}:1048576=threads:2,buffers:4,chunk_bytes:1048576" for d in ("h2d", "d2h")))
    # The driver's copy at 0.25 GB/s (16 ms for 4 MiB) while staging wins: a staged copy that a busy
    # 2-CPU runner deschedules for a few ms still wins (at 0.5 GB/s, 1 run in 16 backed off there).
    copies = {"size": 4 * MIB, "count": 12}
    quiet = s("timed_copies", pinned_gbps=0, pageable_gbps=0.25, **copies)
    busy = s("timed_copies", pinned_gbps=0.05, pageable_gbps=2, **{**copies, "count": 24})
    again = s("timed_copies", pinned_gbps=0, pageable_gbps=0.25, **{**copies, "count": 40})
    err = s.close()
    assert quiet["ok_bytes"] and busy["ok_bytes"] and again["ok_bytes"]
    assert quiet["stats"] == {"h2d": {"accelerated": 12}, "d2h": {"accelerated": 12}}
    assert (quiet["events"]["backed_off"], quiet["events"]["staged_again"]) == (0, 0), quiet
    assert busy["events"]["backed_off"] == 2, busy  # once per direction
    assert all(busy["stats"][d]["backed_off"] >= 8 for d in ("h2d", "d2h")), busy
    assert again["events"]["staged_again"] == 2, again
    assert all(again["stats"][d]["accelerated"] >= 10 for d in ("h2d", "d2h")), again
    assert err.count("bytes back off to the driver") == 2 and err.count("bytes staged again") == 2, err
    assert "backed off to the driver 2 times, staged again 2 times" in err, err


def test_copies_of_a_backed_off_size_go_to_the_driver_without_waiting_for_their_stream(fake_driver_dir):
    """Once the guard has backed off a size, its copies (but for the probes) go straight to the driver:
    no event recorded and waited on for the stream, which cost a 1 MiB copy 5-15 us on the H100."""
    s = CopyServer(fake_driver_dir, CMT_STATS="1", CMT_TEST_HOOKS="wait_setup=1,busy_cpus=0",
                   CMT_PLAN=";".join(f"{d}:1048576=threads:2,buffers:2,chunk_bytes:262144|driver:1000"
                                     for d in ("h2d", "d2h")))  # 4 blocks in 2 slots: each direction waits on DMAs
    slow = {"pinned_gbps": 0.05, "pageable_gbps": 2, "size": MIB}
    first = s("timed_copies", **slow, count=24)
    names = ["cuEventRecord", "cuEventSynchronize"]
    before = s("counts", names=names)["counts"]
    later = s("timed_copies", **slow, count=32)
    after = s("counts", names=names)["counts"]
    s.close()
    assert first["ok_bytes"] and later["ok_bytes"] and first["events"]["backed_off"] == 2, first
    passed = sum(later["stats"][d].get("backed_off", 0) for d in ("h2d", "d2h"))
    assert passed >= 48, later
    # the few probes' own waits (their DMAs' too), not one per passed copy
    assert after["cuEventSynchronize"] - before["cuEventSynchronize"] < passed / 2, (before, after, later)


@pytest.mark.parametrize("driver_gbps", [0.01, 1000], ids=["staging_wins", "staging_loses"])
def test_the_plans_driver_rate_lets_a_host_busy_from_the_start_back_off(fake_driver_dir, driver_gbps):
    """A host busy from the process's start: staging never falls from a best, so only the driver's
    rate that `cmt tune` measured (the plan's `driver:` figure) shows that it may lose. The guard then
    measures the driver and passes copies to it; where staging beats that rate, nothing is measured."""
    s = CopyServer(fake_driver_dir, CMT_STATS="1", CMT_TEST_HOOKS="wait_setup=1",
                   CMT_PLAN=";".join(f"{d}:1048576=threads:2,buffers:4,chunk_bytes:1048576|driver:{driver_gbps}"
                                     for d in ("h2d", "d2h")))
    loses = driver_gbps > 1
    # The stand-in's speeds: staging's pinned DMAs at 0.05 GB/s against the driver's 2, or unbounded.
    r = s("timed_copies", pinned_gbps=0.05 if loses else 0, pageable_gbps=2 if loses else 0.5, size=4 * MIB,
          count=16)
    s.close()
    assert r["ok_bytes"]
    if loses:
        assert r["events"]["backed_off"] == 2, r  # once per direction, within its first copies
        assert all(r["stats"][d]["backed_off"] >= 8 for d in ("h2d", "d2h")), r
    else:
        # Nothing backs off. (On a loaded runner one staged copy may stall far below the best rate,
        # and the guard then measures the driver: two copies passed, as for any such fall.)
        assert not r["events"].get("backed_off"), r
        assert all(r["stats"][d].get("accelerated", 0) >= 14 and set(r["stats"][d]) <= {"accelerated", "backed_off"}
                   for d in ("h2d", "d2h")), r


def test_probes_of_a_size_that_keeps_losing_come_less_and_less_often(fake_driver_dir):
    """A host that stays busy: the guard backed a size off, and its probes (staged copies, which lose
    to the driver's) come at least every 250 ms at first, then twice as long after each one that lost
    (up to 2 s): copies spaced 250 ms apart were otherwise all probes, and a large copy's probe on a
    busy host costs it much more than the driver's copy."""
    s = CopyServer(fake_driver_dir, CMT_STATS="1", CMT_TEST_HOOKS="wait_setup=1,busy_cpus=0",
                   CMT_PLAN=";".join(f"{d}:1048576=threads:2,buffers:4,chunk_bytes:1048576|driver:1000"
                                     for d in ("h2d", "d2h")))
    # 4 MiB through the driver in 105 ms, staged in 210: each direction copies every 210-315 ms
    r = s("timed_copies", pinned_gbps=0.02, pageable_gbps=0.04, size=4 * MIB, count=24)
    s.close()
    # (host-to-device copies return with their DMAs in flight: staged, they win here)
    d2h = r["stats"]["d2h"]
    assert r["ok_bytes"] and r["events"]["backed_off"] >= 1, r
    # 3 copies staged to learn the rate, then probes at about 0.25, 0.75, 1.75 and 3.75 s; with one
    # every 250 ms, every copy of this direction was a probe (22 of 24 staged)
    assert d2h.get("accelerated", 0) <= 9 and d2h.get("backed_off", 0) >= 15, r


def test_the_drivers_slow_first_copy_is_measured_again(fake_driver_dir):
    """A real driver's first pageable copy of a process also sets up its own staging: the rate the
    guard measures on it is far too low, and staging would never look close to the driver again. So
    the guard measures a second time at once, and backs off where staging loses."""
    s = CopyServer(fake_driver_dir, CMT_STATS="1", CMT_TEST_HOOKS="wait_setup=1,busy_cpus=0",
                   FAKE_CUDA_FIRST_PAGEABLE_US="300000",
                   CMT_PLAN=";".join(f"{d}:1048576=threads:2,buffers:4,chunk_bytes:1048576|driver:1000"
                                     for d in ("h2d", "d2h")))
    r = s("timed_copies", pinned_gbps=0.05, pageable_gbps=2, size=4 * MIB, count=16)
    s.close()
    assert r["ok_bytes"]
    assert r["events"]["backed_off"] == 2, r  # the direction whose first measurement was slow too
    assert all(r["stats"][d]["backed_off"] >= 8 for d in ("h2d", "d2h")), r


# ---- contexts that end ----------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["reset", "destroy"])
def test_copies_after_their_context_ended_get_a_new_pipeline_and_every_byte(fake_driver_dir, how):
    """cudaDeviceReset (the primary context goes on under its handle with nothing of what it had),
    or a created context destroyed and another created: the engine's pipeline for the old context
    (its streams, events and staging gone with it) must not serve the new one. Copies after it, from
    the same thread and a new one, are staged again, on a pipeline of their own, byte for byte."""
    s = CopyServer(fake_driver_dir, CMT_STATS="1", FAKE_CUDA_REUSE_CONTEXTS="1")  # a new context, the old handle
    r = s("context_ends", how=how, size=8 * MIB)
    s.close()
    assert r["ok"] and r["same_handle"], r
    for trip in (r["first"], *r["after"]):
        assert trip["device_ok"] and trip["host_ok"], r
        assert trip["stats"] == {"h2d": {"accelerated": 1}, "d2h": {"accelerated": 1}}, r


def test_a_program_that_resets_its_device_again_and_again_keeps_its_copies_staged(fake_driver_dir):
    """A test suite that resets the device between tests: each reset's pipeline is reused for the
    next context (a process registers at most 64 with the lane pool), so copies after the 80th
    reset are still staged, byte for byte."""
    s = CopyServer(fake_driver_dir, CMT_STATS="1")
    r = s("context_ends", how="reset", size=MIB, repeat=80)
    s.close()
    assert r["ok"], r
    assert all(t["device_ok"] and t["host_ok"] for t in r["after"]), r
    staged = [t["stats"] == {"h2d": {"accelerated": 1}, "d2h": {"accelerated": 1}} for t in r["after"]]
    assert all(staged), staged.index(False)


# ---- the node's budget of copy threads ------------------------------------------------------------

def _lanes_settle(server, want: dict, timeout_s: float = 20) -> dict:
    """Polls the node's lanes until every key of `want` has its value (lanes move between two pieces
    of a copy); returns the last answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = server("node_lanes")
        if all(got[k] == v for k, v in want.items()) or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


@pytest.fixture
def own_node():
    """CMT_TEST_HOOKS' item that gives the test's processes a node-budget segment of their own: a
    test run beside it, a cmt user on the machine or an earlier test's process still exiting holds
    none of its lanes."""
    name = f"t{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield f"node={name}"
    Path(f"/dev/shm/cmt-budget4-{os.getuid()}-{name}").unlink(missing_ok=True)


def test_processes_share_the_nodes_budget_and_a_killed_ones_lanes_come_back(fake_driver_dir, own_node):
    """Two processes with a budget of 4 worker lanes (CMT_NODE_THREADS): the first takes 3 while it
    copies alone; the second's copy gets the 1 left, then its fair share of 2 from the first during
    both copies; never more than the budget. When the first is killed mid-copy, its lanes return."""
    env = {"CMT_NODE_THREADS": "4", "FAKE_CUDA_COPY_GBPS": "0.02", "CMT_TEST_HOOKS": "guard=0,wait_setup=1," + own_node,
           "CMT_PLAN": ";".join(f"{d}:1=threads:4,buffers:2,chunk_bytes:1048576" for d in ("h2d", "d2h"))}
    env["SERVER_CONTEXT"] = "created"  # each ring is made at its first copy (copy_server.py)
    a, b = CopyServer(fake_driver_dir, **env), CopyServer(fake_driver_dir, **env)
    try:
        before = b("node_lanes")["in_use"]
        assert b("node_lanes")["budget"] == 4
        a("hold", size=96 * MIB)  # 4.8 s on the slow link
        assert _lanes_settle(a, {"mine": 3})["mine"] == 3 and b("node_lanes")["in_use"] == before + 3
        b("hold", size=192 * MIB, settle_s=0)  # 9.6 s
        seen = [b("node_lanes")["in_use"] for _ in range(20)]
        assert _lanes_settle(b, {"mine": 2})["mine"] == 2  # taken up while its copy runs
        assert a("node_lanes")["mine"] == 2  # let go while its copy runs
        assert max(seen) <= 4 and b("node_lanes")["in_use"] == 4, seen  # never more than the budget
        assert a("held")["exact"] == [True]  # the copy whose lane left mid-copy
        a("hold", size=96 * MIB)  # again, while b still copies: its share is free
        assert _lanes_settle(a, {"mine": 2})["mine"] == 2
        a.proc.kill()
        a.proc.wait(timeout=30)
        assert b("node_lanes")["in_use"] == 2  # the killed process's 2 came back; b still holds 2
    finally:
        for server in (a, b):  # and reaped: a zombie's pid still exists, and its share with it
            server.proc.kill()
            server.proc.wait(timeout=30)


def test_a_copy_that_let_a_lane_go_takes_it_up_again_when_the_other_copy_ends(fake_driver_dir, own_node):
    """A budget of 4 worker lanes: the first process's long copy takes 3, lets one go to the second's
    short copy (a fair share of 2 each), and takes it up again, while it runs, once the second's
    copy has ended."""
    env = {"CMT_NODE_THREADS": "4", "FAKE_CUDA_COPY_GBPS": "0.02", "CMT_TEST_HOOKS": "guard=0,wait_setup=1," + own_node,
           "CMT_PLAN": ";".join(f"{d}:1=threads:4,buffers:2,chunk_bytes:1048576" for d in ("h2d", "d2h"))}
    env["SERVER_CONTEXT"] = "created"  # each ring is made at its first copy (copy_server.py)
    a, b = CopyServer(fake_driver_dir, **env), CopyServer(fake_driver_dir, **env)
    try:
        a("hold", size=192 * MIB)  # 9.6 s on the slow link
        assert _lanes_settle(a, {"mine": 3})["mine"] == 3
        b("hold", size=24 * MIB, settle_s=0)  # 1.2 s
        assert _lanes_settle(a, {"mine": 2})["mine"] == 2
        assert b("held")["exact"] == [True]
        assert _lanes_settle(a, {"mine": 3})["mine"] == 3  # a's copy still runs
        assert a("held")["exact"] == [True]
    finally:
        for server in (a, b):
            server.proc.kill()
            server.proc.wait(timeout=30)


def test_three_processes_copying_in_turns_and_at_once_keep_the_budget_and_every_byte(fake_driver_dir, own_node):
    """Three processes on a budget of 4 worker lanes start copies of different lengths at staggered
    times, so that lanes leave and are taken up again in every order: the lanes in use never exceed
    the budget, every byte arrives, and every lane is given back at the end."""
    env = {"CMT_NODE_THREADS": "4", "FAKE_CUDA_COPY_GBPS": "0.05", "CMT_TEST_HOOKS": "guard=0,wait_setup=1," + own_node,
           "CMT_PLAN": ";".join(f"{d}:1=threads:4,buffers:2,chunk_bytes:1048576" for d in ("h2d", "d2h"))}
    servers = [CopyServer(fake_driver_dir, **env) for _ in range(3)]
    try:
        before = servers[0]("node_lanes")["in_use"]
        seen = []
        for round_sizes in ([96, 24, 48], [16, 80, 32], [40, 40, 40]):
            for server, mib in zip(servers, round_sizes, strict=True):
                server("hold", size=mib * MIB, settle_s=0.1)
                seen += [servers[0]("node_lanes")["in_use"] - before for _ in range(3)]
        for _ in range(40):
            seen.append(servers[0]("node_lanes")["in_use"] - before)
            time.sleep(0.05)
        exact = [server("held")["exact"] for server in servers]
        assert exact == [[True] * 3] * 3, exact
        assert max(seen) <= 4 and max(seen) >= 3, seen
        assert servers[0]("node_lanes")["in_use"] == before
    finally:
        for server in servers:
            server.proc.kill()
            server.proc.wait(timeout=30)


def test_a_copy_that_lacks_its_share_takes_up_lanes_that_come_free(fake_driver_dir, own_node):
    """A budget of 4 worker lanes: the first process's shorter copy takes 3; the second's long copy
    gets the 1 left and lacks 1 of its fair share (2), which it takes up while it runs, not only from
    its next copy on. When the first copies again it takes its share of what is free; the second,
    at its share, lets nothing go, and both copies' bytes arrive."""
    env = {"CMT_NODE_THREADS": "4", "FAKE_CUDA_COPY_GBPS": "0.02", "CMT_TEST_HOOKS": "guard=0,wait_setup=1," + own_node,
           "CMT_PLAN": ";".join(f"{d}:1=threads:4,buffers:2,chunk_bytes:1048576" for d in ("h2d", "d2h"))}
    env["SERVER_CONTEXT"] = "created"  # each ring is made at its first copy (copy_server.py)
    a, b = CopyServer(fake_driver_dir, **env), CopyServer(fake_driver_dir, **env)
    try:
        before = b("node_lanes")["in_use"]
        a("hold", size=48 * MIB)  # 2.4 s on the slow link
        assert _lanes_settle(a, {"mine": 3})["mine"] == 3
        b("hold", size=192 * MIB, settle_s=0)  # 9.6 s
        assert _lanes_settle(a, {"mine": 0})["mine"] == 0  # a's copy ended
        assert _lanes_settle(b, {"mine": 2})["mine"] == 2, b("node_lanes")
        a("hold", size=96 * MIB)  # a copies again: its share of 2 is free; b, at its share, keeps 2
        assert _lanes_settle(a, {"mine": 2})["mine"] == 2
        time.sleep(0.3)
        assert b("node_lanes")["mine"] == 2 and b("node_lanes")["in_use"] == before + 4
        assert b("held")["exact"] == [True] and a("held")["exact"] == [True, True]  # lanes that joined mid-copy
    finally:
        for server in (a, b):
            server.proc.kill()
            server.proc.wait(timeout=30)


def test_a_copy_leaves_the_cpus_that_other_programs_keep_busy(fake_driver_dir, own_node):
    """A budget of 8 with 5 CPUs kept busy by other programs (the test hook stands in for what
    /proc/stat shows): a copy that asks for 8 lanes gets its caller and 2 workers, the 3 CPUs left."""
    env = {"CMT_NODE_THREADS": "8", "FAKE_CUDA_COPY_GBPS": "0.02",
           "CMT_TEST_HOOKS": "guard=0,wait_setup=1,busy_cpus=5," + own_node,
           "CMT_PLAN": ";".join(f"{d}:1=threads:8,buffers:2,chunk_bytes:1048576" for d in ("h2d", "d2h"))}
    s = CopyServer(fake_driver_dir, **env)
    try:
        before = s("node_lanes")
        assert before["others_busy"] == 5
        s("hold", size=16 * MIB)
        assert s("node_lanes")["in_use"] == before["in_use"] + 2
    finally:
        s.proc.kill()
        s.proc.wait(timeout=30)


def test_the_cpus_that_other_programs_keep_busy_are_measured(fake_driver_dir):
    """Two CPU-burning processes: the engine's measure (/proc/stat less its own CPU time) sees at
    least one CPU kept busy by others."""
    s = CopyServer(fake_driver_dir, CMT_TEST_HOOKS="guard=0,wait_setup=1")
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        s("node_lanes")  # a first sample
        time.sleep(0.3)
        s("node_lanes")
        time.sleep(0.3)
        busy = s("node_lanes")["others_busy"]
    finally:
        for b in burners:
            b.kill()
            b.wait(timeout=30)
        s.close()
    assert busy >= 1.0, busy


def test_processes_share_the_nodes_pinned_staging_and_a_killed_ones_comes_back(fake_driver_dir, own_node):
    """10 MiB of pinned staging beyond what other processes hold (CMT_NODE_PINNED_MB): the first
    process's ring takes 6 (4 slots of 1 MiB and 2 spares); the second gets the 4 left and copies with
    2 slots, exactly; when the first is killed, its 6 MiB return."""
    probe = CopyServer(fake_driver_dir, SERVER_CONTEXT="created", CMT_TEST_HOOKS="guard=0," + own_node)
    before = probe("node_lanes")["pinned_in_use"]  # none: the test's own segment
    probe.close()
    env = {"CMT_NODE_PINNED_MB": str(before + 10), "CMT_TEST_HOOKS": "guard=0,wait_setup=1," + own_node,
           "CMT_PLAN": ";".join(f"{d}:1=threads:2,buffers:4,chunk_bytes:1048576" for d in ("h2d", "d2h")),
           "SERVER_CONTEXT": "created"}  # each ring is made at its first copy (copy_server.py)
    a, b = CopyServer(fake_driver_dir, **env), CopyServer(fake_driver_dir, **env)
    try:
        r = a("roundtrip", size=8 * MIB)
        assert r["device_ok"] and r["host_ok"] and outcome(r, "h2d") == {"accelerated": 1}
        assert b("node_lanes")["pinned_in_use"] == before + 6
        r = b("roundtrip", size=8 * MIB, seed=1)
        assert r["device_ok"] and r["host_ok"] and outcome(r, "h2d") == {"accelerated": 1}
        assert b("node_lanes")["pinned_in_use"] == before + 10  # never more than the budget
        a.proc.kill()
        a.proc.wait(timeout=30)
        assert b("node_lanes")["pinned_in_use"] == before + 4
    finally:
        for server in (a, b):  # and reaped: a zombie's pid still exists, and its share with it
            server.proc.kill()
            server.proc.wait(timeout=30)
