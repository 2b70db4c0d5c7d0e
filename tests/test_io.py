"""cmt.io against the stand-in driver: reads and writes between files and device memory through the
engine are byte-exact at any size, offset and alignment, cached (buffered) or not (O_DIRECT);
futures and batches complete out of order. Stream-ordered transfers are in test_io_stream.py, the
error cases in test_io_errors.py."""

from __future__ import annotations

import pytest
from io_scenario import o_direct_works, run_scenario


def test_reads_and_writes_are_byte_exact_at_any_size_offset_and_alignment(run_python, tmp_path):
    run_scenario(run_python, f'''
        from hypothesis import HealthCheck, given, settings, strategies as st
        root = {str(tmp_path)!r}
        SIZE, SLACK = 3 * MiB + 123, 8192
        data = pattern(SIZE, 1)
        src, out = os.path.join(root, "src.bin"), os.path.join(root, "out.bin")
        make_file(src, data)
        direct_ok = supports_o_direct(src)
        d, d2 = drv.mem_alloc(SIZE + SLACK), drv.mem_alloc(SIZE + SLACK)
        small = {{"threads": 3, "buffers": 3, "chunk_bytes": 256 << 10}}  # many blocks and pieces
        sentinel = b"\\xee" * (SIZE + SLACK)
        runs = []

        @settings(max_examples=25, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(file_offset=st.one_of(st.integers(0, 700).map(lambda k: k * 4096), st.integers(0, SIZE + 100)),
               size=st.integers(0, 2 * MiB + 777), dev_offset=st.integers(0, SLACK), cached=st.booleans(),
               small_chunks=st.booleans())
        def case(file_offset, size, dev_offset, cached, small_chunks):
            runs.append((file_offset, size, dev_offset, cached, small_chunks))
            chosen = small if small_chunks else None
            if cached:
                with open(src, "rb") as f:
                    f.read()
            else:
                evict(src)
            drv.poke(d, sentinel)
            with cmt.io.open(src, settings=chosen) as f:
                got, moved = counted(lambda: f.read((d, SIZE + SLACK), size=size, file_offset=file_offset,
                                                    dev_offset=dev_offset))
            expect = data[file_offset:file_offset + size]
            assert got == len(expect), (got, len(expect))
            back = drv.peek(d, SIZE + SLACK)
            assert back[dev_offset:dev_offset + got] == expect
            assert back[:dev_offset] == sentinel[:dev_offset] and back[dev_offset + got:] == sentinel[dev_offset + got:]
            if cached:
                assert moved["direct_bytes"] == 0, moved
            elif direct_ok and file_offset % 4096 == 0 and got >= 64 * 1024:
                assert moved["direct_bytes"] >= got // 2, (moved, got)

            payload = pattern(size, file_offset)
            if size:
                drv.poke(d + dev_offset, payload)
            with cmt.io.open(out, "w+", settings=chosen) as g:
                assert g.write((d, SIZE + SLACK), size=size, file_offset=file_offset, dev_offset=dev_offset) == size
                drv.poke(d2, sentinel)
                assert g.read((d2, SIZE + SLACK), size=size, file_offset=file_offset) == size
            assert drv.peek(d2, size) == payload
            with open(out, "rb") as g:
                content = g.read()
            assert content == (b"\\0" * file_offset + payload if size else b"")

        case()
        assert len(runs) >= 25 and len({{r[1] for r in runs}}) > 10, runs  # sizes of every kind were tried
    ''')


