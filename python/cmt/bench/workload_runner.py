"""Runs workload scripts as subprocesses: plainly, then under `cmt run`, `rounds` times in turn.

A workload that writes input files is first run once to prepare them (untimed); so is the suite's
first workload, which loads the framework once so that no timed run pays for a cold file cache.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .workloads import Workload


@dataclass
class ScriptRun:
    """One process: status 'ok', 'skip' (with a reason), 'error' or 'timeout'."""

    status: str
    wall_s: float
    line: dict[str, Any] = field(default_factory=dict)
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        doc = {"wall_s": round(self.wall_s, 4), **self.line}
        return doc if self.status == "ok" else {**doc, "status": self.status, "message": self.message}


def _last_json_line(text: str) -> dict[str, Any] | None:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return None


def _why_failed(proc: subprocess.CompletedProcess) -> str:
    lines = [s for s in proc.stderr.strip().splitlines() if s.strip()]
    last = lines[-1].strip() if lines else "no output"
    return f"exit status {proc.returncode}: {last[:300]}"


def run_script(argv: Sequence[str], env: Mapping[str, str], timeout_s: float) -> ScriptRun:
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(list(argv), env=dict(env), capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return ScriptRun("timeout", time.perf_counter() - t0, message=f"ran past {timeout_s:.0f} s")
    wall = time.perf_counter() - t0
    line = _last_json_line(proc.stdout)
    if proc.returncode != 0:
        return ScriptRun("error", wall, message=_why_failed(proc))
    if line is None:
        return ScriptRun("error", wall, message="the script printed no JSON result line")
    if "skip" in line:
        return ScriptRun("skip", wall, line, str(line["skip"]).splitlines()[0] if line["skip"] else "skipped")
    if "prepared" not in line and not isinstance(line.get("inner_s"), (int, float)):
        return ScriptRun("error", wall, line, "the result line has no inner_s")
    return ScriptRun("ok", wall, line)


def plain_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment without cmt's library: the 'plain' run must use the driver's own copies.
    (CMT_PLAN and CMT_CONFIG stay: only the `cmt run` runs read them.)"""
    env = dict(os.environ if base is None else base)
    preload = [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split()
               if not os.path.basename(p).startswith("libcmt")]
    if preload:
        env["LD_PRELOAD"] = " ".join(preload)
    else:
        env.pop("LD_PRELOAD", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class SuiteOptions:
    quick: bool = False
    config_path: str | None = None  # tuned file for the cmt runs
    timeout_s: float = 300.0
    env: dict[str, str] = field(default_factory=plain_env)
    work_dir: Path | None = None  # scratch space (a temporary folder by default)
    rounds: int = 1  # plain and cmt processes taken in turn this many times; the figures are medians


def _speedup(plain: float | None, cmt: float | None) -> float | None:
    return round(plain / cmt, 4) if plain and cmt else None


def _median_run(runs: list[ScriptRun]) -> dict[str, Any]:
    """The run whose inner time is the median (the lower one of an even count), with the median wall
    time and every round's times beside it."""
    ranked = sorted(runs, key=lambda r: r.line["inner_s"])
    doc = ranked[(len(ranked) - 1) // 2].to_json()
    if len(runs) > 1:
        doc["wall_s"] = round(statistics.median(r.wall_s for r in runs), 4)
        doc["inner_s"] = statistics.median(r.line["inner_s"] for r in runs)
        doc["rounds_wall_s"] = [round(r.wall_s, 4) for r in runs]
        doc["rounds_inner_s"] = [r.line["inner_s"] for r in runs]
    return doc


def run_workload(w: Workload, opts: SuiteOptions, work_dir: Path,
                 on_phase: Callable[[str], None] | None = None, prepare: bool | None = None) -> dict[str, Any]:
    """Prepare (if `prepare`, by default the workload's own flag), then plain and cmt runs in turn,
    `opts.rounds` times: the workload's entry for the result file."""
    script = [sys.executable, str(w.path), *w.args, "--work-dir", str(work_dir), *(["--quick"] if opts.quick else [])]
    config = ["--config", opts.config_path] if opts.config_path else []
    under_cmt = [sys.executable, "-m", "cmt", "run", *config, "--", *script]
    entry: dict[str, Any] = {"name": w.name, "description": w.description}
    runs: dict[str, list[ScriptRun]] = {"plain": [], "cmt": []}
    phases = [("plain", script), ("cmt", under_cmt)] * max(1, opts.rounds)
    if w.prepare if prepare is None else prepare:
        phases.insert(0, ("prepare", [*script, "--prepare"]))
    for phase, argv in phases:
        if on_phase:
            on_phase(phase)
        run = run_script(argv, opts.env, opts.timeout_s)
        runs.setdefault(phase, []).append(run)
        if run.status != "ok":
            entry["status"] = run.status
            entry["skip" if run.status == "skip" else "error"] = (run.message if run.status == "skip"
                                                                  else f"{phase} run: {run.message}")
            break
    else:
        entry["status"] = "ok"
    if entry["status"] == "ok":
        plain, cmt = _median_run(runs["plain"]), _median_run(runs["cmt"])
        entry["plain"], entry["cmt"] = plain, cmt
        entry["inner_label"] = plain.get("inner_label", "")
        entry["bytes"] = plain.get("bytes")
        entry["speedup_wall"] = _speedup(plain["wall_s"], cmt["wall_s"])
        entry["speedup_inner"] = _speedup(plain["inner_s"], cmt["inner_s"])
        if opts.rounds > 1:
            entry["rounds"] = opts.rounds
            entry["speedup_inner_rounds"] = [_speedup(p.line["inner_s"], c.line["inner_s"])
                                             for p, c in zip(runs["plain"], runs["cmt"], strict=True)]
    elif entry["status"] != "skip":
        for phase in ("plain", "cmt"):
            if runs[phase]:
                entry[phase] = runs[phase][-1].to_json()
    return entry


def run_suite(workloads: Sequence[Workload], opts: SuiteOptions,
              on_phase: Callable[[Workload, str], None] | None = None,
              on_done: Callable[[Workload, dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="cmt-bench-workloads-", dir=opts.work_dir) as tmp:
        entries = []
        for i, w in enumerate(workloads):
            scratch = Path(tmp) / (w.family or w.name)  # a family's workloads share their input files
            scratch.mkdir(exist_ok=True)
            entry = run_workload(w, opts, scratch, (lambda phase, w=w: on_phase(w, phase)) if on_phase else None,
                                 prepare=w.prepare or i == 0)
            entries.append(entry)
            if on_done:
                on_done(w, entry)
    return entries


def document(entries: list[dict[str, Any]], machine: dict[str, Any], engine: dict[str, Any],
             quick: bool) -> dict[str, Any]:
    """The JSON result file's content (format `cmt-bench-workloads`, version 1)."""
    return {"format": "cmt-bench-workloads", "version": 1, "date": machine.get("date"), "machine": machine,
            "cmt": engine, "quick": quick, "python": sys.executable,
            "timing": "wall_s: the whole process, end to end; inner_s: the script's own timer of its copy-heavy part",
            "workloads": entries}
