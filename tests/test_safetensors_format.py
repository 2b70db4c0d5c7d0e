"""The safetensors header parser and checkpoint finder (no PyTorch, no engine): files written by the
safetensors package parse to the dtypes, shapes, metadata and byte ranges it reads back; every kind
of malformed file, index or checkpoint is a clear error naming the file."""

from __future__ import annotations

import errno
import json
import struct

import numpy as np
import pytest
from safetensors_samples import NUMPY_DTYPES, every_dtype, handmade, packed

from cmt.io import FileIOError, SafetensorsError
from cmt.io.safetensors_files import checkpoint_files, checkpoint_headers
from cmt.io.safetensors_format import DTYPE_BITS, parse_header, read_header

safetensors_numpy = pytest.importorskip("safetensors.numpy")
NAME_OF = {np.dtype(v): k for k, v in NUMPY_DTYPES.items()}


def test_files_of_the_safetensors_package_parse_to_what_it_loads(tmp_path):
    path = tmp_path / "m.safetensors"
    tensors = every_dtype(seed=1)
    safetensors_numpy.save_file(tensors, str(path), metadata={"format": "np", "note": "x"})
    h = read_header(path)
    ref = safetensors_numpy.load_file(str(path))
    raw = path.read_bytes()
    assert h.metadata == {"format": "np", "note": "x"}
    assert set(h.tensors) == set(ref) == set(tensors)
    assert h.data_start + h.data_size == len(raw)
    assert h.data_start % 8 == 0  # safetensors pads the header
    for name, t in h.tensors.items():
        assert t.dtype == NAME_OF[ref[name].dtype], name
        assert t.shape == ref[name].shape, name
        assert raw[h.data_start + t.begin:h.data_start + t.end] == ref[name].tobytes(), name
    assert {t.dtype for t in h.tensors.values()} == set(NUMPY_DTYPES)


def test_no_metadata_no_tensors_and_header_padding(tmp_path):
    empty = handmade(tmp_path / "e.safetensors", {}, b"")
    h = read_header(empty)
    assert (h.tensors, h.metadata, h.data_size, h.data_start) == ({}, None, 0, 8 + len(b"{}"))
    entries, data = packed({"a": ("F32", [2], b"\0" * 8)})
    padded = handmade(tmp_path / "p.safetensors", {}, data, header_bytes=json.dumps(entries).encode() + b"    ")
    assert read_header(padded).tensors["a"].nbytes == 8


def test_dtypes_numpy_lacks_parse_with_their_sizes(tmp_path):
    entries, data = packed({
        "bf16": ("BF16", [3, 3], bytes(range(18))), "e4m3": ("F8_E4M3", [5], b"\1" * 5),
        "e5m2": ("F8_E5M2", [2, 2], b"\2" * 4), "e8m0": ("F8_E8M0", [3], b"\3" * 3),
        "fp4": ("F4", [2, 4], b"\4" * 4), "fp6": ("F6_E2M3", [4], b"\5" * 3), "fnuz": ("F8_E4M3FNUZ", [1], b"\6"),
    })
    h = read_header(handmade(tmp_path / "x.safetensors", entries, data))
    assert {n: (t.dtype, t.shape, t.nbytes, t.itemsize) for n, t in h.tensors.items()} == {
        "bf16": ("BF16", (3, 3), 18, 2), "e4m3": ("F8_E4M3", (5,), 5, 1), "e5m2": ("F8_E5M2", (2, 2), 4, 1),
        "e8m0": ("F8_E8M0", (3,), 3, 1), "fp4": ("F4", (2, 4), 4, 1), "fp6": ("F6_E2M3", (4,), 3, 1),
        "fnuz": ("F8_E4M3FNUZ", (1,), 1, 1)}
    assert {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL", "F8_E4M3", "F8_E5M2", "U16",
            "U32", "U64"} <= set(DTYPE_BITS)


F32x2 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


