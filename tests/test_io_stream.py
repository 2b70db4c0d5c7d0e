"""cmt.io's stream-ordered reads and writes (File.read_async, File.write_async) against the stand-in
driver: the call returns at once, the transfer runs after the stream's earlier work and before its
later work, with its DMAs queued on the stream and gated by words in memory; where the device cannot
wait on memory, the call waits for its stream and transfers before it returns."""

from __future__ import annotations

import pytest
from io_scenario import run_scenario


def test_read_async_runs_after_the_streams_earlier_work_and_before_its_later_work(run_python, tmp_path):
    run_scenario(run_python, f'''
        path = os.path.join({str(tmp_path)!r}, "f.bin")
        data = pattern(6 * MiB + 99, 9)
        make_file(path, data)
        n = len(data)
        d, seen = drv.mem_alloc(n), drv.mem_alloc(n)
        s = drv.stream_create()
        gate = threading.Event()
        drv.launch_host_func(s, gate.wait)       # the stream is held here until the test lets it go
        drv.delayed_write(s, d, 0xAA, n, 0)      # a kernel that writes the buffer: before the read
        with cmt.io.open(path) as f:
            start = time.monotonic()
            sf = f.read_async((d, n), s)
            took = time.monotonic() - start
            drv.memcpy("cuMemcpyDtoDAsync_v2", seen, d, n, s)  # a later kernel reads the buffer
            time.sleep(0.05)
            assert not sf.done() and not sf.wait(0.01)  # the stream has not reached it
        gate.set()  # the file was closed meanwhile: the transfer holds it open
        drv.stream_sync(s)
        assert sf.check_bytes_done() == n and sf.done()
        assert drv.peek(d, n) == data, "the read ran before the kernel ahead of it on the stream"
        assert drv.peek(seen, n) == data, "the kernel after the read ran before it"
        assert took < 1.0, took  # the call did not wait for the stream
        assert drv.call_count("cuStreamBatchMemOp_v2") >= 2  # the waits and writes on memory
    ''')


@pytest.mark.parametrize("wait_on_memory", [True, False], ids=["wait_value", "waits_in_the_call"])
def test_write_async_writes_what_the_earlier_kernel_made_before_a_later_one_changes_it(run_python, tmp_path,
                                                                                      wait_on_memory):
    env = {} if wait_on_memory else {"FAKE_CUDA_NO_STREAM_MEMOPS": "1"}
    run_scenario(run_python, f'''
        out = os.path.join({str(tmp_path)!r}, "out.bin")
        n = 5 * MiB + 3
        d = drv.mem_alloc(n)
        drv.memset_d8(d, 0, n)
        s = drv.stream_create()
        gate = threading.Event()
        drv.launch_host_func(s, gate.wait)
        drv.delayed_write(s, d, 0x5A, n, 20000)  # the kernel that makes the bytes
        if not {wait_on_memory!r}:
            threading.Timer(0.3, gate.set).start()  # the call waits for the stream
        with cmt.io.open(out, "w") as g:
            wf = g.write_async((d, n), s, file_offset=4096)
        drv.delayed_write(s, d, 0x11, n, 0)      # a later kernel overwrites the buffer
        assert wf.done() != {wait_on_memory!r}
        gate.set()
        assert wf.check_bytes_done(timeout=60) == n
        drv.stream_sync(s)
        assert open(out, "rb").read() == b"\\0" * 4096 + b"\\x5a" * n
        assert drv.peek(d, 8) == b"\\x11" * 8
    ''', **env)


def test_stream_ordered_transfers_refuse_a_capturing_stream_and_host_buffers(run_python, tmp_path):
    run_scenario(run_python, f'''
        path = os.path.join({str(tmp_path)!r}, "f.bin")
        make_file(path, pattern(MiB, 10))
        d = drv.mem_alloc(MiB)
        s = drv.stream_create()
        with cmt.io.open(path) as f:
            drv.begin_capture(s)
            try:
                f.read_async((d, MiB), s)
                raise AssertionError("a capturing stream took a read")
            except ValueError as e:
                assert "captured" in str(e)
            drv.end_capture(s)
            try:
                f.read_async(bytearray(10), s)
                raise AssertionError("a host buffer took a stream-ordered read")
            except ValueError as e:
                assert "device memory" in str(e)

            class TorchLikeStream:
                cuda_stream = s
            assert f.read_async((d, MiB), TorchLikeStream()).check_bytes_done(timeout=60) == MiB
            assert f.read_async((d, MiB), None).check_bytes_done(timeout=60) == MiB  # the default stream
    ''')


def test_stream_handles_of_every_kind():
    from cmt.io.stream import handle

    class Torch:
        cuda_stream = 7

    class CuPy:
        ptr = 9

    class Protocol:
        def __cuda_stream__(self):
            return (0, 11)

    assert [handle(None), handle(0), handle(5), handle(Torch()), handle(CuPy()), handle(Protocol())] == [0, 0, 5, 7, 9,
                                                                                                          11]
    with pytest.raises(TypeError, match="not a CUDA stream"):
        handle("stream")


