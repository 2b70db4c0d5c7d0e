"""cmt.io's small transfers (up to 1 MiB, native/src/file_transfer.hpp's kSmallIoBytes) against the
stand-in driver: each goes through a pinned bounce buffer of its GPU (a pread into it, one DMA), not
the engine; they are byte-exact at any offset and size, many run at once, none waits behind a large
transfer, and their errors are the engine path's."""

from __future__ import annotations

import os

import pytest
from io_scenario import run_scenario


def test_small_reads_and_writes_are_byte_exact_at_odd_offsets_and_sizes(run_python, tmp_path):
    run_scenario(run_python, f'''
        from hypothesis import HealthCheck, given, settings, strategies as st
        root = {str(tmp_path)!r}
        SIZE, SLACK = 2 * MiB + 333, 8192
        small = cmt.io._lib.small_bytes()
        assert small == MiB, small
        data = pattern(SIZE, 21)
        src, out = os.path.join(root, "src.bin"), os.path.join(root, "out.bin")
        make_file(src, data)
        direct_ok = supports_o_direct(src)
        d, d2 = drv.mem_alloc(small + SLACK), drv.mem_alloc(small + SLACK)
        sentinel = b"\\xee" * (small + SLACK)
        f = cmt.io.open(src)
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)  # no readahead: the counts below are exact
        runs = []

        @settings(max_examples=40, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(file_offset=st.one_of(st.integers(0, 500).map(lambda k: k * 4096), st.integers(0, SIZE + 10)),
               size=st.one_of(st.integers(1, 9000), st.integers(1, small),
                              st.sampled_from([1, 4095, 4096, 4097, small - 1, small])),
               dev_offset=st.integers(0, SLACK), cached=st.booleans())
        def case(file_offset, size, dev_offset, cached):
            runs.append((file_offset, size, dev_offset, cached))
            if cached:
                with open(src, "rb") as g:
                    g.read()
            else:
                evict(src)
            drv.poke(d, sentinel)
            got, moved = counted(lambda: f.read((d, small + SLACK), size=size, file_offset=file_offset,
                                                dev_offset=dev_offset))
            expect = data[file_offset:file_offset + size]
            assert got == len(expect), (got, len(expect))
            back = drv.peek(d, small + SLACK)
            assert back[dev_offset:dev_offset + got] == expect
            assert back[:dev_offset] == sentinel[:dev_offset] and back[dev_offset + got:] == sentinel[dev_offset + got:]
            # Uncached: the bytes up to the first 4 KiB boundary go buffered on their own, then the
            # whole 4 KiB blocks O_DIRECT (they lie aligned in the bounce buffer), the tail buffered.
            head = min(got, -file_offset % 4096)
            whole = (got - head) // 4096 * 4096
            direct = whole if direct_ok and not cached else 0
            assert moved["direct_bytes"] == direct and moved["buffered_bytes"] == got - direct, (moved, got, head)

            payload = pattern(size, file_offset)
            drv.poke(d + dev_offset, payload)
            with cmt.io.open(out, "w+") as g:
                assert g.write((d, small + SLACK), size=size, file_offset=file_offset, dev_offset=dev_offset) == size
                drv.poke(d2, sentinel)
                assert g.read((d2, small + SLACK), size=size, file_offset=file_offset) == size
            back = drv.peek(d2, small + SLACK)
            assert back[:size] == payload and back[size:] == sentinel[size:]
            with open(out, "rb") as g:
                assert g.read() == b"\\0" * file_offset + payload

        case()
        assert len(runs) >= 40 and len({{r[1] for r in runs}}) > 15, runs
        # One bounce buffer and its stream did all of it, one transfer after another; no engine. (The
        # other pinned allocation: the page of flag words for stream-ordered transfers, made at open.)
        assert drv.call_count("cuMemHostAlloc") == 2 and drv.call_count("cuStreamCreate") == 1
        # One byte more than the threshold is the engine's (its staging ring is registered memory).
        assert drv.call_count("cuMemHostRegister_v2") == 0
        assert f.read((d, small + SLACK), size=small + 1) == small + 1 and drv.peek(d, small + 1) == data[:small + 1]
        assert drv.call_count("cuMemHostRegister_v2") > 0
        f.close()
    ''')


