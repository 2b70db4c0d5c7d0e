"""No copy waits on a descheduled lane: a lane parked in the middle of its piece (a test hook) has the
piece done by another lane, and the staging slot it may still write when it wakes is set aside until
it has left, a spare taking its place; so every byte arrives exactly (job.hpp)."""

from __future__ import annotations

import pytest

from preloaded.client import CopyServer, outcome

MIB = 1 << 20
PLAN = ";".join(f"{d}:1=threads:3,buffers:4,chunk_bytes:1048576" for d in ("h2d", "d2h"))


@pytest.mark.parametrize("direction", ["h2d", "d2h"])
@pytest.mark.parametrize("when", ["claimed", "copying"])
def test_a_parked_lanes_piece_is_taken_over_and_every_byte_arrives(fake_driver_dir, direction, when):
    # A link of 0.1 GB/s: the 32 MiB copy's DMAs take 335 ms, so the lane parked for 150 ms wakes in
    # the middle of the copy, while the slot it writes would otherwise carry later blocks.
    hooks = f"guard=0,wait_setup=1,park_piece=7,park_us=150000,park_before={int(when == 'claimed')}"
    s = CopyServer(fake_driver_dir, FAKE_CUDA_COPY_GBPS="0.1", CMT_PLAN=PLAN, CMT_TEST_HOOKS=hooks)
    r = s("one_way", direction=direction, size=32 * MIB, seed=7)
    again = s("one_way", direction=direction, size=32 * MIB, seed=8)  # the slots came back
    s.close()
    assert r["bytes_ok"] and outcome(r, direction) == {"accelerated": 1}, r
    # Device-to-host blocks follow their slots' chains: a lane that needs the parked block's slot
    # takes its piece over. A host-to-device block holds up its own slot only (the next block gets
    # whichever slot is freed first), so the other slots carry the copy on without taking it over.
    if direction == "d2h":
        assert r["events"]["taken_over"] >= 1, r
    assert again["bytes_ok"] and outcome(again, direction) == {"accelerated": 1}, again
    # The parked lane's 150 ms are hidden: the other lanes went on (without taking its piece over, the
    # copy would take them on top of its DMAs).
    assert r["seconds"] < again["seconds"] + 0.075, (r, again)
