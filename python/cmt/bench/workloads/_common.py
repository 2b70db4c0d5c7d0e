"""Helpers shared by the workload scripts: arguments, the result line, skips, timing.

Scripts import this as `cmt.bench.workloads._common` and never import the frameworks at module
level of cmt itself, so listing workloads stays cheap.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

GiB = 1 << 30


def parse_args(**choices: list[str]) -> argparse.Namespace:
    """The arguments every script takes; `choices`: a script's own options (--NAME, one of a list),
    which its entries in WORKLOADS pass."""
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="smaller data, fewer repetitions")
    p.add_argument("--prepare", action="store_true", help="check requirements and create input files only")
    p.add_argument("--work-dir", type=Path, default=Path("."), help="scratch space shared by the runs")
    for name, values in choices.items():
        p.add_argument(f"--{name}", choices=values, required=True)
    return p.parse_args()


def emit(inner_s: float, nbytes: int, label: str, **detail: Any) -> None:
    """The result line the runner reads: the script's own timing of its copy-heavy part."""
    print(json.dumps({"inner_s": inner_s, "bytes": nbytes, "inner_label": label, **detail}), flush=True)


def prepared(**detail: Any) -> NoReturn:
    print(json.dumps({"prepared": True, **detail}), flush=True)
    sys.exit(0)


def skip(reason: str) -> NoReturn:
    """Not a failure: the framework, a GPU or memory is missing here."""
    print(json.dumps({"skip": reason}), flush=True)
    sys.exit(0)


def require(module: str, package: str | None = None):
    try:
        return importlib.import_module(module)
    except ImportError as e:
        missing = f" ({e.msg})" if e.name != module else ""  # a broken install, not an absent one
        skip(f"{package or module} is not installed{missing}")


def torch_cuda():
    """torch with a usable GPU, or a skip."""
    torch = require("torch", "PyTorch")
    if not torch.cuda.is_available():
        skip("PyTorch sees no CUDA GPU")
    return torch


def need_gpu_memory(torch, nbytes: int) -> None:
    free, _total = torch.cuda.mem_get_info()
    if free < nbytes:
        skip(f"needs {nbytes / GiB:.1f} GiB of free GPU memory, {free / GiB:.1f} GiB free")


def need_host_memory(nbytes: int) -> None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
                if available < nbytes:
                    skip(f"needs {nbytes / GiB:.1f} GiB of free host memory, {available / GiB:.1f} GiB available")
    except OSError:
        pass


class Timer:
    """Wall-clock seconds of a block: `with Timer() as t: ...; t.seconds`."""

    def __enter__(self) -> Timer:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self.start
