"""Which machine is this, cheaply: the hardware ids a tuned file is matched by, without CUDA.

`cmt run` must start fast and must not initialise CUDA in the launcher, so the GPUs are read from
procfs (/proc/driver/nvidia/gpus/*/information: model and bus id, also inside containers) and the
CPU from /proc and sysfs. The PCIe link is the slow part (nvidia-smi); it is cached per machine in
`$XDG_CACHE_HOME/cmt/machine.json`, keyed by everything read cheaply, so a changed GPU, CPU or
host re-probes. `cmt tune` records the fingerprint it measured through the driver (`remember`),
which also identifies machines whose GPUs procfs does not show.

The fields and hash are cmt.bench.fingerprint's, so ids here equal the ids `cmt tune` writes.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path
from typing import Any

from ..bench import fingerprint

PROC_GPUS = Path("/proc/driver/nvidia/gpus")
_CACHE_VERSION = 1
_CACHE_ENTRIES = 16  # a home folder shared by many hosts keeps one entry per host


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


def cpu_fields() -> dict[str, Any]:
    return {"cpu_model": fingerprint.cpu_model(), "cpu_cores": os.cpu_count() or 1,
            "numa_nodes": fingerprint.numa_nodes()}


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
    hw = {k: fields.get(k) for k in (*fingerprint.HARDWARE_FIELDS, "pci_bus_id")}
    hw["hardware_id"] = fingerprint.hardware_id(hw)
    hw["slug"] = fingerprint.slug(hw)
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
        from .. import cuda  # nvidia-smi or sysfs: once per machine, then cached

        found = []
        for bus_id, model in gpus:
            link = cuda.pcie_link(bus_id)
            found.append(_with_ids({"gpu": model, "pcie_gen": link.gen, "pcie_width": link.width,
                                    "pci_bus_id": bus_id, **cpu}))
        _write_cache(key, found)
        return found
    except Exception:  # identification is optional: never fail `cmt run` over it
        return []


def remember(machine: dict[str, Any]) -> None:
    """Records a fingerprint measured through the driver (by `cmt tune`) as this machine's."""
    try:
        gpus, cpu = probe_gpus(), cpu_fields()
        entry = _with_ids({**machine, **cpu})
        bus = normalize_bus_id(str(machine.get("pci_bus_id") or ""))
        entry["pci_bus_id"] = bus
        known = [g for g in identify() if normalize_bus_id(str(g.get("pci_bus_id") or "")) != bus]
        _write_cache(_key(gpus, cpu), sorted([*known, entry], key=lambda g: str(g.get("pci_bus_id"))))
    except Exception:  # only a cache: the tuning itself succeeded
        pass


def hardware_ids() -> list[str]:
    return list(dict.fromkeys(g["hardware_id"] for g in identify() if g.get("hardware_id")))


def describe(hw: dict[str, Any]) -> str:
    link = f"PCIe {hw.get('pcie_gen') or '?'} x{hw.get('pcie_width') or '?'}"
    return f"{hw.get('gpu')}, {link}, {hw.get('cpu_model')} ({hw.get('cpu_cores')} cores), id {hw.get('hardware_id')}"
