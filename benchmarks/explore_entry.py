"""Why a 64 MiB host-to-device copy under `cmt run` measures slower in core_acceptance.py (PyTorch's
`gpu.copy_(src)`: the legacy default stream, then a stream and a device synchronisation) than in
`cmt bench copy` (the engine's C API on a non-blocking stream): the same copy reached in each way,
in one process under `cmt run`, the ways taken in turn so that drift hits them alike, each timed
on the host clock between device synchronisations, with pinned copies alongside.

    python benchmarks/explore_entry.py [--size-mib 64] [--rounds 20] [--out entry.json]

Each environment of --variants runs in its own process (switches are read once per process).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import child_result


def child(size: int, rounds: int) -> dict:
    import torch

    from cmt import native

    src = torch.randint(0, 256, (size,), dtype=torch.uint8)
    gpu = torch.empty(size, dtype=torch.uint8, device="cuda")
    pinned = src.clone().pin_memory()
    side = torch.cuda.Stream()
    ways = {
        "torch_legacy": lambda: gpu.copy_(src),
        "torch_side_stream": lambda: _on(side, lambda: gpu.copy_(src)),
        "capi_side_stream": lambda: _capi(native, src, gpu, size, side),
        "capi_legacy": lambda: _capi(native, src, gpu, size, None),
        # The calls PyTorch's copy_ makes (cudaMemcpyAsync on the legacy stream, cudaStreamSynchronize),
        # made straight to its CUDA runtime: tells PyTorch's own cost from the runtime's and cmt's.
        "cudart_legacy": _cudart_copy(src, gpu, size),
        "pinned": lambda: gpu.copy_(pinned, non_blocking=True),
    }
    times: dict[str, list[float]] = {k: [] for k in ways}
    for r in range(rounds + 2):
        for name, fn in ways.items():
            torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            if r >= 2:  # the first copies of a process run slow
                times[name].append(time.perf_counter() - t)
    assert torch.equal(gpu.cpu(), src)
    pinned_s = statistics.median(times["pinned"])
    return {name: {"us": round(statistics.median(v) * 1e6, 1), "gbps": round(size / statistics.median(v) / 1e9, 2),
                   "vs_pinned": round(pinned_s / statistics.median(v), 3)} for name, v in times.items()}


def _on(stream, fn) -> None:
    import torch

    with torch.cuda.stream(stream):
        fn()
        stream.synchronize()


def _cudart_copy(src, gpu, size: int):
    """cudaMemcpyAsync(gpu, src, size, HostToDevice, 0) + cudaStreamSynchronize(0) through the CUDA
    runtime PyTorch loaded (found in this process's mappings)."""
    import ctypes

    with open("/proc/self/maps") as f:
        path = next((line.split()[-1] for line in f if "libcudart.so" in line), None)
    if path is None:
        raise SystemExit("no CUDA runtime loaded in this process (PyTorch built with a static one?)")
    rt = ctypes.CDLL(path)
    memcpy_async, sync = rt.cudaMemcpyAsync, rt.cudaStreamSynchronize
    memcpy_async.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    sync.argtypes = [ctypes.c_void_p]
    dst, host = gpu.data_ptr(), src.data_ptr()

    def copy() -> None:
        if memcpy_async(dst, host, size, 1, None) or sync(None):
            raise SystemExit("cudaMemcpyAsync / cudaStreamSynchronize failed")

    return copy


def _capi(native, src, gpu, size: int, stream) -> None:
    import torch

    handle = stream.cuda_stream if stream is not None else 0
    r = native.memcpy("h2d", src.data_ptr(), gpu.data_ptr(), size, handle)
    if r != 0:
        raise SystemExit(f"cmt_memcpy failed: {int(r)}")
    (stream or torch.cuda.current_stream()).synchronize()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--variants", default="default,entry-stream",
                    help=child_result.VARIANTS_HELP)
    ap.add_argument("--out", default="entry.json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    size = args.size_mib << 20
    if args.child:
        child_result.emit(child(size, args.rounds))
        return
    out = []
    for variant in args.variants.split(","):
        env = {**os.environ, **child_result.variant_env(variant)}
        res, proc = child_result.run([*child_result.UNDER_CMT, sys.executable, __file__, "--child",
                                      "--size-mib", str(args.size_mib), "--rounds", str(args.rounds)], env)
        if res is None:
            print(variant, "FAILED", proc.stderr[-1500:])
            continue
        out.append({"variant": variant, "size": size, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "ways": res})
        print(variant, " ".join(f"{k} {v['us']}us {v['vs_pinned']:.0%}" for k, v in res.items()), flush=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
