"""Reads what the recorder wrote and saves it: per-process ``cmt-<pid>.rec`` files (the format is
documented in native/src/recording_file.hpp), a directory of them, or a saved recording (``--out``:
an uncompressed tar of the .rec files plus ``manifest.json``)."""

from __future__ import annotations

import io
import json
import os
import struct
import tarfile
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..errors import CmtError

MAGIC = b"CMTPROF\0"
FORMAT_VERSION = 3  # 2: host copies (h2h records and the names of their callers); 3: pinning calls, setups
READABLE_VERSIONS = (1, 2, 3)
HEADER = struct.Struct("<8sIIIIIIQQIIQ")  # 64 bytes
MARKER_ENTRY = 0xFF  # not a copy: `bytes` records were dropped
NAME_SLOT_ENTRY = 0xFE  # not a copy: part of a calling object's path (native/src/recorder.hpp)
PIN_ENTRY = 0xFD  # not a copy: a call that pinned host memory or let it go (`dir`: which, pin_calls)
SETUP_ENTRY = 0xFC  # not a copy: the engine's setup of a GPU's staging (bytes pinned, `reserved` buffers)
NAME_SLOT_BYTES = 36
UNKNOWN_CALLER = "unknown"  # an h2h copy whose caller could not be named
RECORD = np.dtype([
    ("start_ns", "<u8"), ("end_ns", "<u8"), ("bytes", "<u8"), ("stream", "<u8"), ("result", "<i4"),
    ("tid", "<u4"), ("dir", "u1"), ("host_kind", "u1"), ("outcome", "u1"), ("entry", "u1"), ("reserved", "<u4"),
])
assert RECORD.itemsize == 48

BUNDLE_FORMAT = "cmt-profile"
BUNDLE_VERSION = 1
MANIFEST = "manifest.json"
NAME_TABLES = ("directions", "host_kinds", "outcomes", "entries", "pin_calls")


@dataclass
class ProcessRecording:
    pid: int
    ppid: int
    forked: bool
    argv: list[str]
    cmt_version: str
    monotonic_ns: int  # when the file was started (same clock as the records)
    realtime_ns: int
    names: dict[str, list[str]]  # code -> name, for each byte field of a record
    outcome_texts: dict[str, str]
    records: np.ndarray  # RECORD, copies only
    dropped: int = 0
    callers: dict[int, str] = field(default_factory=dict)  # object id -> path (h2h records' `reserved`)
    h2h_from: int | None = None  # host copies from this size up were recorded (None: none were)
    pins: np.ndarray = field(default_factory=lambda: np.zeros(0, RECORD))  # RECORD, pinning calls
    setups: np.ndarray = field(default_factory=lambda: np.zeros(0, RECORD))  # RECORD, the engine's setups

    def caller(self, object_id: int) -> str:
        return self.callers.get(object_id, UNKNOWN_CALLER)

    def is_host_copy(self) -> np.ndarray:
        """Per record: an h2h copy (a large memcpy/memmove, or memset), not a host<->device one."""
        names = self.names.get("directions", [])
        return self.records["dir"] == names.index("h2h") if "h2h" in names else np.zeros(len(self.records), bool)

    def name(self, table: str, code: int) -> str:
        names = self.names.get(table, [])
        return names[code] if code < len(names) else f"{table}#{code}"


@dataclass
class Copies:
    """Every copy of every process, one array per field; names decoded to strings."""

    pid: np.ndarray
    tid: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    bytes: np.ndarray
    stream: np.ndarray
    result: np.ndarray
    direction: np.ndarray
    host_kind: np.ndarray
    outcome: np.ndarray
    entry: np.ndarray
    caller: np.ndarray  # h2h: the path of the object that made the copy; "" for host<->device copies

    def __len__(self) -> int:
        return len(self.bytes)

    @property
    def seconds(self) -> np.ndarray:
        return (self.end_ns - self.start_ns).astype(np.float64) / 1e9

    def select(self, mask: np.ndarray) -> Copies:
        return Copies(*(getattr(self, f.name)[mask] for f in fields(self)))


def _decode(proc: ProcessRecording, table: str, codes: np.ndarray) -> np.ndarray:
    lookup = np.array([proc.name(table, i) for i in range(256)], dtype=object)
    return lookup[codes]


