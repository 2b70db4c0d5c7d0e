"""The child process of `cmt bench load`: it copies pageable host memory to and from the GPU and
prints its figures as one `CMT-LOAD-RESULT <json>` line. Run plainly it measures CUDA's own copies;
run under `cmt run` the very same driver calls are cmt's (the interposer answers ctypes' dlsym).

    python -m cmt.bench.load_probe --parent PID --spec JSON

Three kinds of spec:

- `sweep`: the copy sweep of `cmt bench copy` (copy_sweep.measure): pageable copies by size and
  direction through the blocking cuMemcpyHtoD_v2 / cuMemcpyDtoH_v2, each with the pinned copy of
  the same size (CUDA events, the link's limit) measured in this same process.
- `groups`: copies that run at once from Python threads (ctypes lets go of the GIL during a call),
  one thread per copy, each with the context current, its own non-blocking stream and buffers,
  through cuMemcpyHtoDAsync_v2 / cuMemcpyDtoHAsync_v2 and a stream synchronisation. The group is
  timed on the host clock from the first start to the last end; the same group from pinned memory
  follows, timed alike.
- `driven`: one group of copies (one thread each) that the parent starts: a process among
  several. It prints `ready` once set up, then for each stdin line `MODE START [verify]` it waits for
  the monotonic time START (the same clock in every process), runs the group and answers
  `done {"t0": [...], "t1": [...]}`; `quit` ends it with the result line.

Every pageable copy group is checked byte for byte once (the device side read back through pinned
memory, which cmt passes to the driver untouched). Under cmt the result carries what cmt did with the
copies (its statistics, `cmt_outcomes`).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import select
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

RESULT_PREFIX = "CMT-LOAD-RESULT "
_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """Ends this process when `parent` (the bench) ends, even by SIGKILL (Linux's parent-death
    signal, kept across `cmt run`'s exec)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, 9)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent went before the signal was asked for
        os._exit(1)


def emit(result: dict[str, Any]) -> None:
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def parse_result(stdout: str) -> dict[str, Any] | None:
    """The parent's side: the result line of a probe's output, or None."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            try:
                value = json.loads(line[len(RESULT_PREFIX):])
            except json.JSONDecodeError:
                return None
            return value if isinstance(value, dict) else None
    return None


# -- what cmt did: the preloaded library's counters ------------------------------------------------
def _cmt_stats() -> dict[str, dict[str, list[int]]] | None:
    from .. import cuda

    if not cuda.preloaded_cmt():
        return None
    try:
        fn = ctypes.CDLL(None).cmt_stats_json  # the preloaded library answers in the global scope
    except AttributeError:
        return None
    fn.restype = ctypes.c_int
    size = fn(None, 0)
    buf = ctypes.create_string_buffer(size + 1)
    fn(buf, size + 1)
    return json.loads(buf.value)


class Outcomes:
    """What cmt did with the copies since the last `take()` (or since it was made), from its
    statistics: {direction: {outcome: copies}}, and any other counters they hold (the rate guard's
    {"events": {"backed_off": n, ...}}) alike; None without cmt."""

    def __init__(self) -> None:
        self._before = _cmt_stats()
        self.active = self._before is not None

    @staticmethod
    def _count(value: Any) -> int:
        """A counter: [copies, bytes] counts its copies; a number counts itself."""
        if isinstance(value, list) and value:
            value = value[0]
        return value if isinstance(value, int) else 0

    def take(self) -> dict[str, dict[str, int]] | None:
        after = _cmt_stats()
        if after is None or self._before is None:
            return None
        out: dict[str, dict[str, int]] = {}
        for group, counts in after.items():
            if not isinstance(counts, dict):
                continue
            before = self._before.get(group, {})
            for name, value in counts.items():
                diff = self._count(value) - self._count(before.get(name, 0))
                if diff:
                    out.setdefault(group, {})[name] = diff
        self._before = after
        return out


class LaneGauge:
    """The most copy threads all of this user's cmt processes held while the gauge ran, as the node
    budget's shared segment counts them (node_budget.hpp), sampled every millisecond, and the budget;
    inactive without cmt."""

    def __init__(self) -> None:
        from .. import cuda

        self.lib = ctypes.CDLL(None) if cuda.preloaded_cmt() else None
        self.most = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def budget(self) -> int | None:
        return int(self.lib.cmt_node_budget()) if self.lib else None

    def _sample(self) -> None:
        while not self._stop.wait(0.001):
            self.most = max(self.most, int(self.lib.cmt_node_lanes_in_use()))

    def __enter__(self) -> LaneGauge:
        if self.lib:
            self._stop.clear()
            self._thread = threading.Thread(target=self._sample, name="cmt-lane-gauge", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread:
            self._stop.set()
            self._thread.join()
            self._thread = None


# -- sweep: cmt bench copy's measurements ----------------------------------------------------------
def run_sweep(spec: dict[str, Any]) -> dict[str, Any]:
    from .. import cuda
    from . import copy_sweep

    drv = cuda.load()
    dev = drv.open_device(spec["device"])
    r = spec["reps"]
    reps = copy_sweep.Repetitions(r["warmup"], r["least"], r["most"], r["target_bytes"], r.get("fixed"))
    results = []
    with copy_sweep.CopyBench(drv, dev, max(spec["sizes"])) as bench:
        counts = Outcomes()
        for n in spec["sizes"]:
            for d in spec["directions"]:
                repeats = reps.repeats(n)
                counts.take()
                page = copy_sweep.measure(bench, "pageable", d, n, repeats, reps.warmup)
                outcomes = counts.take()
                pinned = copy_sweep.measure(bench, "pinned", d, n, repeats, reps.warmup)
                results.append({"direction": d, "bytes": n,
                                "pageable": {**page.to_json(), "seconds": page.seconds, "cmt_outcomes": outcomes},
                                "pinned": {**pinned.to_json(), "seconds": pinned.seconds}})
    return {"results": results}


# -- groups: copies at once from threads -------------------------------------------------------------
@dataclass
class Copy:
    """One thread's copy: `direction` ('h2d' or 'd2h') of `nbytes` on GPU `device`, with its own
    stream, device buffer, pageable buffer (random data, or touched memory to copy into) and pinned
    buffer of the same size."""

    device: int
    direction: str
    nbytes: int
    seed: int
    ctx: int = 0
    stream: int = 0
    dev: int = 0
    pinned_ptr: int = 0
    pattern: Any = None
    pageable: Any = None
    pinned: Any = None
    freers: list[Callable[[], None]] = field(default_factory=list)


class Group:
    """Copies run at once, one Python thread each (see the module's docstring)."""

    def __init__(self, drv, devices: dict[int, Any], jobs: list[dict[str, Any]], seed: int = 0):
        import numpy as np

        from . import copy_sweep

        self.drv = drv
        self.copies = [Copy(j["device"], j["direction"], j["bytes"], seed + i) for i, j in enumerate(jobs)]
        try:
            for c in self.copies:
                ctx = devices[c.device].context
                drv.set_current(ctx)
                c.ctx = ctx
                c.stream = drv.stream_create()
                c.freers.append(lambda c=c: drv.stream_destroy(c.stream))
                c.dev = drv.mem_alloc(c.nbytes)
                c.freers.append(lambda c=c: drv.mem_free(c.dev))
                c.pinned_ptr = drv.host_alloc(c.nbytes)
                c.freers.append(lambda c=c: drv.host_free(c.pinned_ptr))
                c.pinned = copy_sweep.host_view(c.pinned_ptr, c.nbytes)
                c.pattern = copy_sweep.random_pattern(c.nbytes, 0x10AD + c.seed)
                c.pinned[:] = c.pattern
                if c.direction == "h2d":
                    c.pageable = c.pattern  # pageable, random, already touched
                else:
                    c.pageable = np.ones(c.nbytes, dtype=np.uint8)  # every page touched
                    drv.memcpy_htod(c.dev, c.pinned_ptr, c.nbytes)  # what the device gives back
            drv.synchronize()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for c in self.copies:
            try:
                self.drv.set_current(c.ctx)
            except Exception:  # noqa: BLE001 - freeing after a failure: the first error is the one to report
                pass
            for free in reversed(c.freers):
                try:
                    free()
                except Exception:  # noqa: BLE001
                    pass
            c.freers.clear()

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.copies)

    def _one(self, c: Copy, pinned: bool) -> None:
        drv = self.drv
        host = c.pinned_ptr if pinned else c.pageable.ctypes.data
        if c.direction == "h2d":
            drv.memcpy_htod_async(c.dev, host, c.nbytes, c.stream)
        else:
            drv.memcpy_dtoh_async(host, c.dev, c.nbytes, c.stream)
        drv.stream_synchronize(c.stream)

    def run(self, pinned: bool, start_at: float | None = None) -> tuple[list[float], list[float]]:
        """Every copy at once; (starts, ends) per copy on time.monotonic()'s clock. With
        `start_at`, the copies start at that monotonic time (the same clock in every process)."""
        n = len(self.copies)
        t0, t1 = [0.0] * n, [0.0] * n
        errors: list[BaseException] = []
        barrier = threading.Barrier(n)

        def work(i: int) -> None:
            c = self.copies[i]
            try:
                self.drv.set_current(c.ctx)
                barrier.wait()
                if start_at is not None:
                    _wait_until(start_at)
                t0[i] = time.monotonic()
                self._one(c, pinned)
                t1[i] = time.monotonic()
            except threading.BrokenBarrierError:
                pass
            except BaseException as e:  # noqa: BLE001 - reported by the calling thread
                errors.append(e)
                barrier.abort()

        if n == 1:
            work(0)
        else:
            threads = [threading.Thread(target=work, args=(i,), name=f"cmt-load-{i}") for i in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        if errors:
            raise errors[0]
        return t0, t1

    def verify(self, pinned: bool) -> None:
        """One group copy of each copy's own random bytes, checked byte for byte. Pinned
        host-to-device copies are not checked (their source buffer is the read-back buffer)."""
        from . import copy_sweep

        drv = self.drv
        for c in self.copies:
            drv.set_current(c.ctx)
            if c.direction == "h2d":
                drv.memset_d8(c.dev, 0, c.nbytes)
            else:
                (c.pinned if pinned else c.pageable)[:] = 0
        drv.synchronize()
        self.run(pinned)
        for c in self.copies:
            what = (f"{'pinned' if pinned else 'pageable'} {c.direction} copy on GPU {c.device}, "
                    f"among {len(self.copies)}")
            if c.direction == "d2h":
                copy_sweep._compare(c.pinned if pinned else c.pageable, c.pattern, what)
            elif not pinned:
                drv.set_current(c.ctx)
                drv.memcpy_dtoh(c.pinned_ptr, c.dev, c.nbytes)  # pinned: cmt leaves it to the driver
                copy_sweep._compare(c.pinned, c.pattern, what)
                c.pinned[:] = c.pattern


def _wait_until(t: float) -> None:
    while True:
        left = t - time.monotonic()
        if left <= 0:
            return
        time.sleep(left - 0.0005 if left > 0.001 else 0)


def _open_devices(drv, jobs: list[dict[str, Any]]) -> dict[int, Any]:
    return {d: drv.open_device(d) for d in sorted({j["device"] for j in jobs})}


def run_groups(spec: dict[str, Any]) -> dict[str, Any]:
    from .. import cuda

    drv = cuda.load()
    out = []
    for g in spec["groups"]:
        devices = _open_devices(drv, g["jobs"])
        group = Group(drv, devices, g["jobs"])
        try:
            entry: dict[str, Any] = {"name": g["name"], "bytes": group.nbytes,
                                     "copies": [{"device": c.device, "direction": c.direction, "bytes": c.nbytes}
                                                for c in group.copies]}
            counts = Outcomes()
            for pinned in (False, True):
                group.verify(pinned)
                for _ in range(g["warmup"]):
                    group.run(pinned)
                counts.take()
                runs = [group.run(pinned) for _ in range(g["repeats"])]
                entry["pinned" if pinned else "pageable"] = {
                    "t0": [t0 for t0, _ in runs], "t1": [t1 for _, t1 in runs], "cmt_outcomes": counts.take()}
            entry["verified"] = True
            out.append(entry)
        finally:
            group.close()
    return {"groups": out}


# -- driven: one process among several, started by the parent ---------------------------------------
class LineReader:
    """A file descriptor, a line at a time, with a time limit (select on the raw descriptor): the
    parent reads its children's stdout with it, and a child its parent's commands (a parent that
    vanished must not leave it waiting)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buf, self.closed = fd, b"", False

    def read(self, timeout: float) -> str | None:
        """The next line; None when the other end closed (`closed`) or said nothing in time."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                return None
            chunk = os.read(self.fd, 65536)
            if not chunk:
                self.closed = True
                return None
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode(errors="replace")


def run_driven(spec: dict[str, Any]) -> dict[str, Any]:
    from .. import cuda

    drv = cuda.load()
    group = Group(drv, _open_devices(drv, spec["jobs"]), spec["jobs"], seed=spec.get("seed", 0))
    counts = Outcomes()
    gauge = LaneGauge()
    outcomes: dict[str, Any] = {}
    verified: list[str] = []
    lines = LineReader(sys.stdin.fileno())
    try:
        print("ready", flush=True)
        while True:
            line = lines.read(spec.get("idle_timeout", 600))
            if line is None or line.strip() == "quit":
                break
            words = line.split()
            pinned, start_at, verify = words[0] == "pinned", float(words[1]), "verify" in words[2:]
            counts.take()
            if verify:
                group.verify(pinned)
                verified.append(words[0])
                print("done {}", flush=True)
                continue
            with gauge:
                t0, t1 = group.run(pinned, start_at)
            for d, by_outcome in (counts.take() or {}).items():
                mine = outcomes.setdefault(words[0], {}).setdefault(d, {})
                for k, v in by_outcome.items():
                    mine[k] = mine.get(k, 0) + v
            print("done " + json.dumps({"t0": t0, "t1": t1}), flush=True)
    finally:
        group.close()
    return {"bytes": group.nbytes, "cmt_outcomes": outcomes if counts.active else None, "verified": verified,
            "lanes_most": gauge.most if gauge.lib else None, "node_budget": gauge.budget()}


KINDS = {"sweep": run_sweep, "groups": run_groups, "driven": run_driven}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m cmt.bench.load_probe", description=__doc__.split("\n\n")[0])
    ap.add_argument("--parent", type=int, required=True, help="the bench's process id: this one ends with it")
    ap.add_argument("--spec", required=True, help="what to measure (JSON)")
    args = ap.parse_args(argv)
    die_with_parent(args.parent)
    spec = json.loads(args.spec)
    from .. import cuda
    from ..errors import CmtError

    try:
        result = KINDS[spec["kind"]](spec)
    except CmtError as e:
        print(f"cmt bench load probe: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
    result["under_cmt"] = bool(cuda.preloaded_cmt())
    result["pid"] = os.getpid()
    emit(result)


if __name__ == "__main__":
    main()