def test_uncached_aligned_reads_go_o_direct_and_cached_ones_through_the_page_cache(run_python, tmp_path):
    """Cold aligned pieces go O_DIRECT, cached ones buffered."""
    if not o_direct_works(tmp_path):
        pytest.skip(f"{tmp_path} has no O_DIRECT (tmpfs?)")
    run_scenario(run_python, f'''
        path, data, d = cold_file({str(tmp_path)!r}, "weights.bin", 16 * MiB + 5000, 2)
        with cmt.io.open(path) as f:
            assert cmt.io._lib.resident_fraction(f.fileno(), 0, len(data)) < 0.1
            n, cold = counted(lambda: f.read((d, len(data))))
            assert n == len(data) and drv.peek(d, n) == data
            # every piece aligned and not cached went O_DIRECT: all but the last partial 4 KiB
            assert cold == {{"direct_bytes": 16 * MiB + 4096, "buffered_bytes": 904, "direct_refused_files": 0}}, cold
            with open(path, "rb") as g:
                g.read()  # into the page cache
            drv.memset_d8(d, 0, n)
            n, warm = counted(lambda: f.read((d, len(data))))
            assert n == len(data) and drv.peek(d, n) == data
            assert warm["direct_bytes"] == 0 and warm["buffered_bytes"] >= len(data), warm
            # An unaligned file offset: its first bytes up to 4 KiB go on their own, the rest aligned.
            evict(path)
            n, odd = counted(lambda: f.read((d, len(data)), size=8 * MiB, file_offset=1000))
            assert n == 8 * MiB and drv.peek(d, n) == data[1000:1000 + n]
            assert odd["direct_bytes"] >= 8 * MiB - 8192, odd
    ''')


def test_a_cold_read_keeps_two_of_its_buffers_in_flight_and_the_ring_stays_whole(run_python, tmp_path):
    # Cold 3.6 GiB reads ran at a median 3.51 GB/s from 2 staging buffers of 8 MiB and 3.12 from 4
    # (H100, 2026-12-07): a narrower window of the file in flight. A read mostly from the disk uses 2
    # of its buffers; the setup it starts still pins all 4 (and 2 spares) for the warm reads after it,
    # which use them all.
    if not o_direct_works(tmp_path):
        pytest.skip(f"{tmp_path} has no O_DIRECT (tmpfs?)")
    proc = run_scenario(run_python, f'''
        path, data, d = cold_file({str(tmp_path)!r}, "cold.bin", 24 * MiB, 21)
        with cmt.io.open(path, settings={{"threads": 3, "buffers": 4, "chunk_bytes": MiB}}) as f:
            n, cold = counted(lambda: f.read((d, len(data))))
            assert n == len(data) and drv.peek(d, n) == data
            assert cold["direct_bytes"] == len(data), cold
            with open(path, "rb") as g:
                g.read()
            drv.memset_d8(d, 0, n)
            n, warm = counted(lambda: f.read((d, len(data))))
            assert n == len(data) and drv.peek(d, n) == data and warm["direct_bytes"] == 0, warm
    ''', CMT_LOG="debug", CMT_TEST_HOOKS="wait_setup=1,guard=0")
    assert "a read mostly from the disk (O_DIRECT) keeps 2 of its 4 buffers in flight" in proc.stderr, proc.stderr
    assert "staging pipeline set up: 6 buffers of 1048576 bytes" in proc.stderr, proc.stderr


def test_lanes_that_wait_milliseconds_for_their_slots_leave_the_cpus_alone(run_python, tmp_path):
    # A cold read's lanes wait milliseconds for their blocks' slots, at the disk's pace. Spinning and
    # yielding, they held every CPU meanwhile: here 5 lanes waiting for one slot's 10 ms DMAs (1 MiB
    # at 0.1 GB/s) burnt 1.8 of the runner's 2 CPUs. After a millisecond a wait naps (spin.hpp):
    # about 0.6 CPUs, the stand-in's own copying included.
    proc = run_scenario(run_python, f'''
        import resource
        path, data, d = file_and_buffer({str(tmp_path)!r}, "warm.bin", 32 * MiB, 5)
        with cmt.io.open(path, settings={{"threads": 5, "buffers": 1, "chunk_bytes": MiB}}) as f:
            f.read((d, 2 * MiB))  # the setup, outside
            r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            n = f.read((d, len(data)))
            t, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
        assert n == len(data) and drv.peek(d, n) == data
        cpus = (r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) / t
        print(f"{{cpus:.2f}} CPUs over {{t:.3f}} s")
        assert cpus < 1.1, cpus
    ''', CMT_TEST_HOOKS="wait_setup=1,guard=0,piece=524288", FAKE_CUDA_COPY_GBPS="0.1")
    assert "CPUs over" in proc.stdout, proc.stdout


