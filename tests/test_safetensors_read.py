"""The byte path of cmt.io.load_safetensors without PyTorch, against the stand-in driver: each file's
data section, read by one cmt.io read into (stand-in) device memory or a host array, cached or not,
holds every tensor's bytes where its header says, equal to what safetensors.numpy loads; a file cut
after its header was read is a FileIOError; `import cmt.io` never imports torch."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from io_scenario import run_scenario

pytest.importorskip("safetensors")

SETUP = '''
    import json, sys
    sys.path.insert(0, {tests!r})
    from safetensors.numpy import load_file, save_file
    from safetensors_samples import every_dtype
    from cmt.io import DevicePointer
    from cmt.io.safetensors_files import checkpoint_headers, read_data
    root = {root!r}
'''


def _scenario(run_python, tmp_path, body: str):
    setup = SETUP.format(tests=str(Path(__file__).parent), root=str(tmp_path))
    return run_scenario(run_python, textwrap.dedent(setup) + textwrap.dedent(body))


def test_every_tensor_lands_byte_exact_in_device_memory_cached_and_not(run_python, tmp_path):
    _scenario(run_python, tmp_path, '''
        path = os.path.join(root, "m.safetensors")
        save_file(every_dtype(seed=3, big=5 * MiB + 3), path, metadata={"format": "np"})
        ref = load_file(path)
        (h,) = checkpoint_headers(path)
        for cached in (True, False):
            if cached:
                with open(path, "rb") as f:
                    f.read()
            else:
                evict(path)
            d = drv.mem_alloc(h.data_size + 4096)
            drv.poke(d, b"\\xee" * (h.data_size + 4096))
            for settings in (None, {"threads": 3, "buffers": 3, "chunk_bytes": 256 << 10}):  # one block, many
                with cmt.io.open(path, settings=settings) as f:
                    read_data(h, DevicePointer(d, h.data_size + 4096), file=f, dev_offset=7)
                for name, t in h.tensors.items():
                    assert drv.peek(d + 7 + t.begin, t.nbytes) == ref[name].tobytes(), (name, cached, settings)
                assert drv.peek(d, 7) == b"\\xee" * 7
                assert drv.peek(d + 7 + h.data_size, 100) == b"\\xee" * 100  # nothing past the data section
    ''')


def test_a_sharded_checkpoint_into_host_and_device_memory(run_python, tmp_path):
    _scenario(run_python, tmp_path, '''
        ck = os.path.join(root, "ck")
        os.mkdir(ck)
        weight_map, ref = {}, {}
        for i in range(3):
            shard = os.path.join(ck, f"model-{i + 1:05d}-of-00003.safetensors")
            save_file({f"l{i}.{k}": v for k, v in every_dtype(seed=10 + i, big=(i + 1) * 300_001).items()}, shard)
            weight_map.update(dict.fromkeys(load_file(shard), os.path.basename(shard)))
            ref.update(load_file(shard))
        with open(os.path.join(ck, "model.safetensors.index.json"), "w") as f:
            json.dump({"weight_map": weight_map}, f)
        headers = checkpoint_headers(ck)
        seen = set()
        for h in headers:
            host = np.full(h.data_size, 0xEE, dtype=np.uint8)
            read_data(h, host)  # host memory: preadv, no engine
            d = drv.mem_alloc(max(h.data_size, 1))
            read_data(h, (d, h.data_size))
            dev = drv.peek(d, h.data_size)
            assert dev == host.tobytes()
            for name, t in h.tensors.items():
                assert host[t.begin:t.end].tobytes() == ref[name].tobytes(), name
                seen.add(name)
        assert seen == set(ref)
    ''')


def test_a_file_cut_after_its_header_was_read_is_a_file_io_error(run_python, tmp_path):
    _scenario(run_python, tmp_path, '''
        path = os.path.join(root, "m.safetensors")
        save_file(every_dtype(seed=4, big=MiB), path)
        (h,) = checkpoint_headers(path)
        os.truncate(path, h.data_start + h.data_size - 1000)
        d = drv.mem_alloc(h.data_size)
        for buf in ((d, h.data_size), np.empty(h.data_size, np.uint8)):
            try:
                read_data(h, buf)
                raise AssertionError("a short read was taken for the whole data section")
            except cmt.io.FileIOError as e:
                assert e.filename == path and e.errno == errno.EIO, e
                assert "1000 bytes before the end of its data section" in str(e), e
    ''')


def test_import_cmt_io_never_imports_torch(run_python):
    # torch set to None in sys.modules: any import of it fails, as where PyTorch is not installed.
    proc = run_python('''
import sys
sys.modules["torch"] = None
import cmt, cmt.io, cmt.io.safetensors_files, cmt.io.safetensors_format
from cmt.bench import workloads
try:
    cmt.io.load_safetensors("x.safetensors")
except ImportError as e:
    assert "need PyTorch" in str(e), e
else:
    raise AssertionError("load_safetensors ran without torch")
print("ok")
''')
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
