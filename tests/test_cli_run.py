"""`cmt run`: preloading, exit statuses, signals, configuration errors."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cmt.native import library_path

TESTS = Path(__file__).resolve().parent


def cmt(*args, env=None, **kw):
    return subprocess.run([sys.executable, "-m", "cmt", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120, **kw)


def test_exit_status_is_the_commands():
    assert cmt("run", "--", sys.executable, "-c", "raise SystemExit(7)").returncode == 7


def test_missing_command_is_127_with_one_line():
    r = cmt("run", "--", "surely-not-a-command-xyz")
    assert r.returncode == 127
    assert r.stderr.strip() == "cmt: surely-not-a-command-xyz: command not found"


def test_no_command_is_an_error():
    assert cmt("run").returncode != 0


def test_preload_is_added_to_existing_ld_preload():
    r = cmt("run", "--", sys.executable, "-c", "import os; print(os.environ['LD_PRELOAD'])",
            env={"LD_PRELOAD": "libfoo_nonexistent.so"})
    # The nonexistent library only makes the loader print a warning.
    assert r.stdout.split() == [str(library_path()), "libfoo_nonexistent.so"]


def test_runs_unchanged_without_a_gpu():
    # No libcuda in the process: the library stays inert and the command runs as usual.
    r = cmt("run", "--", sys.executable, "-c", "print('hello')", env={"CMT_STATS": "1"})
    assert r.returncode == 0 and r.stdout == "hello\n" and r.stderr == ""


def test_signals_are_forwarded():
    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(42))\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-m", "cmt", "run", "--", sys.executable, "-c", code],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 42


def test_signal_before_the_child_exists_still_reaches_it():
    """`cmt profile` runs CMD as a child: a SIGTERM that lands while the child is being started
    (here: just before) is held and forwarded, not the end of the parent with the child left over."""
    code = ("import signal, os, subprocess, sys\n"
            "from cmt import launcher\n"
            "real = subprocess.Popen\n"
            "def popen(*a, **kw):\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    return real(*a, **kw)\n"
            "subprocess.Popen = popen\n"
            "child = 'import time; time.sleep(60)'\n"
            "sys.exit(launcher.run([sys.executable, '-c', child], os.environ))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert r.returncode == 128 + signal.SIGTERM, r.stderr


def test_command_killed_by_a_signal_ends_the_same_way():
    # cmt run becomes the command (exec): a shell sees exactly what it would see without cmt.
    r = cmt("run", "--", sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert r.returncode == -signal.SIGKILL


@pytest.mark.parametrize("content", ["{", '{"format": "cmt-tuned-config", "version": 99}', "[]"])
def test_corrupt_tuned_file_is_refused_before_running(tmp_path, content):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    marker = tmp_path / "ran"
    r = cmt("run", "--config", str(bad), "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')")
    assert r.returncode == 2 and r.stderr.startswith("cmt: ") and "Traceback" not in r.stderr
    assert not marker.exists()
    r = cmt("run", "--", "true", env={"CMT_CONFIG": str(bad)})
    assert r.returncode == 2


def test_run_accelerates_a_program_with_the_stand_in_driver(fake_driver_dir, tmp_path):
    exe = tmp_path / "direct"
    src = TESTS / "preloaded" / "direct_calls.cpp"
    subprocess.run(["g++", "-std=c++17", "-O1", "-I", str(TESTS.parent / "native" / "include"), "-o", str(exe),
                    str(src), "-L", str(fake_driver_dir), "-lcuda"], check=True)
    env = {"LD_LIBRARY_PATH": str(fake_driver_dir), "CMT_STATS": "1"}
    r = cmt("run", "--", str(exe), env=env)
    assert r.returncode == 0 and "OK" in r.stdout
    assert re.search(r"h2d accelerated\s+6 copies", r.stderr), r.stderr

    # A tuned file that passes everything through is honoured.
    tuned = tmp_path / "pass.json"
    tuned.write_text(json.dumps({"format": "cmt-tuned-config", "version": 1,
                                 "h2d": [{"min_bytes": 0, "mode": "pass"}], "d2h": []}))
    r = cmt("run", "--config", str(tuned), "--", str(exe), env=env)
    assert r.returncode == 0 and "OK" in r.stdout
    assert re.search(r"h2d below_minimum\s+6 copies", r.stderr), r.stderr

    # CMT_DISABLE=1 runs the program with every copy passed through.
    r = cmt("run", "--", str(exe), env={**env, "CMT_DISABLE": "1"})
    assert r.returncode == 0 and re.search(r"h2d disabled\s+6 copies", r.stderr), r.stderr


def test_bad_option_is_a_clean_error():
    r = cmt("run", "--config")
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_startup_is_cheap():
    t = time.perf_counter()
    cmt("run", "--", "true")
    assert time.perf_counter() - t < 10


def test_without_a_driver_one_debug_line_says_nothing_was_staged():
    """On a machine without a GPU, `cmt run` with CMT_LOG=debug CMT_STATS=1 says why nothing happened."""
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    r = subprocess.run([sys.executable, "-m", "cmt", "run", "--", "true"], capture_output=True, text=True,
                       env={**env, "CMT_LOG": "debug", "CMT_STATS": "1"}, timeout=120)
    assert r.returncode == 0
    assert r.stderr.count("no CUDA driver (libcuda.so.1) was loaded in this process: nothing was staged") == 1, r.stderr


def test_an_environment_value_not_understood_is_warned_about_once():
    r = cmt("run", "--", "true", env={"CMT_LOG": "bogus"})
    assert r.returncode == 0
    assert r.stderr.count("warning: ignoring CMT_LOG=bogus (expected quiet, warn, info or debug)") == 1, r.stderr
