"""On a machine of several NUMA nodes, a GPU's copy threads run on its node's CPUs (numa_place.hpp).
The machine is a made-up sysfs tree (CMT_TEST_HOOKS sysfs=): two nodes of one CPU each, and the
stand-in driver's device 0 (PCI 0000:10:00.0) on one of them."""

from __future__ import annotations

import os

import pytest

from preloaded.client import CopyServer, outcome

MIB = 1 << 20


def _sysfs(root, node_cpus: list[int], gpu_node: int):
    nodes = root / "devices" / "system" / "node"
    nodes.mkdir(parents=True)
    (nodes / "online").write_text(f"0-{len(node_cpus) - 1}\n" if len(node_cpus) > 1 else "0\n")
    for i, cpu in enumerate(node_cpus):
        (nodes / f"node{i}").mkdir()
        (nodes / f"node{i}" / "cpulist").write_text(f"{cpu}\n")
    gpu = root / "bus" / "pci" / "devices" / "0000:10:00.0"
    gpu.mkdir(parents=True)
    (gpu / "numa_node").write_text(f"{gpu_node}\n")
    return root


def _workers(server) -> list[list[int]]:
    return [t["cpus"] for t in server("threads")["threads"] if t["name"].startswith("cmt-copy-")]


@pytest.mark.parametrize("gpu_node", [0, 1])
def test_copy_threads_run_on_the_gpus_node(fake_driver_dir, tmp_path, gpu_node):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two usable CPUs")
    tree = _sysfs(tmp_path / "sys", cpus[:2], gpu_node)
    s = CopyServer(fake_driver_dir, CMT_TEST_HOOKS=f"guard=0,wait_setup=1,sysfs={tree}")
    # 6 MiB: staged on two lanes, and below the size from which the program's own memcpy calls are
    # split over the lanes too (host copies run wherever the process may, numa_place.hpp).
    r = s("roundtrip", size=6 * MIB)
    assert r["device_ok"] and r["host_ok"]
    assert outcome(r, "h2d") == {"accelerated": 1} and outcome(r, "d2h") == {"accelerated": 1}
    workers = _workers(s)
    s.close()
    assert workers, "no copy threads were started"
    assert all(w == [cpus[gpu_node]] for w in workers), workers


def test_one_node_places_nothing(fake_driver_dir, tmp_path):
    cpus = sorted(os.sched_getaffinity(0))
    tree = _sysfs(tmp_path / "sys", cpus[:1], 0)
    s = CopyServer(fake_driver_dir, CMT_TEST_HOOKS=f"guard=0,wait_setup=1,sysfs={tree}")
    r = s("roundtrip", size=6 * MIB)
    assert r["device_ok"] and r["host_ok"] and outcome(r, "h2d") == {"accelerated": 1}
    workers = _workers(s)
    s.close()
    assert workers and all(w == cpus for w in workers), workers


def test_staging_is_faulted_in_ahead_for_any_device_only_on_one_node(run_python, tmp_path):
    # `import cmt.io` faults the first transfer's staging in before any device is known: only where
    # there is one node, since the pages would stay on whichever node the importing thread ran on.
    cpus = sorted(os.sched_getaffinity(0))
    code = "import time, cmt.io; time.sleep(0.5)"
    for node_cpus, expected in (([cpus[0]], True), ([cpus[0], cpus[0]], False)):
        tree = _sysfs(tmp_path / f"sys{len(node_cpus)}", node_cpus, 0)
        proc = run_python(code, env={"CMT_LOG": "debug", "CMT_TEST_HOOKS": f"sysfs={tree}"})
        assert proc.returncode == 0, proc.stderr
        assert ("staging for any device faulted in ahead" in proc.stderr) == expected, proc.stderr
