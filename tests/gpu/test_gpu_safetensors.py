"""GPU tests of cmt.io.load_safetensors and cmt.io.safe_open (pytest -m gpu) against
safetensors.torch.load_file(device='cuda'): every dtype, warm and cold, a sharded checkpoint, a
tensor at an unaligned offset, the lazy handle. Each case runs in a subprocess (a fresh CUDA context)."""

from __future__ import annotations

import pytest

from .child import run_child

pytestmark = pytest.mark.gpu

_PRELUDE = """
import json, os, struct, torch, cmt.io
from safetensors.torch import load_file, save_file
assert torch.cuda.is_available()

def raw(t):
    return t.reshape(-1).view(torch.uint8)  # the bytes, for dtypes torch.equal cannot compare

def same(got, want, device):
    assert set(got) == set(want), set(got) ^ set(want)
    for k, w in want.items():
        g = got[k]
        assert (g.dtype, tuple(g.shape)) == (w.dtype, tuple(w.shape)), (k, g.dtype, g.shape, w.dtype, w.shape)
        assert g.device == torch.device(device), (k, g.device)
        assert torch.equal(raw(g).cpu(), raw(w).cpu()), k

def every_dtype(seed, big=0):
    g = torch.Generator().manual_seed(seed)
    names = ["float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
             "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "complex64", "uint16",
             "uint32", "uint64"]
    out = {}
    for i, name in enumerate(names):
        dtype = getattr(torch, name, None)
        if dtype is None:
            continue
        b = torch.randint(0, 256, (3 * (5 + i) * dtype.itemsize,), dtype=torch.uint8, generator=g)
        if dtype == torch.bool:
            b = b % 2
        out["t." + name] = b.view(dtype).reshape(3, 5 + i)
    out["scalar"] = torch.tensor(2.5)
    out["empty"] = torch.zeros(0, 7, dtype=torch.float16)
    if big:
        out["big"] = torch.randint(-2**31, 2**31 - 1, (big // 4,), dtype=torch.int32, generator=g)
    return out
"""


def run_python(code: str, tmp_path, timeout: int = 300) -> str:
    return run_child(_PRELUDE, code, tmp_path, timeout, needs=("torch", "safetensors"))


def test_every_dtype_warm_and_cold_as_safetensors_loads_it(tmp_path):
    out = run_python("""
        tensors = every_dtype(1, big=300 << 20)
        save_file(tensors, "m.safetensors", metadata={"format": "pt"})
        want = load_file("m.safetensors", device="cuda")
        for cache in ("warm", "cold"):
            if cache == "cold":
                evict("m.safetensors")
            got = cmt.io.load_safetensors("m.safetensors", device="cuda:0")
            same(got, want, "cuda:0")
            # one allocation for the file: every non-empty tensor lies in one storage
            storages = {t.untyped_storage().data_ptr() for t in got.values() if t.numel()}
            assert len(storages) == 1, storages
        same(cmt.io.load_safetensors("m.safetensors", device="cpu"), want, "cpu")
        print("OK dtypes", len(want))
    """, tmp_path)
    assert "OK dtypes" in out


def test_a_tensor_at_an_unaligned_offset_gets_an_aligned_copy(tmp_path):
    out = run_python("""
        a = torch.arange(3, dtype=torch.uint8)
        b = torch.arange(10, dtype=torch.float32) / 3
        c = torch.arange(5, dtype=torch.int64) - 7
        parts, entries = [a, b, c], {}
        at = 0
        for name, t in zip("abc", parts):
            n = t.numel() * t.itemsize
            entries[name] = {"dtype": {torch.uint8: "U8", torch.float32: "F32", torch.int64: "I64"}[t.dtype],
                             "shape": list(t.shape), "data_offsets": [at, at + n]}
            at += n
        text = json.dumps(entries).encode()
        with open("odd.safetensors", "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text + b"".join(t.numpy().tobytes() for t in parts))
        got = cmt.io.load_safetensors("odd.safetensors")
        for name, t in zip("abc", parts):
            assert torch.equal(got[name].cpu(), t), name
            assert got[name].data_ptr() % t.itemsize == 0
        with cmt.io.safe_open("odd.safetensors") as f:
            assert torch.equal(f.get_tensor("b").cpu(), b)
        print("OK unaligned")
    """, tmp_path)
    assert "OK unaligned" in out


def test_a_sharded_checkpoint_by_folder_and_by_index(tmp_path):
    out = run_python("""
        os.mkdir("ck")
        weight_map, want = {}, {}
        for i in range(3):
            shard = f"model-{i + 1:05d}-of-00003.safetensors"
            tensors = {f"layer{i}.{k}": v for k, v in every_dtype(10 + i, big=(i + 1) << 20).items()}
            save_file(tensors, os.path.join("ck", shard))
            weight_map.update(dict.fromkeys(tensors, shard))
            want.update(load_file(os.path.join("ck", shard), device="cuda"))
        with open("ck/model.safetensors.index.json", "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f)
        same(cmt.io.load_safetensors("ck"), want, "cuda:0")
        same(cmt.io.load_safetensors("ck/model.safetensors.index.json", device="cuda"), want, "cuda:0")
        os.remove("ck/model-00002-of-00003.safetensors")
        try:
            cmt.io.load_safetensors("ck")
            raise AssertionError("a missing shard was not noticed")
        except cmt.io.FileIOError as e:
            assert "model-00002-of-00003.safetensors" in str(e), e
        print("OK sharded")
    """, tmp_path)
    assert "OK sharded" in out


def test_the_lazy_handle(tmp_path):
    out = run_python("""
        tensors = every_dtype(5)
        save_file(tensors, "m.safetensors", metadata={"format": "pt", "k": "v"})
        want = load_file("m.safetensors", device="cuda")
        with cmt.io.safe_open("m.safetensors", device="cuda") as f:
            assert sorted(f.keys()) == sorted(want) and len(f) == len(want)
            assert f.metadata() == {"format": "pt", "k": "v"}
            same({k: f.get_tensor(k) for k in f.keys()}, want, "cuda:0")
            try:
                f.get_tensor("nope")
                raise AssertionError("an unknown name was taken")
            except KeyError as e:
                assert "nope" in str(e)
        try:
            f.get_tensor("scalar")
            raise AssertionError("a closed handle read")
        except ValueError as e:
            assert "closed" in str(e)
        print("OK lazy")
    """, tmp_path)
    assert "OK lazy" in out


def test_bad_files_fail_before_any_allocation(tmp_path):
    out = run_python("""
        save_file({"w": torch.ones(1 << 20)}, "m.safetensors")
        data = open("m.safetensors", "rb").read()
        open("cut.safetensors", "wb").write(data[:-10])
        before = torch.cuda.memory_allocated()
        for path, problem in (("cut.safetensors", "truncated"), ("nope.safetensors", "no such file")):
            try:
                cmt.io.load_safetensors(path)
                raise AssertionError(path)
            except (ValueError, OSError) as e:
                assert path in str(e) and problem in str(e), e
        for device in ("cuda:99", "meta", "nonsense"):
            try:
                cmt.io.load_safetensors("m.safetensors", device=device)
                raise AssertionError(device)
            except ValueError as e:
                assert device in str(e), e
        assert torch.cuda.memory_allocated() == before
        print("OK errors")
    """, tmp_path)
    assert "OK errors" in out
