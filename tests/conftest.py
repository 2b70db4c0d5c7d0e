"""Shared fixtures: the stand-in driver (tests/fake_cuda), helpers that run C/C++ and Python programs
against it, and the ``gpu`` marker (skipped unless a real NVIDIA GPU is present)."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
REPO = TESTS_DIR.parent
NATIVE_INCLUDE = REPO / "native" / "include"
PRELOADED = REPO / "tests" / "preloaded"  # driver_api.hpp, for the test programs

sys.path.insert(0, str(TESTS_DIR))
# The node's budget of copy threads is the usable CPUs, two on CI: the tests ask the engine for more
# lanes than that and count them, so every process they start shares a budget large enough. The
# tests of the budget itself set their own.
os.environ.setdefault("CMT_NODE_THREADS", "64")
# A context's first copies pass through while its pipeline is set up in the background; most tests
# copy once and check that it was staged, so their copies wait for the setup (tests of the setup
# itself clear this). And they stage what the plan says: the rate guard, which may find staging
# slower than the stand-in's pageable copies (the built-in plan's driver rates are the H200's), has
# tests of its own, which set their hooks. Nor do they leave CPUs to other programs (the host that
# runs them is busy with other tests): the tests of that measure it.
os.environ.setdefault("CMT_TEST_HOOKS", "guard=0,wait_setup=1,busy_cpus=0")
from fake_cuda.build import build_fake_driver  # noqa: E402


# ---------------------------------------------------------------------------------------------
# gpu marker
# ---------------------------------------------------------------------------------------------
def _has_real_gpu() -> bool:
    if not os.path.exists("/dev/nvidiactl"):
        return False
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    try:
        res = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return res.returncode == 0 and "GPU" in res.stdout


HAS_GPU: bool | None = None


def has_real_gpu() -> bool:
    global HAS_GPU
    if HAS_GPU is None:
        HAS_GPU = _has_real_gpu()
    return HAS_GPU


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a real NVIDIA GPU and driver (skipped without one)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [it for it in items if it.get_closest_marker("gpu")]
    if not gpu_items or has_real_gpu():
        return
    skip = pytest.mark.skip(reason="needs a real NVIDIA GPU (/dev/nvidiactl + nvidia-smi -L)")
    for it in gpu_items:
        it.add_marker(skip)


# ---------------------------------------------------------------------------------------------
# fake driver
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def fake_driver_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory holding the freshly built fake ``libcuda.so.1`` and ``libcuda.so``."""
    out = tmp_path_factory.mktemp("fake_cuda")
    build_fake_driver(out)
    return out


@pytest.fixture(scope="session")
def fake_driver_lib(fake_driver_dir: Path) -> Path:
    """Full path of the fake ``libcuda.so.1``."""
    return fake_driver_dir / "libcuda.so.1"


def _child_env(fake_dir: Path, env: Mapping[str, str] | None) -> dict[str, str]:
    merged = dict(os.environ)
    extra = dict(env or {})
    ld = [str(fake_dir)]
    if extra.get("LD_LIBRARY_PATH"):
        ld.append(extra.pop("LD_LIBRARY_PATH"))
    elif merged.get("LD_LIBRARY_PATH"):
        ld.append(merged["LD_LIBRARY_PATH"])
    merged.update(extra)
    merged["LD_LIBRARY_PATH"] = os.pathsep.join(ld)
    py = [str(TESTS_DIR)]
    if merged.get("PYTHONPATH"):
        py.append(merged["PYTHONPATH"])
    merged["PYTHONPATH"] = os.pathsep.join(py)
    return merged


_prog_counter = itertools.count()

RunC = Callable[..., subprocess.CompletedProcess]


@pytest.fixture(scope="session")
def run_c_program(fake_driver_dir: Path) -> RunC:
    """``run_c_program(source_text, tmp_path, env=None, link_cuda=True, args=(), lang="c++",
    extra_flags=(), timeout=300, check_build=True)`` -> CompletedProcess (text, captured output).

    Compiles ``source_text`` with g++ (``lang="c"``: gcc) against native/include and tests/preloaded, linking
    ``-L<fake dir> -lcuda`` when ``link_cuda`` (else ``-ldl``), then runs it with
    ``LD_LIBRARY_PATH=<fake dir>`` plus ``env`` (e.g. ``LD_PRELOAD`` of the cmt library).
    A failed build raises AssertionError with the compiler output."""

    def run(
        source_text: str,
        tmp_path: Path,
        env: Mapping[str, str] | None = None,
        link_cuda: bool = True,
        args: Sequence[str] = (),
        lang: str = "c++",
        extra_flags: Sequence[str] = (),
        timeout: float = 300,
        check_build: bool = True,
    ) -> subprocess.CompletedProcess:
        n = next(_prog_counter)
        ext = ".c" if lang == "c" else ".cpp"
        src = Path(tmp_path) / f"prog{n}{ext}"
        exe = Path(tmp_path) / f"prog{n}"
        src.write_text(source_text)
        compiler = (os.environ.get("CC") or "gcc") if lang == "c" else (os.environ.get("CXX") or "g++")
        std = ["-std=c11"] if lang == "c" else ["-std=c++17"]
        cmd = [compiler, *std, "-O1", "-g", "-pthread", "-I", str(NATIVE_INCLUDE), "-I", str(PRELOADED), *extra_flags,
               "-o", str(exe), str(src)]
        cmd += ["-L", str(fake_driver_dir), "-lcuda"] if link_cuda else []
        cmd += ["-ldl"]
        build = subprocess.run(cmd, capture_output=True, text=True)
        if build.returncode != 0:
            if check_build:
                raise AssertionError(f"compile failed: {' '.join(cmd)}\n{build.stdout}{build.stderr}")
            return build
        return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=timeout,
                              env=_child_env(fake_driver_dir, env))

    return run


@pytest.fixture(scope="session")
def run_python(fake_driver_dir: Path) -> RunC:
    """``run_python(code, env=None, args=(), timeout=300)`` -> CompletedProcess: runs
    ``sys.executable -c code`` with ``LD_LIBRARY_PATH=<fake dir>`` plus ``env``; tests/ is on
    PYTHONPATH so ``from fake_cuda.fake_client import Driver`` works in the child."""

    def run(
        code: str,
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
        timeout: float = 300,
    ) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                              timeout=timeout, env=_child_env(fake_driver_dir, env))

    return run


@pytest.fixture(scope="session")
def fake_driver(fake_driver_lib: Path):
    """The fake driver loaded into the pytest process (by full path), initialised, with device 0's
    primary context current on the calling thread. A ``fake_cuda.fake_client.Driver``."""
    from fake_cuda.fake_client import Driver

    drv = Driver(str(fake_driver_lib))
    drv.init_primary(0)
    return drv
