"""The benchmarks' parent/child protocol: a child process measures and prints one `RESULT <json>`
line; its parent runs it (plainly, under `cmt run`, in an environment of switches) and reads that
line back. Each benchmark is a script run from anywhere, so its folder is on sys.path."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

PREFIX = "RESULT "
UNDER_CMT = [sys.executable, "-m", "cmt", "run", "--"]  # a command's prefix that runs it under cmt

# The engine switches the explorers' --variants can name (native/src/engine.cpp, copy_path.cpp).
VARIANTS: dict[str, dict[str, str]] = {
    "default": {}, "disabled": {"CMT_DISABLE": "1"}, "entry-stream": {"CMT_ENTRY": "stream"},
    "spin": {"CMT_SPIN_US": "20000"}, "nospin": {"CMT_SPIN_US": "0"},
    "no-spin-tail": {"CMT_SPIN_TAIL": "0"}, "no-spin-yield": {"CMT_SPIN_YIELD": "0"},
    "stream-down": {"CMT_RAMP_STREAM": "1"}, "stream-ramps": {"CMT_RAMP_STREAM": "2"},
    "stream-up": {"CMT_RAMP_STREAM": "3"},
    "stream-down-full1": {"CMT_RAMP_STREAM": "1", "CMT_RAMP_STREAM_FULL": "1"},
    "stream-down-full2": {"CMT_RAMP_STREAM": "1", "CMT_RAMP_STREAM_FULL": "2"},
    "ramp-head": {"CMT_RAMP_TAIL": "0"}, "window-start": {"CMT_WINDOW_FLIP": "0"},
    "tail-kept": {"CMT_DEMOTE_TAIL": "0"}, "ramp-down": {"CMT_RAMP_DOWN": "1"},
    "old-defaults": {"CMT_DEMOTE_TAIL": "0", "CMT_RAMP_STREAM": "1", "CMT_RAMP_DOWN": "1"},
}
VARIANTS_HELP = ", ".join(VARIANTS) + ", or VAR=VALUE[+VAR=VALUE...]"


def emit(result: Any) -> None:
    """The child's side: its result, as the one line the parent looks for."""
    print(PREFIX + json.dumps(result), flush=True)


def run(cmd: Sequence[str], env: Mapping[str, str] | None = None) -> tuple[Any, subprocess.CompletedProcess]:
    """The parent's side: runs cmd and returns (its result, the process); the result is None when
    the child failed or printed none."""
    proc = subprocess.run(list(cmd), capture_output=True, text=True, env=None if env is None else dict(env))
    line = next((x for x in proc.stdout.splitlines() if x.startswith(PREFIX)), None)
    return (json.loads(line[len(PREFIX):]) if line and not proc.returncode else None), proc


def variant_env(variant: str, known: Mapping[str, Mapping[str, str]] = VARIANTS) -> dict[str, str]:
    """A --variants entry's switches: a name from `known`, or the switches themselves written
    VAR=VALUE[+VAR=VALUE...] (e.g. CMT_CONFIG=benchmarks/ab-configs/h2d64-t16.json+CMT_SPIN_YIELD=0)."""
    if variant in known:
        return dict(known[variant])
    if "=" not in variant:
        raise SystemExit(f"unknown variant {variant!r}: one of {', '.join(known)}, or VAR=VALUE[+VAR=VALUE...]")
    return dict(item.split("=", 1) for item in variant.split("+"))
