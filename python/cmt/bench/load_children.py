"""`cmt bench load`'s child processes: the CPU burners, the record of every child started (all
killed and reaped at the end), SIGTERM and SIGHUP turned into an exception, and the probes' environment."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from ..errors import CmtError
from . import load_probe

_BURNER_MARK = "cmt-load-burner"
_BURNER = f"""# {_BURNER_MARK}
import ctypes, os, sys, time
parent, stop = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
try:
    ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG: SIGKILL when the bench ends
except Exception:
    pass
if os.getppid() != parent:
    os._exit(0)
os.write(1, b"b")
while True:
    for _ in range(200000):
        pass
    if os.getppid() != parent or time.monotonic() > stop:
        os._exit(0)
"""


class Stopped(BaseException):
    """SIGTERM or SIGHUP came: every child goes, then the command ends."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP raise Stopped in the main thread, so that the `finally` clauses that end
    the children run (Ctrl-C raises KeyboardInterrupt already)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, _frame):
        raise Stopped(signum)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


class Children:
    """Every process this run starts; whatever is still alive on leaving is killed and reaped."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, argv: Sequence[str], **kw) -> subprocess.Popen:
        proc = subprocess.Popen(list(argv), **kw)
        self.procs.append(proc)
        return proc

    def end(self, proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        if proc in self.procs:
            self.procs.remove(proc)

    def end_all(self) -> None:
        for proc in list(self.procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
        for proc in list(self.procs):
            self.end(proc)

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc) -> None:
        self.end_all()


class _LineReader(load_probe.LineReader):
    """A child's stdout, a line at a time, with a time limit; knows its child."""

    def __init__(self, proc: subprocess.Popen):
        super().__init__(proc.stdout.fileno())
        self.proc = proc


@contextlib.contextmanager
def burners(children: Children, count: int, max_s: float) -> Iterator[list[subprocess.Popen]]:
    """`count` processes, each a pure busy loop in a session of its own, running before the body
    starts and gone after it ends, whatever happens. Each also ends itself when this process ends
    (parent-death signal, and a check of its parent) and after `max_s` seconds."""
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(count):
            procs.append(children.start([sys.executable, "-S", "-c", _BURNER, str(os.getpid()), str(max_s)],
                                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, start_new_session=True))
        for p in procs:  # each says it is burning
            ready = select.select([p.stdout], [], [], 30)[0]
            if not ready or os.read(p.stdout.fileno(), 1) != b"b":
                raise CmtError(f"a CPU burner did not start (exit status {p.poll()})", exit_code=1)
        yield procs
    finally:
        for p in procs:  # all stop at once, then each is reaped
            with contextlib.suppress(ProcessLookupError):
                p.kill()
        for p in procs:
            children.end(p)


def child_env() -> dict[str, str]:
    """The probes' environment: without cmt's library (`cmt run` adds it to the cmt side), with
    this cmt package importable."""
    from . import workload_runner

    env = workload_runner.plain_env()
    root = str(Path(__file__).resolve().parents[2])
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths and not root.endswith(("site-packages", "dist-packages")):
        env["PYTHONPATH"] = os.pathsep.join([root, *paths])
    return env