@dataclass
class Recording:
    processes: list[ProcessRecording]
    manifest: dict[str, Any] = field(default_factory=dict)

    def copies(self) -> Copies:
        """All processes merged (each process's own name tables decode its records)."""
        parts = []
        for p in self.processes:
            r = p.records
            parts.append((np.full(len(r), p.pid, np.int64), r["tid"].astype(np.int64), r["start_ns"], r["end_ns"],
                          r["bytes"], r["stream"], r["result"], _decode(p, "directions", r["dir"]),
                          _decode(p, "host_kinds", r["host_kind"]), _decode(p, "outcomes", r["outcome"]),
                          _decode(p, "entries", r["entry"]), _callers(p)))
        return _merged(parts)

    def pin_calls(self) -> Copies:
        """Every process's pinning calls, as Copies: `entry` names the call (cuMemHostAlloc, ...),
        `caller` the object that made it; `direction` and `host_kind` are empty."""
        parts = []
        for p in self.processes:
            r = p.pins
            blank = np.full(len(r), "", dtype=object)
            parts.append((np.full(len(r), p.pid, np.int64), r["tid"].astype(np.int64), r["start_ns"], r["end_ns"],
                          r["bytes"], r["stream"], r["result"], blank, blank, blank,
                          _decode(p, "pin_calls", r["dir"]), np.array([p.caller(int(i)) for i in r["reserved"]],
                                                                      dtype=object)))
        return _merged(parts)

    def setups(self) -> list[dict[str, Any]]:
        """The engine's setups of staging, every process's, in time order: pid, thread, start and end
        (ns, the copies' clock), bytes pinned, buffers, whether it succeeded."""
        out = [{"pid": p.pid, "tid": int(r["tid"]), "start_ns": int(r["start_ns"]), "end_ns": int(r["end_ns"]),
                "bytes": int(r["bytes"]), "buffers": int(r["reserved"]), "ok": int(r["result"]) == 0}
               for p in self.processes for r in p.setups]
        return sorted(out, key=lambda s: s["start_ns"])

    def outcome_texts(self) -> dict[str, str]:
        texts: dict[str, str] = {}
        for p in self.processes:
            texts.update(p.outcome_texts)
        return texts


def _merged(parts: list[tuple]) -> Copies:
    """Copies from each process's columns, in Copies' field order."""
    if not parts:
        empty = np.zeros(0, np.uint64)
        return Copies(*([empty] * 7), *([np.zeros(0, object)] * 5))
    return Copies(*(np.concatenate(cols) for cols in zip(*parts, strict=True)))


def _callers(proc: ProcessRecording) -> np.ndarray:
    r = proc.records
    out = np.full(len(r), "", dtype=object)
    h2h = proc.is_host_copy()
    out[h2h] = [proc.caller(int(i)) for i in r["reserved"][h2h]]
    return out


def _names(slots: np.ndarray) -> dict[int, str]:
    """The calling objects' paths from their name slots (in any order in the file)."""
    text = slots.view(np.uint8).reshape(-1, RECORD.itemsize)[:, :NAME_SLOT_BYTES]
    parts: dict[int, dict[int, bytes]] = {}
    for i, (object_id, index) in enumerate(zip(slots["reserved"].tolist(), slots["dir"].tolist(), strict=True)):
        parts.setdefault(object_id, {})[index] = text[i].tobytes()
    return {object_id: b"".join(chunks[k] for k in sorted(chunks)).rstrip(b"\0").decode(errors="replace")
            for object_id, chunks in parts.items()}