def test_a_cold_read_in_fastsafetensors_geometry_is_exact(run_python, tmp_path):
    # research/cold_depth.py's next comparison: blocks of 512 KiB, each one lane's piece (test hook
    # piece=), 32 buffers and a cap set by the hook cold_buffers= instead of the engine's 2.
    if not o_direct_works(tmp_path):
        pytest.skip(f"{tmp_path} has no O_DIRECT (tmpfs?)")
    proc = run_scenario(run_python, f'''
        path, data, d = cold_file({str(tmp_path)!r}, "cold.bin", 24 * MiB + 8192, 23)
        with cmt.io.open(path, settings={{"threads": 4, "buffers": 32, "chunk_bytes": MiB // 2}}) as f:
            n, cold = counted(lambda: f.read((d, len(data))))
        assert n == len(data) and drv.peek(d, n) == data
        assert cold["direct_bytes"] == len(data), cold
    ''', CMT_LOG="debug", CMT_TEST_HOOKS="wait_setup=1,guard=0,piece=524288,cold_buffers=24")
    assert "a read mostly from the disk (O_DIRECT) keeps 24 of its 32 buffers in flight" in proc.stderr, proc.stderr


def test_a_lane_whose_piece_is_taken_over_does_not_read_the_disk_again(run_python, tmp_path):
    # The lane that claims piece 3 is parked for 150 ms (a test hook), so another lane takes its piece
    # over (job.hpp); a piece read O_DIRECT is then read once, by whichever lane came first. One slot:
    # the next block needs the parked one's, whichever lane (the caller's included) was parked.
    if not o_direct_works(tmp_path):
        pytest.skip(f"{tmp_path} has no O_DIRECT (tmpfs?)")
    run_scenario(run_python, f'''
        path, data, d = cold_file({str(tmp_path)!r}, "f.bin", 16 * MiB, 13)
        with cmt.io.open(path, settings={{"threads": 3, "buffers": 1, "chunk_bytes": MiB}}) as f:
            n, moved = counted(lambda: f.read((d, len(data))))
        assert n == len(data) and drv.peek(d, n) == data
        events = engine_events()
        assert events["taken_over"] >= 1, events
        assert moved == {{"direct_bytes": len(data), "buffered_bytes": 0, "direct_refused_files": 0}}, moved
    ''', CMT_TEST_HOOKS="wait_setup=1,guard=0,park_piece=3,park_us=150000")


def test_lanes_that_wait_for_their_slots_dma_are_not_taken_for_stalled(run_python, tmp_path):
    # Cold reads on the H100 of 2026-12-07 had 176-183 of their 7,460 pieces taken over from lanes
    # that were only waiting: a lane claims its piece long before its block gets a slot, then waits
    # for the slot's DMA, and a lane that checks for stalls saw that DMA done before the waiting
    # lane had woken. Here one slot carries every block (1 MiB DMAs at 0.25 GB/s), 5 lanes read
    # 512 KiB pieces (the 3 without a piece of the next block check for stalls), and the lane that
    # waits in the driver for a DMA wakes 100 us after it (a test knob of the stand-in). Taking
    # those for stalled took 56-93 pieces over; a lane is stalled only once its slot has been known
    # ready for the stall limit (0.2 ms). A loaded runner may deschedule a lane for real: a few.
    proc = run_scenario(run_python, f'''
        path, data, d = file_and_buffer({str(tmp_path)!r}, "warm.bin", 64 * MiB, 5)
        with cmt.io.open(path, settings={{"threads": 5, "buffers": 1, "chunk_bytes": MiB}}) as f:
            n = f.read((d, len(data)))
        assert n == len(data) and drv.peek(d, n) == data
        events = engine_events()
        print("taken over", events["taken_over"])
        assert events["taken_over"] <= 8, events
    ''', CMT_TEST_HOOKS="wait_setup=1,guard=0,piece=524288", FAKE_CUDA_COPY_GBPS="0.25",
        FAKE_CUDA_EVENT_WAKE_US="100")
    assert "taken over" in proc.stdout, proc.stdout


