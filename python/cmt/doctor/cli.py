"""`cmt doctor`: the platform check a user runs first. Runs every check (checks.py, paths.py), prints
a table of verdicts with their fixes, or JSON for scripts; exits 1 when any line is `fail`."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

import click

from .. import __version__, cuda, machine
from . import checks, paths
from .checks import Finding, Gpu
from .sysfs import ROOT

_STYLES = {"ok": "green", "info": "blue", "warn": "yellow", "fail": "bold red"}


def _hardware_id(gpu: Gpu) -> dict[str, Any]:
    """The id `cmt tune` records for this machine with `gpu` (machine.fingerprint's fields)."""
    link = cuda.pcie_link(gpu.bus_id)
    fields = {"gpu": gpu.name, "pcie_gen": link.gen, "pcie_width": link.width, **machine.cpu_fields()}
    hw_id = machine.hardware_id(fields)
    return {"hardware_id": hw_id, "slug": machine.slug({**fields, "hardware_id": hw_id})}


def machine_info(gpus: list[Gpu]) -> dict[str, Any]:
    listed = []
    for g in gpus:
        entry: dict[str, Any] = {"ordinal": g.ordinal, "name": g.name, "pci_bus_id": g.bus_id,
                                 "memory_bytes": g.memory_bytes}
        if g.ordinal is not None:
            entry.update(_hardware_id(g))
        listed.append(entry)
    return {"host": platform.node(), "kernel": platform.release(), "cpu_model": machine.cpu_model(),
            "cpus": os.cpu_count(), "usable_cpus": machine.usable_cpus(), "numa_nodes": machine.numa_nodes(),
            "memory_bytes": machine.memory_bytes(), "nvidia_driver_version": machine.nvidia_driver_version(),
            "cmt_version": __version__, "gpus": listed}


def collect(checked_paths: list[str], device: int | None, root: Path = ROOT) -> tuple[list[Finding], dict[str, Any]]:
    """Every finding, in the order the table shows them, and the machine's description."""
    gpu_finding, gpus = checks.find_gpus(device)
    findings = [gpu_finding, checks.check_driver(), checks.check_library()]
    for gpu in gpus:
        findings += [checks.check_pcie(gpu, root), checks.check_numa(gpu, root)]
    gds = checks.gds_parts(root)
    findings += [checks.check_thp(root), checks.check_memlock(any(gds.values())), checks.check_iommu(gpus, root),
                 checks.check_gds(gds)]
    for path in checked_paths:
        findings += paths.check(path, root)
    info = machine_info(gpus)
    findings.append(checks.check_tuned_file([g["hardware_id"] for g in info["gpus"] if g.get("hardware_id")]))
    return findings, info


def _render(findings: list[Finding], info: dict[str, Any]) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    out = Console()
    title = f"cmt doctor {info['cmt_version']}: {info['host']}, {info['cpu_model']}, kernel {info['kernel']}"
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("check", no_wrap=True)
    table.add_column("verdict")
    table.add_column("detail and fix", ratio=1)
    for f in findings:
        text = Text(f.detail)
        if f.fix:
            text.append("\nfix: ", style="bold").append(f.fix)
        table.add_row(Text(f.name), Text(f.verdict, style=_STYLES[f.verdict]), text)
    out.print(table)
    counts = {v: sum(f.verdict == v for f in findings) for v in checks.VERDICTS}
    out.print(", ".join(f"{n} {v}" for v, n in counts.items() if n), highlight=False)


@click.command()
@click.option("--path", "path_args", multiple=True, metavar="PATH",
              help="Also check the filesystem of PATH (a file or folder) and whether it takes O_DIRECT. Repeatable.")
@click.option("--device", type=click.IntRange(min=0), metavar="N",
              help="Check only GPU N (numbered as CUDA numbers them); default: every GPU.")
@click.option("--json", "as_json", is_flag=True, help="Print the findings and the machine as JSON.")
@click.pass_context
def doctor(ctx, path_args, device, as_json):
    """Check this machine for cmt: GPU, driver, PCIe link, NUMA, huge pages, memlock, IOMMU,
    GPUDirect Storage, the filesystems of --path, the tuned file in force. Each line has a verdict
    (ok, info, warn, fail) and a fix; the exit status is 1 when a line is `fail`, else 0."""
    checked_paths = [paths.validate(p) for p in path_args]  # bad input first, before any check runs
    findings, info = collect(checked_paths, device)
    failed = any(f.verdict == "fail" for f in findings)
    if as_json:
        click.echo(json.dumps({"ok": not failed, "machine": info, "findings": [f.as_dict() for f in findings]},
                              indent=1))
    else:
        _render(findings, info)
    ctx.exit(1 if failed else 0)
