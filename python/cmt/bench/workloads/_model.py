"""The model of the model-load workloads: a Llama-shaped set of bf16 tensors with random weights, one
safetensors file (3.9 GB; --quick 0.5 GB), made once in the family's shared work folder.

Each tensor's bits come from its own seeded CUDA generator, so a loaded model is checked exactly by
making the same bits again on the GPU: no reference copy, no host work. Also here: the page cache
(warm: read once; cold: posix_fadvise DONTNEED, and how much is still resident, since a sandbox may
ignore it) and the torch.save copy of the model that torch.load reads."""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import mmap
import os
from pathlib import Path

SEED = 20261205
HIDDEN, INTER, KV, VOCAB = 2048, 8192, 512, 32000  # hf-load's Llama shape: 63M parameters a layer


def layers(quick: bool) -> int:
    return 2 if quick else 30


def shapes(quick: bool) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape, in the order of a Llama checkpoint (3.9 GB of bf16 with 30 layers)."""
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB, HIDDEN)}
    for i in range(layers(quick)):
        p = f"model.layers.{i}."
        out.update({p + "input_layernorm.weight": (HIDDEN,), p + "self_attn.q_proj.weight": (HIDDEN, HIDDEN),
                    p + "self_attn.k_proj.weight": (KV, HIDDEN), p + "self_attn.v_proj.weight": (KV, HIDDEN),
                    p + "self_attn.o_proj.weight": (HIDDEN, HIDDEN), p + "post_attention_layernorm.weight": (HIDDEN,),
                    p + "mlp.gate_proj.weight": (INTER, HIDDEN), p + "mlp.up_proj.weight": (INTER, HIDDEN),
                    p + "mlp.down_proj.weight": (HIDDEN, INTER)})
    out.update({"model.norm.weight": (HIDDEN,), "lm_head.weight": (VOCAB, HIDDEN)})
    return out


def model_bytes(quick: bool) -> int:
    return sum(2 * math.prod(shape) for shape in shapes(quick).values())


def expected(torch, index: int, shape: tuple[int, ...]):
    """Tensor number `index`'s bits, made on the GPU: random int16 seen as bf16 (NaNs included)."""
    g = torch.Generator(device="cuda").manual_seed(SEED + index)
    return torch.randint(-(1 << 15), 1 << 15, shape, dtype=torch.int16, device="cuda", generator=g)


def model_path(work_dir: Path, quick: bool) -> Path:
    return work_dir / f"llama-{layers(quick)}l.safetensors"


def ensure_model(torch, work_dir: Path, quick: bool) -> Path:
    """The model's safetensors file, written once (to a temporary name first: a run stopped halfway
    leaves no file that looks whole)."""
    path = model_path(work_dir, quick)
    if not path.exists():
        from safetensors.torch import save_file

        tensors = {name: expected(torch, i, shape).cpu().view(torch.bfloat16)
                   for i, (name, shape) in enumerate(shapes(quick).items())}
        tmp = path.with_suffix(".tmp")
        save_file(tensors, str(tmp), metadata={"format": "pt", "seed": str(SEED)})
        os.replace(tmp, path)
    return path


def ensure_pt(torch, work_dir: Path, quick: bool) -> Path:
    """The same model as a torch.save file (for torch.load(mmap=True))."""
    path = model_path(work_dir, quick).with_suffix(".pt")
    if not path.exists():
        from safetensors.torch import load_file

        tmp = path.with_suffix(".pt.tmp")
        torch.save(load_file(str(ensure_model(torch, work_dir, quick))), tmp)
        os.replace(tmp, path)
    return path


def verify(torch, loaded: dict, quick: bool) -> None:
    """Every tensor, bit for bit, against its generator; an AssertionError names the first wrong one."""
    want = shapes(quick)
    assert set(loaded) == set(want), f"tensors missing or extra: {sorted(set(loaded) ^ set(want))[:5]}"
    for i, (name, shape) in enumerate(want.items()):
        t = loaded[name]
        assert t.is_cuda and t.dtype == torch.bfloat16 and tuple(t.shape) == shape, (name, t.device, t.dtype, t.shape)
        assert torch.equal(t.view(torch.int16), expected(torch, i, shape)), f"{name}: wrong bytes"


def warm(path: Path) -> None:
    """Into the page cache, by reading it (a buffer at a time, not the whole file into memory)."""
    buf = bytearray(64 << 20)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def evict(path: Path) -> float | None:
    """Out of the page cache (/proc/sys/vm/drop_caches is not writable on the GPU machine); returns
    the fraction still resident after, as the kernel tells it (None where it cannot be told)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages cannot be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return resident_fraction(path)


def resident_fraction(path: Path) -> float | None:
    """mincore over a mapping of the file: the share of its pages in the page cache."""
    import numpy as np

    size = path.stat().st_size
    if size == 0:
        return 0.0
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    vec = np.zeros((size + mmap.PAGESIZE - 1) // mmap.PAGESIZE, dtype=np.uint8)
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
        try:
            view = np.frombuffer(m, dtype=np.uint8)  # for the mapping's address
            ok = libc.mincore(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(size),
                              vec.ctypes.data_as(ctypes.c_void_p)) == 0
            del view
        finally:
            m.close()
    return float((vec & 1).mean()) if ok else None
