"""`cmt bench load`: copies on a loaded machine, plainly and under `cmt run` (issue 22).

Scenarios, each measured by child processes (cmt.bench.load_probe) run plainly and under `cmt run`
in turn, `rounds` pairs of them; every figure is the median over the processes of one side, with
their minimum and maximum, and the pinned figure measured by the same processes:

- `busy`: the copy sweep (cmt bench copy's measurements: pageable h2d and d2h by size, pinned
  alongside) while other processes keep 0, 4, 8, ... CPUs busy. The burners are separate
  processes in sessions of their own running a pure busy loop, started before each probe process
  and stopped after it (and on error or Ctrl-C; each also ends itself with this process).
- `duplex`: one host-to-device and one device-to-host copy at once, from two threads on two
  non-blocking streams; the total GB/s.
- `processes`: N processes (1, 2, 4, 8) each copying host-to-device at once, started together on
  the shared monotonic clock: the aggregate GB/s and each process's share of it; to the one GPU, and
  round robin over several GPUs where there are several.
- `threads`: T threads of one process each copying host-to-device, then device-to-host, at once:
  the aggregate GB/s and each thread's share (and round robin over several GPUs where there are several).

This module holds the plan, the runner of the probes and the scenarios; the child processes are in
load_children, the result document, tables and plot in load_report.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import CmtError
from . import load_probe
from .load_children import Children, Stopped, _LineReader, _stop_on_signals, burners, child_env

SCENARIOS = ("busy", "duplex", "processes", "threads")
SIDES = ("plain", "cmt")
DIRECTIONS = ("h2d", "d2h")
GB = 1e9

DEFAULT_BUSY, QUICK_BUSY = "0,4,8,12,16", "0,8"
DEFAULT_SIZES, QUICK_SIZES = "1M,16M,64M,1G", "1M,64M"
DEFAULT_COUNTS, QUICK_COUNTS = "1,2,4,8", "1,2,4"
DEFAULT_COPY_SIZE, QUICK_COPY_SIZE = "1G", "256M"
DEFAULT_THREAD_SIZE, QUICK_THREAD_SIZE = "64M", "16M"
DEFAULT_THREADS = 8
DEFAULT_ROUNDS = 3

PROBE_TIMEOUT_S = 300.0  # one probe process, or one step of a group of processes
START_AHEAD_S = 0.02  # processes start their copies this long after the parent says go


# -- the plan ---------------------------------------------------------------------------------------
def parse_counts(text: str, what: str, least: int) -> list[int]:
    """'0,4,8' -> [0, 4, 8] (whole numbers >= least, in the order given, without repeats)."""
    items = [t.strip() for t in (text or "").split(",") if t.strip()]
    if not items:
        raise CmtError(f"the {what} list is empty (example: {'0,4,8' if least == 0 else '1,2,4'})")
    out = []
    for t in items:
        try:
            n = int(t)
        except ValueError:
            raise CmtError(f"{what} {t!r} is not a whole number") from None
        if n < least:
            raise CmtError(f"{what} {t!r} is below {least}")
        if n > 1024:
            raise CmtError(f"{what} {t!r} is more than 1024")
        out.append(n)
    return list(dict.fromkeys(out))


@dataclass(frozen=True)
class Repeats:
    """Untimed and timed repeats of the concurrent scenarios (the sweep uses copy_sweep.Repetitions)."""

    warmup: int = 1
    timed: int = 5


FULL_SWEEP = {"warmup": 1, "least": 5, "most": 20, "target_bytes": 1 << 30, "fixed": None}
QUICK_SWEEP = {"warmup": 1, "least": 2, "most": 5, "target_bytes": 128 << 20, "fixed": None}
FULL_GROUPS, QUICK_GROUPS = Repeats(1, 5), Repeats(1, 2)


@dataclass
class LoadPlan:
    scenarios: list[str]
    rounds: int = DEFAULT_ROUNDS
    busy: list[int] = field(default_factory=lambda: [0, 4, 8, 12, 16])
    sizes: list[int] = field(default_factory=lambda: [1 << 20, 16 << 20, 64 << 20, 1 << 30])
    directions: list[str] = field(default_factory=lambda: list(DIRECTIONS))
    copy_bytes: int = 1 << 30  # duplex: each direction; processes: each process
    counts: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    threads: int = DEFAULT_THREADS
    thread_bytes: int = 64 << 20
    device: int = 0
    gpus: list[int] = field(default_factory=list)  # round robin over these where there are several
    sweep: dict[str, Any] = field(default_factory=lambda: dict(FULL_SWEEP))
    groups: Repeats = FULL_GROUPS
    quick: bool = False
    config_path: str | None = None

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["groups"] = asdict(self.groups)
        return doc

    def gpu_series(self) -> list[list[int]]:
        """The one GPU, then round robin over `gpus` where there are several."""
        return [[self.device]] + ([self.gpus] if len(self.gpus) > 1 else [])

    def counts_on(self, gpus: list[int]) -> list[int]:
        """Process counts of a series: one process is the same on one GPU as round robin."""
        return self.counts if len(gpus) == 1 else [n for n in self.counts if n > 1]

    def steps(self) -> int:
        """Probe runs (a group of processes counts once): the progress bar's length."""
        per_round = {"busy": len(self.busy), "duplex": 1, "threads": 1,
                     "processes": sum(len(self.counts_on(g)) for g in self.gpu_series())}
        return sum(per_round[s] for s in self.scenarios) * self.rounds * len(SIDES)


