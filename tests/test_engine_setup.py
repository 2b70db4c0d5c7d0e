"""A GPU's staging pipeline is set up in the background, when the process makes its first primary
context or at a context's first copy: until it is ready, copies go to the driver (never slower than
without cmt), and its ring is sized once for every rule in force. Most tests here are of copies that
come during a setup: their server makes a context of its own (cuCtxCreate), whose setup starts at its
first copy."""

from __future__ import annotations

import time

from preloaded.client import CopyServer, outcome

MIB = 1 << 20
CREATED = {"SERVER_CONTEXT": "created"}  # the setup starts at the first copy (copy_server.py)


def test_the_first_copies_go_to_the_driver_until_the_pipeline_is_ready(fake_driver_dir):
    # No wait_setup, as in real programs; pinning a staging buffer takes 20 ms, as a real driver's can.
    s = CopyServer(fake_driver_dir, **CREATED, CMT_TEST_HOOKS="guard=0", FAKE_CUDA_HOST_ALLOC_US="20000")
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


def test_copies_passed_during_the_setup_do_not_wait_for_its_pinning(fake_driver_dir):
    # A real driver's calls wait while another thread pins memory (the stand-in's pageable copies and
    # pointer queries too, with FAKE_CUDA_HOST_ALLOC_US). The setup pins 8 buffers of 50 ms each (long
    # enough for the test's copies to come during it on a slow runner); a copy passed to the driver
    # meanwhile waits for the buffer being pinned, not for all of them: the
    # setup pauses while a copy is in flight, its checks included (on the H100 the first 64 MiB
    # device-to-host copy took 50-80 ms under cmt, 9 plain).
    plan = ";".join(f"{d}:1=threads:2,buffers:6,chunk_bytes:1048576" for d in ("h2d", "d2h"))
    s = CopyServer(fake_driver_dir, **CREATED, CMT_PLAN=plan, CMT_TEST_HOOKS="guard=0", FAKE_CUDA_HOST_ALLOC_US="50000",
                   FAKE_CUDA_PAGEABLE_GBPS="2")
    first = s("one_way", direction="h2d", size=MIB)
    assert first["bytes_ok"] and outcome(first, "h2d") == {"warming": 1}
    passed = [s("one_way", direction=d, size=4 * MIB, seed=k) for k, d in enumerate(("d2h", "h2d", "d2h"))]
    s.close()
    for r, d in zip(passed, ("d2h", "h2d", "d2h"), strict=True):
        assert r["bytes_ok"] and outcome(r, d) == {"warming": 1}
        # 2 ms to copy, plus at most the 50 ms of the buffer being pinned when it came (and slack);
        # the last comes after more than the setup's 8 MiB were passed, and first waits up to 40 ms
        assert r["seconds"] < 0.12 + (0.04 if r is passed[-1] else 0), [p["seconds"] for p in passed]


def test_the_staging_ring_is_made_once_for_the_largest_rule(fake_driver_dir):
    # Small copies use 4 buffers of 1 MiB, large ones 6 of 4 MiB: the first copy already gets the ring
    # of the large ones, and no later copy replaces or adds a buffer.
    plan = ";".join(f"{d}:1=threads:2,buffers:4,chunk_bytes:1048576;"
                    f"{d}:16777216=threads:2,buffers:6,chunk_bytes:4194304" for d in ("h2d", "d2h"))
    s = CopyServer(fake_driver_dir, **CREATED, CMT_PLAN=plan)
    names = ["cuMemHostRegister_v2", "cuMemHostUnregister", "cuMemHostAlloc"]  # staging is registered
    before = s("counts", names=names)["counts"]
    made = []
    for size in (2 * MIB, 32 * MIB, 3 * MIB, 64 * MIB):
        r = s("roundtrip", size=size, seed=size)
        assert r["device_ok"] and r["host_ok"]
        assert outcome(r, "h2d") == {"accelerated": 1} and outcome(r, "d2h") == {"accelerated": 1}
        now = s("counts", names=names)["counts"]
        made.append({k: now[k] - before[k] for k in names})
    s.close()
    # and two spares (job.hpp)
    assert made == [{"cuMemHostRegister_v2": 6 + 2, "cuMemHostUnregister": 0, "cuMemHostAlloc": 0}] * 4


