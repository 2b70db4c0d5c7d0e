"""The copies as a Chrome / Perfetto trace (JSON trace-event format, open at ui.perfetto.dev or
chrome://tracing): per process, one track per calling thread and one per stream, each copy a
complete ("X") event on both (a host copy, h2h, on its thread's only; a call that pins host memory
or lets it go, category "pin", on its thread's only; cmt's setup of its staging, category "setup",
on a track of its own); "M" metadata events name the tracks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import CmtError
from .recording import Recording
from .report import fmt_bytes

_STREAM_TID_BASE = 1 << 30  # stream tracks get tids above any real thread id
_SETUP_TID_BASE = (1 << 30) - 1024  # and the engine's setups below them
_LEGACY, _PER_THREAD = 0x1, 0x2  # CU_STREAM_LEGACY, CU_STREAM_PER_THREAD


def _stream_key(stream: int, entry: str, tid: int) -> tuple[str, str]:
    """Identity and name of the stream a copy ran on; stream 0 depends on the entry point."""
    per_thread_default = entry.endswith(("_ptds", "_ptsz"))
    if stream == _PER_THREAD or (stream == 0 and per_thread_default):
        return f"ptds-{tid}", f"per-thread default stream (thread {tid})"
    if stream in (0, _LEGACY):
        return "legacy", "legacy default stream"
    return f"{stream:#x}", f"stream {stream:#x}"


def _meta(kind: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": args}


def build(rec: Recording) -> dict[str, Any]:
    c, pins, setups = rec.copies(), rec.pin_calls(), rec.setups()
    t0 = min((p.monotonic_ns for p in rec.processes), default=0)
    for calls in (c, pins):
        if len(calls):
            t0 = min(t0, int(calls.start_ns.min()))
    t0 = min([t0] + [st["start_ns"] for st in setups])  # a setup may start before every copy
    events: list[dict[str, Any]] = []
    for p in rec.processes:
        name = " ".join(p.argv[:2]) or "process"
        events.append(_meta("process_name", p.pid, 0, {"name": f"{name} (pid {p.pid})"}))
    threads: set[tuple[int, int]] = set()

    def thread_track(pid: int, tid: int) -> None:
        if (pid, tid) not in threads:
            threads.add((pid, tid))
            label = "main thread" if tid == pid else f"thread {tid}"
            events.append(_meta("thread_name", pid, tid, {"name": label}))
            events.append(_meta("thread_sort_index", pid, tid, {"sort_index": 0 if tid == pid else 1}))

    lanes: dict[tuple[int, str], list[int]] = {}  # stream -> end time of each lane (no overlaps in a lane)
    lane_tid: dict[tuple[int, str, int], int] = {}
    order = c.start_ns.argsort(kind="stable")
    for i in order:
        pid, tid, start, end = int(c.pid[i]), int(c.tid[i]), int(c.start_ns[i]), int(c.end_ns[i])
        nbytes, stream, entry = int(c.bytes[i]), int(c.stream[i]), str(c.entry[i])
        secs = (end - start) / 1e9
        event = {
            "name": f"{c.direction[i]} {fmt_bytes(nbytes)}", "cat": f"{c.direction[i]},{c.host_kind[i]}",
            "ph": "X", "ts": (start - t0) / 1e3, "dur": (end - start) / 1e3, "pid": pid, "tid": tid,
            "args": {"bytes": nbytes, "host_kind": str(c.host_kind[i]), "outcome": str(c.outcome[i]),
                     "entry": entry, "stream": f"{stream:#x}", "result": int(c.result[i]),
                     "gbps": round(nbytes / secs / 1e9, 3) if secs > 0 else None},
        }
        if c.direction[i] == "h2h":  # a host copy: no stream; its caller instead
            event["args"].update(caller=str(c.caller[i]), call_site=f"{stream:#x}")
            for k in ("host_kind", "stream", "result"):
                del event["args"][k]
        events.append(event)
        thread_track(pid, tid)
        if c.direction[i] == "h2h":
            continue
        key, stream_name = _stream_key(stream, entry, tid)
        ends = lanes.setdefault((pid, key), [])
        lane = next((j for j, e in enumerate(ends) if e <= start), len(ends))
        if lane == len(ends):
            ends.append(end)
            stid = _STREAM_TID_BASE + len(lane_tid)
            lane_tid[(pid, key, lane)] = stid
            suffix = f" ({lane + 1})" if lane else ""
            events.append(_meta("thread_name", pid, stid, {"name": f"{stream_name}{suffix}"}))
            events.append(_meta("thread_sort_index", pid, stid, {"sort_index": 1000 + len(lane_tid)}))
        ends[lane] = end
        events.append({**event, "tid": lane_tid[(pid, key, lane)]})
    for i in pins.start_ns.argsort(kind="stable"):
        pid, tid, start, end = int(pins.pid[i]), int(pins.tid[i]), int(pins.start_ns[i]), int(pins.end_ns[i])
        events.append({"name": f"{pins.entry[i]} {fmt_bytes(int(pins.bytes[i]))}", "cat": "pin", "ph": "X",
                       "ts": (start - t0) / 1e3, "dur": (end - start) / 1e3, "pid": pid, "tid": tid,
                       "args": {"bytes": int(pins.bytes[i]), "caller": str(pins.caller[i]),
                                "call_site": f"{int(pins.stream[i]):#x}", "result": int(pins.result[i])}})
        thread_track(pid, tid)
    for k, st in enumerate(setups):  # on a track of their own: the setup thread is cmt's
        stid = _SETUP_TID_BASE + k
        events.append(_meta("thread_name", st["pid"], stid, {"name": "cmt staging setup"}))
        events.append({"name": f"setup {fmt_bytes(st['bytes'])}", "cat": "setup", "ph": "X",
                       "ts": (st["start_ns"] - t0) / 1e3, "dur": (st["end_ns"] - st["start_ns"]) / 1e3,
                       "pid": st["pid"], "tid": stid, "args": {"bytes": st["bytes"], "buffers": st["buffers"],
                                                              "ok": st["ok"]}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"producer": f"cmt {__version__} profile", "command": rec.manifest.get("command")}}


def write_trace(rec: Recording, path: Path) -> None:
    try:
        with open(path, "w") as f:
            json.dump(build(rec), f, separators=(",", ":"))
    except OSError as e:
        raise CmtError(f"cannot write trace {path}: {e.strerror or e}") from None