# -- the probes ---------------------------------------------------------------------------------------
@dataclass
class ProbeRun:
    """How a probe, or a group of probe processes, went: `result` or an `error`."""

    result: Any = None
    error: str | None = None


class Runner:
    """Starts the probes, plainly and under `cmt run`."""

    def __init__(self, children: Children, config_path: str | None, env: dict[str, str] | None = None,
                 timeout_s: float = PROBE_TIMEOUT_S):
        self.children, self.timeout_s = children, timeout_s
        self.env = env if env is not None else child_env()
        config = ["--config", config_path] if config_path else []
        self.prefix = {"plain": [], "cmt": [sys.executable, "-m", "cmt", "run", *config, "--"]}

    def argv(self, side: str, spec: dict[str, Any]) -> list[str]:
        return [*self.prefix[side], sys.executable, "-m", "cmt.bench.load_probe", "--parent", str(os.getpid()),
                "--spec", json.dumps(spec)]

    def _check_side(self, side: str, result: dict[str, Any]) -> str | None:
        if result.get("under_cmt") != (side == "cmt"):
            return f"the probe ran {'under' if result.get('under_cmt') else 'without'} cmt on the {side} side"
        return None

    def run(self, side: str, spec: dict[str, Any]) -> ProbeRun:
        """One probe process to its end."""
        proc = self.children.start(self.argv(side, spec), env=self.env, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            return ProbeRun(error=f"{side} probe ran past {self.timeout_s:.0f} s (killed)")
        finally:
            self.children.end(proc)
        result = load_probe.parse_result(out)
        if proc.returncode != 0 or result is None:
            return ProbeRun(error=f"{side} probe: {_why(proc.returncode, err)}")
        wrong = self._check_side(side, result)
        return ProbeRun(error=wrong) if wrong else ProbeRun(result)

    def run_processes(self, side: str, specs: list[dict[str, Any]], reps: Repeats) -> ProbeRun:
        """Driven probes, one per spec, copying at once: first a checked copy in every process, then
        for pageable and pinned memory the warm-ups and timed repeats, each started together.
        The result: {"pageable": [(starts, ends) per process, per repeat], "pinned": ..., "processes": [...]}."""
        procs, errs, readers = [], [], []
        try:
            for spec in specs:
                err = tempfile.TemporaryFile()
                errs.append(err)
                procs.append(self.children.start(self.argv(side, spec), env=self.env, stdin=subprocess.PIPE,
                                                 stdout=subprocess.PIPE, stderr=err, bufsize=0))
            readers = [_LineReader(p) for p in procs]
            self._expect(readers, errs, "ready", side)
            out: dict[str, Any] = {}
            for mode in ("pageable", "pinned"):
                self._say(procs, f"{mode} 0 verify")
                self._expect(readers, errs, "done", side)
                times = []
                for k in range(reps.warmup + reps.timed):
                    self._say(procs, f"{mode} {time.monotonic() + START_AHEAD_S!r}")
                    replies = self._expect(readers, errs, "done", side)
                    if k >= reps.warmup:
                        times.append([json.loads(r) for r in replies])
                out[mode] = times
            self._say(procs, "quit")
            finals = []
            for p, reader, err in zip(procs, readers, errs, strict=True):
                result = None
                while (line := reader.read(self.timeout_s)) is not None:
                    if line.startswith(load_probe.RESULT_PREFIX):
                        result = load_probe.parse_result(line)
                        break
                if p.wait(timeout=self.timeout_s) != 0 or result is None:
                    raise _ProbeFailed(f"{side} probe: {_why(p.returncode, _tail(err))}")
                wrong = self._check_side(side, result)
                if wrong:
                    raise _ProbeFailed(wrong)
                finals.append(result)
            out["processes"] = finals
            return ProbeRun(out)
        except _ProbeFailed as e:
            return ProbeRun(error=str(e))
        except (BrokenPipeError, subprocess.TimeoutExpired):
            ended = [(i, p) for i, p in enumerate(procs) if p.poll() is not None]
            if not ended:
                return ProbeRun(error=f"{side} probe processes did not end in {self.timeout_s:.0f} s")
            i, p = ended[0]
            return ProbeRun(error=f"{side} probe process {i + 1} of {len(procs)}: {_why(p.returncode, _tail(errs[i]))}")
        finally:
            for p in procs:
                self.children.end(p)
            for err in errs:
                err.close()

    @staticmethod
    def _say(procs: list[subprocess.Popen], line: str) -> None:
        data = (line + "\n").encode()
        for p in procs:
            p.stdin.write(data)

    def _expect(self, readers: list[_LineReader], errs: list, word: str, side: str) -> list[str]:
        replies = []
        for reader, err in zip(readers, errs, strict=True):
            line = reader.read(self.timeout_s)
            if line is None or not line.startswith(word):
                status = reader.proc.poll()
                if status is None and reader.closed:  # it is ending: its status and message come next
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        status = reader.proc.wait(timeout=10)
                why = (f"said nothing for {self.timeout_s:.0f} s" if status is None and line is None
                       else _why(status, _tail(err)))
                raise _ProbeFailed(f"{side} probe process {len(replies) + 1} of {len(readers)}: {why}")
            replies.append(line[len(word):].strip() or "{}")
        return replies


class _ProbeFailed(Exception):
    pass


def _tail(err) -> str:
    err.seek(0)
    return err.read().decode(errors="replace")


def _why(status: int | None, stderr: str) -> str:
    lines = [s.strip() for s in (stderr or "").strip().splitlines() if s.strip()]
    last = lines[-1][:300] if lines else "no message"
    return f"exit status {status}: {last}" if status is not None else last


# -- measurements into rows ------------------------------------------------------------------------
def _gbps(nbytes: int, seconds: Sequence[float]) -> float:
    return nbytes / statistics.median(seconds) / GB


def _shares(runs: list[tuple[list[float], list[float]]], sizes: list[int]) -> dict[str, Any]:
    """Each copy's rate (its bytes over its own time) against the mean of all the copies' rates, per
    repeat (1 for every copy = fair): the medians over the repeats of the smallest and largest, and
    each copy's median GB/s."""
    lows, highs, rates = [], [], [[] for _ in sizes]
    for t0, t1 in runs:
        own = [n / (b - a) for n, a, b in zip(sizes, t0, t1, strict=True)]
        mean = statistics.fmean(own)
        lows.append(min(own) / mean)
        highs.append(max(own) / mean)
        for r, x in zip(rates, own, strict=True):
            r.append(x)
    return {"share_min": round(statistics.median(lows), 3), "share_max": round(statistics.median(highs), 3),
            "copy_gbps": [round(statistics.median(r) / GB, 3) for r in rates]}


def _group_run(nbytes: int, sizes: list[int], pageable: list, pinned: list, extra: dict[str, Any]) -> dict[str, Any]:
    """One process's (or group of processes') figures: `pageable` and `pinned` are (starts, ends)
    per repeat."""
    run: dict[str, Any] = {}
    for mode, runs in (("pageable", pageable), ("pinned", pinned)):
        walls = [max(t1) - min(t0) for t0, t1 in runs]
        run[mode] = {"seconds": [round(s, 6) for s in walls], "gbps": round(_gbps(nbytes, walls), 3),
                     **_shares(runs, sizes)}
    run["gbps"], run["pinned_gbps"] = run["pageable"]["gbps"], run["pinned"]["gbps"]
    return {**run, **extra}


def _lanes(processes: list[dict[str, Any]]) -> dict[str, Any]:
    """Under cmt: the most copy threads the node's segment counted while the processes copied (each
    samples the node-wide count), and the node's budget."""
    most = [x["lanes_most"] for x in processes if x.get("lanes_most") is not None]
    budgets = {x["node_budget"] for x in processes if x.get("node_budget") is not None}
    return {"lanes_most": max(most), "node_budget": min(budgets)} if most and budgets else {}


def _repeats(entry: dict[str, Any], mode: str) -> list[tuple[list[float], list[float]]]:
    """A group's repeats as (starts, ends), one of each per copy."""
    return list(zip(entry[mode]["t0"], entry[mode]["t1"], strict=True))


def new_row(scenario: str, staged: bool, **key: Any) -> dict[str, Any]:
    return {"scenario": scenario, **key, "staged": staged, **{s: {"runs": [], "errors": []} for s in SIDES}}


def _summary(side: dict[str, Any], staged: bool, is_cmt: bool) -> None:
    """Median, minimum and maximum over the processes of one side, and the pinned figures of the
    same processes; `vs_pinned` is the median over the processes of pageable / pinned within each."""
    runs = [r for r in side["runs"] if r.get("gbps")]
    for k in ("median_gbps", "min_gbps", "max_gbps", "pinned_median_gbps", "vs_pinned", "outcome"):
        side.pop(k, None)
    if not runs:
        return
    rates, pinned = [r["gbps"] for r in runs], [r["pinned_gbps"] for r in runs]
    side.update({"median_gbps": round(statistics.median(rates), 3), "min_gbps": round(min(rates), 3),
                 "max_gbps": round(max(rates), 3), "pinned_median_gbps": round(statistics.median(pinned), 3),
                 "pinned_min_gbps": round(min(pinned), 3), "pinned_max_gbps": round(max(pinned), 3),
                 "vs_pinned": round(statistics.median(r["gbps"] / r["pinned_gbps"] for r in runs), 3)})
    if is_cmt and not staged:
        side["outcome"] = "below_minimum"  # the plan passes these copies to the driver


def finish_row(row: dict[str, Any]) -> dict[str, Any]:
    for s in SIDES:
        _summary(row[s], row["staged"], s == "cmt")
    plain, cmt = row["plain"], row["cmt"]
    row.pop("cmt_vs_plain", None)
    row.pop("cmt_vs_plain_pairs", None)
    if plain.get("median_gbps") and cmt.get("median_gbps"):
        row["cmt_vs_plain"] = round(cmt["median_gbps"] / plain["median_gbps"], 3)
        by_round = {r["round"]: r["gbps"] for r in plain["runs"] if r.get("gbps")}
        row["cmt_vs_plain_pairs"] = [round(r["gbps"] / by_round[r["round"]], 3) for r in cmt["runs"]
                                     if r.get("gbps") and r["round"] in by_round]
    return row


# -- the scenarios ---------------------------------------------------------------------------------
Progress = Callable[[str], None]


class LoadBench:
    """Runs a LoadPlan; `rows` fill as the probes end (each row: one measurement, both sides)."""

    def __init__(self, plan: LoadPlan, runner: Runner, children: Children, staged: Callable[[str, int], bool],
                 progress: Progress | None = None):
        self.plan, self.runner, self.children = plan, runner, children
        self.staged, self.progress = staged, progress or (lambda _text: None)
        self.rows: list[dict[str, Any]] = []
        self.failures: list[str] = []

    def _fail(self, rows: list[dict[str, Any]], side: str, what: str, error: str) -> None:
        for row in rows:
            row[side]["errors"].append(error)
        self.failures.append(f"{what}: {error}")

    def run(self) -> None:
        for scenario in self.plan.scenarios:
            getattr(self, f"_{scenario}")()

    # busy host
    def _busy(self) -> None:
        p = self.plan
        rows = {(b, d, n): new_row("busy", self.staged(d, n), busy_threads=b, direction=d, bytes=n)
                for b in p.busy for n in p.sizes for d in p.directions}
        self.rows += rows.values()
        spec = {"kind": "sweep", "device": p.device, "sizes": p.sizes, "directions": p.directions, "reps": p.sweep}
        for rnd in range(p.rounds):
            for b in p.busy:
                for side in SIDES:
                    self.progress(f"busy {b}: {side}, round {rnd + 1}")
                    with burners(self.children, b, self.runner.timeout_s + 60) as burning:
                        got = self.runner.run(side, spec)
                        running = sum(p.poll() is None for p in burning)
                    mine = [r for k, r in rows.items() if k[0] == b]
                    if got.error:
                        self._fail(mine, side, f"busy {b}, round {rnd + 1}", got.error)
                        continue
                    for m in got.result["results"]:
                        page, pin = m["pageable"], m["pinned"]
                        rows[(b, m["direction"], m["bytes"])][side]["runs"].append({
                            "round": rnd, "pid": got.result["pid"], "burners_running": running,
                            "gbps": page["median_gbps"],
                            "pinned_gbps": pin["median_gbps"], "pageable": page, "pinned": pin})
        for r in rows.values():
            finish_row(r)

    # groups of copies in one process
    def _groups(self, scenario: str, groups: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
        """`groups`: (row, group spec) measured by one probe per side and round."""
        self.rows += [row for row, _ in groups]
        spec = {"kind": "groups", "groups": [g for _, g in groups]}
        for rnd in range(self.plan.rounds):
            for side in SIDES:
                self.progress(f"{scenario}: {side}, round {rnd + 1}")
                got = self.runner.run(side, spec)
                if got.error:
                    self._fail([row for row, _ in groups], side, f"{scenario}, round {rnd + 1}", got.error)
                    continue
                for (row, _), entry in zip(groups, got.result["groups"], strict=True):
                    sizes = [c["bytes"] for c in entry["copies"]]
                    row[side]["runs"].append(_group_run(
                        entry["bytes"], sizes, _repeats(entry, "pageable"), _repeats(entry, "pinned"),
                        {"round": rnd, "pid": got.result["pid"], "devices": [c["device"] for c in entry["copies"]],
                         "verified": entry["verified"],
                         "cmt_outcomes": entry["pageable"]["cmt_outcomes"]}))
        for row, _ in groups:
            finish_row(row)

    def _group(self, name: str, jobs: list[dict[str, Any]]) -> dict[str, Any]:
        return {"name": name, "jobs": jobs, "warmup": self.plan.groups.warmup, "repeats": self.plan.groups.timed}

    def _duplex(self) -> None:
        p = self.plan
        jobs = [{"device": p.device, "direction": d, "bytes": p.copy_bytes} for d in DIRECTIONS]
        row = new_row("duplex", all(self.staged(d, p.copy_bytes) for d in DIRECTIONS), direction="both",
                      bytes=p.copy_bytes, gpus=[p.device])
        self._groups("duplex", [(row, self._group("duplex", jobs))])

    def _threads(self) -> None:
        p = self.plan
        groups = []
        for gpus in p.gpu_series():
            for d in DIRECTIONS:
                jobs = [{"device": gpus[i % len(gpus)], "direction": d, "bytes": p.thread_bytes}
                        for i in range(p.threads)]
                row = new_row("threads", self.staged(d, p.thread_bytes), direction=d, threads=p.threads,
                              bytes=p.thread_bytes, gpus=gpus)
                groups.append((row, self._group(f"threads {d} gpus {gpus}", jobs)))
        self._groups("threads", groups)

    def _processes(self) -> None:
        p = self.plan
        rows = {(tuple(g), n): new_row("processes", self.staged("h2d", p.copy_bytes), direction="h2d",
                                       processes=n, bytes=p.copy_bytes, gpus=g)
                for g in p.gpu_series() for n in p.counts_on(g)}
        self.rows += rows.values()
        for rnd in range(p.rounds):
            for gpus in p.gpu_series():
                for n in p.counts_on(gpus):
                    row = rows[(tuple(gpus), n)]
                    for side in SIDES:
                        self.progress(f"{n} process{'es' if n > 1 else ''} on GPU{'s' if len(gpus) > 1 else ''} "
                                      f"{','.join(map(str, gpus))}: {side}, round {rnd + 1}")
                        specs = [{"kind": "driven", "seed": 1000 * i, "idle_timeout": self.runner.timeout_s + 60,
                                  "jobs": [{"device": gpus[i % len(gpus)], "direction": "h2d", "bytes": p.copy_bytes}]}
                                 for i in range(n)]
                        got = self.runner.run_processes(side, specs, p.groups)
                        if got.error:
                            self._fail([row], side, f"{n} processes, round {rnd + 1}", got.error)
                            continue
                        by_process = got.result
                        sizes = [p.copy_bytes] * n
                        # per repeat: one (start, end) per process -> (starts, ends)
                        times = {m: [([r["t0"][0] for r in rep], [r["t1"][0] for r in rep]) for rep in by_process[m]]
                                 for m in ("pageable", "pinned")}
                        row[side]["runs"].append(_group_run(
                            n * p.copy_bytes, sizes, times["pageable"], times["pinned"],
                            {"round": rnd, "pids": [x["pid"] for x in by_process["processes"]],
                             "devices": [spec["jobs"][0]["device"] for spec in specs],
                             "verified": all(x["verified"] == ["pageable", "pinned"] for x in by_process["processes"]),
                             "cmt_outcomes": [x["cmt_outcomes"] for x in by_process["processes"]]
                             if side == "cmt" else None, **_lanes(by_process["processes"])}))
        for r in rows.values():
            finish_row(r)


def run(plan: LoadPlan, staged: Callable[[str, int], bool], progress: Progress | None = None,
        timeout_s: float = PROBE_TIMEOUT_S) -> tuple[list[dict[str, Any]], list[str]]:
    """Runs the plan: (rows, failures). No child survives it, also on Ctrl-C, SIGTERM or an error."""
    with _stop_on_signals(), Children() as children:
        bench = LoadBench(plan, Runner(children, plan.config_path, timeout_s=timeout_s), children, staged, progress)
        try:
            bench.run()
        except Stopped as e:
            children.end_all()
            raise CmtError(f"stopped by {signal.Signals(e.signum).name}; nothing written",
                           exit_code=128 + e.signum) from None
    return bench.rows, bench.failures
