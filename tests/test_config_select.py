"""Which tuned file is in force: --config, CMT_CONFIG, the user's tuned file for this machine, a
shipped profile for it, the defaults; and how this machine is identified without CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cmt import config as cfg
from cmt import cuda, machine

H200_ID = "1a2c1d17dfe9"
H200_SLUG = f"nvidia-h200-pcie5x16-{H200_ID}"
H200_CPU = {"cpu_model": "Intel(R) Xeon(R) Processor", "cpu_cores": 16, "numa_nodes": 1}
H200 = {"gpu": "NVIDIA H200", "pcie_gen": 5, "pcie_width": 16, **H200_CPU, "hardware_id": H200_ID,
        "slug": H200_SLUG}
OTHER = {**H200, "gpu": "NVIDIA A100", "hardware_id": "0123456789ab", "slug": "nvidia-a100-pcie4x16-0123456789ab"}


def tuned(hw: dict, threads: int = 3) -> dict:
    return {"format": cfg.FORMAT, "version": cfg.VERSION, "search": "full", "machine": hw,
            "h2d": [{"min_bytes": 0, "mode": "pass"},
                    {"min_bytes": 1 << 20, "threads": threads, "buffers": 4, "chunk_bytes": 1 << 19, "gbps": 20.0}],
            "d2h": []}


@pytest.fixture
def home(tmp_path, monkeypatch):
    """Private config and cache folders, no CMT_CONFIG."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("CMT_CONFIG", raising=False)
    return tmp_path


def on_machine(monkeypatch, *hws: dict) -> None:
    monkeypatch.setattr(machine, "identify", lambda: [dict(hw) for hw in hws])


def write(path: Path, doc) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


# -- the selection order --------------------------------------------------------------------------
def test_order_config_env_user_file_profile_defaults(home, monkeypatch):
    on_machine(monkeypatch, H200)
    # nothing tuned: the shipped H200 profile
    sel = cfg.select(None)
    assert sel.path == cfg.PROFILES_DIR / f"{H200_SLUG}.json" and sel.reason.startswith("shipped profile")
    assert sel.config.search == "full"
    # the user's tuned file for this machine beats it
    mine = write(cfg.user_dir() / cfg.file_name(H200_SLUG), tuned(H200, threads=5))
    sel = cfg.select(None)
    assert sel.path == mine and "tuned for this machine" in sel.reason
    assert sel.config.rule_for("h2d", 1 << 20).settings.threads == 5
    # CMT_CONFIG beats that, --config beats both
    env = write(home / "env.json", tuned(H200, threads=6))
    monkeypatch.setenv("CMT_CONFIG", str(env))
    assert cfg.select(None).path == env and cfg.select(None).reason == "named by CMT_CONFIG"
    cli = write(home / "cli.json", tuned(H200, threads=7))
    assert cfg.select(str(cli)).path == cli and cfg.select(str(cli)).reason == "given with --config"


def test_another_machines_files_are_not_picked(home, monkeypatch):
    on_machine(monkeypatch, OTHER)
    write(cfg.user_dir() / cfg.file_name(H200_SLUG), tuned(H200))
    sel = cfg.select(None)
    assert sel.config is None and sel.reason == "no tuned file for this machine: built-in defaults"


def test_unidentified_machine_gets_the_defaults(home, monkeypatch):
    on_machine(monkeypatch)
    sel = cfg.select(None)
    assert sel.config is None and "could not be identified" in sel.reason and not sel.warnings


def test_second_gpu_matches_too(home, monkeypatch):
    on_machine(monkeypatch, OTHER, H200)
    assert cfg.select(None).path.name == f"{H200_SLUG}.json"


def test_corrupt_user_file_is_skipped_with_a_warning(home, monkeypatch, capsys):
    on_machine(monkeypatch, H200)
    write(cfg.user_dir() / cfg.file_name(H200_SLUG), "{broken")
    sel = cfg.select(None)
    assert sel.path.parent == cfg.PROFILES_DIR  # the next in line
    err = capsys.readouterr().err
    assert "cmt: warning: ignoring tuned file" in err and "not valid JSON" in err


def test_foreign_file_warns_once_and_is_used(home, monkeypatch, capsys):
    on_machine(monkeypatch, H200)
    foreign = write(home / "foreign.json", tuned(OTHER))
    sel = cfg.select(str(foreign))
    assert sel.path == foreign and sel.config.machine["gpu"] == "NVIDIA A100"
    err = capsys.readouterr().err
    assert err.count("cmt: warning:") == 1 and "tuned for another machine" in err and H200_ID in err
    assert cfg.select(str(foreign), warn=False).warnings  # kept for callers that print them elsewhere
    assert capsys.readouterr().err == ""


