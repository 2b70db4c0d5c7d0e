"""Reading /sys, /proc and /etc for `cmt doctor`, and the parsers of what they hold.

Every reader takes `root`, the folder standing for `/`, so that the tests can point it at a
fabricated tree. Nothing here raises on a missing or unreadable file: it answers None (or empty).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/")

# The transfer rate of one lane (GT/s, as sysfs writes it) -> PCIe generation.
_GEN_BY_GTS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6, 128.0: 7}


def read(root: Path, relative: str) -> str | None:
    try:
        return (root / relative).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


# -- PCIe link --------------------------------------------------------------------------------------
def link_speed(text: str | None) -> tuple[float, int | None] | None:
    """'32.0 GT/s PCIe' -> (32.0, 5); '8 GT/s' -> (8.0, 3); 'Unknown' or None -> None. A rate
    that is no PCIe generation's keeps its figure with generation None."""
    if not text:
        return None
    found = re.match(r"\s*(\d+(?:\.\d+)?)\s*GT/s", text)
    if not found:
        return None
    gts = float(found.group(1))
    return gts, _GEN_BY_GTS.get(gts)


def pci_device_dir(root: Path, bus_id: str) -> Path:
    """The sysfs folder of a PCI device ('0000:18:00.0', the form sysfs and procfs use)."""
    return root / "sys/bus/pci/devices" / bus_id


@dataclass(frozen=True)
class Link:
    """A PCIe link as the device's own registers show it; `port_max_*`: the upstream port's maximum
    (the link trains to the lower of both ends). A figure sysfs does not give is None."""

    speed: float | None
    gen: int | None
    width: int | None
    max_speed: float | None
    max_gen: int | None
    max_width: int | None
    port_max_gen: int | None = None
    port_max_width: int | None = None
    port: str | None = None


def pci_link(root: Path, bus_id: str) -> Link | None:
    """The device's link, or None when sysfs has no link figures for it."""
    dev = pci_device_dir(root, bus_id)
    current, maximum = link_speed(read(dev, "current_link_speed")), link_speed(read(dev, "max_link_speed"))
    width, max_width = _int(read(dev, "current_link_width")), _int(read(dev, "max_link_width"))
    if current is None and width is None:
        return None
    port_dir = dev.resolve().parent
    port_max = link_speed(read(port_dir, "max_link_speed"))
    port_width = _int(read(port_dir, "max_link_width"))
    return Link(current[0] if current else None, current[1] if current else None, width,
                maximum[0] if maximum else None, maximum[1] if maximum else None, max_width,
                port_max[1] if port_max else None, port_width,
                port_dir.name if (port_max or port_width) else None)


# -- NUMA -------------------------------------------------------------------------------------------
def parse_cpulist(text: str | None) -> set[int]:
    """'0-3,8,10-11' -> {0, 1, 2, 3, 8, 10, 11}; '' or None -> set(). Raises ValueError when the
    text is no CPU list."""
    cpus: set[int] = set()
    for part in (text or "").strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, dash, hi = part.partition("-")
        first, last = int(lo), int(hi) if dash else int(lo)
        if last < first:
            raise ValueError(f"CPU range runs backwards: {part}")
        cpus.update(range(first, last + 1))
    return cpus


def format_cpulist(cpus: set[int] | frozenset[int]) -> str:
    """{0, 1, 2, 3, 8} -> '0-3,8' (the form taskset and numactl take)."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def numa_node_of(root: Path, bus_id: str) -> int | None:
    """The device's NUMA node; -1 when the firmware does not say; None when sysfs has no entry."""
    return _int(read(pci_device_dir(root, bus_id), "numa_node"))


def node_cpus(root: Path) -> dict[int, set[int]]:
    """NUMA node -> its CPUs, from /sys/devices/system/node/node*/cpulist."""
    nodes: dict[int, set[int]] = {}
    try:
        entries = list((root / "sys/devices/system/node").glob("node[0-9]*"))
    except OSError:
        return nodes
    for entry in entries:
        try:
            nodes[int(entry.name[4:])] = parse_cpulist(read(entry, "cpulist"))
        except ValueError:
            continue
    return nodes


# -- kernel settings --------------------------------------------------------------------------------
def selected(text: str | None) -> str | None:
    """The bracketed choice of a sysfs setting: 'always [madvise] never' -> 'madvise'."""
    found = re.search(r"\[([^\]]+)\]", text or "")
    return found.group(1) if found else None


def iommu_units(root: Path) -> list[str]:
    """The IOMMUs the kernel drives (/sys/class/iommu: dmar0, ivhd0...); [] when it drives none."""
    try:
        return sorted(p.name for p in (root / "sys/class/iommu").iterdir())
    except OSError:
        return []


def iommu_group_type(root: Path, bus_id: str) -> str | None:
    """How the IOMMU treats the device: 'identity' (passthrough), 'DMA' or 'DMA-FQ' (translated)..."""
    return read(pci_device_dir(root, bus_id), "iommu_group/type")


def kernel_cmdline(root: Path) -> list[str]:
    return (read(root, "proc/cmdline") or "").split()


def module_loaded(root: Path, name: str) -> bool:
    modules = read(root, "proc/modules") or ""
    if any(line.split(" ", 1)[0] == name for line in modules.splitlines()):
        return True
    return (root / "sys/module" / name).is_dir()


# -- mounts -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Mount:
    mount_point: str
    fstype: str
    source: str


def _unescape(field: str) -> str:
    """mountinfo writes a space as \\040, a tab as \\011, a backslash as \\134."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts of /proc/self/mountinfo, in its order (a later mount covers an earlier one at the
    same place). Lines that are not understood are skipped."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 2:
            continue
        mounts.append(Mount(_unescape(fields[4]), tail[0], _unescape(tail[1])))
    return mounts


def mount_for(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount that holds `path` (absolute, symbolic links resolved): the longest mount point that
    is `path` or a folder above it; of mounts at the same place, the last."""
    best: Mount | None = None
    for m in mounts:
        point = m.mount_point.rstrip("/") or "/"
        inside = path == point or point == "/" or path.startswith(point + "/")
        if inside and (best is None or len(point) >= len(best.mount_point.rstrip("/") or "/")):
            best = m
    return best


def mounts(root: Path) -> list[Mount]:
    return parse_mountinfo(read(root, "proc/self/mountinfo") or "")
