"""A GPU's staging pipeline is set up in the background on its first copy: until it is ready, copies go
to the driver (never slower than without cmt), and its ring is sized once for every rule in force."""

from __future__ import annotations

import time

from preloaded.client import CopyServer, outcome

MIB = 1 << 20


def test_the_first_copies_go_to_the_driver_until_the_pipeline_is_ready(fake_driver_dir):
    # No wait_setup, as in real programs; pinning a staging buffer takes 20 ms, as a real driver's can.
    s = CopyServer(fake_driver_dir, CMT_TEST_HOOKS="guard=0", FAKE_CUDA_HOST_ALLOC_US="20000")
    first = s("roundtrip", size=8 * MIB)
    assert first["device_ok"] and first["host_ok"]
    assert outcome(first, "h2d") == {"warming": 1}
    # The setup takes milliseconds: copies are staged soon after.
    deadline = time.monotonic() + 10
    later = first
    while outcome(later, "h2d") != {"accelerated": 1} and time.monotonic() < deadline:
        time.sleep(0.01)
        later = s("roundtrip", size=8 * MIB, seed=1)
    assert later["device_ok"] and later["host_ok"]
    assert outcome(later, "h2d") == {"accelerated": 1} and outcome(later, "d2h") == {"accelerated": 1}
    s.close()


def test_the_staging_ring_is_made_once_for_the_largest_rule(fake_driver_dir):
    # Small copies use 4 buffers of 1 MiB, large ones 6 of 4 MiB: the first copy already gets the ring
    # of the large ones, and no later copy replaces or adds a buffer.
    plan = ";".join(f"{d}:1=threads:2,buffers:4,chunk_bytes:1048576;"
                    f"{d}:16777216=threads:2,buffers:6,chunk_bytes:4194304" for d in ("h2d", "d2h"))
    s = CopyServer(fake_driver_dir, CMT_PLAN=plan)
    names = ["cuMemHostAlloc", "cuMemFreeHost"]
    before = s("counts", names=names)["counts"]
    made = []
    for size in (2 * MIB, 32 * MIB, 3 * MIB, 64 * MIB):
        r = s("roundtrip", size=size, seed=size)
        assert r["device_ok"] and r["host_ok"]
        assert outcome(r, "h2d") == {"accelerated": 1} and outcome(r, "d2h") == {"accelerated": 1}
        now = s("counts", names=names)["counts"]
        made.append({k: now[k] - before[k] for k in names})
    s.close()
    assert made == [{"cuMemHostAlloc": 6 + 2, "cuMemFreeHost": 0}] * 4  # and two spares (job.hpp)