@pytest.mark.parametrize("size", [4096 + 5, (6 << 20) + 5], ids=["small", "bulk"])
@pytest.mark.parametrize("direction", ["read", "write"])
def test_a_launch_that_holds_the_driver_while_streams_drain_does_not_hang_a_waiting_transfer(run_python, tmp_path,
                                                                                          size, direction):
    # On the real driver a kernel launch that loads its module lazily holds the driver until every
    # stream has drained; a transfer whose stream waits for it must then need no driver call.
    run_scenario(run_python, f'''
        path = os.path.join({str(tmp_path)!r}, "f.bin")
        n = {size}
        data, d, s = transfer_setup(path, n, 13, {direction!r})
        gate = threading.Event()
        drv.launch_host_func(s, gate.wait)  # a busy stream: the transfer is the process's first
        with cmt.io.open(path, "r" if {direction!r} == "read" else "r+") as f:
            start = time.monotonic()
            op = f.read_async((d, n), s) if {direction!r} == "read" else f.write_async((d, n), s)
            assert time.monotonic() - start < 1.0
            threading.Timer(0.3, gate.set).start()
            rc = drv.launch_loading(20000)
            assert rc == 0, f"the launch waited for the streams in vain ({{rc}}): a hang on a real driver"
            assert op.check_bytes_done(timeout=30) == n
        if {direction!r} == "read":
            assert drv.peek(d, n) == data
        else:
            assert open(path, "rb").read() == data
    ''')


def test_a_small_stream_ordered_read_does_not_wait_behind_a_bulk_one_on_another_stream(run_python, tmp_path):
    # The bulk read's engine copy is parked for 3 s (a test hook); the small read, on another stream,
    # runs on the small transfers' I/O thread meanwhile.
    run_scenario(run_python, f'''
        path = os.path.join({str(tmp_path)!r}, "f.bin")
        data = pattern(8 * MiB, 12)
        make_file(path, data)
        big, small = drv.mem_alloc(8 * MiB), drv.mem_alloc(4096)
        s1, s2 = drv.stream_create(), drv.stream_create()
        with cmt.io.open(path) as f:
            bulk = f.read_async((big, 8 * MiB), s1)
            time.sleep(0.3)  # the bulk read is running, parked
            start = time.monotonic()
            assert f.read_async((small, 4096), s2, file_offset=5000).check_bytes_done(timeout=10) == 4096
            took = time.monotonic() - start
            assert not bulk.done(), "the bulk read was not held back"
            assert took < 1.5, took
            assert bulk.check_bytes_done(timeout=30) == 8 * MiB
        assert drv.peek(small, 4096) == data[5000:9096] and drv.peek(big, 8 * MiB) == data
    ''', CMT_TEST_HOOKS="wait_setup=1,park_piece=0,park_us=3000000")


@pytest.mark.parametrize("direction", ["read", "write"])
def test_a_large_stream_ordered_transfer_queues_few_large_dmas(run_python, tmp_path, direction):
    # The caller's thread queues every DMA before it returns, two driver calls per block: a large
    # transfer is cut into blocks of about an eighth of it (stream_pipeline.cpp, stream_geometry),
    # not into the settings' 8 MiB chunks (96 MiB would be twelve and more).
    run_scenario(run_python, f'''
        path = os.path.join({str(tmp_path)!r}, "f.bin")
        n = 96 * MiB + 4096 * 3 + 7
        data, d, s = transfer_setup(path, n, 14, {direction!r})
        name = "cuMemcpyHtoDAsync_v2" if {direction!r} == "read" else "cuMemcpyDtoHAsync_v2"
        before, batches = drv.call_count(name), drv.call_count("cuStreamBatchMemOp_v2")
        with cmt.io.open(path, "r" if {direction!r} == "read" else "r+") as f:
            op = f.read_async((d, n), s) if {direction!r} == "read" else f.write_async((d, n), s)
            assert op.check_bytes_done(timeout=60) == n
        drv.stream_sync(s)
        dmas = drv.call_count(name) - before
        assert 4 <= dmas <= 13, dmas
        assert drv.call_count("cuStreamBatchMemOp_v2") - batches <= dmas + 2  # the probe, one per block, the last write
        if {direction!r} == "read":
            assert drv.peek(d, n) == data
        else:
            assert open(path, "rb").read() == data
    ''')


def test_transfers_after_cudaDeviceReset_under_cmt_run_get_new_buffers_and_every_byte(run_python, tmp_path):
    """Under `cmt run` (the library preloaded, so the reset reaches its hook): the primary context's
    reset takes its streams and pinned memory with it, among them what cmt.io made for it (small
    transfers' bounce buffers, stream-ordered pipelines, the words streams wait on). Synchronous,
    small and stream-ordered transfers after it make their own, and every byte arrives."""
    from cmt.native import library_path

    run_scenario(run_python, f'''
        path = os.path.join({str(tmp_path)!r}, "f.bin")
        data = pattern(6 * MiB + 99, 4)
        make_file(path, data)
        n = len(data)

        def every_kind(seed):
            d = drv.mem_alloc(n)
            with cmt.io.open(path) as f:
                assert f.read((d, n)) == n and drv.peek(d, n) == data
                small = drv.mem_alloc(4096)
                assert f.read((small, 4096), file_offset=5000) == 4096 and drv.peek(small, 4096) == data[5000:9096]
                s = drv.stream_create()
                drv.memset_d8(d, 0, n)
                assert f.read_async((d, n), s).check_bytes_done(timeout=60) == n
                drv.stream_sync(s)
                assert drv.peek(d, n) == data
            out = os.path.join({str(tmp_path)!r}, f"out{{seed}}.bin")
            with cmt.io.open(out, "w") as g:
                assert g.write_async((d, n), s).check_bytes_done(timeout=60) == n
            drv.stream_sync(s)
            assert open(out, "rb").read() == data

        every_kind(1)
        drv.check("cuDevicePrimaryCtxReset_v2", 0)
        every_kind(2)
        print("OK")
    ''', LD_PRELOAD=str(library_path()))
