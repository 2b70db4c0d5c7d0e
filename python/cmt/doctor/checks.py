"""The checks of `cmt doctor`, one function each, every one answering Findings (a verdict and, where
something can be done, the fix). A missing GPU or driver is a `fail` finding, never an exception:
the user runs this first, on machines where things are missing."""

from __future__ import annotations

import ctypes
import os
import resource
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import config as cfg
from .. import cuda, machine
from ..errors import CmtError
from . import sysfs
from .sysfs import ROOT

VERDICTS = ("ok", "info", "warn", "fail")


@dataclass(frozen=True)
class Finding:
    name: str
    verdict: str  # one of VERDICTS
    detail: str
    fix: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Gpu:
    ordinal: int | None  # None: seen by the kernel driver (procfs) but not through libcuda
    name: str
    bus_id: str  # as sysfs names it: 0000:18:00.0
    memory_bytes: int | None = None

    @property
    def label(self) -> str:
        return f"GPU {self.ordinal}" if self.ordinal is not None else f"GPU {self.bus_id}"


_INSTALL_DRIVER = ("install the NVIDIA driver and check that `nvidia-smi` lists the GPU; in a container, start it "
                   "with the GPU passed in (`docker run --gpus all`, the NVIDIA Container Toolkit)")


# -- GPU and driver ---------------------------------------------------------------------------------
def _loaded_from(fragment: str) -> str | None:
    """Where this process loaded a library from (its first mapping in /proc/self/maps)."""
    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            path = line.split(maxsplit=5)[-1]
            if fragment in os.path.basename(path):
                return path
    except OSError:
        pass
    return None


def check_driver() -> Finding:
    module = machine.nvidia_driver_version()
    module_words = (f"kernel module {module}" if module
                    else "kernel module version unknown (no /proc/driver/nvidia/version)")
    try:
        drv = cuda.Driver(ctypes.CDLL(cuda.LIBRARY))
    except OSError as e:
        return Finding("driver", "fail", f"{cuda.LIBRARY} cannot be loaded ({e}); {module_words}", _INSTALL_DRIVER)
    try:
        version = drv.driver_version()
    except CmtError as e:
        return Finding("driver", "warn", f"{cuda.LIBRARY} loaded but gives no version ({e}); {module_words}",
                       "reinstall the NVIDIA driver")
    where = _loaded_from("libcuda.so") or cuda.LIBRARY
    words = f"CUDA {version // 1000}.{version % 1000 // 10} driver API ({where}), {module_words}"
    if version < 12000:
        return Finding("driver", "warn", f"{words}: older than CUDA 12, which cmt is tested with",
                       "update the NVIDIA driver to one of CUDA 12 or newer")
    return Finding("driver", "ok", words)


def find_gpus(device: int | None = None) -> tuple[Finding, list[Gpu]]:
    """The GPU finding and the GPUs to check (only `device` when given). CmtError (exit 2) only for
    a --device that does not exist."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    note = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
    try:
        ctypes.CDLL(cuda.LIBRARY)
        drv = cuda.load()
    except (OSError, CmtError) as e:
        seen = [Gpu(None, model, bus) for bus, model in machine.probe_gpus()]
        if isinstance(e, OSError):
            why, fix = "the CUDA driver cannot be loaded (see `driver`)", _INSTALL_DRIVER
            if seen:
                fix = "install the driver's user-space part (libcuda.so.1) of the kernel module's version"
        else:
            why, fix = str(e), ("check that `nvidia-smi` lists the GPU, that CUDA_VISIBLE_DEVICES does not hide it "
                                "and that you may open /dev/nvidia*; in a container, start it with the GPU passed "
                                "in (`docker run --gpus all`)")
        if seen:
            models = ", ".join(f"{g.name} at {g.bus_id}" for g in seen)
            return Finding("gpu", "fail", f"the kernel driver sees {models}, but CUDA cannot use it: {why}{note}",
                           fix), seen
        return Finding("gpu", "fail", f"no GPU can be used: {why}{note}", fix), []
    count = drv.device_count()
    if device is not None and not 0 <= device < count:
        raise CmtError(f"--device {device}: this machine has {count} GPU{'s' if count != 1 else ''} "
                       f"(numbered from 0){note}")
    gpus = []
    try:
        for ordinal in range(count) if device is None else [device]:
            dev = drv.device(ordinal)
            gpus.append(Gpu(ordinal, drv.device_name(dev), machine.normalize_bus_id(drv.pci_bus_id(dev)),
                            drv.total_mem(dev)))
    except CmtError as e:
        return Finding("gpu", "fail", f"{count} GPU{'s' if count != 1 else ''}{note}, but asking about them "
                                      f"failed: {e}", "check the GPU with `nvidia-smi`"), gpus
    listing = "; ".join(f"{g.ordinal}: {g.name} at {g.bus_id}, {(g.memory_bytes or 0) / 2**30:.0f} GiB" for g in gpus)
    return Finding("gpu", "ok", f"{count} GPU{'s' if count != 1 else ''}{note}; checking {listing}"), gpus


def check_library() -> Finding:
    """cmt's own native library (the interposer `cmt run` preloads)."""
    from .. import native

    try:
        path = native.library_path()
        version = native.load().cmt_version().decode()
    except (CmtError, OSError) as e:
        return Finding("cmt library", "fail", str(e), "reinstall cmt (`pip install .`); for a development build, "
                                                     "set CMT_LIBRARY=<build folder>/libcmt.so")
    return Finding("cmt library", "ok", f"libcmt {version} at {path}")