def test_explicit_corrupt_file_is_still_an_error(home, monkeypatch):
    from cmt.errors import CmtError

    on_machine(monkeypatch, H200)
    with pytest.raises(CmtError, match="not valid JSON"):
        cfg.select(str(write(home / "bad.json", "{")))


def test_user_dir_follows_xdg_and_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "x"))
    assert cfg.user_dir() == tmp_path / "x" / "cmt"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert cfg.user_dir() == tmp_path / "h" / ".config" / "cmt"


def test_profiles_ship_with_the_installed_package():
    """`pip install .` must install the JSON profiles beside the code (scikit-build-core package data)."""
    profiles = sorted(cfg.PROFILES_DIR.glob("*.json"))
    assert cfg.PROFILES_DIR / f"{H200_SLUG}.json" in profiles
    for p in profiles:
        conf = cfg.load(p)
        assert p.stem == conf.machine["slug"] and conf.machine["hardware_id"] == machine.hardware_id(conf.machine)


# -- identifying this machine without CUDA -----------------------------------------------------------
@pytest.fixture
def fake_proc(home, monkeypatch, tmp_path):
    """procfs showing one H200, nvidia-smi answering Gen5 x16 (counted), the H200 host's CPU."""
    gpus = tmp_path / "proc-gpus"
    write(gpus / "0000:00:06.0" / "information",
          "Model: \t\t NVIDIA H200\nIRQ: \t\t 37\nBus Location: \t 0000:00:06.0\n")
    monkeypatch.setattr(machine, "PROC_GPUS", gpus)
    monkeypatch.setattr(machine, "cpu_fields", lambda: dict(H200_CPU))
    calls = []

    def link(bus_id):
        calls.append(bus_id)
        return cuda.PcieLink(5, 16, 5, "test")

    monkeypatch.setattr(cuda, "pcie_link", link)
    return calls


def test_identify_from_procfs_matches_the_h200_fingerprint_and_caches_the_link(fake_proc):
    first = machine.identify()
    assert [hw["hardware_id"] for hw in first] == [H200_ID] and first[0]["slug"] == H200_SLUG
    assert first[0]["pci_bus_id"] == "0000:00:06.0" and fake_proc == ["0000:00:06.0"]
    assert machine.identify() == first and len(fake_proc) == 1  # second time from the cache
    assert machine.hardware_ids() == [H200_ID]
    assert cfg.select(None).path.name == f"{H200_SLUG}.json"  # the shipped profile, end to end


def test_a_changed_gpu_is_probed_again(fake_proc, tmp_path):
    machine.identify()
    write(machine.PROC_GPUS / "0000:00:06.0" / "information", "Model: NVIDIA A100\n")
    assert machine.identify()[0]["gpu"] == "NVIDIA A100" and len(fake_proc) == 2


def test_identify_never_raises(home, monkeypatch):
    def boom():
        raise RuntimeError("procfs exploded")

    monkeypatch.setattr(machine, "probe_gpus", boom)
    assert machine.identify() == [] and machine.hardware_ids() == []
    assert cfg.select(None).config is None


def test_corrupt_cache_is_ignored(fake_proc):
    write(machine.cache_dir() / "machine.json", "{not json")
    assert machine.hardware_ids() == [H200_ID]


def test_remember_identifies_machines_procfs_does_not_show(home, monkeypatch, tmp_path):
    monkeypatch.setattr(machine, "PROC_GPUS", tmp_path / "nothing")
    assert machine.identify() == []
    measured = {**H200, "pci_bus_id": "00000000:00:06.0", "date": "today", "cpu_cores": os.cpu_count(),
                "cpu_model": machine.cpu_model(), "numa_nodes": machine.numa_nodes()}
    measured["hardware_id"] = machine.hardware_id(measured)
    machine.remember(measured)
    (hw,) = machine.identify()
    assert hw["hardware_id"] == measured["hardware_id"] and hw["pci_bus_id"] == "0000:00:06.0"


def test_unwritable_cache_is_harmless(fake_proc, monkeypatch, tmp_path):
    blocker = write(tmp_path / "file", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    assert machine.hardware_ids() == [H200_ID]


def test_selection_does_not_load_the_cuda_driver(tmp_path):
    """`cmt run` decides in the launcher, which must stay fast and never initialise CUDA."""
    code = ("from cmt import config; config.select(None)\n"
            "print(any('libcuda' in line for line in open('/proc/self/maps')))")
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "c"), "XDG_CACHE_HOME": str(tmp_path / "k")}
    env.pop("CMT_CONFIG", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


def test_interrupted_save_leaves_nothing(tmp_path, monkeypatch):
    def interrupted(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cfg.save(cfg.parse(tuned(H200)), tmp_path / "t.json")
    assert list(tmp_path.iterdir()) == []