def _first_staged_after(s, first: dict, size: int) -> dict:
    """After a first copy that cmt did not stage: the first pageable round trip of `size`, once the
    setup that copy started has had time to finish (the stand-in pins in well under a second)."""
    r = s("roundtrip", **first)
    assert r["device_ok"] and r["host_ok"]
    time.sleep(1.0)
    later = s("roundtrip", size=size, seed=7)
    assert later["device_ok"] and later["host_ok"]
    return later


def test_a_pinned_or_small_first_copy_starts_the_setup(fake_driver_dir):
    # CuPy, safetensors and JAX copy from pinned buffers of their own first, and a from_pretrained
    # makes small copies first: their first pageable copies found the setup still running and went
    # to the driver (H100, 2026-12-06). Now the first copy of any kind starts it.
    for first in ({"size": 8 * MIB, "host_kind": "pinned", "dst_kind": "pinned"}, {"size": 4096}):
        s = CopyServer(fake_driver_dir, **CREATED, CMT_TEST_HOOKS="guard=0", FAKE_CUDA_HOST_ALLOC_US="2000")
        later = _first_staged_after(s, first, 8 * MIB)
        s.close()
        assert outcome(later, "h2d") == {"accelerated": 1} and outcome(later, "d2h") == {"accelerated": 1}, first


def test_a_plan_that_stages_nothing_sets_nothing_up(fake_driver_dir):
    plan = "h2d:0=pass;d2h:0=pass"
    s = CopyServer(fake_driver_dir, **CREATED, CMT_PLAN=plan, CMT_TEST_HOOKS="guard=0")
    names = ["cuMemHostRegister_v2", "cuMemHostAlloc"]
    before = s("counts", names=names)["counts"]
    _first_staged_after(s, {"size": 4096}, 8 * MIB)
    after = s("counts", names=names)["counts"]
    s.close()
    assert after == before


def test_back_to_back_long_copies_do_not_hold_the_setup_back(fake_driver_dir):
    # The setup pauses while a copy passed to the driver runs, but not for the whole of a long one:
    # with 1 GiB copies back to back, a pause per copy until each ended let CuPy's five get()s all
    # go to the driver (H100, 2026-12-06). Here 8 copies of about 100 ms each run back to back and
    # the ring has 8 buffers: with a pause until each copy ends, none would be staged.
    plan = ";".join(f"{d}:1=threads:2,buffers:6,chunk_bytes:1048576" for d in ("h2d", "d2h"))
    s = CopyServer(fake_driver_dir, **CREATED, CMT_PLAN=plan, CMT_TEST_HOOKS="guard=0", FAKE_CUDA_HOST_ALLOC_US="1000")
    r = s("timed_copies", count=4, size=20 * MIB, pinned_gbps=0, pageable_gbps=0.2)
    s.close()
    assert r["ok_bytes"]
    done = [outcome(r, d) for d in ("h2d", "d2h")]
    assert done[0].get("warming") and sum(o.get("accelerated", 0) for o in done) >= 4, done


def _setup_plan(driver_gbps: float) -> str:
    return ";".join(f"{d}:1=threads:2,buffers:6,chunk_bytes:1048576|driver:{driver_gbps}" for d in ("h2d", "d2h"))


def test_a_large_copy_waits_for_a_setup_that_ends_soon_and_is_staged(fake_driver_dir):
    # CuPy's 256 MiB get()s and a from_pretrained's copies of 4-128 MiB came while the setup ran and
    # went to the driver (H100, 2026-12-06), at a tenth of the staged rate. A copy the driver would
    # take 670 ms for (32 MiB at the plan's 0.05 GB/s) waits for a setup of 8 x 2 ms and is staged.
    s = CopyServer(fake_driver_dir, **CREATED, CMT_PLAN=_setup_plan(0.05), CMT_TEST_HOOKS="guard=0",
                   FAKE_CUDA_HOST_ALLOC_US="2000")
    r = s("one_way", direction="h2d", size=32 * MIB)
    s.close()
    assert r["bytes_ok"] and outcome(r, "h2d") == {"accelerated": 1}


