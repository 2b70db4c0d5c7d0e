"""Runs a command with the interposer preloaded: `cmt run`, `cmt tune -- CMD`, `cmt profile`."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from contextlib import contextmanager

from . import config as cfg
from . import native
from .errors import CmtError

# Signals a terminal or a job scheduler sends to the whole job; the child gets each one too.
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def preload_env(selection: cfg.Selection, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for CMD: libcmt.so added to any LD_PRELOAD, the plan in CMT_PLAN, and the tuned
    file's node budget in CMT_NODE_THREADS unless the user set that."""
    env = dict(os.environ if base is None else base)
    lib = str(native.library_path())
    preload = [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split() if p and p != lib]
    env["LD_PRELOAD"] = " ".join([lib, *preload])
    if selection.config is not None:
        env["CMT_PLAN"] = selection.config.to_plan()
        if selection.config.node_threads is not None:
            env.setdefault("CMT_NODE_THREADS", str(selection.config.node_threads))
    return env


def resolve_command(argv: Sequence[str]) -> list[str]:
    if not argv:
        raise CmtError("no command given: use `cmt run -- CMD [ARGS...]`")
    exe = argv[0]
    if os.sep not in exe and shutil.which(exe) is None:
        raise CmtError(f"{exe}: command not found", exit_code=127)
    if os.sep in exe and not os.path.exists(exe):
        raise CmtError(f"{exe}: no such file or directory", exit_code=127)
    return list(argv)


@contextmanager
def _launch_errors(exe: str):
    """A command that cannot be started gets the shell's message and exit status."""
    try:
        yield
    except PermissionError:
        raise CmtError(f"{exe}: permission denied", exit_code=126) from None
    except FileNotFoundError:
        raise CmtError(f"{exe}: command not found", exit_code=127) from None
    except OSError as e:
        raise CmtError(f"{exe}: cannot run: {e.strerror}", exit_code=126) from None


def exec_command(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """Replaces this process with argv (`cmt run`): CMD gets every signal and its exit status is
    the command's own, with no Python process left in between."""
    cmd = resolve_command(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    with _launch_errors(cmd[0]):
        os.execvpe(cmd[0], cmd, dict(env))


def run(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Runs argv as a child (for commands that report after it ends: `cmt profile`), forwarding
    signals, and returns its exit status the way a shell reports it."""
    cmd = resolve_command(argv)
    child: subprocess.Popen | None = None
    pending: list[int] = []  # signals that came before the child existed

    def forward(signum, _frame):
        if child is None:
            pending.append(signum)
            return
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    # The handlers go in before the child starts: a signal in between would otherwise end this
    # process with the default action and leave the child running, holding its output open.
    previous = {s: signal.signal(s, forward) for s in _FORWARDED}
    try:
        with _launch_errors(cmd[0]):
            child = subprocess.Popen(cmd, env=dict(env))
        for signum in pending:
            forward(signum, None)
        while True:
            try:
                code = child.wait()
                break
            except InterruptedError:
                continue
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    # A child killed by a signal: report 128+N like a shell does.
    return 128 - code if code < 0 else code