def parse_process(data: bytes, source: str) -> ProcessRecording:
    if len(data) < HEADER.size or data[:8] != MAGIC:
        raise CmtError(f"{source}: not a cmt recording")
    (_, version, header_bytes, record_bytes, pid, ppid, flags, mono, real,
     meta_bytes, cmdline_bytes, _) = HEADER.unpack_from(data)
    if version not in READABLE_VERSIONS:
        raise CmtError(f"{source}: recording format version {version} is not supported (cmt {__version__} "
                       f"reads versions {', '.join(map(str, READABLE_VERSIONS))}); render it with the cmt version "
                       "that recorded it")
    if record_bytes != RECORD.itemsize or header_bytes > len(data) or HEADER.size + meta_bytes > header_bytes:
        raise CmtError(f"{source}: damaged recording header")
    meta = dict(line.split("=", 1) for line in
                data[HEADER.size:HEADER.size + meta_bytes].decode(errors="replace").splitlines() if "=" in line)
    cmd_start = HEADER.size + meta_bytes
    argv = [a.decode(errors="replace") for a in data[cmd_start:cmd_start + cmdline_bytes].split(b"\0") if a]
    count = (len(data) - header_bytes) // RECORD.itemsize  # a partial last record (killed mid-write) is ignored
    raw = np.frombuffer(data, RECORD, count=count, offset=header_bytes)
    marker = raw["entry"] == MARKER_ENTRY
    names = raw["entry"] == NAME_SLOT_ENTRY
    pins = raw["entry"] == PIN_ENTRY
    setups = raw["entry"] == SETUP_ENTRY
    h2h_from = meta.get("h2h_from", "off")
    return ProcessRecording(
        pid=pid, ppid=ppid, forked=bool(flags & 1), argv=argv, cmt_version=meta.get("cmt_version", "?"),
        monotonic_ns=mono, realtime_ns=real,
        names={t: meta.get(t, "").split(",") for t in NAME_TABLES},
        outcome_texts={k.removeprefix("outcome_text."): v for k, v in meta.items() if k.startswith("outcome_text.")},
        records=raw[~(marker | names | pins | setups)].copy(), dropped=int(raw["bytes"][marker].sum()),
        callers=_names(raw[names]), h2h_from=int(h2h_from) if h2h_from.isdigit() else None, pins=raw[pins].copy(),
        setups=raw[setups].copy(),
    )


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise CmtError(f"recording {path} does not exist") from None
    except OSError as e:
        raise CmtError(f"cannot read recording {path}: {e.strerror}") from None


def read_dir(directory: Path) -> Recording:
    files = sorted(directory.glob("cmt-*.rec"))
    manifest = {}
    if (directory / MANIFEST).exists():
        manifest = _parse_manifest(_read_bytes(directory / MANIFEST), str(directory / MANIFEST))
    return Recording([parse_process(_read_bytes(f), str(f)) for f in files], manifest)


def _parse_manifest(data: bytes, source: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CmtError(f"{source}: damaged manifest") from None
    if not isinstance(doc, dict) or doc.get("format") != BUNDLE_FORMAT:
        raise CmtError(f"{source}: not a cmt profile recording")
    if doc.get("version") != BUNDLE_VERSION:
        raise CmtError(f"{source}: saved recording version {doc.get('version')!r} (cmt {doc.get('cmt_version')}) "
                       f"is not supported; cmt {__version__} reads version {BUNDLE_VERSION}")
    return doc


def _read_bundle(path: Path) -> Recording:
    try:
        with tarfile.open(path, "r:") as tar:
            members = {m.name: m for m in tar.getmembers() if m.isfile()}
            if MANIFEST not in members:
                raise CmtError(f"{path}: not a cmt profile recording (no {MANIFEST})")
            manifest = _parse_manifest(tar.extractfile(members[MANIFEST]).read(), f"{path}:{MANIFEST}")
            procs = [parse_process(tar.extractfile(m).read(), f"{path}:{name}")
                     for name, m in sorted(members.items()) if name.endswith(".rec")]
    except (tarfile.TarError, EOFError):
        raise CmtError(f"{path}: damaged saved recording") from None
    return Recording(procs, manifest)


def read(path: str | os.PathLike) -> Recording:
    """A saved recording (--out), one .rec file, or a directory of them."""
    p = Path(path)
    if p.is_dir():
        return read_dir(p)
    if not p.exists():
        raise CmtError(f"recording {p} does not exist")
    try:
        is_tar = tarfile.is_tarfile(p)
    except OSError as e:
        raise CmtError(f"cannot read recording {p}: {e.strerror}") from None
    if is_tar:
        return _read_bundle(p)
    return Recording([parse_process(_read_bytes(p), str(p))])


def make_manifest(command: list[str], exit_code: int, config: dict | None, config_source: str) -> dict[str, Any]:
    return {"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "cmt_version": __version__,
            "command": command, "exit_code": exit_code, "config": config, "config_source": config_source}


def save(directory: Path, manifest: dict[str, Any], out: Path) -> None:
    """Writes the .rec files of `directory` and the manifest as one file, atomically."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with tarfile.open(tmp, "w:", format=tarfile.PAX_FORMAT) as tar:
            blob = json.dumps(manifest, indent=2).encode()
            info = tarfile.TarInfo(MANIFEST)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
            for f in sorted(directory.glob("cmt-*.rec")):
                tar.add(f, arcname=f.name)
        os.replace(tmp, out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise CmtError(f"cannot write recording {out}: {e.strerror or e}") from None
