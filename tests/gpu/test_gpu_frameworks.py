"""GPU tests (pytest -m gpu): real programs under `cmt run`, every byte checked.

Each program runs in a subprocess under `cmt run` with CMT_STATS=1, prints OK lines for its
checks, and the test also requires that cmt actually accelerated copies in it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu


def run_under_cmt(args, timeout=300, env=None):
    import os

    full_env = {**os.environ, "CMT_STATS": "1", **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "cmt", "run", "--", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def accelerated(stderr: str, direction: str) -> int:
    """Copies cmt staged in one direction, summed over the processes' exit reports."""
    return sum(int(n) for n in re.findall(rf"{direction} accelerated\s+(\d+) copies", stderr))


def run_python(code: str, **kw):
    return run_under_cmt([sys.executable, "-c", textwrap.dedent(code)], **kw)


def _need(module):
    return pytest.importorskip(module)


def test_torch_round_trip_and_side_stream_ordering():
    _need("torch")
    proc = run_python("""
        import torch
        assert torch.cuda.is_available()
        n = 256 << 20
        for size in (n, n + 4097, 3 << 20, (1 << 20) + 1):
            host = torch.randint(0, 256, (size,), dtype=torch.uint8)
            gpu = host.to('cuda')                       # pageable H2D
            back = gpu.cpu()                            # D2H into a fresh pageable tensor
            assert torch.equal(back, host), size
            # odd offsets on both sides
            view = host[3:size - 5]
            g2 = torch.empty(view.numel() + 7, dtype=torch.uint8, device='cuda')
            g2[7:].copy_(view)
            assert torch.equal(g2[7:].cpu(), view)
        print('OK round trips')

        # Ordering on a side stream: a kernel writes, then copy_ D2H on the same stream must see it.
        s = torch.cuda.Stream()
        x = torch.zeros(64 << 20, dtype=torch.float32, device='cuda')
        out = torch.empty(64 << 20, dtype=torch.float32)
        with torch.cuda.stream(s):
            torch.cuda._sleep(50_000_000)               # keep the stream busy
            x.fill_(3.0)
            out.copy_(x)                                # blocking D2H on s
        assert bool((out == 3.0).all()), 'D2H ran before the kernel on its stream'
        # H2D then a kernel on the same side stream reads the new data
        src = torch.full((64 << 20,), 5.0)
        with torch.cuda.stream(s):
            torch.cuda._sleep(50_000_000)
            y = torch.empty_like(x)
            y.copy_(src)
            z = y * 2
        s.synchronize()
        assert bool((z == 10.0).all()), 'kernel ran before the H2D on its stream'
        print('OK side stream ordering')
    """)
    assert "OK round trips" in proc.stdout and "OK side stream ordering" in proc.stdout
    assert accelerated(proc.stderr, "h2d") > 0 and accelerated(proc.stderr, "d2h") > 0, proc.stderr


def test_cupy_asarray_and_get():
    _need("cupy")
    proc = run_python("""
        import cupy as cp, numpy as np
        a = np.random.default_rng(1).integers(0, 256, 200 << 20, dtype=np.uint8)
        g = cp.asarray(a)
        assert (cp.asnumpy(g) == a).all()
        assert (g.get() == a).all()
        b = np.empty_like(a)
        g.get(out=b)
        assert (b == a).all()
        print('OK cupy')
    """)
    assert "OK cupy" in proc.stdout
    assert accelerated(proc.stderr, "d2h") > 0, proc.stderr