def test_copies_wait_for_a_slow_setup_a_bounded_while(fake_driver_dir):
    # A setup of 8 x 500 ms: the first large copy waits at most 40 ms (the pipeline's budget; its
    # share, half the driver's 670 ms, is larger) and goes to the driver; later ones find the budget
    # spent and go at once. Each also waits, in the stand-in as in a real driver, for the buffers
    # being pinned while it runs (one or two): all three end well before the 4 s setup.
    s = CopyServer(fake_driver_dir, **CREATED, CMT_PLAN=_setup_plan(0.05), CMT_TEST_HOOKS="guard=0",
                   FAKE_CUDA_HOST_ALLOC_US="500000", FAKE_CUDA_PAGEABLE_GBPS="40", CMT_LOG="debug")
    done = [s("one_way", direction="h2d", size=32 * MIB, seed=k) for k in range(3)]
    log = s.close()
    for r in done:
        assert r["bytes_ok"] and outcome(r, "h2d") == {"warming": 1}
    assert "waits for it up to 40.0 ms" in log
    assert sum(r["seconds"] for r in done) < 3.3, [r["seconds"] for r in done]


def test_a_copy_does_not_wait_for_a_setup_that_cannot_end_in_its_share(fake_driver_dir):
    # The plan's driver figure is high (32 MiB in 0.3 ms at 100 GB/s): its share of a wait is far
    # less than what the setup of 8 MiB may take, so it goes to the driver at once.
    s = CopyServer(fake_driver_dir, **CREATED, CMT_PLAN=_setup_plan(100), CMT_TEST_HOOKS="guard=0",
                   FAKE_CUDA_HOST_ALLOC_US="2000", CMT_LOG="debug")
    r = s("one_way", direction="h2d", size=32 * MIB)
    log = s.close()
    assert r["bytes_ok"] and outcome(r, "h2d") == {"warming": 1}
    assert "waits for it" not in log


def _second_copy_during_the_setup(fake_driver_dir, expected_ms: int, gap_s: float = 0, **env: str) -> None:
    """A setup of 26 x 1 MiB, 3 ms to pin each, expected (test hook) to take `expected_ms`; a first
    4 MiB copy that starts it and goes to the driver, then, `gap_s` later, a second one that comes
    while the setup still runs (tried again if a loaded runner made it come later). Asserts that the
    second goes to the driver without waiting for the setup."""
    plan = ";".join(f"{d}:1=threads:2,buffers:24,chunk_bytes:1048576|driver:1" for d in ("h2d", "d2h"))
    for _ in range(3):
        s = CopyServer(fake_driver_dir, **CREATED, CMT_PLAN=plan,
                       CMT_TEST_HOOKS=f"guard=0,setup_expected_ms={expected_ms}", FAKE_CUDA_HOST_ALLOC_US="3000",
                       CMT_LOG="debug", **env)
        first = s("one_way", direction="h2d", size=4 * MIB)
        time.sleep(gap_s)
        second = s("one_way", direction="d2h", size=4 * MIB, seed=1)
        log = s.close()
        assert first["bytes_ok"] and second["bytes_ok"] and outcome(first, "h2d") == {"warming": 1}, log
        if outcome(second, "d2h") == {"warming": 1}:  # it came while the setup ran
            break
    assert outcome(second, "d2h") == {"warming": 1}, log
    assert "waits for it" not in log, log


def test_the_time_a_setup_paused_for_a_passed_copy_is_not_its_progress(fake_driver_dir):
    # The first 64 MiB device-to-host copy after a context took 8 ms under cmt against 5 plain (H100,
    # 2026-12-07): the setup had paused 5 ms for the copy before it, the copy's wait counted that as
    # progress, found the setup due, waited its 3.4 ms share for nothing and went to the driver. Here
    # the setup is expected to take 95 ms; the first copy (4 MiB at 0.05 GB/s, over 84 ms) pauses it
    # most of that time; the second would wait 2 ms at most: it goes to the driver at once.
    _second_copy_during_the_setup(fake_driver_dir, 95, FAKE_CUDA_PAGEABLE_GBPS="0.05")


