"""Prints the report model (report.build) as rich tables."""

from __future__ import annotations

import shlex
from typing import Any

from rich.console import Console
from rich.table import Table

from .report import bucket_label, fmt_bytes

# Outcomes shown as the reason a group was passed to the driver, when the recording has no text.
_SHORT = {"accelerated": "accelerated", "no_driver": "no driver", "below_minimum": "below minimum size",
          "pinned_host": "pinned", "capturing": "capture", "no_context": "no context", "managed": "managed memory",
          "warming": "setup still running", "backed_off": "backed off"}


def _seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    return f"{s * 1e3:.3f} ms" if s >= 1e-3 else f"{s * 1e6:.1f} µs"


def _what(outcomes: dict[str, int]) -> str:
    return ", ".join(f"{_SHORT.get(n, n.replace('_', ' '))} {k:,}" for n, k in outcomes.items())


def _header(model: dict[str, Any], console: Console) -> None:
    t = model["totals"]
    cmd = model.get("command")
    title = f"cmt profile: {shlex.join(cmd)}" if cmd else "cmt profile"
    console.print(f"[bold]{title}[/bold]")
    if model.get("exit_code") is not None:
        console.print(f"  exit status {model['exit_code']}")
    console.print(f"  {t['copies']:,} host<->device copies, {fmt_bytes(t['bytes'])}, "
                  f"{_seconds(t['seconds'])} in copy calls, {len(model['processes'])} process(es)")
    f = t.get("in_flight")  # (reports saved before version 4 lack it)
    if f and f["threads"]:
        console.print(f"  a copy call in flight for {_seconds(f['seconds'])} of the {_seconds(f['span_seconds'])} "
                      f"from the first to the last; {f['threads']:,} thread(s) made them")
    for p in model["processes"]:
        how = f"forked from {p['ppid']}" if p["forked"] else f"parent {p['ppid']}"
        argv = shlex.join(p["argv"])[:80] or "?"
        host = f", {p['host_copies']:,} host copies" if p.get("host_copies") else ""
        console.print(f"    pid {p['pid']} ({how}): {argv}  {p['copies']:,} copies, {fmt_bytes(p['bytes'])}{host}")
    h = model["host_copies"]
    if h["copies"]:
        console.print(f"  {h['copies']:,} large host copies (memcpy/memmove/memset from "
                      f"{fmt_bytes(h['recorded_from'])}), {fmt_bytes(h['bytes'])}, {_seconds(h['seconds'])}")
    for st in model.get("setups", []):
        what = f"{fmt_bytes(st['bytes'])} in {st['buffers']} buffers" if st["ok"] else "failed (the driver copies)"
        passed = (f"; {st['passed']:,} copies ({fmt_bytes(st['passed_bytes'])}) went to the driver meanwhile"
                  if st["passed"] else "")
        console.print(f"  cmt's staging setup (pid {st['pid']}): {what}, {_seconds(st['seconds'])}{passed}")
    pins = model.get("pin_calls")
    if pins and pins["calls"]:
        console.print(f"  {pins['calls']:,} calls that pin host memory or let it go, {_seconds(pins['seconds'])}; "
                      f"{fmt_bytes(pins['bytes_pinned'])} pinned")
    if t["dropped"]:
        console.print(f"  [yellow]{t['dropped']:,} copies were not recorded (recording buffers full)[/yellow]")


def _groups_table(model: dict[str, Any]) -> Table:
    table = Table(title="Copies by direction, host memory and size", title_justify="left")
    for name, justify in (("dir", "left"), ("host", "left"), ("size", "left"), ("copies", "right"),
                          ("async", "right"), ("bytes", "right"), ("time in call", "right"), ("GB/s", "right"),
                          ("what cmt did", "left")):
        table.add_column(name, justify=justify, no_wrap=name != "what cmt did")
    for g in model["groups"]:
        gbps = f"{g['gbps']:.2f}" if g["gbps"] is not None else "-"
        table.add_row(g["direction"], g["host_kind"], bucket_label(g["bucket_bytes"]), f"{g['count']:,}",
                      f"{g['async']:,}", fmt_bytes(g["bytes"]), _seconds(g["seconds"]), gbps, _what(g["outcomes"]))
    return table


def _share_table(direction: str, rows: list[dict[str, Any]]) -> Table:
    table = Table(title=f"Share of {direction} bytes by copy size", title_justify="left")
    for name in ("size", "copies", "bytes", "share", "cumulative"):
        table.add_column(name, justify="left" if name == "size" else "right")
    for r in rows:
        table.add_row(bucket_label(r["bucket_bytes"]), f"{r['count']:,}", fmt_bytes(r["bytes"]),
                      f"{100 * r['share']:.1f}%", f"{100 * r['cumulative']:.1f}%")
    return table


