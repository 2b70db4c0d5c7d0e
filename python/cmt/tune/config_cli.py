"""`cmt config`: which tuned file is in force and why (`show`), and checking a file (`validate`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click

from .. import config as cfg
from .. import machine
from ..bench.sizes import format_size


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def config():
    """Show the tuned configuration in force, validate tuned files."""


def _match(doc_machine: dict[str, Any], ids: list[str]) -> tuple[bool | None, str]:
    """(matches this machine?, in words); None when it cannot be told."""
    theirs = doc_machine.get("hardware_id")
    if not theirs:
        return None, "the file records no machine"
    if not ids:
        return None, f"tuned for id {theirs}; this machine could not be identified without CUDA"
    if theirs in ids:
        return True, f"tuned for this machine (id {theirs})"
    return False, (f"tuned for another machine: {doc_machine.get('gpu', 'unknown GPU')} (id {theirs}); "
                   f"this machine is {', '.join(ids)}")


def _rules_table(conf: cfg.TunedConfig, title: str):
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for name in ("direction", "sizes", "mode", "threads", "buffers", "chunk", "stores", "GB/s", "gain"):
        t.add_column(name, justify="left" if name in ("direction", "sizes", "mode") else "right")
    for direction in cfg.RULE_LISTS:
        rules = conf.rules.get(direction, [])
        if not rules or rules[0].min_bytes > 0:
            rules = [cfg.Rule(0), *rules]  # copies below the first rule pass through
        for i, r in enumerate(rules):
            lo, hi = format_size(r.min_bytes), format_size(rules[i + 1].min_bytes) if i + 1 < len(rules) else None
            sizes = (f"{lo} to {hi}" if r.min_bytes else f"below {hi}") if hi else (f"{lo} and up" if r.min_bytes
                                                                                    else "all")
            gbps, gain, s = r.figures.get("gbps"), r.figures.get("gain"), r.settings
            host = direction == "h2h"  # split over threads in pieces of `chunk`: no ring, no stores
            t.add_row(direction, sizes, "pass" if s is None else "split" if host else "stage",
                      *(("-",) * 4 if s is None else (str(s.threads), "-" if host else str(s.buffers),
                                                       format_size(s.chunk_bytes), "-" if host else s.stores)),
                      f"{gbps:.1f}" if isinstance(gbps, (int, float)) else "-",
                      f"{gain:.2f}x" if isinstance(gain, (int, float)) else "-")
    return t


@config.command("show")
@click.option("--config", "config_path", metavar="FILE", help="Show FILE as `cmt run --config FILE` would use it.")
def show(config_path):
    """The tuned file in force (as `cmt run` would choose it), why, and its rules."""
    from rich.console import Console

    from .. import native

    selection = cfg.select(config_path)
    out = Console()
    hardware = machine.identify()
    ids = [hw["hardware_id"] for hw in hardware]
    if selection.config is None:
        out.print(f"[bold]in force:[/] cmt's built-in defaults ({selection.reason})")
        conf = cfg.from_plan(native.active_plan())
    else:
        conf = selection.config
        out.print(f"[bold]in force:[/] {selection.path} ({selection.reason})")
        out.print(f"  search: {conf.search}; created: {conf.created or '-'}; {_match(conf.machine, ids)[1]}")
    if hardware:
        for hw in hardware:
            out.print(f"[bold]this machine:[/] {machine.describe(hw)}")
    else:
        out.print("[bold]this machine:[/] not identified without CUDA (no GPU in /proc/driver/nvidia; "
                  "`cmt tune` records it)")
    out.print(f"[bold]tuned files:[/] {cfg.user_dir()}  [bold]shipped profiles:[/] {cfg.PROFILES_DIR}")
    built_in_h2h = not conf.rules.get("h2h")
    if built_in_h2h:  # what `cmt run` applies to a file without h2h rules
        conf = dataclasses.replace(conf, rules={**conf.rules, "h2h": cfg.from_plan(native.active_plan()).rules["h2h"]})
    out.print(_rules_table(conf, "rules (GB/s and gain: measured when tuned)"))
    source = ("built-in" if selection.config is None else "built-in: the file has none" if built_in_h2h
              else "the file's")
    out.print(f"  h2h: large host memcpy/memmove, split over threads in pieces of `chunk` (rules {source}); "
              '"h2h": [{"min_bytes": 0, "mode": "pass"}] turns it off')


@config.command("validate")
@click.argument("file", type=click.Path(path_type=Path))  # cfg.load says what is wrong, in one line
def validate(file):
    """Check FILE: exit 0 if it is a valid tuned file (a file tuned for another machine is valid
    but reported), 2 with the reason if not."""
    conf = cfg.load(file)  # a CmtError: `cmt: <where and what>`, exit 2
    staged = sum(not r.passes for rules in conf.rules.values() for r in rules)
    total = sum(len(rules) for rules in conf.rules.values())
    click.echo(f"{file}: valid cmt tuned file (version {cfg.VERSION}, search {conf.search}, {total} rules, "
               f"{staged} staging)")
    matches, words = _match(conf.machine, machine.hardware_ids())
    if matches is False:
        click.echo(f"cmt: warning: {file}: {words}; `cmt run --config` uses it with a warning, "
                   f"`cmt tune` makes one for this machine", err=True)
    else:
        click.echo(f"  {words}")