def test_jax_device_put_and_asarray():
    _need("jax")
    proc = run_python("""
        import os
        os.environ.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')
        import jax, numpy as np
        assert jax.devices()[0].platform == 'gpu'
        for size in (64 << 20, (1 << 30) + 12):        # XLA stages < 1 GiB itself (pinned)
            a = np.random.default_rng(2).integers(0, 256, size, dtype=np.uint8)
            d = jax.device_put(a)
            d.block_until_ready()
            back = np.asarray(d)
            assert (back == a).all(), size
        print('OK jax')
    """, env={"XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
    assert "OK jax" in proc.stdout
    assert accelerated(proc.stderr, "d2h") + accelerated(proc.stderr, "h2d") > 0, proc.stderr


C_PROGRAM = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
  printf("FAIL %s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

__global__ void spin_then_fill(unsigned char* p, size_t n, unsigned char v, long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {}
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = v;
}

int main() {
  const size_t n = (64u << 20) + 123;
  unsigned char* h = (unsigned char*)malloc(n);
  unsigned char* back = (unsigned char*)malloc(n);
  for (size_t i = 0; i < n; ++i) h[i] = (unsigned char)(i * 131 + 7);
  unsigned char* d;
  CK(cudaMalloc(&d, n));
  CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(back, d, n, cudaMemcpyDeviceToHost));
  if (memcmp(h, back, n)) { printf("FAIL sync round trip\n"); return 1; }
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  memset(back, 0, n);
  CK(cudaMemcpyAsync(d, h + 1, n - 1, cudaMemcpyHostToDevice, s));
  CK(cudaMemcpyAsync(back, d, n - 1, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  if (memcmp(h + 1, back, n - 1)) { printf("FAIL async round trip\n"); return 1; }
  // cudaMemcpyDefault goes through cuMemcpy / cuMemcpyAsync (UVA).
  memset(back, 0, n);
  CK(cudaMemcpy(d, h, n, cudaMemcpyDefault));
  CK(cudaMemcpy(back, d, n, cudaMemcpyDefault));
  if (memcmp(h, back, n)) { printf("FAIL default-kind round trip\n"); return 1; }
  // A copy on a blocking stream right after a kernel on another blocking stream, through the
  // legacy default stream: the D2H on `blocking` must see the kernel's bytes only after a sync
  // through the legacy stream, which the kernel's stream joins.
  cudaStream_t a, blocking;
  CK(cudaStreamCreate(&a));
  CK(cudaStreamCreate(&blocking));
  spin_then_fill<<<256, 256, 0, a>>>(d, n, 0x5a, 200000000LL);
  CK(cudaGetLastError());
  CK(cudaMemcpy(back, d, n, cudaMemcpyDeviceToHost));  // legacy stream: waits for stream a
  for (size_t i = 0; i < n; ++i) if (back[i] != 0x5a) { printf("FAIL legacy ordering at %zu\n", i); return 1; }
  spin_then_fill<<<256, 256, 0, a>>>(d, n, 0x33, 200000000LL);
  CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));     // H2D must land after the kernel's writes
  CK(cudaMemcpyAsync(back, d, n, cudaMemcpyDeviceToHost, blocking));
  CK(cudaStreamSynchronize(blocking));
  if (memcmp(h, back, n)) { printf("FAIL H2D overtook the kernel\n"); return 1; }
  // Pinned memory passes through untouched and stays asynchronous.
  unsigned char* pinned;
  CK(cudaMallocHost(&pinned, n));
  CK(cudaMemcpyAsync(pinned, d, n, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  if (memcmp(h, pinned, n)) { printf("FAIL pinned\n"); return 1; }
  // An invalid copy gets the driver's own error.
  cudaError_t e = cudaMemcpy(d + n - 10, h, 4096, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) { printf("FAIL out-of-range copy succeeded\n"); return 1; }
  cudaGetLastError();
  printf("OK c program\n");
  return 0;
}
"""


@pytest.mark.parametrize("cudart", ["static", "shared"])
def test_c_program_cudart(cudart, tmp_path):
    nvcc = shutil.which("nvcc")
    if not nvcc:
        pytest.skip("nvcc not found")
    src = tmp_path / "prog.cu"
    src.write_text(C_PROGRAM)
    exe = tmp_path / f"prog_{cudart}"
    subprocess.run([nvcc, "-O2", f"-cudart={cudart}", "-o", str(exe), str(src)], check=True)
    proc = run_under_cmt([str(exe)])
    assert "OK c program" in proc.stdout, proc.stdout + proc.stderr
    assert accelerated(proc.stderr, "h2d") >= 4 and accelerated(proc.stderr, "d2h") >= 4, proc.stderr
    assert "pinned_host" in proc.stderr


def test_copies_after_a_device_reset_are_staged_again_and_exact():
    """cudaDeviceReset's driver call (cuDevicePrimaryCtxReset) destroys the primary context with its
    streams, events and pinned memory; the next retain makes a new one, which may have the old
    handle: cmt's pipeline for the old one must not serve the copies after it, from this thread or
    another."""
    proc = run_python("""
        import threading
        import numpy as np
        from cmt import cuda
        drv = cuda.load()
        dev = drv.open_device(0)
        n = 64 << 20
        ctx = dev.context
        def round_trip(seed):
            drv.set_current(ctx)
            host = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
            back = np.zeros_like(host)
            d = drv.mem_alloc(n)
            for _ in range(3):
                drv.memcpy_htod(d, host.ctypes.data, n)
                drv.memcpy_dtoh(back.ctypes.data, d, n)
                assert np.array_equal(back, host), seed
                back[:] = 0
            drv.mem_free(d)
        round_trip(1)
        assert drv.lib.cuDevicePrimaryCtxReset_v2(dev.handle) == 0  # (through dlsym, as cudart finds it)
        ctx = drv.retain_primary(dev.handle)  # a new primary context, as cudart's next call makes
        print('same handle' if ctx == dev.context else 'new handle')
        round_trip(2)
        t = threading.Thread(target=round_trip, args=(3,))
        t.start(); t.join()
        print('OK after reset')
    """, env={"CMT_TEST_HOOKS": "wait_setup=1"})  # copies wait for each pipeline's setup: 9 staged each way
    assert "OK after reset" in proc.stdout
    assert accelerated(proc.stderr, "h2d") >= 6 and accelerated(proc.stderr, "d2h") >= 6, proc.stderr


def test_a_torch_program_s_first_copy_finds_the_staging_set_up_with_its_context():
    """The program's very first CUDA call is a 256 MiB pageable copy: cudart makes the primary
    context inside it (cuDevicePrimaryCtxRetain, wrapped: the staging is faulted in meanwhile and
    registered once the context exists), and the copy, which may wait for that a bounded while, is
    staged; every byte checked. No wait_setup hook: as in real programs."""
    _need("torch")
    proc = run_python("""
        import torch
        host = torch.randint(0, 256, (256 << 20,), dtype=torch.uint8)
        gpu = host.to('cuda')                       # the process's first CUDA call
        assert torch.equal(gpu.cpu(), host)
        print('OK first copy')
    """, env={"CMT_LOG": "debug"})
    assert "OK first copy" in proc.stdout
    assert "faulted in ahead:" in proc.stderr, proc.stderr
    assert accelerated(proc.stderr, "h2d") >= 1, proc.stderr
