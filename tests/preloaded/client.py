"""The test side of the copy server (copy_server.py): starts it under LD_PRELOAD=libcmt.so with the
stand-in driver and sends it requests, one JSON line each way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cmt.native import library_path

TESTS = Path(__file__).resolve().parent.parent


class CopyServer:
    def __init__(self, fake_dir: Path, **env: str):
        # The tests of the engine and the interposer stage what the plan says: the rate guard, which may
        # find staging tiny copies slower than the stand-in's pageable ones, has its own tests.
        full = {**os.environ, "LD_LIBRARY_PATH": str(fake_dir), "LD_PRELOAD": str(library_path()),
                "PYTHONPATH": str(TESTS), "CMT_TEST_HOOKS": "guard=0,wait_setup=1", **env}
        self.proc = subprocess.Popen([sys.executable, str(TESTS / "preloaded" / "copy_server.py")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=full)

    def __call__(self, op: str, **req) -> dict:
        self.proc.stdin.write(json.dumps({"op": op, **req}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"copy server died: {self.proc.wait()}\n{self.proc.stderr.read()}")
        reply = json.loads(line)
        assert reply["ok"], reply.get("error")
        return reply

    def close(self) -> str:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        return self.proc.stderr.read()


def outcome(reply: dict, direction: str) -> dict:
    """What cmt did with the request's copies in one direction: {"accelerated": 1, ...}."""
    return reply["stats"].get(direction, {})
