"""Which machine this is: the fingerprint a result or a tuned file records, and its hardware id.

Two ways to tell, one set of fields and one hash, so that both give the same id:

- `fingerprint(drv, device)`, through the CUDA driver: everything a result records (GPU, PCIe
  link, CPU, memory, driver and cmt versions, date). `cmt tune` and `cmt bench` use it.
- `identify()` / `hardware_ids()`, cheaply and without CUDA, for choosing the tuned file
  (cmt.config) at `cmt run`, which must start fast and must not initialise CUDA in the launcher.
  The GPUs are read from procfs (/proc/driver/nvidia/gpus/*/information: model and bus id, also
  inside containers), the CPU from /proc and sysfs. The PCIe link is the slow part (nvidia-smi);
  it is cached per machine in `$XDG_CACHE_HOME/cmt/machine.json`, keyed by everything read
  cheaply, so a changed GPU, CPU or host re-probes. `cmt tune` records the fingerprint it measured
  through the driver (`remember`), which also identifies machines whose GPUs procfs does not show.

`hardware_id` hashes only the fields that decide copy speed and do not change between runs
(HARDWARE_FIELDS), so tuned files can be named by it; dates and versions are left out of the hash.

Only the standard library is imported here (cmt.cuda when the driver is asked): cmt.config uses
this module on every `cmt run`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import __version__

if TYPE_CHECKING:
    from .cuda import Device, Driver

HARDWARE_FIELDS = ("gpu", "pcie_gen", "pcie_width", "cpu_model", "cpu_cores", "numa_nodes")
PROC_GPUS = Path("/proc/driver/nvidia/gpus")
_CACHE_VERSION = 1
_CACHE_ENTRIES = 16  # a home folder shared by many hosts keeps one entry per host


# -- the fields and the hash ----------------------------------------------------------------------
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


def cpu_fields() -> dict[str, Any]:
    return {"cpu_model": cpu_model(), "cpu_cores": os.cpu_count() or 1, "numa_nodes": numa_nodes()}


def hardware_id(fp: dict[str, Any]) -> str:
    """A stable 12-hex-digit hash of the hardware fields."""
    key = json.dumps({k: fp.get(k) for k in HARDWARE_FIELDS}, sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def slug(fp: dict[str, Any]) -> str:
    """A file-name-safe label: 'nvidia-h200-pcie5x16-1a2b3c4d5e6f'."""
    gpu = re.sub(r"[^a-z0-9]+", "-", str(fp.get("gpu", "gpu")).lower()).strip("-")
    link = f"pcie{fp.get('pcie_gen') or 'x'}x{fp.get('pcie_width') or 'x'}"
    return f"{gpu}-{link}-{fp.get('hardware_id') or hardware_id(fp)}"


def describe(hw: dict[str, Any]) -> str:
    link = f"PCIe {hw.get('pcie_gen') or '?'} x{hw.get('pcie_width') or '?'}"
    return f"{hw.get('gpu')}, {link}, {hw.get('cpu_model')} ({hw.get('cpu_cores')} cores), id {hw.get('hardware_id')}"


# -- through the driver: what a result records ----------------------------------------------------
def fingerprint(drv: Driver, device: Device) -> dict[str, Any]:
    """The fingerprint of this machine with `device` as the GPU."""
    from . import cuda

    link = cuda.pcie_link(device.pci_bus_id)
    version = drv.driver_version()
    fp: dict[str, Any] = {
        "gpu": device.name,
        "pcie_gen": link.gen,
        "pcie_width": link.width,
        **cpu_fields(),
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


# -- without CUDA: which tuned file is this machine's ---------------------------------------------
def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cmt"


def normalize_bus_id(bus_id: str) -> str:
    """The driver's '00000000:18:00.0' and procfs's '0000:18:00.0' name the same device."""
    domain, _, rest = bus_id.strip().partition(":")
    try:
        return f"{int(domain, 16):04x}:{rest.lower()}"
    except ValueError:
        return bus_id.strip().lower()


def probe_gpus() -> list[tuple[str, str]]:
    """(bus id, model) of each NVIDIA GPU procfs shows, in bus order; [] when it shows none."""
    found = []
    try:
        entries = sorted(PROC_GPUS.iterdir())
    except OSError:
        return []
    for entry in entries:
        try:
            text = (entry / "information").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        model = fields.get("Model", "").strip()
        if model:
            found.append((normalize_bus_id(entry.name), model))
    return found


def _key(gpus: list[tuple[str, str]], cpu: dict[str, Any]) -> str:
    raw = json.dumps({"host": platform.node(), "gpus": gpus, "cpu": cpu}, sort_keys=True)
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def _read_cache() -> dict[str, Any]:
    try:
        doc = json.loads((cache_dir() / "machine.json").read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict) or doc.get("version") != _CACHE_VERSION or not isinstance(doc.get("hosts"), dict):
        return {}
    return doc["hosts"]


def _write_cache(key: str, gpus: list[dict[str, Any]]) -> None:
    """Best effort: a read-only home folder only costs a re-probe next time."""
    hosts = _read_cache()
    hosts.pop(key, None)
    hosts[key] = gpus
    hosts = dict(list(hosts.items())[-_CACHE_ENTRIES:])
    path = cache_dir() / "machine.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".machine.json.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"version": _CACHE_VERSION, "hosts": hosts}, indent=1) + "\n")
        os.replace(tmp, path)
    except OSError:
        pass


def _with_ids(fields: dict[str, Any]) -> dict[str, Any]:
    hw = {k: fields.get(k) for k in (*HARDWARE_FIELDS, "pci_bus_id")}
    hw["hardware_id"] = hardware_id(hw)
    hw["slug"] = slug(hw)
    return hw


def identify() -> list[dict[str, Any]]:
    """This machine's hardware fields, one dict per GPU (with `hardware_id` and `slug`), or []
    when it cannot be told without CUDA. Never raises: callers fall back to the defaults."""
    try:
        gpus, cpu = probe_gpus(), cpu_fields()
        key = _key(gpus, cpu)
        cached = _read_cache().get(key)
        if isinstance(cached, list) and all(isinstance(g, dict) for g in cached):
            return cached
        if not gpus:
            return []
        from . import cuda  # nvidia-smi or sysfs: once per machine, then cached

        found = []
        for bus_id, model in gpus:
            link = cuda.pcie_link(bus_id)
            found.append(_with_ids({"gpu": model, "pcie_gen": link.gen, "pcie_width": link.width,
                                    "pci_bus_id": bus_id, **cpu}))
        _write_cache(key, found)
        return found
    except Exception:  # identification is optional: never fail `cmt run` over it
        return []


def remember(measured: dict[str, Any]) -> None:
    """Records a fingerprint measured through the driver (by `cmt tune`) as this machine's."""
    try:
        gpus, cpu = probe_gpus(), cpu_fields()
        entry = _with_ids({**measured, **cpu})
        bus = normalize_bus_id(str(measured.get("pci_bus_id") or ""))
        entry["pci_bus_id"] = bus
        known = [g for g in identify() if normalize_bus_id(str(g.get("pci_bus_id") or "")) != bus]
        _write_cache(_key(gpus, cpu), sorted([*known, entry], key=lambda g: str(g.get("pci_bus_id"))))
    except Exception:  # only a cache: the tuning itself succeeded
        pass


def hardware_ids() -> list[str]:
    return list(dict.fromkeys(g["hardware_id"] for g in identify() if g.get("hardware_id")))