def _saving(est: dict[str, Any], console: Console) -> None:
    if not est["available"]:
        console.print(f"[bold]Estimated saving:[/bold] no estimate possible: {est['reason']}")
        return
    table = Table(title=f"Estimated saving on pageable copies ({est['source']})", title_justify="left")
    for name in ("dir", "size", "copies", "bytes", "took", "would take", "saving"):
        table.add_column(name, justify="left" if name in ("dir", "size") else "right")
    for r in est["rows"]:
        table.add_row(r["direction"], bucket_label(r["bucket_bytes"]), f"{r['count']:,}", fmt_bytes(r["bytes"]),
                      _seconds(r["took_s"]), _seconds(r["estimated_s"]), _seconds(r["saving_s"]))
    console.print(table)
    pct = 100 * est["saving_s"] / est["took_s"] if est["took_s"] > 0 else 0.0
    console.print(f"  pageable copies took {_seconds(est['took_s'])}; at the configuration's bandwidth they would "
                  f"take {_seconds(est['estimated_s'])}: [bold]{_seconds(est['saving_s'])} saved ({pct:.0f}%)[/bold]")
    if est["not_estimated_bytes"]:
        console.print(f"  {fmt_bytes(est['not_estimated_bytes'])} of pageable copies are at sizes with no "
                      "measured bandwidth and are left out")


def _host_copies_table(section: dict[str, Any]) -> Table:
    table = Table(title=f"Host copies from {fmt_bytes(section['recorded_from'])} (h2h), by calling library",
                  title_justify="left")
    for name, justify in (("library", "left"), ("copies", "right"), ("bytes", "right"), ("time in call", "right"),
                          ("GB/s", "right"), ("what cmt did", "left"), ("through", "left")):
        table.add_column(name, justify=justify, no_wrap=name not in ("what cmt did", "through"))
    for r in section["by_caller"]:
        gbps = f"{r['gbps']:.2f}" if r["gbps"] is not None else "-"
        table.add_row(r["library"], f"{r['count']:,}", fmt_bytes(r["bytes"]), _seconds(r["seconds"]), gbps,
                      _what(r["outcomes"]), ", ".join(r["functions"]))
    return table


def _host_copies(section: dict[str, Any], console: Console) -> None:
    if not section["copies"]:
        return
    console.print(_host_copies_table(section))
    outcomes = {o for r in section["by_caller"] for o in r["outcomes"]}
    notes = ["accelerated: split over cmt's threads"]
    if "no_driver" in outcomes:
        notes.append("no driver: the process had not loaded CUDA (cmt splits host copies only in processes that do)")
    if "below_minimum" in outcomes:
        notes.append("below minimum size: a pass rule of the tuned file covers the size")
    console.print("  " + "; ".join(notes))


def _pin_calls(section: dict[str, Any] | None, console: Console) -> None:
    if not section or not section["calls"]:
        return
    table = Table(title="Calls that pin host memory or let it go, by calling library", title_justify="left")
    for name, justify in (("library", "left"), ("call", "left"), ("calls", "right"), ("bytes", "right"),
                          ("time in call", "right"), ("GB/s", "right"), ("failed", "right")):
        table.add_column(name, justify=justify, no_wrap=True)
    for r in section["by_caller"]:
        gbps = f"{r['gbps']:.2f}" if r["gbps"] is not None else "-"
        table.add_row(r["library"], r["call"], f"{r['count']:,}", fmt_bytes(r["bytes"]), _seconds(r["seconds"]), gbps,
                      f"{r['failed']:,}")
    console.print(table)
    console.print("  cmt does not speed pinning up: a library that pins a buffer per transfer spends this time on "
                  "top of its copies")
    for r in section.get("repeated", []):
        console.print(f"  {r['library']} pinned memory {r['pinned']:,} times and let it go {r['released']:,} times, "
                      f"{_seconds(r['seconds'])} pinning: a buffer pinned once and reused would save about "
                      f"{_seconds(r['saving_s'])}")


def render(model: dict[str, Any], console: Console, chart_path: str | None = None) -> None:
    _header(model, console)
    _host_copies(model["host_copies"], console)
    _pin_calls(model.get("pin_calls"), console)
    if not model["groups"]:
        console.print("  no host<->device copies were recorded (a program that never copies, or one that "
                      "cmt cannot preload into, such as a static or setuid binary)")
        return
    console.print(_groups_table(model))
    console.print("  time in call: for async copies of pinned memory only the time to enqueue (GB/s not shown)")
    for direction, rows in model["share"].items():
        console.print(_share_table(direction, rows))
    if chart_path:
        console.print(f"  chart of the share of bytes by copy size: {chart_path}")
    _saving(model["saving"], console)