# -- PCIe link --------------------------------------------------------------------------------------
_GTS_BY_GEN = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0, 7: 128.0}


def _link_from_nvidia_smi(bus_id: str) -> sysfs.Link | None:
    """The GPU's own view, for when sysfs has no link figures (some containers)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    query = "pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max"
    try:
        out = subprocess.run([smi, "-i", bus_id, f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30)
        gen, max_gen, width, max_width = (int(v) for v in out.stdout.strip().split(","))
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None
    return sysfs.Link(_GTS_BY_GEN.get(gen), gen, width, _GTS_BY_GEN.get(max_gen), max_gen, max_width)


def _gen(gen: int | None, speed: float | None) -> str:
    return f"Gen{gen or '?'} ({speed:g} GT/s)" if speed else f"Gen{gen or '?'}"


def check_pcie(gpu: Gpu, root: Path = ROOT) -> Finding:
    name = f"pcie {gpu.label}"
    link, source = sysfs.pci_link(root, gpu.bus_id), "sysfs"
    if link is None and root == ROOT:
        link, source = _link_from_nvidia_smi(gpu.bus_id), "nvidia-smi"
    if link is None or link.width is None or link.gen is None:
        return Finding(name, "warn", f"no PCIe link figures for {gpu.bus_id} in sysfs or from nvidia-smi",
                       "see the link with `nvidia-smi -q -d PCI` or `sudo lspci -vv -s <bus id>` (LnkSta, LnkCap)")
    now = f"{_gen(link.gen, link.speed)} x{link.width}"
    best = f"{_gen(link.max_gen, link.max_speed)} x{link.max_width or '?'}"
    sys_dir = f"/sys/bus/pci/devices/{gpu.bus_id}"
    if link.max_width and link.width < link.max_width:
        return Finding(name, "fail", f"running at {now}, the GPU can do {best}: the link trained to a narrower width, "
                                     f"a fraction of the copy bandwidth ({source})",
                       "reseat the GPU and its riser cable, use a slot wired x16, check the BIOS's bifurcation "
                       "setting for the slot")
    if link.max_gen and link.gen < link.max_gen:
        if link.port_max_gen and link.gen >= link.port_max_gen:
            return Finding(name, "warn", f"running at {now}, the GPU can do {best}, but its upstream port "
                                         f"({link.port}) goes no higher than Gen{link.port_max_gen} ({source}; in a "
                                         "VM that port may be a virtual one)",
                           f"use a slot of Gen{link.max_gen} if the board has one")
        return Finding(name, "warn", f"running at {now} of {best} ({source}): NVIDIA GPUs lower the link speed "
                                     "when idle, so this is normal while nothing uses the GPU; the width is full",
                       f"check it under load: while `cmt bench copy --quick` runs, "
                       f"`cat {sys_dir}/current_link_speed` (or `nvidia-smi -q -d PCI`); if it stays low, reseat "
                       "the card and check the slot's BIOS setting")
    return Finding(name, "ok", f"{now}, the maximum ({source})")


# -- NUMA -------------------------------------------------------------------------------------------
def check_numa(gpu: Gpu, root: Path = ROOT, cpus: set[int] | None = None) -> Finding:
    name = f"numa {gpu.label}"
    in_use = set(os.sched_getaffinity(0)) if cpus is None else cpus
    nodes = sysfs.node_cpus(root)
    if len(nodes) <= 1:
        return Finding(name, "ok", "one NUMA node: every CPU is as near the GPU as any other")
    node = sysfs.numa_node_of(root, gpu.bus_id)
    if node is None or node < 0 or node not in nodes:
        return Finding(name, "info", f"{len(nodes)} NUMA nodes, and the firmware does not say which one the GPU "
                                     "is attached to (numa_node is -1 or missing)",
                       "`nvidia-smi topo -m` shows the GPU's CPU affinity; pin with `numactl --cpunodebind=N "
                       "--membind=N cmt run -- CMD`")
    near, used = nodes[node], sysfs.format_cpulist(in_use)
    pin = f"numactl --cpunodebind={node} --membind={node} cmt run -- CMD"
    if in_use <= near:
        return Finding(name, "ok", f"the GPU is on node {node}, and so are all CPUs in use ({used})")
    if not in_use & near:
        return Finding(name, "warn", f"the GPU is on node {node} (CPUs {sysfs.format_cpulist(near)}), but none of "
                                     f"the CPUs in use ({used}) is: every staged copy crosses the link between "
                                     "sockets", f"run on the GPU's node: `{pin}`")
    spanned = sorted(n for n, c in nodes.items() if in_use & c)
    return Finding(name, "info", f"the GPU is on node {node} (CPUs {sysfs.format_cpulist(near)}); the CPUs in use "
                                 f"({used}) span nodes {', '.join(map(str, spanned))}, so some copy threads may run "
                                 "far from it", f"for the fastest copies to this GPU: `{pin}`")


# -- kernel settings --------------------------------------------------------------------------------
def check_thp(root: Path = ROOT) -> Finding:
    base = "sys/kernel/mm/transparent_hugepage"
    enabled = sysfs.selected(sysfs.read(root, f"{base}/enabled"))
    defrag = sysfs.selected(sysfs.read(root, f"{base}/defrag"))
    name = "transparent huge pages"
    if enabled is None:
        return Finding(name, "info", "this kernel has no transparent huge pages: cmt prefaults never-touched "
                                     "copy destinations in small pages")
    words = f"enabled: {enabled}, defrag: {defrag or '?'}"
    if enabled == "never":
        return Finding(name, "warn", f"{words}: cmt's prefault of never-touched device-to-host destinations "
                                     "(CMT_PREFAULT=huge, the default) falls back to small pages, several times slower",
                       f"echo madvise | sudo tee /{base}/enabled (or boot with transparent_hugepage=madvise)")
    if defrag == "never":
        return Finding(name, "warn", f"{words}: huge pages only when free ones happen to exist, so cmt's 2 MiB "
                                     "prefault often gets small pages", f"echo madvise | sudo tee /{base}/defrag")
    return Finding(name, "ok", f"{words}: cmt's prefault gets 2 MiB pages (it asks with madvise)")


def _limit(value: int) -> str:
    if value == resource.RLIM_INFINITY:
        return "unlimited"
    return f"{value >> 20} MiB" if value >= 1 << 20 else f"{value >> 10} KiB"


def check_memlock(gds_present: bool, limits: tuple[int, int] | None = None) -> Finding:
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK) if limits is None else limits
    words = f"locked-memory limit {_limit(soft)} (hard {_limit(hard)})"
    why = ("cmt's staging buffers are pinned by the NVIDIA driver (cuMemHostAlloc), which this limit does not bound; "
           "it bounds memory a program locks itself (mlock) and what GPUDirect Storage (cuFile buffer registration) "
           "and RDMA register")
    if soft == resource.RLIM_INFINITY:
        return Finding("memlock", "ok", f"{words}: {why}")
    fix = ("raise it: `ulimit -l unlimited` (up to the hard limit), `* - memlock unlimited` in "
           "/etc/security/limits.conf, or `--ulimit memlock=-1` for a container")
    if gds_present:
        return Finding("memlock", "warn", f"{words}, and GPUDirect Storage is installed: {why}", fix)
    return Finding("memlock", "info", f"{words}: {why}", fix)


def check_iommu(gpus: list[Gpu], root: Path = ROOT) -> Finding:
    units, cmdline = sysfs.iommu_units(root), sysfs.kernel_cmdline(root)
    asked = " ".join(t for t in cmdline if t.startswith(("intel_iommu=", "amd_iommu=", "iommu=", "iommu.passthrough=")))
    asked_words = f"kernel options: {asked}" if asked else "no IOMMU kernel options"
    if not units:
        return Finding("iommu", "ok", f"off: no IOMMU is active ({asked_words}); DMA goes straight to memory")
    types = {g.label: sysfs.iommu_group_type(root, g.bus_id) for g in gpus}
    translated = sorted(label for label, t in types.items() if t and t.startswith("DMA"))
    passthrough = "iommu=pt" in cmdline or "iommu.passthrough=1" in cmdline
    if translated or (not passthrough and not any(types.values())):
        which = f" for {', '.join(translated)}" if translated else ""
        return Finding("iommu", "warn", f"on ({', '.join(units)}), translating DMA{which} ({asked_words}): every "
                                        "host<->GPU transfer goes through IOMMU page tables, which costs bandwidth on "
                                        "some platforms, and GPUDirect Storage needs the IOMMU off or in passthrough",
                       "boot with `iommu=pt` added to the kernel command line (the IOMMU stays on for VMs and "
                       "devices that need it)")
    return Finding("iommu", "ok", f"on ({', '.join(units)}) in passthrough mode: DMA is not translated "
                                  f"({asked_words})")


# -- GPUDirect Storage ------------------------------------------------------------------------------
_CUFILE_DIRS = ("usr/local/cuda/lib64", "usr/local/cuda/targets/x86_64-linux/lib")


def find_cufile(root: Path = ROOT) -> str | None:
    """libcufile.so.0 on the loader's path or in the CUDA toolkit's usual folders, if it loads."""
    candidates = [str(root / d / "libcufile.so.0") for d in _CUFILE_DIRS]
    if root == ROOT:
        candidates.insert(0, "libcufile.so.0")  # the loader's path first, as a program would find it
    for candidate in candidates:
        try:
            ctypes.CDLL(candidate)
        except OSError:
            continue
        return _loaded_from("libcufile") or candidate
    return None


def gds_parts(root: Path = ROOT) -> dict[str, str | None]:
    """The three parts of GPUDirect Storage: where each is, or None when missing."""
    json_path = os.environ.get("CUFILE_ENV_PATH_JSON") if root == ROOT else None
    json_path = json_path or str(root / "etc/cufile.json")
    return {"libcufile.so.0": find_cufile(root),
            "cufile.json": json_path if os.path.isfile(json_path) else None,
            "nvidia_fs": "loaded" if sysfs.module_loaded(root, "nvidia_fs") else None}


def check_gds(parts: dict[str, str | None]) -> Finding:
    found = {k: v for k, v in parts.items() if v}
    missing = [k for k, v in parts.items() if not v]
    name, no_need = "gpudirect storage", "cmt does not need it: file data reaches the GPU through cmt's pinned staging"
    if not found:
        return Finding(name, "info", f"not installed (no libcufile.so.0, cufile.json or nvidia_fs); {no_need}")
    words = ", ".join(f"{k}: {v}" for k, v in found.items())
    if not missing:
        return Finding(name, "info", f"installed ({words}); {no_need}")
    if "nvidia_fs" in missing and "libcufile.so.0" in found:
        return Finding(name, "warn", f"partly installed ({words}; missing: nvidia_fs): cuFile falls back to "
                                     f"compatibility mode, POSIX reads through bounce buffers; {no_need}",
                       "`sudo modprobe nvidia_fs` (package nvidia-fs or nvidia-gds), then check with "
                       "`gdscheck -p`")
    return Finding(name, "warn", f"partly installed ({words}; missing: {', '.join(missing)}); {no_need}",
                   "install the nvidia-gds package of your CUDA version, then check with `gdscheck -p`")


# -- tuned file -------------------------------------------------------------------------------------
def check_tuned_file(gpu_ids: list[str]) -> Finding:
    """The tuned file `cmt run` would use, and whether it was tuned for this machine. `gpu_ids`: this
    machine's hardware ids as `cmt tune` records them (through the driver)."""
    name = "tuned file"
    try:
        sel = cfg.select(None, warn=False)
    except CmtError as e:
        return Finding(name, "fail", f"CMT_CONFIG names a file cmt cannot use: {e}",
                       "fix the file (`cmt config validate FILE` says what is wrong) or unset CMT_CONFIG")
    ids = list(dict.fromkeys([*machine.hardware_ids(), *gpu_ids]))
    notes = "".join(f"; {w}" for w in sel.warnings)
    if sel.config is None:
        unused = [p for hw in gpu_ids for folder in (cfg.user_dir(), cfg.PROFILES_DIR)
                  for p in cfg.matching_files(folder, hw)]
        if unused:
            return Finding(name, "warn", f"built-in defaults{notes}, although {unused[0]} is tuned for this "
                                         "machine: `cmt run` cannot identify the machine without CUDA until "
                                         "`cmt tune` has recorded it",
                           f"run `cmt tune` once (it records the machine), or set CMT_CONFIG={unused[0]}")
        return Finding(name, "warn" if notes else "info", f"{sel.reason}{notes}",
                       "`cmt tune` measures this machine and writes its tuned file (`--search instant`: seconds)")
    theirs = sel.config.machine.get("hardware_id")
    where = f"{sel.path} ({sel.reason}){notes}"
    if not theirs or not ids:
        return Finding(name, "info", f"{where}; cannot tell whether it was tuned for this machine")
    if theirs in ids:
        return Finding(name, "warn" if notes else "ok", f"{where}; tuned for this machine (id {theirs})")
    return Finding(name, "warn", f"{where}; tuned for another machine ({sel.config.machine.get('gpu', 'unknown GPU')}, "
                                 f"id {theirs}); this machine is {', '.join(ids)}",
                   "`cmt tune` writes a tuned file for this machine")