def test_a_slow_disk_read_holds_up_its_own_slot_only(run_python, tmp_path):
    # fastsafetensors' 16 threads, each reading and sending on its own, loaded a cold file faster than
    # cmt.io with as many bytes in flight (H100, 2026-12-07). In a ring where block b waits for block
    # b - N's slot, one slow disk read idles every lane that reaches its chain. Here the read at file
    # offset 0 takes 0.6 s more (a test hook; it counts as disk I/O, which no other lane takes over)
    # and each 1 MiB block's DMA 30 ms (the stand-in at 0.035 GB/s): the other blocks go on through
    # the other slots meanwhile, so the slow read costs less than half its time.
    def timed(hooks):
        out = run_scenario(run_python, f'''
            path = os.path.join({str(tmp_path)!r}, "slow.bin")
            data = pattern(48 * MiB, 5)
            make_file(path, data)
            d = drv.mem_alloc(len(data))
            with cmt.io.open(path, settings={{"threads": 2, "buffers": 4, "chunk_bytes": MiB}}) as f:
                f.read((d, MiB))  # the setup, outside the timer
                t0 = time.monotonic()
                n = f.read((d, len(data)))
                print("seconds", time.monotonic() - t0)
            assert n == len(data) and drv.peek(d, n) == data
        ''', CMT_TEST_HOOKS=hooks, FAKE_CUDA_COPY_GBPS="0.035")
        return float(out.stdout.split("seconds")[1].split()[0])

    base = timed("wait_setup=1,guard=0")
    slow = timed("wait_setup=1,guard=0,disk_slow_at=0,disk_slow_us=600000")
    assert slow < base + 0.3, (base, slow)


def test_a_file_system_without_o_direct_gets_buffered_transfers(run_python, tmp_path):
    shm = "/dev/shm"
    if not __import__("os").path.isdir(shm) or o_direct_works(shm):
        pytest.skip("needs a tmpfs /dev/shm that refuses O_DIRECT (Linux < 6.6)")
    run_scenario(run_python, f'''
        import tempfile
        path = tempfile.mktemp(dir={shm!r}, prefix="cmt-io-test-")
        try:
            data = pattern(4 * MiB + 1, 3)
            make_file(path, data)
            d = drv.mem_alloc(len(data))
            with cmt.io.open(path) as f:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # tmpfs keeps its pages anyway
                n, moved = counted(lambda: f.read((d, len(data))))
            assert n == len(data) and drv.peek(d, n) == data
            assert moved["direct_bytes"] == 0 and moved["buffered_bytes"] >= n, moved
        finally:
            os.unlink(path)
    ''')


def test_devices_and_pipes_are_read_and_written_buffered(run_python, tmp_path):
    run_scenario(run_python, f'''
        d = device_with(b"\\x33" * (3 * MiB))
        with cmt.io.open("/dev/zero") as f:
            n, moved = counted(lambda: f.read((d, 3 * MiB), file_offset=5 * MiB))
        assert n == 3 * MiB and drv.peek(d, n) == bytes(n)  # a device has no end to stop at
        assert moved["direct_bytes"] == 0, moved
        fifo = os.path.join({str(tmp_path)!r}, "fifo")
        os.mkfifo(fifo)
        payload = pattern(2 * MiB, 12)
        drv.poke(d, payload)
        got = []
        reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))
        reader.start()
        with cmt.io.open(fifo, "w") as g:
            try:
                g.write((d, 2 * MiB))
                raise AssertionError("a pipe took a write at an offset")
            except cmt.io.FileIOError as e:
                assert e.errno == errno.ESPIPE and e.filename == fifo
        reader.join()
    ''')