def test_a_setup_that_pins_slower_than_expected_is_judged_by_its_own_pace(fake_driver_dir):
    # The driver registers more slowly while the program's copies run in it: on the H100 of
    # 2026-12-07, 14 x 8 MiB took 14.9 ms beside the first two copies against 7 alone, and the
    # device-to-host copy that came at 8.5 ms of the 7.3 expected waited its share for nothing. Here
    # the setup is expected to take 10 ms but pins each buffer in 3 ms. A copy that comes 30 ms in,
    # a few buffers pinned and many left, goes to the driver at once.
    _second_copy_during_the_setup(fake_driver_dir, 10, gap_s=0.03)


def test_after_the_setup_s_worth_of_passed_copies_a_copy_waits_for_it(fake_driver_dir):
    # A from_pretrained's copies of 4-128 MiB all went to the driver during a 100 ms setup (H200,
    # 2026-12-06); each one's share of a wait was a few milliseconds. Here the plan's driver figure
    # makes each copy's share tiny, and the setup of 8 x 1 MiB takes 20 ms more (as faulting pages in
    # would): of back-to-back 4 MiB copies, two pass (8 MiB, the setup's worth), the third waits for
    # the setup and is staged, and so are the rest.
    s = CopyServer(fake_driver_dir, **CREATED, CMT_PLAN=_setup_plan(100),
                   CMT_TEST_HOOKS="guard=0,setup_delay_us=20000", CMT_LOG="debug")
    r = s("timed_copies", count=3, size=4 * MIB, pinned_gbps=0, pageable_gbps=0)
    log = s.close()
    assert r["ok_bytes"]
    assert r["stats"] == {"h2d": {"warming": 1, "accelerated": 2}, "d2h": {"warming": 1, "accelerated": 2}}, log
    assert "after the program had passed more than the staging to the driver" in log


def test_without_the_setup_s_worth_passed_a_copy_does_not_wait(fake_driver_dir):
    # The same with one copy passed first (4 MiB of 8): the second's share is tiny, it goes at once.
    s = CopyServer(fake_driver_dir, **CREATED, CMT_PLAN=_setup_plan(100),
                   CMT_TEST_HOOKS="guard=0,setup_delay_us=200000", CMT_LOG="debug")
    done = [s("one_way", direction="h2d", size=4 * MIB, seed=k) for k in range(2)]
    log = s.close()
    assert all(r["bytes_ok"] for r in done) and [outcome(r, "h2d") for r in done] == [{"warming": 1}] * 2
    assert "passed more than the staging" not in log and done[1]["seconds"] < 0.1


def _tiny_plan() -> str:
    return ";".join(f"{d}:0=pass;{d}:1048576=threads:2,buffers:4,chunk_bytes:1048576" for d in ("h2d", "d2h"))


def _setup_line(log: str) -> str:
    return next(line for line in log.splitlines() if "staging pipeline set up" in line)


def test_the_staging_is_faulted_in_and_registered_when_the_context_is_made(fake_driver_dir):
    # Faulting the staging in was most of a setup's time (80 MiB: 27-35 ms of 34-41 on the lent VMs),
    # and a from_pretrained's copies came while it ran (all 30 went to the driver). Here each of the
    # ring's 6 buffers (4 and two spares) takes 100 ms more to fault in, as a slow host's would. The
    # server's cuDevicePrimaryCtxRetain starts the faulting, and the setup once the context is made:
    # the first copy, a while later, is staged. A context made by cuCtxCreate gets its setup at its
    # first copy, which goes to the driver meanwhile.
    hooks = "guard=0,fault_us=100000"
    s = CopyServer(fake_driver_dir, CMT_PLAN=_tiny_plan(), CMT_TEST_HOOKS=hooks, CMT_LOG="debug")
    time.sleep(1.5)
    r = s("roundtrip", size=8 * MIB)
    log = s.close()
    assert r["device_ok"] and r["host_ok"] and outcome(r, "h2d") == {"accelerated": 1}, log
    assert "staging for device 0 faulted in ahead: 6 slots of 1048576 bytes" in log, log
    assert "(6 faulted in ahead;" in _setup_line(log)

    s = CopyServer(fake_driver_dir, **CREATED, CMT_PLAN=_tiny_plan(), CMT_TEST_HOOKS=hooks, CMT_LOG="debug")
    time.sleep(1.5)
    r = s("roundtrip", size=8 * MIB)
    log = s.close()
    assert r["device_ok"] and r["host_ok"] and outcome(r, "h2d") == {"warming": 1}, log
    assert "faulted in ahead:" not in log


