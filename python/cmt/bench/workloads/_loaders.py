"""The loaders the model-load workloads compare, each the way its users call it: a function from the
model's file to a dict of bf16 tensors on the GPU. `needs` is the module whose absence makes the
workload a skip; `source` says which file it reads (the safetensors file, or its torch.save copy).
HF from_pretrained is the hf-load workload (the same Llama shape and size), not repeated here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def _st_cuda(torch, path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path), device="cuda")


def _st_cpu(torch, path: Path) -> dict:
    from safetensors.torch import load_file

    return {k: v.to("cuda") for k, v in load_file(str(path), device="cpu").items()}


def _cmt_io(torch, path: Path) -> dict:
    import cmt.io

    return cmt.io.load_safetensors(path, device="cuda:0")


def _fastsafetensors(torch, path: Path) -> dict:
    from fastsafetensors import fastsafe_open

    # nogds: pread into its bounce buffers (GPUDirect Storage is not set up on most machines)
    with fastsafe_open(str(path), framework="pt", device="cuda:0", nogds=True) as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _runai(torch, path: Path) -> dict:
    from runai_model_streamer import SafetensorsStreamer

    out = {}
    with SafetensorsStreamer() as streamer:  # host buffers filled by its threads; vLLM's .to(device)
        streamer.stream_file(str(path), device="cpu")
        for name, tensor in streamer.get_tensors():
            out[name] = tensor.to("cuda")
    return out


def _instanttensor(torch, path: Path) -> dict:
    from instanttensor import safe_open

    # Its defaults: Direct I/O through io_uring (else libaio) into pinned staging, asynchronous copies
    # into a GPU ring; yielded tensors own their memory (copy=True).
    with safe_open(str(path), framework="pt", device=0) as f:
        return dict(f.tensors())


def _torch_mmap(torch, path: Path) -> dict:
    return torch.load(path, mmap=True, map_location="cuda", weights_only=True)


def _np_memmap(torch, path: Path) -> dict:
    """Each tensor's bytes from a numpy memmap of the file to the GPU, then seen as bf16."""
    import warnings

    import numpy as np

    from cmt.io.safetensors_format import read_header

    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

    h = read_header(path)
    mm = np.memmap(path, dtype=np.uint8, mode="r", offset=h.data_start, shape=(h.data_size,))
    out = {}
    for name, t in h.tensors.items():
        host = torch.from_numpy(np.asarray(mm[t.begin:t.end]).view(np.int16))  # a read-only view: no copy
        out[name] = host.to("cuda").view(torch.bfloat16).view(t.shape)
    return out


@dataclass(frozen=True)
class Loader:
    load: Callable[[Any, Path], dict]
    label: str  # what the timer covers
    needs: str = "safetensors"  # imported before the timer, as a program imports its loader at its start
    source: str = "safetensors"  # or "pt": the torch.save copy


LOADERS: dict[str, Loader] = {
    "st-cuda": Loader(_st_cuda, "safetensors load_file(device='cuda')"),
    "st-cpu": Loader(_st_cpu, "safetensors load_file(device='cpu') + .to('cuda')"),
    "fastsafetensors": Loader(_fastsafetensors, "fastsafetensors fastsafe_open(device='cuda:0', nogds=True)",
                              needs="fastsafetensors"),
    "runai": Loader(_runai, "Run:ai SafetensorsStreamer + .to('cuda')", needs="runai_model_streamer"),
    "instanttensor": Loader(_instanttensor, "InstantTensor safe_open(device=0), its default backend",
                            needs="instanttensor"),
    "cmt-io": Loader(_cmt_io, "cmt.io.load_safetensors(device='cuda:0')", needs="cmt.io"),
    "torch-mmap": Loader(_torch_mmap, "torch.load(mmap=True, map_location='cuda')", needs="torch", source="pt"),
    "np-memmap": Loader(_np_memmap, "numpy memmap, tensor by tensor .to('cuda')", needs="numpy"),
}