@pytest.mark.parametrize("entries, data, problem", [
    ({"w": {**F32x2, "dtype": "F128"}}, b"\0" * 8, "unknown dtype 'F128'"),
    ({"w": {"dtype": "F32", "shape": [2]}}, b"\0" * 8, "has no data_offsets"),
    ({"w": {**F32x2, "shape": [-2]}}, b"\0" * 8, "shape must be a list of non-negative integers"),
    ({"w": {**F32x2, "shape": [2.0]}}, b"\0" * 8, "shape must be a list of non-negative integers"),
    ({"w": {**F32x2, "shape": "2"}}, b"\0" * 8, "shape must be a list of non-negative integers"),
    ({"w": {**F32x2, "data_offsets": [8, 0]}}, b"\0" * 8, "data_offsets must be [begin, end]"),
    ({"w": {**F32x2, "data_offsets": [0, 4, 8]}}, b"\0" * 8, "data_offsets must be [begin, end]"),
    ({"w": {**F32x2, "data_offsets": [-8, 0]}}, b"\0" * 8, "data_offsets must be [begin, end]"),
    ({"w": {**F32x2, "data_offsets": [True, 8]}}, b"\0" * 8, "data_offsets must be [begin, end]"),
    ({"w": {**F32x2, "shape": [3]}}, b"\0" * 12, "shape [3] of F32 is 12 bytes but data_offsets [0, 8] hold 8"),
    ({"w": {**F32x2, "data_offsets": [0, 12]}}, b"\0" * 12, "is 8 bytes but data_offsets [0, 12] hold 12"),
    ({"w": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}, b"\0" * 2, "not a whole number of bytes"),
    ({"a": F32x2, "b": {**F32x2, "data_offsets": [4, 12]}}, b"\0" * 12, "overlap"),
    ({"a": {**F32x2, "shape": [4], "data_offsets": [0, 16]}, "b": {**F32x2, "data_offsets": [4, 12]}},
     b"\0" * 16, "overlap"),
    ({"w": F32x2}, b"\0" * 7, "the file is truncated: it has"),
    ({"w": {**F32x2, "data_offsets": [1 << 40, (1 << 40) + 8]}}, b"\0" * 8, "the file is truncated"),
    ({"w": [1, 2]}, b"", "expected an object with dtype, shape and data_offsets"),
    ({"__metadata__": {"n": 1}}, b"", "__metadata__ must be an object of strings"),
])
def test_malformed_headers_name_the_file_and_the_problem(tmp_path, entries, data, problem):
    path = handmade(tmp_path / "bad.safetensors", entries, data)
    with pytest.raises(SafetensorsError) as e:
        read_header(path)
    assert isinstance(e.value, ValueError)
    assert str(e.value).startswith(f"{path}: ") and problem in str(e.value), str(e.value)


@pytest.mark.parametrize("raw, problem", [
    (b"", "too few for a safetensors header's length"),
    (b"\x05\0\0", "too few for a safetensors header's length"),
    (struct.pack("<Q", 1 << 62) + b"{}", "over 100000000"),
    (struct.pack("<Q", 100) + b"{}", "the header's length says 100 bytes but the file has only 2"),
    (struct.pack("<Q", 4) + b"\xff\xfe{}", "the header is not JSON"),
    (struct.pack("<Q", 7) + b"PK\x03\x04abc", "the header is not JSON"),
    (struct.pack("<Q", 2) + b"[]", "the header is JSON but not an object (list)"),
])
def test_a_bad_length_or_a_header_that_is_not_json(tmp_path, raw, problem):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(raw)
    with pytest.raises(SafetensorsError, match=None) as e:
        read_header(path)
    assert e.value.path == str(path) and problem in str(e.value), str(e.value)


def test_parse_header_without_a_file_size_skips_only_the_size_check():
    entries, _ = packed({"w": ("F32", [4], b"\0" * 16)})
    h = parse_header("mem", json.dumps(entries).encode())
    assert h.data_size == 16
    with pytest.raises(SafetensorsError, match="mem: the file is truncated"):
        parse_header("mem", json.dumps(entries).encode(), file_size=10)