def test_a_read_at_the_end_of_the_file_returns_what_was_read(run_python, tmp_path):
    run_scenario(run_python, f'''
        path = os.path.join({str(tmp_path)!r}, "f.bin")
        data = pattern(1 * MiB + 10, 4)
        make_file(path, data)
        d = device_with(b"\\x11" * (2 * MiB))
        host = bytearray(b"\\x22" * (2 * MiB))
        with cmt.io.open(path) as f:
            assert f.read((d, 2 * MiB), file_offset=MiB) == 10
            assert drv.peek(d, 11) == data[MiB:] + b"\\x11"  # nothing past what was read is touched
            assert f.read((d, 2 * MiB), file_offset=len(data)) == 0
            assert f.read((d, 2 * MiB), file_offset=len(data) + 12345) == 0
            assert f.pread((d, 2 * MiB), file_offset=MiB - 6).get() == 16
            assert f.read(host, file_offset=MiB + 3) == 7 and host[:8] == bytearray(data[MiB + 3:]) + b"\\x22"
            assert f.read(host) == len(data) and host[:len(data)] == bytearray(data)
        with cmt.io.open(os.path.join({str(tmp_path)!r}, "empty.bin"), "w+") as f:
            assert f.read((d, 4096)) == 0 and f.write((d, 4096), size=0) == 0
    ''')


def test_host_buffers_and_device_buffers_of_every_kind(run_python, tmp_path):
    run_scenario(run_python, f'''
        path = os.path.join({str(tmp_path)!r}, "f.bin")
        data = pattern(2 * MiB, 5)
        make_file(path, data)
        n = len(data)
        d = drv.mem_alloc(n)

        class CudaArray:  # what PyTorch and CuPy expose
            def __init__(self, ptr, count, strides=None):
                self.__cuda_array_interface__ = {{"data": (ptr, False), "shape": (count,), "typestr": "<f4",
                                                  "strides": strides, "version": 3}}

        class DLManaged(ctypes.Structure):
            _fields_ = [("dl_tensor", cmt.io.buffers._DLTensor), ("ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]

        class CudaDLPack:  # a CUDA tensor seen only through DLPack
            def __init__(self, ptr, count):
                self.shape = (ctypes.c_int64 * 1)(count)
                self.managed = DLManaged()
                t = self.managed.dl_tensor
                t.data, t.ndim, t.shape = ptr, 1, self.shape
                t.device.device_type, t.dtype.code, t.dtype.bits, t.dtype.lanes = 2, 1, 8, 1
            def __dlpack_device__(self):
                return (2, 0)
            def __dlpack__(self, **kwargs):
                new = ctypes.pythonapi.PyCapsule_New
                new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
                return new(ctypes.addressof(self.managed), b"dltensor", None)

        class TorchLike:  # a CUDA torch.Tensor: read through its own methods, not its slow interface
            def __init__(self, ptr, count, contiguous=True, requires_grad=False):
                self.is_cuda, self.requires_grad, self._ptr, self._n = True, requires_grad, ptr, count
                self._contiguous = contiguous
            @property
            def __cuda_array_interface__(self):  # PyTorch's refuses a tensor that requires grad
                if self.requires_grad:
                    raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires grad")
                raise AssertionError("the slow interface was used")
            def data_ptr(self):
                return self._ptr
            def numel(self):
                return self._n // 4
            def element_size(self):
                return 4
            def is_contiguous(self):
                return self._contiguous

        class HostDLPack:  # a CPU tensor without the buffer protocol (PyTorch's)
            def __init__(self, array):
                self.array = array
            def __dlpack__(self, **kwargs):
                return self.array.__dlpack__()
            def __dlpack_device__(self):
                return self.array.__dlpack_device__()

        with cmt.io.open(path) as f:
            try:
                f.read(TorchLike(d, n, requires_grad=True))
                raise AssertionError("a tensor that requires grad was taken")
            except RuntimeError as e:
                assert "requires grad" in str(e)
            for buf in (CudaArray(d, n // 4), CudaDLPack(d, n), cmt.io.DevicePointer(d, n), (d, n), TorchLike(d, n)):
                drv.memset_d8(d, 0, n)
                assert f.read(buf) == n and drv.peek(d, n) == data, type(buf)
            for make in (lambda: np.zeros(n // 8, np.float64), lambda: bytearray(n),
                         lambda: memoryview(bytearray(n)), lambda: HostDLPack(np.zeros(n, np.uint8))):
                buf = make()
                assert f.read(buf) == n
                view = buf.array if isinstance(buf, HostDLPack) else buf
                assert bytes(memoryview(view).cast("B")) == data, type(buf)
            for strided in (CudaArray(d, n // 8, strides=(8,)), TorchLike(d, n, contiguous=False)):
                try:
                    f.read(strided)
                    raise AssertionError("a strided array was taken")
                except ValueError as e:
                    assert "contiguous" in str(e)
            try:
                f.read("not a buffer")
                raise AssertionError("a str was taken")
            except TypeError as e:
                assert "DevicePointer" in str(e)
        out = os.path.join({str(tmp_path)!r}, "out.bin")
        with cmt.io.open(out, "w") as g:
            assert g.write(np.frombuffer(data, np.uint8)) == n
        with cmt.io.open(out, "a") as g:  # writes without an offset go to the end
            assert g.write(CudaArray(d, n // 4), size=1000) == 1000
            assert g.write(b"tail") == 4
        assert open(out, "rb").read() == data + data[:1000] + b"tail"
    ''')


