"""`cmt doctor`: the parsers of sysfs and procfs, each check against fabricated /sys trees, the
O_DIRECT probe, and the command end to end with the stand-in driver and with no driver at all."""

from __future__ import annotations

import errno
import json
import os
import platform
import re
import resource
import shutil
from pathlib import Path

import pytest

from cmt import config as cfg
from cmt.doctor import checks, paths, sysfs
from cmt.doctor.checks import Gpu
from cmt.errors import CmtError

MAIN = "import sys; from cmt.cli import main; sys.argv[0] = 'cmt'; main()"
# The kernel driver's GPUs, as procfs lists them: none (as on CI), whatever the machine has.
NO_PROCFS = "import pathlib, cmt.machine; cmt.machine.PROC_GPUS = pathlib.Path('/nonexistent'); "
NO_DRIVER = NO_PROCFS + "import cmt.cuda; cmt.cuda.LIBRARY = 'libcuda-not-here.so.1'; " + MAIN
H200_PROFILE = cfg.PROFILES_DIR / "nvidia-h200-pcie5x16-1a2c1d17dfe9.json"
BUS = "0000:18:00.0"
GPU = Gpu(0, "NVIDIA H200", BUS, 141 << 30)


# -- parsers ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("2.5 GT/s PCIe", (2.5, 1)), ("5.0 GT/s PCIe", (5.0, 2)), ("8.0 GT/s PCIe", (8.0, 3)),
    ("16.0 GT/s PCIe", (16.0, 4)), ("32.0 GT/s PCIe", (32.0, 5)), ("64.0 GT/s PCIe", (64.0, 6)),
    ("8 GT/s", (8.0, 3)), ("2.5 GT/s", (2.5, 1)), ("20 GT/s", (20.0, None)),
    ("Unknown", None), ("", None), (None, None),
])
def test_link_speed_to_generation(text, expected):
    assert sysfs.link_speed(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("0-3,8,10-11", {0, 1, 2, 3, 8, 10, 11}), ("0", {0}), ("0-1\n", {0, 1}), ("", set()), (None, set()),
    ("4-7, 12", {4, 5, 6, 7, 12}),
])
def test_parse_cpulist(text, expected):
    assert sysfs.parse_cpulist(text) == expected


@pytest.mark.parametrize("text", ["a-b", "3-1", "0-"])
def test_parse_cpulist_rejects(text):
    with pytest.raises(ValueError):
        sysfs.parse_cpulist(text)