# -- checkpoints: one file, a folder, an index -------------------------------------------------------
def _sharded(root, n=3, seed=0):
    """A checkpoint of n shards, its index and every tensor (name -> array)."""
    root.mkdir(exist_ok=True)
    weight_map, every = {}, {}
    for i in range(n):
        tensors = {f"layer{i}.{k}": v for k, v in every_dtype(seed + i).items()}
        shard = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        safetensors_numpy.save_file(tensors, str(root / shard))
        weight_map.update(dict.fromkeys(tensors, shard))
        every.update(tensors)
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return every


def test_a_sharded_checkpoint_by_folder_by_index_and_without_one(tmp_path):
    every = _sharded(tmp_path / "ck")
    index = tmp_path / "ck" / "model.safetensors.index.json"
    for path in (tmp_path / "ck", index):
        files, weight_map = checkpoint_files(path)
        assert [f.name for f in files] == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
        assert set(weight_map) == set(every)
        headers = checkpoint_headers(path)
        assert sum(len(h.tensors) for h in headers) == len(every)
    index.unlink()
    files, weight_map = checkpoint_files(tmp_path / "ck")
    assert len(files) == 3 and weight_map is None
    assert {n for h in checkpoint_headers(tmp_path / "ck") for n in h.tensors} == set(every)
    one = files[0]
    assert checkpoint_files(one) == ([one], None)


def test_a_missing_shard_names_the_shard_and_the_index(tmp_path):
    _sharded(tmp_path / "ck")
    gone = tmp_path / "ck" / "model-00002-of-00003.safetensors"
    gone.unlink()
    with pytest.raises(FileIOError) as e:
        checkpoint_headers(tmp_path / "ck")
    assert e.value.errno == errno.ENOENT and e.value.filename == str(gone)
    assert "model-00002-of-00003.safetensors" in str(e.value) and "model.safetensors.index.json" in str(e.value)


@pytest.mark.parametrize("damage, problem", [
    ("not json", "the index is not JSON"),
    ({"metadata": {}}, "the index has no weight_map"),
    ({"weight_map": {"a": 3}}, "the index has no weight_map"),
    ({"weight_map": {"nope": "model-00001-of-00003.safetensors"}}, "the index places tensor 'nope' in this shard"),
    ({"weight_map": {"layer1.scalar": "model-00001-of-00003.safetensors"}},
     "the index places tensor 'layer1.scalar' in this shard"),
])
def test_a_bad_index(tmp_path, damage, problem):
    _sharded(tmp_path / "ck")
    index = tmp_path / "ck" / "model.safetensors.index.json"
    index.write_text(damage if isinstance(damage, str) else json.dumps(damage))
    with pytest.raises(SafetensorsError) as e:
        checkpoint_headers(tmp_path / "ck")
    assert problem in str(e.value), str(e.value)


def test_a_tensor_in_two_shards_an_empty_folder_and_a_missing_path(tmp_path):
    (tmp_path / "dup").mkdir()
    for name in ("a.safetensors", "b.safetensors"):
        safetensors_numpy.save_file({"w": np.zeros(3, np.float32)}, str(tmp_path / "dup" / name))
    with pytest.raises(SafetensorsError, match="tensor 'w' is also in .*a.safetensors"):
        checkpoint_headers(tmp_path / "dup")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileIOError, match="no \\*.safetensors file"):
        checkpoint_headers(tmp_path / "empty")
    with pytest.raises(FileIOError, match="no such file or folder") as e:
        checkpoint_headers(tmp_path / "nope.safetensors")
    assert e.value.errno == errno.ENOENT
    with pytest.raises(FileIOError, match="no such index file"):
        checkpoint_headers(tmp_path / "nope.safetensors.index.json")


def test_a_bad_shard_is_named(tmp_path):
    _sharded(tmp_path / "ck")
    shard = tmp_path / "ck" / "model-00003-of-00003.safetensors"
    shard.write_bytes(shard.read_bytes()[:-5])
    with pytest.raises(SafetensorsError, match="truncated") as e:
        checkpoint_headers(tmp_path / "ck")
    assert e.value.path == str(shard)