def test_many_futures_at_once_share_the_pool_and_each_is_exact(run_python, tmp_path):
    run_scenario(run_python, f'''
        path = os.path.join({str(tmp_path)!r}, "f.bin")
        data = pattern(8 * MiB, 6)
        make_file(path, data)
        d = drv.mem_alloc(len(data))
        threads_before = threading.active_count()
        piece = len(data) // 64
        with cmt.io.open(path) as f:
            futs = [f.pread((d, len(data)), size=piece, file_offset=i * piece, dev_offset=i * piece) for i in range(64)]
            f.close()  # closes once the transfers submitted are done
            assert sum(fut.get() for fut in futs) == len(data) and all(fut.done() for fut in futs)
        assert drv.peek(d, len(data)) == data
        assert threading.active_count() - threads_before <= 8  # the pool's threads, not one per future
        try:
            f.pread((d, 10))
            raise AssertionError("a closed file took a read")
        except ValueError as e:
            assert "closed" in str(e)
    ''')


def test_a_batch_hands_back_completions_out_of_order(run_python, tmp_path):
    # A slow link (0.02 GB/s): the first op, 8 MiB to the GPU, takes 400 ms of DMA; the ones after it,
    # a small read into host memory and a read to the second GPU (its own pipeline), finish first.
    run_scenario(run_python, f'''
        path = os.path.join({str(tmp_path)!r}, "f.bin")
        data = pattern(8 * MiB, 7)
        make_file(path, data)
        big = drv.mem_alloc(len(data))
        drv.ctx_set_current(drv.primary_ctx(1))
        other = drv.mem_alloc(64 * 1024)
        drv.ctx_set_current(drv.primary_ctx(0))
        host = bytearray(4096)
        with cmt.io.open(path) as f, cmt.io.Batch() as batch:
            assert batch.read(f, (big, len(data))) == 0
            assert batch.poll(min_nr=1, timeout=0.05) == []  # nothing finished yet: the timeout ends it
            assert batch.read(f, host, file_offset=100) == 1
            assert batch.read(f, (other, 64 * 1024), file_offset=4096) == 2
            first = batch.poll(min_nr=2)
            assert sorted(c.index for c in first) == [1, 2], first
            assert [c.result() for c in sorted(first, key=lambda c: c.index)] == [4096, 64 * 1024]
            rest = batch.wait()
            assert [(c.index, c.result()) for c in rest] == [(0, len(data))]
            assert batch.outstanding == 0 and batch.poll(min_nr=5) == []
        assert bytes(host) == data[100:4196] and drv.peek(big, len(data)) == data
        drv.ctx_set_current(drv.primary_ctx(1))
        assert drv.peek(other, 64 * 1024) == data[4096:4096 + 64 * 1024]
    ''', FAKE_CUDA_COPY_GBPS="0.02", FAKE_CUDA_DEVICES="2")


