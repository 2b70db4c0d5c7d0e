"""What a new user trips over on the command line: a misspelt option taken for the command, an empty
output folder left behind without a GPU, `--config`'s help leaving out where a tuned file comes
from, and matplotlib or numpy needed where no plot is drawn."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cmt import config as cfg

H200_PROFILE = cfg.PROFILES_DIR / "nvidia-h200-pcie5x16-1a2c1d17dfe9.json"
MAIN = "import sys; from cmt.cli import main; sys.argv[0] = 'cmt'; main()"
# matplotlib missing, as after `pip install cudamemcpy-tuner` without the `plot` extra.
NO_MATPLOTLIB = "import sys; sys.modules['matplotlib'] = None; "
SKIPPED = "cmt: PNG plot skipped: matplotlib is not installed (pip install 'cudamemcpy-tuner[plot]')"


@pytest.fixture
def home(tmp_path) -> dict[str, str]:
    """Private config and cache folders, no CMT_CONFIG."""
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("CMT_CONFIG", None)
    return env


def cmt(*args: str, env=None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cmt", *args], capture_output=True, text=True, timeout=120,
                          env=env, cwd=cwd)


# -- a misspelt option is a usage error, not the command --------------------------------------------
@pytest.mark.parametrize("args, closest", [
    (["tune", "--serach", "instant"], "--search"),
    (["run", "--conifg", "f", "--", "x"], "--config"),
    (["profile", "--jsn", "--", "true"], "--json"),
    (["tune", "--quik", "--", "true"], "--quick"),
])
def test_misspelt_option_names_the_closest(args, closest, home):
    r = cmt(*args, env=home)
    assert r.returncode == 2, r.stderr
    assert f"No such option '{args[1]}'" in r.stderr and f"Did you mean '{closest}'?" in r.stderr
    assert "command not found" not in r.stderr and "Traceback" not in r.stderr


def test_the_command_starts_at_the_first_word_that_is_not_an_option(home):
    # Without `--`: the first plain word is CMD, and what follows it is CMD's, options included.
    r = cmt("run", sys.executable, "-c", "import sys; print(sys.argv[1:])", "--conifg", "x", env=home)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "['--conifg', 'x']\n"
    # After `--`, even a word that looks like an option is the command.
    r = cmt("run", "--", "--conifg", env=home)
    assert r.returncode == 127 and r.stderr == "cmt: --conifg: command not found\n"


def test_run_profile_and_tune_take_the_command_one_way():
    import click

    from cmt.cli import run
    from cmt.profile.cli import profile
    from cmt.tune.cli import tune

    for command in (run, profile, tune):
        # Unknown options are errors (no ignore_unknown_options); parsing stops at CMD.
        assert command.context_settings == {"allow_interspersed_args": False}, command.name
        (arg,) = [p for p in command.params if isinstance(p, click.Argument)]
        assert (arg.name, arg.nargs, arg.type) == ("command", -1, click.UNPROCESSED)


# -- no GPU: a clear line, and no empty cmt-bench-* folder -----------------------------------------
@pytest.mark.parametrize("args", [["copy", "--quick"], ["workloads", "--quick"], ["copy", "--out", "a/b/c"]])
def test_no_gpu_leaves_no_output_folder(run_python, tmp_path: Path, args):
    work = tmp_path / "work"
    work.mkdir()
    code = f"import os; os.chdir({str(work)!r}); " + MAIN
    r = run_python(code, args=("bench", *args), env={"FAKE_CUDA_DEVICES": "0"})
    assert r.returncode != 0
    assert r.stderr.startswith("cmt: no NVIDIA GPU / driver found") and len(r.stderr.strip().splitlines()) == 1
    assert list(work.iterdir()) == []


def test_an_existing_empty_output_folder_is_kept(run_python, tmp_path: Path):
    out = tmp_path / "mine"
    out.mkdir()
    r = run_python(MAIN, args=("bench", "copy", "--out", str(out)), env={"FAKE_CUDA_DEVICES": "0"})
    assert r.returncode != 0 and out.is_dir()


@pytest.mark.parametrize("out, message", [
    ("/proc/cmt-test/x", "cannot write to output folder /proc/cmt-test/x"),
    ("/dev/null/x", "cannot write to output folder /dev/null/x"),
])
def test_unwritable_output_folder_is_one_line_and_exit_2(out, message, home):
    r = cmt("bench", "copy", "--out", out, env=home)
    assert r.returncode == 2 and r.stderr.startswith(f"cmt: {message}"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


# -- --config's help lists the whole order ----------------------------------------------------------
@pytest.mark.parametrize("command", [["run"], ["profile"], ["bench", "copy"], ["bench", "workloads"]])
def test_config_help_lists_where_a_tuned_file_comes_from(command, home):
    r = cmt(*command, "--help", env=home)
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    help_ = text[text.index("--config FILE"):]
    order = ["--config FILE", "CMT_CONFIG", "the tuned file `cmt tune` wrote for this machine",
             "a profile shipped for this machine", "the built-in defaults"]
    where = [help_.find(part) for part in order]
    assert -1 not in where and where == sorted(where), help_


# -- matplotlib is optional, numpy is not loaded by `cmt run` --------------------------------------
def test_bench_without_matplotlib_writes_the_json_and_says_why_no_png(run_python, tmp_path: Path):
    out = tmp_path / "o"
    r = run_python(NO_MATPLOTLIB + MAIN, args=("bench", "copy", "--sizes", "64K", "--directions", "h2d", "--modes",
                                               "pageable", "--repeats", "1", "--warmup", "0", "--out", str(out)))
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "copy.json").read_text())["results"]
    assert not (out / "copy.png").exists()
    assert r.stderr.count(SKIPPED) == 1 and "Traceback" not in r.stderr


def test_matplotlib_is_an_optional_extra():
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    deps = pyproject[pyproject.index("dependencies = ["):]
    deps = deps[:deps.index("]")]
    assert "numpy" in deps and "matplotlib" not in deps
    assert re.search(r'^plot = \["matplotlib[^"]*"\]', pyproject, re.M)
    assert re.search(r'^test = \[.*"matplotlib', pyproject, re.M)  # CI's `pip install ".[test]"` draws the plots


RUN_AND_REPORT = """
import os, sys
def exec_(file, args, env):  # instead of becoming CMD: report what `cmt run` loaded
    print(sorted(m for m in ('numpy', 'matplotlib') if m in sys.modules), flush=True)
    os._exit(0)
os.execvpe = exec_
from cmt.cli import main
main(['run', *sys.argv[1:]])
"""


@pytest.mark.parametrize("args", [["--", "true"], ["--config", str(H200_PROFILE), "true"]])
def test_run_loads_neither_numpy_nor_matplotlib(args, home):
    r = subprocess.run([sys.executable, "-c", RUN_AND_REPORT, *args], capture_output=True, text=True, env=home,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "[]\n"