def test_format_cpulist_is_what_taskset_takes():
    assert sysfs.format_cpulist({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
    assert sysfs.format_cpulist({5}) == "5" and sysfs.format_cpulist(set()) == ""
    assert sysfs.parse_cpulist(sysfs.format_cpulist({1, 3, 4, 5, 9})) == {1, 3, 4, 5, 9}


def test_selected_setting():
    assert sysfs.selected("always [madvise] never") == "madvise"
    assert sysfs.selected("always defer defer+madvise madvise [never]") == "never"
    assert sysfs.selected("madvise") is None and sysfs.selected(None) is None


MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24683792k
30 24 0:27 / /dev/shm rw,relatime - tmpfs shm2 rw
40 27 8:1 / /data rw,relatime shared:5 master:2 - xfs /dev/sdb1 rw
41 40 0:50 / /data/my\\040files rw - nfs4 server:/export rw
not a mount line
"""


def test_parse_mountinfo_unescapes_and_keeps_order():
    mounts = sysfs.parse_mountinfo(MOUNTINFO)
    assert [m.mount_point for m in mounts] == ["/proc", "/", "/dev/shm", "/dev/shm", "/data", "/data/my files"]
    assert mounts[4] == sysfs.Mount("/data", "xfs", "/dev/sdb1")
    assert mounts[5].fstype == "nfs4" and mounts[5].source == "server:/export"


@pytest.mark.parametrize("path, point, fstype", [
    ("/", "/", "ext4"), ("/home/u/x.bin", "/", "ext4"), ("/data", "/data", "xfs"), ("/data/a/b", "/data", "xfs"),
    ("/datalake/x", "/", "ext4"), ("/data/my files/f", "/data/my files", "nfs4"), ("/data/my filesx", "/data", "xfs"),
    ("/dev/shm/f", "/dev/shm", "tmpfs"), ("/proc/self", "/proc", "proc"),
])
def test_mount_for_takes_the_longest_prefix(path, point, fstype):
    m = sysfs.mount_for(path, sysfs.parse_mountinfo(MOUNTINFO))
    assert (m.mount_point, m.fstype) == (point, fstype)


def test_mount_for_takes_the_last_of_mounts_at_one_place():
    assert sysfs.mount_for("/dev/shm/x", sysfs.parse_mountinfo(MOUNTINFO)).source == "shm2"
    assert sysfs.mount_for("/x", []) is None


# -- fabricated /sys trees --------------------------------------------------------------------------
def write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def make_gpu(root: Path, speed="32.0 GT/s PCIe", width="16", max_speed="32.0 GT/s PCIe", max_width="16",
             port_max="32.0 GT/s PCIe", numa="0", bus=BUS, iommu_type=None) -> None:
    """A GPU below a root port, linked from /sys/bus/pci/devices as on a real machine."""
    port = "sys/devices/pci0000:00/0000:00:01.0"
    dev = f"{port}/{bus}"
    for name, value in (("current_link_speed", speed), ("current_link_width", width), ("max_link_speed", max_speed),
                        ("max_link_width", max_width), ("numa_node", numa)):
        if value is not None:
            write(root, f"{dev}/{name}", value)
    if port_max:
        write(root, f"{port}/max_link_speed", port_max)
    if iommu_type:
        write(root, f"{dev}/iommu_group/type", iommu_type)
    (root / dev).mkdir(parents=True, exist_ok=True)
    link = root / "sys/bus/pci/devices" / bus
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(root / dev, link.parent))


def make_nodes(root: Path, *cpulists: str) -> None:
    for i, cpus in enumerate(cpulists):
        write(root, f"sys/devices/system/node/node{i}/cpulist", cpus)


def test_pci_link_reads_the_device_and_its_port(tmp_path):
    make_gpu(tmp_path, speed="2.5 GT/s PCIe", port_max="16.0 GT/s PCIe")
    link = sysfs.pci_link(tmp_path, BUS)
    assert (link.speed, link.gen, link.width, link.max_gen, link.max_width) == (2.5, 1, 16, 5, 16)
    assert (link.port_max_gen, link.port) == (4, "0000:00:01.0")
    assert sysfs.pci_link(tmp_path, "0000:99:00.0") is None


@pytest.mark.parametrize("speed, width, port_max, verdict, words", [
    ("32.0 GT/s PCIe", "16", "32.0 GT/s PCIe", "ok", "Gen5 (32 GT/s) x16, the maximum"),
    ("2.5 GT/s PCIe", "16", "32.0 GT/s PCIe", "warn", "lower the link speed when idle"),
    ("32.0 GT/s PCIe", "8", "32.0 GT/s PCIe", "fail", "narrower width"),
    ("2.5 GT/s PCIe", "4", "32.0 GT/s PCIe", "fail", "running at Gen1 (2.5 GT/s) x4"),
    ("16.0 GT/s PCIe", "16", "16.0 GT/s PCIe", "warn", "upstream port (0000:00:01.0) goes no higher than Gen4"),
])
def test_check_pcie(tmp_path, speed, width, port_max, verdict, words):
    make_gpu(tmp_path, speed=speed, width=width, port_max=port_max)
    f = checks.check_pcie(GPU, tmp_path)
    assert (f.name, f.verdict) == ("pcie GPU 0", verdict), f
    assert words in f.detail
    assert (f.fix is None) == (verdict == "ok")


def test_check_pcie_without_figures(tmp_path):
    make_gpu(tmp_path, speed=None, width=None)
    f = checks.check_pcie(GPU, tmp_path)
    assert f.verdict == "warn" and "no PCIe link figures" in f.detail and "nvidia-smi" in f.fix


@pytest.mark.parametrize("numa, cpus, verdict, words", [
    ("1", {4, 5}, "ok", "all CPUs in use (4-5)"),
    ("1", {0, 1}, "warn", "none of the CPUs in use (0-1)"),
    ("1", set(range(8)), "info", "span nodes 0, 1"),
    ("-1", {0}, "info", "does not say"),
])
def test_check_numa(tmp_path, numa, cpus, verdict, words):
    make_gpu(tmp_path, numa=numa)
    make_nodes(tmp_path, "0-3", "4-7")
    f = checks.check_numa(GPU, tmp_path, cpus)
    assert f.verdict == verdict and words in f.detail, f
    if verdict == "warn":
        assert "numactl --cpunodebind=1 --membind=1" in f.fix


def test_check_numa_one_node(tmp_path):
    make_gpu(tmp_path, numa="0")
    make_nodes(tmp_path, "0-7")
    assert checks.check_numa(GPU, tmp_path, {0}).verdict == "ok"


@pytest.mark.parametrize("enabled, defrag, verdict", [
    ("always [madvise] never", "always defer defer+madvise [madvise] never", "ok"),
    ("[always] madvise never", "always defer defer+madvise madvise [never]", "warn"),
    ("always madvise [never]", "[always] defer defer+madvise madvise never", "warn"),
    (None, None, "info"),
])
def test_check_thp(tmp_path, enabled, defrag, verdict):
    if enabled:
        write(tmp_path, "sys/kernel/mm/transparent_hugepage/enabled", enabled)
        write(tmp_path, "sys/kernel/mm/transparent_hugepage/defrag", defrag)
    f = checks.check_thp(tmp_path)
    assert f.verdict == verdict, f
    assert (f.fix is not None) == (verdict == "warn")


@pytest.mark.parametrize("units, cmdline, group, verdict", [
    ([], "quiet intel_iommu=off", None, "ok"),
    (["dmar0"], "quiet intel_iommu=on", "DMA-FQ", "warn"),
    (["dmar0"], "quiet intel_iommu=on", "identity", "ok"),
    (["ivhd0"], "quiet amd_iommu=on iommu=pt", None, "ok"),
    (["ivhd0"], "quiet", None, "warn"),
])
def test_check_iommu(tmp_path, units, cmdline, group, verdict):
    make_gpu(tmp_path, iommu_type=group)
    (tmp_path / "sys/class/iommu").mkdir(parents=True)
    for unit in units:
        (tmp_path / "sys/class/iommu" / unit).mkdir()
    write(tmp_path, "proc/cmdline", cmdline)
    f = checks.check_iommu([GPU], tmp_path)
    assert f.verdict == verdict, f
    if verdict == "warn":
        assert "iommu=pt" in f.fix


def test_gds_parts_and_verdicts(tmp_path):
    assert checks.gds_parts(tmp_path) == {"libcufile.so.0": None, "cufile.json": None, "nvidia_fs": None}
    f = checks.check_gds(checks.gds_parts(tmp_path))
    assert f.verdict == "info" and "not installed" in f.detail and "cmt does not need it" in f.detail
    write(tmp_path, "proc/modules", "nvidia 123 0 - Live 0x0\nnvidia_fs 45 0 - Live 0x0")
    write(tmp_path, "etc/cufile.json", "{}")
    write(tmp_path, "usr/local/cuda/lib64/libcufile.so.0", "not a library")  # does not load: missing
    parts = checks.gds_parts(tmp_path)
    assert parts == {"libcufile.so.0": None, "cufile.json": str(tmp_path / "etc/cufile.json"), "nvidia_fs": "loaded"}
    f = checks.check_gds(parts)
    assert f.verdict == "warn" and "missing: libcufile.so.0" in f.detail and "nvidia-gds" in f.fix
    f = checks.check_gds({"libcufile.so.0": "/x/libcufile.so.0", "cufile.json": None, "nvidia_fs": None})
    assert f.verdict == "warn" and "compatibility mode" in f.detail and "modprobe nvidia_fs" in f.fix
    f = checks.check_gds({"libcufile.so.0": "/x/libcufile.so.0", "cufile.json": "/etc/cufile.json",
                          "nvidia_fs": "loaded"})
    assert f.verdict == "info" and f.detail.startswith("installed")


def test_module_loaded_from_sys_module(tmp_path):
    assert not sysfs.module_loaded(tmp_path, "nvidia_fs")
    (tmp_path / "sys/module/nvidia_fs").mkdir(parents=True)
    assert sysfs.module_loaded(tmp_path, "nvidia_fs")


def test_check_memlock():
    inf = resource.RLIM_INFINITY
    assert checks.check_memlock(False, (inf, inf)).verdict == "ok"
    low = checks.check_memlock(False, (64 << 10, 64 << 10))
    assert low.verdict == "info" and "64 KiB" in low.detail and "does not bound" in low.detail
    assert "ulimit -l unlimited" in low.fix
    assert checks.check_memlock(True, (8 << 20, inf)).verdict == "warn"


# -- paths and O_DIRECT -----------------------------------------------------------------------------
def _kernel() -> tuple[int, int]:
    found = re.match(r"(\d+)\.(\d+)", platform.release())
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def _fstype(path: str) -> str | None:
    m = sysfs.mount_for(os.path.realpath(path), sysfs.mounts(sysfs.ROOT))
    return m.fstype if m else None


def _leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.startswith(".cmt-doctor-")]


def test_o_direct_on_a_disk_folder_and_file(tmp_path):
    if _fstype(str(tmp_path)) not in ("ext4", "xfs", "btrfs"):
        pytest.skip(f"{tmp_path} is on {_fstype(str(tmp_path))}, not a disk filesystem known to take O_DIRECT")
    f = paths.check_o_direct(str(tmp_path), sysfs.mounts(sysfs.ROOT))
    assert f.verdict == "ok" and "write and read" in f.detail, f
    assert not _leftovers(tmp_path)
    data = tmp_path / "weights.bin"
    data.write_bytes(os.urandom(10_000))
    assert paths.probe_o_direct(str(data)) == (True, "an aligned 4096-byte O_DIRECT read of the file worked "
                                                     "(4096 bytes read)")


def test_o_direct_on_tmpfs():
    if _fstype("/dev/shm") != "tmpfs":
        pytest.skip("/dev/shm is not a tmpfs here")
    f = paths.check_o_direct("/dev/shm", sysfs.mounts(sysfs.ROOT))
    # tmpfs takes O_DIRECT since Linux 6.6; before, opening with it says EINVAL.
    if _kernel() >= (6, 6):
        assert f.verdict == "ok", f
    else:
        assert f.verdict == "warn" and "not supported on tmpfs" in f.detail and "EINVAL" in f.detail, f
    assert not _leftovers(Path("/dev/shm"))


def test_o_direct_refused_is_a_warning_and_leaves_nothing(tmp_path, monkeypatch):
    real_open = os.open

    def refusing(path, flags, *args, **kwargs):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing)
    mounts = [sysfs.Mount("/", "fancyfs", "none")]
    f = paths.check_o_direct(str(tmp_path), mounts)
    assert f.verdict == "warn" and "not supported on fancyfs" in f.detail and "EINVAL" in f.detail
    assert "ext4, xfs" in f.fix
    assert not _leftovers(tmp_path)
    (tmp_path / "f").write_bytes(b"x" * 5000)
    assert paths.probe_o_direct(str(tmp_path / "f"))[0] is False


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_o_direct_in_a_read_only_folder_cannot_be_told(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o500)
    f = paths.check_o_direct(str(folder), sysfs.mounts(sysfs.ROOT))
    assert f.verdict == "warn" and "could not be tested" in f.detail


def test_check_filesystem_words():
    mounts = sysfs.parse_mountinfo(MOUNTINFO)
    f = paths.check_filesystem("/data/my files/x", mounts)
    assert f.verdict == "info" and f.detail.startswith("nfs4 (server:/export) mounted at /data/my files")
    assert "network" in f.detail
    assert "memory-backed" in paths.check_filesystem("/dev/shm", mounts).detail


def test_validate_paths(tmp_path):
    assert paths.validate(str(tmp_path / ".")) == str(tmp_path)
    with pytest.raises(CmtError, match="no such file or folder"):
        paths.validate(str(tmp_path / "nope"))
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    with pytest.raises(CmtError, match="symbolic link to nothing"):
        paths.validate(str(tmp_path / "dangling"))
    with pytest.raises(CmtError, match="not a regular file or a folder"):
        paths.validate("/dev/null")


# -- the command ------------------------------------------------------------------------------------
@pytest.fixture
def home(tmp_path) -> dict[str, str]:
    return {"XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_CACHE_HOME": str(tmp_path / "cache"), "CMT_CONFIG": ""}


def doctor(run_python, home, *args, code=MAIN, env=None):
    r = run_python(code, args=("doctor", *args), env={**home, **(env or {})}, timeout=120)
    assert "Traceback" not in r.stderr, r.stderr
    return r


def findings(result) -> dict[str, dict]:
    doc = json.loads(result.stdout)
    assert set(doc) == {"ok", "machine", "findings"}
    for f in doc["findings"]:
        assert set(f) == {"name", "verdict", "detail", "fix"} and f["verdict"] in checks.VERDICTS, f
    assert doc["ok"] == (result.returncode == 0) == all(f["verdict"] != "fail" for f in doc["findings"])
    return {f["name"]: f for f in doc["findings"]}


def test_without_a_driver_the_gpu_line_fails(run_python, home):
    r = doctor(run_python, home, code=NO_DRIVER)
    assert r.returncode == 1, r.stderr
    assert re.search(r"gpu\s+fail\s+no GPU can be used", r.stdout), r.stdout
    assert "install the NVIDIA driver" in r.stdout and "fail" in r.stdout.splitlines()[-1]
    found = findings(doctor(run_python, home, "--json", code=NO_DRIVER))
    assert found["gpu"]["verdict"] == "fail" and found["driver"]["verdict"] == "fail"
    assert "libcuda-not-here.so.1" in found["driver"]["detail"]
    assert not [n for n in found if n.startswith(("pcie", "numa"))]
    assert {"transparent huge pages", "memlock", "iommu", "gpudirect storage", "tuned file"} <= set(found)


def test_a_kernel_driver_without_libcuda(run_python, home, tmp_path):
    write(tmp_path, "gpus/0000:18:00.0/information", "Model: \t\t NVIDIA H200\nIRQ: 42")
    code = NO_DRIVER.replace("/nonexistent", str(tmp_path / "gpus"))
    found = findings(doctor(run_python, home, "--json", code=code))
    assert found["gpu"]["verdict"] == "fail", found["gpu"]
    assert found["gpu"]["detail"].startswith("the kernel driver sees NVIDIA H200 at 0000:18:00.0, but CUDA cannot")
    assert "libcuda.so.1" in found["gpu"]["fix"]
    assert {"pcie GPU 0000:18:00.0", "numa GPU 0000:18:00.0"} <= set(found)


def test_a_driver_that_sees_no_gpu(run_python, home):
    found = findings(doctor(run_python, home, "--json", code=NO_PROCFS + MAIN, env={"FAKE_CUDA_DEVICES": "0"}))
    assert found["gpu"]["verdict"] == "fail" and "CUDA_ERROR_NO_DEVICE" in found["gpu"]["detail"]
    assert "CUDA_VISIBLE_DEVICES" in found["gpu"]["fix"]
    assert found["driver"]["verdict"] == "ok"


def test_with_the_stand_in_driver(run_python, home, tmp_path):
    r = doctor(run_python, home, "--json", "--path", str(tmp_path), "--path", "/dev/shm",
               env={"FAKE_CUDA_DEVICES": "2"})
    found = findings(r)
    doc = json.loads(r.stdout)
    assert found["gpu"]["verdict"] == "ok" and "2 GPUs" in found["gpu"]["detail"]
    assert found["driver"]["verdict"] == "ok" and "CUDA 13.0" in found["driver"]["detail"]
    assert {"pcie GPU 0", "pcie GPU 1", "numa GPU 0", "numa GPU 1", f"O_DIRECT {tmp_path}",
            "O_DIRECT /dev/shm", f"filesystem {tmp_path}", "filesystem /dev/shm", "tuned file"} <= set(found)
    gpus = doc["machine"]["gpus"]
    assert [g["name"] for g in gpus] == ["Fake CUDA Device"] * 2
    assert gpus[0]["pci_bus_id"] == "0000:10:00.0" and re.fullmatch(r"[0-9a-f]{12}", gpus[0]["hardware_id"])
    assert {"host", "kernel", "cpu_model", "usable_cpus", "numa_nodes", "cmt_version"} <= set(doc["machine"])
    assert not _leftovers(tmp_path)
    # --device picks one GPU; the table says the same as the JSON
    r = doctor(run_python, home, "--device", "1", env={"FAKE_CUDA_DEVICES": "2"})
    assert r.returncode in (0, 1) and "pcie GPU 1" in r.stdout and "pcie GPU 0" not in r.stdout
    assert "Fake CUDA Device" in r.stdout and re.search(r"\d+ ok", r.stdout.splitlines()[-1])


def test_bad_input_is_a_clear_error(run_python, home, tmp_path):
    r = doctor(run_python, home, "--path", str(tmp_path / "missing"))
    assert r.returncode == 2 and r.stderr == f"cmt: --path {tmp_path / 'missing'}: no such file or folder\n"
    assert r.stdout == ""
    r = doctor(run_python, home, "--device", "3")
    assert r.returncode == 2 and "cmt: --device 3: this machine has 1 GPU (numbered from 0)" in r.stderr
    r = doctor(run_python, home, "--device", "-1")
    assert r.returncode == 2 and "Invalid value for '--device'" in r.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
def test_an_unreadable_path_is_a_clear_error(run_python, home, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("x")
    secret.chmod(0)
    r = doctor(run_python, home, "--path", str(secret))
    assert r.returncode == 2 and r.stderr == f"cmt: --path {secret}: not readable (permission denied)\n"


def test_the_tuned_file_line(run_python, home, tmp_path):
    found = findings(doctor(run_python, home, "--json", env={"CMT_CONFIG": str(H200_PROFILE)}))
    assert found["tuned file"]["verdict"] == "warn" and "tuned for another machine" in found["tuned file"]["detail"]
    assert "cmt tune" in found["tuned file"]["fix"]
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = doctor(run_python, home, "--json", env={"CMT_CONFIG": str(bad)})
    found = findings(r)
    assert r.returncode == 1 and found["tuned file"]["verdict"] == "fail" and "CMT_CONFIG" in found["tuned file"]["fix"]
    # A file `cmt tune` wrote for this machine, which `cmt run` cannot see before the machine is recorded.
    doc = json.loads(doctor(run_python, home, "--json").stdout)
    gpu = doc["machine"]["gpus"][0]
    tuned = json.loads(H200_PROFILE.read_text())
    tuned["machine"] = {**tuned["machine"], "hardware_id": gpu["hardware_id"], "gpu": gpu["name"]}
    folder = Path(home["XDG_CONFIG_HOME"]) / "cmt"
    folder.mkdir(parents=True)
    (folder / f"{gpu['slug']}.json").write_text(json.dumps(tuned))
    shutil.rmtree(home["XDG_CACHE_HOME"], ignore_errors=True)
    line = findings(doctor(run_python, home, "--json"))["tuned file"]
    if line["verdict"] == "ok":  # this machine's GPUs are in procfs: `cmt run` finds the file itself
        assert "tuned for this machine" in line["detail"]
    else:
        assert line["verdict"] == "warn" and "cannot identify the machine without CUDA" in line["detail"]
        assert "cmt tune" in line["fix"]
        # once recorded (as `cmt tune` does), `cmt run` finds it, and the line is ok
        run_python("from cmt import machine; machine.remember({'gpu': 'Fake CUDA Device', 'pcie_gen': None, "
                   "'pcie_width': None, 'pci_bus_id': '00000000:10:00.0'})", env=home)
        line = findings(doctor(run_python, home, "--json"))["tuned file"]
        assert line["verdict"] == "ok" and "tuned for this machine" in line["detail"], line


def test_doctor_is_listed(run_python, home):
    r = run_python(MAIN, args=("--help",), env=home)
    assert r.returncode == 0 and "doctor" in r.stdout
