"""The machine fingerprint: what a result or a tuned file was measured on.

`hardware_id` hashes only the fields that decide copy speed and do not change between runs (GPU,
PCIe link, CPU, cores, NUMA nodes), so `cmt tune` can name tuned files by it; dates, driver and cmt
versions are recorded beside it but left out of the hash.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import re
from pathlib import Path
from typing import Any

from .. import __version__, cuda

HARDWARE_FIELDS = ("gpu", "pcie_gen", "pcie_width", "cpu_model", "cpu_cores", "numa_nodes")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def numa_nodes() -> int:
    return max(1, len(list(Path("/sys/devices/system/node").glob("node[0-9]*"))))


def memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def usable_cpus() -> int:
    """CPUs this process may run on (a container or taskset may allow fewer than exist)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def hardware_id(fp: dict[str, Any]) -> str:
    """A stable 12-hex-digit hash of the hardware fields."""
    key = json.dumps({k: fp.get(k) for k in HARDWARE_FIELDS}, sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def slug(fp: dict[str, Any]) -> str:
    """A file-name-safe label: 'nvidia-h200-pcie5x16-1a2b3c4d5e6f'."""
    gpu = re.sub(r"[^a-z0-9]+", "-", str(fp.get("gpu", "gpu")).lower()).strip("-")
    link = f"pcie{fp.get('pcie_gen') or 'x'}x{fp.get('pcie_width') or 'x'}"
    return f"{gpu}-{link}-{fp.get('hardware_id') or hardware_id(fp)}"


def machine(drv: cuda.Driver, device: cuda.Device) -> dict[str, Any]:
    """The fingerprint of this machine with `device` as the GPU."""
    link = cuda.pcie_link(device.pci_bus_id)
    version = drv.driver_version()
    fp: dict[str, Any] = {
        "gpu": device.name,
        "pcie_gen": link.gen,
        "pcie_width": link.width,
        "cpu_model": cpu_model(),
        "cpu_cores": os.cpu_count() or 1,
        "numa_nodes": numa_nodes(),
        "gpu_ordinal": device.ordinal,
        "gpu_memory_bytes": device.total_mem,
        "pci_bus_id": device.pci_bus_id,
        "pcie_gen_current": link.gen_current,
        "pcie_source": link.source,
        "usable_cpus": usable_cpus(),
        "memory_bytes": memory_bytes(),
        "driver_cuda_version": f"{version // 1000}.{version % 1000 // 10}",
        "driver_version": nvidia_driver_version(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "cmt_version": __version__,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    fp["hardware_id"] = hardware_id(fp)
    fp["slug"] = slug(fp)
    return fp


def nvidia_driver_version() -> str | None:
    """The kernel driver's version (580.159.04), which the CUDA API does not give."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    found = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return found.group(1) if found else None
