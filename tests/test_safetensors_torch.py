"""cmt.io.load_safetensors and safe_open into host memory (device='cpu'), where PyTorch is installed
(CI has none: these skip there; the GPU ones are tests/gpu/test_gpu_safetensors.py): every dtype
PyTorch and safetensors share, views of one allocation, a tensor at an unaligned offset, the dtypes
PyTorch lacks refused by name, a sharded checkpoint, the lazy handle."""

from __future__ import annotations

import json
import struct

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

import cmt.io  # noqa: E402

NAMES = ["float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
         "float8_e4m3fn", "float8_e5m2", "complex64", "uint16", "uint32", "uint64"]


def every_dtype(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i, name in enumerate(NAMES):
        dtype = getattr(torch, name, None)
        if dtype is None:
            continue
        b = torch.randint(0, 256, (3 * (5 + i) * dtype.itemsize,), dtype=torch.uint8, generator=g)
        out["t." + name] = (b % 2 if dtype == torch.bool else b).view(dtype).reshape(3, 5 + i)
    out["scalar"] = torch.tensor(2.5)
    out["empty"] = torch.zeros(0, 7, dtype=torch.float16)
    return out


def same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for k, w in want.items():
        assert (got[k].dtype, got[k].shape) == (w.dtype, w.shape), k
        assert torch.equal(got[k].reshape(-1).view(torch.uint8), w.reshape(-1).view(torch.uint8)), k


def _handmade(path, parts: list[tuple[str, str, torch.Tensor]]) -> None:
    entries, data = {}, b""
    for name, code, t in parts:
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
        entries[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(entries).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def test_every_dtype_as_safetensors_loads_it_in_one_allocation(tmp_path):
    path = tmp_path / "m.safetensors"
    safetensors_torch.save_file(every_dtype(1), str(path), metadata={"format": "pt"})
    got = cmt.io.load_safetensors(path, device="cpu")
    same(got, safetensors_torch.load_file(str(path)))
    assert len({t.untyped_storage().data_ptr() for t in got.values() if t.numel()}) == 1


def test_an_unaligned_tensor_gets_an_aligned_copy(tmp_path):
    a, b, c = torch.arange(3, dtype=torch.uint8), torch.arange(10, dtype=torch.float32) / 3, torch.arange(5) - 7
    _handmade(tmp_path / "odd.safetensors", [("a", "U8", a), ("b", "F32", b), ("c", "I64", c)])
    got = cmt.io.load_safetensors(tmp_path / "odd.safetensors", device="cpu")
    for name, t in zip("abc", (a, b, c), strict=True):
        assert torch.equal(got[name], t) and got[name].data_ptr() % t.element_size() == 0, name


def test_packed_fp4_and_dtypes_torch_lacks(tmp_path):
    fp4 = getattr(torch, "float4_e2m1fn_x2", None)
    if fp4 is not None:
        path = tmp_path / "fp4.safetensors"
        raw = torch.arange(6, dtype=torch.uint8)
        _handmade(path, [("w", "U8", raw.reshape(2, 3))])
        doc = path.read_bytes()
        n = struct.unpack("<Q", doc[:8])[0]
        header = json.loads(doc[8:8 + n])
        header["w"].update(dtype="F4", shape=[2, 6])  # 12 four-bit values in 6 bytes
        text = json.dumps(header).encode()
        path.write_bytes(struct.pack("<Q", len(text)) + text + doc[8 + n:])
        w = cmt.io.load_safetensors(path, device="cpu")["w"]
        assert w.dtype == fp4 and w.shape == (2, 3) and torch.equal(w.view(torch.uint8).reshape(-1), raw)
    path = tmp_path / "fp6.safetensors"
    _handmade(path, [("w", "U8", torch.zeros(3, dtype=torch.uint8))])
    doc = path.read_bytes().replace(b'"U8", "shape": [3]', b'"F6_E2M3", "shape": [4]')
    path.write_bytes(struct.pack("<Q", struct.unpack("<Q", doc[:8])[0] + 5) + doc[8:])
    with pytest.raises(cmt.io.SafetensorsError, match="tensor 'w' is F6_E2M3, which PyTorch .* has no dtype for"):
        cmt.io.load_safetensors(path, device="cpu")


def test_a_sharded_checkpoint_and_the_lazy_handle(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    weight_map, want = {}, {}
    for i in range(3):
        tensors = {f"l{i}.{k}": v for k, v in every_dtype(10 + i).items()}
        shard = f"model-{i + 1:05d}-of-00003.safetensors"
        safetensors_torch.save_file(tensors, str(ck / shard), metadata={"shard": str(i)})
        weight_map.update(dict.fromkeys(tensors, shard))
        want.update(tensors)
    (ck / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    same(cmt.io.load_safetensors(ck, device="cpu"), want)
    same(cmt.io.load_safetensors(ck / "model.safetensors.index.json", device="cpu"), want)
    with cmt.io.safe_open(ck / "model-00002-of-00003.safetensors", device="cpu") as f:
        assert f.metadata() == {"shard": "1"} and len(f) == len(every_dtype(0))
        same({k: f.get_tensor(k) for k in f.keys()}, {k: v for k, v in want.items() if k.startswith("l1.")})
        with pytest.raises(KeyError, match="nope"):
            f.get_tensor("nope")
    with pytest.raises(ValueError, match="closed"):
        f.get_tensor("l1.scalar")
    with pytest.raises(IsADirectoryError, match="load_safetensors"):
        cmt.io.safe_open(ck, device="cpu")


def test_bad_devices_and_frameworks(tmp_path):
    path = tmp_path / "m.safetensors"
    safetensors_torch.save_file({"w": torch.ones(3)}, str(path))
    for device in ("meta", "nonsense"):
        with pytest.raises(ValueError, match=device):
            cmt.io.load_safetensors(path, device=device)
    with pytest.raises(ValueError, match="gives PyTorch tensors"):
        cmt.io.safe_open(path, device="cpu", framework="np")
