"""The benchmarks' parent/child protocol: a child process measures and prints one `RESULT <json>`
line; its parent runs it (plainly, under `cmt run`, in an environment of switches) and reads that
line back. Each benchmark is a script run from anywhere, so its folder is on sys.path (the programs in
research/ put benchmarks/ there themselves)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

PREFIX = "RESULT "
UNDER_CMT = [sys.executable, "-m", "cmt", "run", "--"]  # a command's prefix that runs it under cmt


def emit(result: Any) -> None:
    """The child's side: its result, as the one line the parent looks for."""
    print(PREFIX + json.dumps(result), flush=True)


def run(cmd: Sequence[str], env: Mapping[str, str] | None = None,
        timeout: float | None = None) -> tuple[Any, subprocess.CompletedProcess]:
    """The parent's side: runs cmd and returns (its result, the process); the result is None when
    the child failed, printed none, or ran past `timeout` seconds (stopped: its output so far is in
    the process's stdout and stderr, and its return code is None)."""
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, env=None if env is None else dict(env),
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return None, subprocess.CompletedProcess(list(cmd), None, out, err + f"\n(stopped after {timeout} s)")
    line = next((x for x in proc.stdout.splitlines() if x.startswith(PREFIX)), None)
    return (json.loads(line[len(PREFIX):]) if line and not proc.returncode else None), proc


def variant_env(variant: str, known: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """A child's environment named on a command line (research/explore_timeline.py --variants): a name
    from `known`, or the settings themselves written VAR=VALUE[+VAR=VALUE...] (e.g.
    CMT_CONFIG=rules.json+CMT_SPIN_US=0)."""
    if variant in known:
        return dict(known[variant])
    if "=" not in variant:
        raise SystemExit(f"unknown variant {variant!r}: one of {', '.join(known)}, or VAR=VALUE[+VAR=VALUE...]")
    return dict(item.split("=", 1) for item in variant.split("+"))