def test_a_batch_of_device_reads_runs_on_native_workers_byte_exact(run_python, tmp_path):
    # Many small reads: each costs Python one call (native/src/io_batch.hpp), and no Python thread
    # runs them; completions come back whole and byte-exact, whichever order they finish in.
    run_scenario(run_python, f'''
        import random
        path = os.path.join({str(tmp_path)!r}, "f.bin")
        data = pattern(8 * MiB, 21)
        make_file(path, data)
        K, count = 64 * 1024, 256
        dev = cmt.io.DevicePointer(drv.mem_alloc(count * K), count * K)
        rng = random.Random(3)
        offs = [rng.randrange(0, len(data) - K) for _ in range(count)]  # unaligned too
        threads = threading.active_count()
        for many in (False, True):  # one call per read, or one for all (read_many)
            drv.memset_d8(dev.ptr, 0, count * K)
            with cmt.io.open(path) as f:
                batch = cmt.io.Batch()
                if many:
                    assert list(batch.read_many(f, dev, K, offs, [i * K for i in range(count)])) == list(range(count))
                else:
                    for i, off in enumerate(offs):
                        assert batch.read(f, dev, K, off, i * K) == i
                assert threading.active_count() == threads, "a Python thread ran the device reads"
                done = []
                while batch.outstanding:
                    done += batch.poll(min_nr=1)
            assert sorted(c.index for c in done) == list(range(count))
            assert all(c.result() == K for c in done)
            got = drv.peek(dev.ptr, count * K)
            assert all(got[i * K:(i + 1) * K] == data[off:off + K] for i, off in enumerate(offs))
        with cmt.io.open(path) as f:  # bad input: nothing starts
            batch = cmt.io.Batch()
            for sizes, offsets, why in ((K, [0, -1], "negative"), (2 * K, [0, 1], "too few")):
                try:
                    batch.read_many(f, cmt.io.DevicePointer(dev.ptr, 2 * K), sizes, offsets, [0, K])
                    raise AssertionError("bad input was taken")
                except ValueError as e:
                    assert why in str(e), e
            assert batch.outstanding == 0
            host = bytearray(2 * K)
            assert list(batch.read_many(f, host, K, [0, 5], [0, K])) == [0, 1]  # host memory: as futures
            assert sorted(c.result() for c in batch.wait()) == [K, K]
            assert bytes(host) == data[:K] + data[5:5 + K]
    ''')


def test_a_batch_reports_each_ops_error_with_its_index(run_python, tmp_path):
    run_scenario(run_python, f'''
        path = os.path.join({str(tmp_path)!r}, "f.bin")
        make_file(path, pattern(MiB, 8))
        d = drv.mem_alloc(MiB)
        with cmt.io.open(path) as f, cmt.io.open("/dev/full", "w") as full:
            batch = cmt.io.Batch()
            batch.read(f, (d, MiB))
            batch.write(full, (d, MiB))
            done = {{c.index: c for c in batch.wait()}}
            assert done[0].result() == MiB and done[1].nbytes == 0
            assert isinstance(done[1].error, cmt.io.FileIOError) and done[1].error.errno == errno.ENOSPC
    ''')