def test_many_small_transfers_run_at_once_and_each_is_exact(run_python, tmp_path):
    # A slow link (0.05 GB/s: 32 KiB take 0.6 ms of DMA) keeps each buffer busy long enough that the
    # transfers that find none free make more: how many were made tells how many ran at once.
    run_scenario(run_python, f'''
        import random
        root = {str(tmp_path)!r}
        path, out = os.path.join(root, "f.bin"), os.path.join(root, "out.bin")
        data = pattern(16 * MiB, 22)
        make_file(path, data)
        SLOT, N = 32 * 1024, 480
        d, w = drv.mem_alloc(N * SLOT), drv.mem_alloc(N * SLOT)
        payload = pattern(N * SLOT, 23)
        drv.poke(w, payload)
        rng = random.Random(5)
        ops = [(i, rng.randrange(len(data)), rng.randrange(1, SLOT + 1)) for i in range(N)]
        threads_before = threading.active_count()
        with cmt.io.open(path) as f, cmt.io.open(out, "w+") as g:
            futs = [f.pread((d, N * SLOT), size=n, file_offset=off, dev_offset=i * SLOT) for i, off, n in ops[:160]]
            writes = [g.pwrite((w, N * SLOT), size=SLOT - 7, file_offset=i * SLOT + 7, dev_offset=i * SLOT)
                      for i in range(N)]
            batch = cmt.io.Batch()
            index = {{batch.read(f, (d, N * SLOT), n, off, i * SLOT): (i, off, n) for i, off, n in ops[160:320]}}

            def caller(part):  # synchronous reads from threads of the program's own, all at once
                for i, off, n in part:
                    assert f.read((d, N * SLOT), size=n, file_offset=off, dev_offset=i * SLOT) == n
            callers = [threading.Thread(target=caller, args=(ops[320 + k::12],)) for k in range(12)]
            for t in callers:
                t.start()
            for t in callers:
                t.join()
            assert [fut.get() for fut in futs] == [n for _, _, n in ops[:160]]
            for c in batch.wait():
                assert c.result() == index[c.index][2], c
            assert all(fut.get() == SLOT - 7 for fut in writes)
        got = drv.peek(d, N * SLOT)
        for i, off, n in ops:
            assert got[i * SLOT:i * SLOT + n] == data[off:off + n], (i, off, n)
        written = open(out, "rb").read()
        for i in range(N):
            assert written[i * SLOT + 7:(i + 1) * SLOT] == payload[i * SLOT:(i + 1) * SLOT - 7], i
        made = drv.call_count("cuMemHostAlloc") - 1  # less the flag words' page, made at open
        assert 4 <= made <= 16, made  # many at once; never more than a context's 16 buffers
        assert drv.call_count("cuStreamCreate") == made  # a stream each; no engine
        assert threading.active_count() - threads_before <= 8  # the small transfers' pool
    ''', FAKE_CUDA_COPY_GBPS="0.05")


