"""cmt.machine: one module tells which machine this is, for choosing the tuned file (without CUDA)
and for `cmt tune` and the benches (through the driver), with one hash; cmt.config reaches it
without loading cmt.tune or cmt.bench."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from cmt import machine


def test_the_old_modules_are_gone():
    for name in ("cmt.tune.machine", "cmt.bench.fingerprint"):
        assert importlib.util.find_spec(name) is None, name


def test_choosing_a_tuned_file_loads_neither_tune_nor_bench(tmp_path: Path):
    code = ("import sys\n"
            "from cmt import config\n"
            "config.select(None)\n"
            "print(sorted(m for m in sys.modules if m.startswith(('cmt.tune', 'cmt.bench'))))\n")
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("CMT_CONFIG", None)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "[]\n"


def test_the_driver_and_procfs_give_the_same_hardware_id(run_python, tmp_path: Path):
    """What `cmt tune` names a tuned file by (through the driver) is what `cmt run` looks it up by
    (procfs, no CUDA)."""
    code = ("import json, pathlib, sys\n"
            "from cmt import cuda, machine\n"
            "cuda.pcie_link = lambda bus_id: cuda.PcieLink(5, 16, 5, 'test')\n"
            "gpus = pathlib.Path(sys.argv[1]) / 'gpus'\n"
            "(gpus / '0000:10:00.0').mkdir(parents=True)\n"
            "(gpus / '0000:10:00.0' / 'information').write_text('Model: \\t Fake CUDA Device\\n')\n"
            "machine.PROC_GPUS = gpus\n"
            "drv = cuda.load()\n"
            "fp = machine.fingerprint(drv, drv.open_device(0))\n"
            "print(json.dumps({'fp': fp, 'procfs': machine.identify()}))\n")
    r = run_python(code, args=(str(tmp_path),), env={"XDG_CACHE_HOME": str(tmp_path / "cache"),
                                                     "FAKE_CUDA_DEVICES": "1"})
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    fp, (seen,) = doc["fp"], doc["procfs"]
    assert fp["gpu"] == seen["gpu"] == "Fake CUDA Device"
    assert fp["hardware_id"] == seen["hardware_id"] == machine.hardware_id(fp)
    assert fp["slug"] == seen["slug"] == f"fake-cuda-device-pcie5x16-{fp['hardware_id']}"
    assert machine.normalize_bus_id(fp["pci_bus_id"]) == seen["pci_bus_id"] == "0000:10:00.0"
    for key in ("driver_cuda_version", "cmt_version", "date", "usable_cpus", "memory_bytes"):
        assert key in fp


def test_hardware_id_hashes_only_the_hardware_fields():
    hw = {"gpu": "NVIDIA H200", "pcie_gen": 5, "pcie_width": 16, "cpu_model": "Intel(R) Xeon(R) Processor",
          "cpu_cores": 16, "numa_nodes": 1}
    assert machine.hardware_id(hw) == "1a2c1d17dfe9"  # the shipped H200 profile's id
    assert machine.hardware_id({**hw, "date": "tomorrow", "driver_version": "999"}) == "1a2c1d17dfe9"
    assert machine.slug(hw) == "nvidia-h200-pcie5x16-1a2c1d17dfe9"