def test_default_settings_suit_files_and_can_be_overridden(run_python, tmp_path):
    run_scenario(run_python, f'''
        s = cmt.io.default_settings()
        assert s["chunk_bytes"] == 8 * MiB and s["buffers"] == 4 and 1 <= s["threads"] <= 16, s
        path = os.path.join({str(tmp_path)!r}, "f.bin")
        make_file(path, pattern(3 * MiB, 11))
        d = drv.mem_alloc(3 * MiB)
        from cmt.config import Settings
        for chosen in ({{"threads": 1}}, Settings(threads=2, buffers=2, chunk_bytes=1 << 16)):
            with cmt.io.open(path, settings=chosen) as f:
                assert f.read((d, 3 * MiB)) == 3 * MiB
        assert drv.peek(d, 3 * MiB) == pattern(3 * MiB, 11)
        bads = (({{"threads": 0}}, "threads"), ({{"colour": 1}}, "unknown"), ({{"stores": "fast"}}, "stores"))
        for bad, word in bads:
            try:
                cmt.io.open(path, "w", settings=bad)
                raise AssertionError(f"{{bad}} was taken")
            except ValueError as e:
                assert word in str(e), e
        assert os.path.getsize(path) == 3 * MiB  # the bad settings were refused before 'w' truncated it
    ''')


def test_a_first_transfer_pins_staging_for_its_own_settings_not_the_copy_plans_largest(run_python, tmp_path):
    # The copy plan's largest rule (16 buffers of 8 MiB, plus two spares) is what a program's copies
    # need under `cmt run`; a cmt.io transfer follows its own settings, and its process's first
    # transfer waits for the setup: pinning 144 MiB would be most of it (issue 19's setup criterion).
    plan = "h2d:1=threads:2,buffers:16,chunk_bytes:8388608;d2h:1=threads:2,buffers:16,chunk_bytes:8388608"
    run_scenario(run_python, f'''
        path = os.path.join({str(tmp_path)!r}, "f.bin")
        data = pattern(16 * MiB + 5, 15)
        make_file(path, data)
        d = drv.mem_alloc(len(data))
        with cmt.io.open(path, settings={{"buffers": 3, "chunk_bytes": 2 * MiB}}) as f:
            before = drv.call_count("cuMemHostRegister_v2")  # the staging ring is registered memory
            assert f.read((d, len(data))) == len(data)
            pinned = drv.call_count("cuMemHostRegister_v2") - before
        assert drv.peek(d, len(data)) == data
        assert pinned == 3 + 2, pinned  # its three buffers and the two spares (job.hpp)
    ''', CMT_PLAN=plan)


def test_import_faults_the_first_transfer_s_staging_in_ahead(run_python, tmp_path):
    # A fresh process's first warm 3.6 GiB read spent 13-16 ms of its 90 faulting its 48 MiB of staging
    # in (H100, 2026-12-07). `import cmt.io` starts that in the background (no driver needed); each
    # buffer here takes 50 ms more to fault in, as a slow host's would, and the first read, a second
    # later, finds all 6 (4 and two spares) faulted in. Bytes exact.
    proc = run_scenario(run_python, f'''
        time.sleep(1.0)
        data = pattern(24 * MiB + 5, 3)
        path = os.path.join({str(tmp_path)!r}, "f.bin")
        make_file(path, data)
        d = drv.mem_alloc(len(data))
        with cmt.io.open(path) as f:
            assert f.read((d, len(data))) == len(data)
        assert drv.peek(d, len(data)) == data
    ''', CMT_LOG="debug", CMT_TEST_HOOKS="fault_us=50000")
    assert "staging for any device faulted in ahead: 6 slots of 8388608 bytes" in proc.stderr, proc.stderr
    setup = next(line for line in proc.stderr.splitlines() if "staging pipeline set up" in line)
    assert "(6 faulted in ahead;" in setup, setup
    assert float(setup.split(" in ")[1].split(" ms")[0]) < 50, setup  # less than one buffer's faulting