def test_a_small_transfer_does_not_wait_behind_large_ones(run_python, tmp_path):
    # The first engine copy's only lane is parked for 3 s (a test hook) while it holds the GPU's
    # pipeline; eight more large reads queue behind it, filling the pool of large transfers. Small
    # reads and writes, synchronous, futures, a batch and stream-ordered, are done meanwhile.
    run_scenario(run_python, f'''
        root = {str(tmp_path)!r}
        path, out = os.path.join(root, "f.bin"), os.path.join(root, "out.bin")
        data = pattern(18 * MiB, 24)
        make_file(path, data)
        big = drv.mem_alloc(len(data))
        d = drv.mem_alloc(MiB)
        s = drv.stream_create()
        with cmt.io.open(path, settings={{"threads": 1}}) as slow, cmt.io.open(path) as f, \\
                cmt.io.open(out, "w") as g:
            bigs = [slow.pread((big, len(data)), size=2 * MiB, file_offset=k * 2 * MiB, dev_offset=k * 2 * MiB)
                    for k in range(9)]
            time.sleep(0.3)  # the first has its pipeline, parked
            start = time.monotonic()
            assert f.read((d, MiB), size=65536, file_offset=12345) == 65536
            futs = [f.pread((d, MiB), size=4096, file_offset=k * 4096, dev_offset=k * 4096) for k in range(16)]
            assert [fut.get() for fut in futs] == [4096] * 16
            with cmt.io.Batch() as batch:
                for k in range(8):
                    batch.read(f, (d, MiB), 1000, 5 * MiB + k, 100000 + k * 1000)
                assert all(c.result() == 1000 for c in batch.wait())
            assert g.pwrite((d, MiB), size=MiB, file_offset=3).get() == MiB
            assert f.read_async((d, MiB), s, size=777, file_offset=99).check_bytes_done(timeout=10) == 777
            took = time.monotonic() - start
            # A large stream-ordered read, whose staging the parked copy's pipeline has: queued at
            # once, not after the parked copy; done after it.
            s2 = drv.stream_create()
            big2 = drv.mem_alloc(2 * MiB)
            t = time.monotonic()
            la = slow.read_async((big2, 2 * MiB), s2, file_offset=4 * MiB)
            assert time.monotonic() - t < 0.5, time.monotonic() - t
            assert not bigs[0].done() and not any(b.done() for b in bigs), "the large reads were not held back"
            assert took < 2.0, took
            assert [b.get() for b in bigs] == [2 * MiB] * 9
            assert la.check_bytes_done(timeout=30) == 2 * MiB
        assert drv.peek(big2, 2 * MiB) == data[4 * MiB:6 * MiB]
        assert drv.peek(big, len(data)) == data
        assert drv.peek(d, 777) == data[99:876]
        assert open(out, "rb").read()[:3] == b"\\0" * 3
    ''', CMT_TEST_HOOKS="wait_setup=1,park_piece=0,park_us=3000000")


def test_small_stream_ordered_transfers_make_nothing_in_the_io_thread(run_python, tmp_path):
    # The pipeline's staging and words are made in the caller's thread when the transfer is queued:
    # nothing is made, and no driver call is made, once the stream waits (stream_pipeline.hpp).
    run_scenario(run_python, f'''
        path = os.path.join({str(tmp_path)!r}, "f.bin")
        data = pattern(3 * MiB, 25)
        make_file(path, data)
        n = 65536 + 3
        d, seen = drv.mem_alloc(2 * MiB), drv.mem_alloc(2 * MiB)
        s = drv.stream_create()
        gate = threading.Event()
        drv.launch_host_func(s, gate.wait)
        drv.delayed_write(s, d, 0xAA, n, 0)  # a kernel before the read
        def made_so_far():  # pinned allocations and registrations, streams
            pinned = drv.call_count("cuMemHostAlloc") + drv.call_count("cuMemHostRegister_v2")
            return pinned, drv.call_count("cuStreamCreate")

        made = made_so_far()
        with cmt.io.open(path, "r+") as f:
            sf = f.read_async((d, n), s, file_offset=1001)
            drv.memcpy("cuMemcpyDtoDAsync_v2", seen, d, n, s)  # a kernel after it
            tail = f.read_async((d + MiB, MiB), s, file_offset=len(data) - 1000)  # cut to 1000 at the end
            wf = f.write_async((d, n), s, file_offset=2 * MiB + 5)
            at_submit = made_so_far()
            assert at_submit[0] > made[0], (made, at_submit)
            time.sleep(0.05)
            assert not sf.done()
            gate.set()
            assert sf.check_bytes_done(timeout=10) == n and tail.check_bytes_done(timeout=10) == 1000
            assert wf.check_bytes_done(timeout=10) == n
        drv.stream_sync(s)
        assert drv.peek(d, n) == data[1001:1001 + n] and drv.peek(seen, n) == data[1001:1001 + n]
        assert drv.peek(d + MiB, 1000) == data[-1000:]
        assert open(path, "rb").read()[2 * MiB + 5:2 * MiB + 5 + n] == data[1001:1001 + n]
        assert made_so_far() == at_submit
    ''')


