"""What the GPU tests of cmt.io share: a Python child in a fresh CUDA context, with a helper that
evicts a file from the page cache (`evict(path)`) already defined."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

EVICT = """
import os
def evict(path):
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
"""


def run_child(prelude: str, code: str, cwd, timeout: int = 300, needs: tuple[str, ...] = ("torch",)) -> str:
    """Runs EVICT + prelude + code in a child (in `cwd`); its stdout, or a failed assertion with both outputs."""
    for module in needs:
        pytest.importorskip(module)
    # A child that hangs prints its threads' Python stacks before it is stopped, so the log says where.
    watchdog = f"import faulthandler; faulthandler.dump_traceback_later({max(5, timeout - 10)}, exit=True)\n"
    try:
        proc = subprocess.run([sys.executable, "-c", watchdog + EVICT + prelude + textwrap.dedent(code)],
                              capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the child did not finish in {timeout} s\nstdout:\n{e.stdout}\nstderr:\n{e.stderr}")
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout
