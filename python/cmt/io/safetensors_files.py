"""A safetensors checkpoint's files and their data sections, without PyTorch.

A checkpoint is one file, or sharded: a folder with ``model.safetensors.index.json`` (whose
``weight_map`` names each tensor's shard), the index file itself, or a folder of ``*.safetensors``
files. `checkpoint_headers` finds and checks every shard's header before any data is read;
`read_data` reads a file's whole data section with one cmt.io read (the engine's lanes read it in
parallel, O_DIRECT where it is not in the page cache, while the copy engine moves it to the GPU)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

from .errors import FileIOError
from .file import File
from .safetensors_format import Header, SafetensorsError, read_header

INDEX_SUFFIX = ".safetensors.index.json"


def _missing(path: Path, why: str) -> FileIOError:
    return FileIOError(errno.ENOENT, why, str(path))


def _from_index(index: Path) -> tuple[list[Path], dict[str, str]]:
    """The shards an index names (in the order first named) and its weight_map."""
    try:
        doc = json.loads(index.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(index, f"the index is not JSON ({e})") from None
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise SafetensorsError(index, "the index has no weight_map object of tensor name -> shard file")
    shards = [index.parent / name for name in dict.fromkeys(weight_map.values())]
    for shard in shards:
        if not shard.is_file():
            raise _missing(shard, f"shard {shard.name} named by the index {index} is missing")
    return shards, weight_map


def checkpoint_files(path: str | os.PathLike) -> tuple[list[Path], dict[str, str] | None]:
    """The files of a checkpoint and, for an indexed one, its weight_map."""
    p = Path(os.fspath(path))
    if p.is_dir():
        indexes = sorted(p.glob("*" + INDEX_SUFFIX))
        if len(indexes) > 1:
            preferred = p / ("model" + INDEX_SUFFIX)
            if not preferred.is_file():
                raise SafetensorsError(p, f"several indexes ({', '.join(i.name for i in indexes)}): pass one")
            indexes = [preferred]
        if indexes:
            return _from_index(indexes[0])
        files = sorted(f for f in p.glob("*.safetensors") if f.is_file())
        if not files:
            raise _missing(p, f"no *.safetensors file and no *{INDEX_SUFFIX} in the folder {p}")
        return files, None
    if p.name.endswith(INDEX_SUFFIX) or (p.suffix == ".json" and p.is_file()):
        if not p.is_file():
            raise _missing(p, f"no such index file: {p}")
        return _from_index(p)
    if not p.exists():
        raise _missing(p, f"no such file or folder: {p}")
    return [p], None


def checkpoint_headers(path: str | os.PathLike) -> list[Header]:
    """Every shard's checked header. A tensor in two shards, or one the index places in a shard that
    lacks it, is a SafetensorsError."""
    files, weight_map = checkpoint_files(path)
    headers = [read_header(f) for f in files]
    seen: dict[str, str] = {}
    for h in headers:
        for name in h.tensors:
            if name in seen:
                raise SafetensorsError(h.path, f"tensor {name!r} is also in {seen[name]}")
            seen[name] = h.path
    if weight_map is not None:
        for name, shard in weight_map.items():
            where = seen.get(name)
            if where is None or Path(where).name != Path(shard).name:
                raise SafetensorsError(str(Path(files[0]).parent / shard),
                                       f"the index places tensor {name!r} in this shard, which does not hold it")
    return headers


def read_data(header: Header, buf: Any, file: File | None = None, dev_offset: int = 0) -> None:
    """Reads the data section of `header`'s file into buf (from dev_offset): any cmt.io buffer (a
    device tensor, DevicePointer, a host array). `file`: the file already open with cmt.io."""
    if header.data_size == 0:
        return
    f = file if file is not None else File(header.path, "r")
    try:
        n = f.read(buf, size=header.data_size, file_offset=header.data_start, dev_offset=dev_offset)
    finally:
        if file is None:
            f.close()
    if n != header.data_size:
        at = header.data_start + n
        raise FileIOError(errno.EIO, f"the file ended at offset {at}, {header.data_size - n} bytes before the end "
                          "of its data section: it was truncated after its header was read", header.path, at)