def test_small_transfers_fail_as_the_engine_path_does(run_python, tmp_path):
    # Each failure of a small transfer against the same one larger than the threshold (the engine's):
    # the same status, errno and file offset, and a failed write leaves the file as it was.
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    run_scenario(run_python, f'''
        import resource, signal
        from cmt.io import _lib
        root = {str(tmp_path)!r}
        path = os.path.join(root, "f.bin")
        data = pattern(6 * MiB - 1000, 26)
        make_file(path, data)
        d = device_with(pattern(4 * MiB, 27))
        lib = _lib.lib()

        def native(fn, fd, nbytes, offset):
            err = ctypes.c_int(0)
            h = lib.cmt_io_attach(fd, ctypes.byref(err))
            r = _lib.Result()
            fn(h, d, nbytes, offset, None, ctypes.byref(r))
            lib.cmt_io_detach(h)
            return r.status, r.os_errno, r.offset, r.done

        # A descriptor that cannot read (or write): the OS error at the transfer's offset.
        wo, ro = os.open(path, os.O_WRONLY), os.open(path, os.O_RDONLY)
        for offset in (0, 12345):
            small = native(lib.cmt_io_read, wo, 65536, offset)
            assert small == native(lib.cmt_io_read, wo, 3 * MiB, offset) == (_lib.OS_ERROR, errno.EBADF, offset, 0)
            small = native(lib.cmt_io_write, ro, 65536, offset)
            assert small == native(lib.cmt_io_write, ro, 3 * MiB, offset) == (_lib.OS_ERROR, errno.EBADF, offset, 0)
        os.close(wo)
        os.close(ro)
        assert open(path, "rb").read() == data

        # A full disk, every way of writing.
        s = drv.stream_create()
        with cmt.io.open("/dev/full", "w") as full:
            for size in (65536 + 5, 3 * MiB):
                for name, call in (("write", lambda: full.write((d, size), file_offset=8193)),
                                   ("pwrite", lambda: full.pwrite((d, size), file_offset=8193).get()),
                                   ("write_async", lambda: full.write_async((d, size), s, file_offset=8193)
                                                                .check_bytes_done(timeout=60))):
                    try:
                        call()
                        raise AssertionError(f"{{name}} to /dev/full succeeded")
                    except cmt.io.FileIOError as e:
                        assert e.errno == errno.ENOSPC and e.offset == 8193, (name, size, e)

        # The file size limit, met part of the way through: the error where the limit is, and the
        # file back to its size before the write.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        limits = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (6 * MiB, limits[1]))
        with cmt.io.open(path, "r+") as f:
            for size, offset in ((512 * 1024, 6 * MiB - 100 * 1024), (3 * MiB, 6 * MiB - 100 * 1024),
                                 (4096 + 1, 6 * MiB - 2049), (MiB + 1, 6 * MiB - 2049)):
                try:
                    f.write((d, 4 * MiB), size=size, file_offset=offset)
                    raise AssertionError("a write past the limit succeeded")
                except cmt.io.FileIOError as e:
                    assert e.errno == errno.EFBIG and e.offset == 6 * MiB, (size, offset, e)
                assert os.path.getsize(path) == len(data), (size, offset, os.path.getsize(path))
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        assert open(path, "rb").read(6 * MiB - 100 * 1024) == data[:6 * MiB - 100 * 1024]  # before the writes
        make_file(path, data)

        # The end of the file: what was there, nothing past it touched.
        with cmt.io.open(path) as f:
            drv.memset_d8(d, 0x5C, 4 * MiB)
            assert f.read((d, 4 * MiB), size=MiB, file_offset=len(data) - 999) == 999
            assert drv.peek(d, 1000) == data[-999:] + b"\\x5c"
            assert f.read((d, 4 * MiB), size=100, file_offset=len(data)) == 0
            assert f.pread((d, 4 * MiB), size=5000, file_offset=len(data) + 7).get() == 0
    ''')