def test_a_copy_does_not_wait_for_staging_still_being_faulted_in_ahead(fake_driver_dir):
    # The process's first 64 MiB device-to-host copy, right after torch made the context, took 9.3 ms
    # under cmt against 4.9 plain (H100, 2026-12-07): the setup was expected at the speed of
    # registering its staging, as if it were all faulted in ahead, while the reserve was still
    # faulting it in, so the copy waited out its share and then went to the driver. Here the ring is
    # 20 slots of 32 MiB (640 MiB: 40 ms to register, 268 ms to fault in and register), each slot
    # 1 s slower to fault in; the copy's share of a wait is the pipeline's 40 ms (half of 32 MiB at
    # the plan's 0.4 GB/s is more). It comes once the context is made (within 228 ms of it, even on a
    # busy runner) and goes to the driver without waiting.
    plan = ";".join(f"{d}:1=threads:2,buffers:18,chunk_bytes:33554432|driver:0.4" for d in ("h2d", "d2h"))
    s = CopyServer(fake_driver_dir, CMT_PLAN=plan, CMT_TEST_HOOKS="guard=0,fault_us=1000000", CMT_LOG="debug")
    r = s("one_way", direction="h2d", size=32 * MIB)
    log = s.close()
    assert r["bytes_ok"] and outcome(r, "h2d") == {"warming": 1}, log
    assert "waits for it" not in log, log


def test_staging_faulted_in_ahead_that_no_setup_takes_is_let_go(fake_driver_dir):
    # The process's first primary context comes after a small copy in a context of its own, which
    # started that context's setup: the primary context's staging is faulted in ahead for its own
    # first copy, and with no copy within the hold (here 0 ms) let go; a copy on it then maps its own.
    s = CopyServer(fake_driver_dir, **CREATED, CMT_PLAN=_tiny_plan(),
                   CMT_TEST_HOOKS="guard=0,wait_setup=1,reserve_hold_ms=0", CMT_LOG="debug")
    s("roundtrip", size=4096)
    time.sleep(0.5)  # that setup done (a setup still mapping when the reserve comes takes it: the same device)
    s("retain")
    time.sleep(1.0)
    log = s.close()
    assert "staging for device 0 faulted in ahead: 6 slots" in log, log
    assert "no setup took the staging faulted in ahead for device 0 within 0 ms: let go" in log, log
    assert [line for line in log.splitlines() if "staging pipeline set up" in line][-1].count("(0 faulted in ahead;")


def test_a_plan_that_stages_nothing_faults_nothing_in_ahead(fake_driver_dir):
    s = CopyServer(fake_driver_dir, CMT_PLAN="h2d:0=pass;d2h:0=pass", CMT_LOG="debug")
    time.sleep(0.3)
    s("roundtrip", size=8 * MIB)
    log = s.close()
    assert "faulted in ahead" not in log and "staging pipeline set up" not in log


def test_a_refused_retain_faults_nothing_in_and_keeps_the_driver_s_answer(fake_driver_dir):
    # A retain of a device the driver does not have is refused as without cmt, and faults no staging
    # in; the process's first real primary context still gets its staging ahead.
    s = CopyServer(fake_driver_dir, **CREATED, CMT_PLAN=_tiny_plan(), CMT_LOG="debug")
    refused = s("retain", device=9)
    s("retain", device=0)
    time.sleep(0.5)
    log = s.close()
    assert refused["rc"] == 101, refused  # CUDA_ERROR_INVALID_DEVICE
    assert log.count("faulted in ahead:") == 1 and "staging for device 0 faulted in ahead" in log, log
