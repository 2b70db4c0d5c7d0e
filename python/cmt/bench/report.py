"""What a benchmark shows: rich tables on the terminal, the JSON result file, PNG plots (cmt.plotting)."""

from __future__ import annotations

import contextlib
import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from rich.table import Table

from .. import plotting
from ..errors import CmtError
from .sizes import format_size

DIRECTION_TITLES = {"h2d": "host to device", "d2h": "device to host",
                    "d2h-fresh": "device to host, into fresh memory", "h2h": "CPU memcpy"}


# -- files ----------------------------------------------------------------------------------------
def make_out_dir(path: str | os.PathLike) -> Path:
    """Creates the output folder and proves it writable."""
    out = Path(path)
    probe = out / f".cmt-write-test-{os.getpid()}"
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise CmtError(f"cannot write to output folder {out}: {e.strerror or e}") from None
    return out


def check_out_dir(path: str | os.PathLike) -> Path:
    """Proves, before anything is measured, that the output folder can be made and written, and
    leaves nothing behind: the folders it had to make go again. `make_out_dir` makes them once
    there is something to write, so a run that fails (no GPU, Ctrl-C) leaves no empty folder."""
    out = Path(path)
    made = [p for p in (out, *out.parents) if not p.exists()]  # deepest first
    try:
        make_out_dir(out)
    finally:
        for p in made:
            with contextlib.suppress(OSError):
                p.rmdir()
    return out


def write_json(doc: dict[str, Any], path: Path) -> Path:
    try:
        path.write_text(json.dumps(doc, indent=2) + "\n")
    except OSError as e:
        raise CmtError(f"cannot write {path}: {e.strerror or e}") from None
    return path


def _save(plt, fig, path: Path) -> Path:
    try:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    except OSError as e:
        raise CmtError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        plt.close(fig)
    return path


def machine_text(machine: dict[str, Any]) -> str:
    """'NVIDIA H200, PCIe 5 x16, 16 CPUs, 2026-12-02'."""
    gen, width = machine.get("pcie_gen"), machine.get("pcie_width")
    link = f"PCIe {gen} x{width}" if gen and width else "PCIe link unknown"
    return (f"{machine.get('gpu', '?')}, {link}, {machine.get('cpu_cores', '?')} CPUs, "
            f"{str(machine.get('date', ''))[:10]}")


# -- copy sweep -----------------------------------------------------------------------------------
def results_by_key(doc: dict[str, Any]) -> dict[tuple[str, str], dict[int, dict[str, Any]]]:
    """{(mode, direction): {bytes: result}}; CPU results keyed by ('cpu<T>', 'h2h')."""
    table: dict[tuple[str, str], dict[int, dict[str, Any]]] = defaultdict(dict)
    for r in doc["results"]:
        mode = f"cpu{r['threads']}" if r["mode"] == "cpu" else r["mode"]
        table[(mode, r["direction"])][r["bytes"]] = r
    return table


def pinned_ceiling(direction: str) -> str:
    """Pinned memory is never fresh: d2h's pinned figure is the ceiling for d2h-fresh too."""
    return "d2h" if direction == "d2h-fresh" else direction


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "-"
    passed = "*" if r.get("outcome") not in (None, "accelerated") else ""
    return f"{r['median_gbps']:.1f}{passed} [dim]{_short(r['min_gbps'])}-{_short(r['max_gbps'])}[/]"


def _short(gbps: float) -> str:
    return f"{gbps:.0f}" if gbps >= 10 else f"{gbps:.1f}"


_PASSED_NOTE = "* cmt's plan passed these copies to the driver (see `outcome` in the JSON)"


def _ratio(a: dict[str, Any] | None, b: dict[str, Any] | None, percent: bool = False) -> str:
    if a is None or b is None:
        return "-"
    x = a["median_gbps"] / b["median_gbps"]
    return f"{100 * x:.0f}%" if percent else f"{x:.2f}x"


def copy_tables(doc: dict[str, Any]) -> list[Table]:
    """One table per direction (GB/s: median (min-max)), and one for CPU memcpy by threads."""
    data = results_by_key(doc)
    sizes = doc["settings"]["sizes"]
    tables = []
    for d in doc["settings"]["directions"]:
        t = Table(title=f"{DIRECTION_TITLES[d]}: GB/s, median [dim]min-max[/]", title_justify="left",
                  caption_justify="left")
        for col in ("size", "pageable", "pinned", "cmt", "cmt/pageable", "cmt/pinned"):
            t.add_column(col, justify="right", no_wrap=True)
        for n in sizes:
            page, cmt = data[("pageable", d)].get(n), data[("cmt", d)].get(n)
            pin = data[("pinned", pinned_ceiling(d))].get(n)
            t.add_row(format_size(n), _cell(page), _cell(pin), _cell(cmt), _ratio(cmt, page), _ratio(cmt, pin, True))
            if cmt and cmt.get("outcome") not in (None, "accelerated"):
                t.caption = _PASSED_NOTE
        tables.append(t)
    threads = doc["settings"]["cpu_threads"] if "cpu" in doc["settings"]["modes"] else []
    if threads:
        t = Table(title="Host memcpy (pageable): GB/s by threads (1: libc's; more: cmt's engine), and under "
                  "cmt's plan", title_justify="left")
        t.add_column("size", justify="right")
        for n_threads in threads:
            t.add_column(str(n_threads), justify="right")
        planned = data.get(("cmt", "h2h"), {})
        if planned:
            t.add_column("cmt", justify="right")
            t.add_column("cmt / 1", justify="right")
        for n in sizes:
            row = [data[(f"cpu{k}", "h2h")].get(n) for k in threads]
            cells = [f"{r['median_gbps']:.1f}" if r else "-" for r in row]
            if planned:
                cells += [_cell(planned.get(n)), _ratio(planned.get(n), data[("cpu1", "h2h")].get(n))]
            t.add_row(format_size(n), *cells)
        tables.append(t)
    return tables


_STYLE = {"pageable": ("tab:red", "-", "o"), "cmt": ("tab:blue", "-", "s"), "pinned": ("black", "--", None)}


def plot_copy(doc: dict[str, Any], path: Path) -> Path:
    """Bandwidth against size (log x), one panel per direction, pinned as the ceiling line.
    Raises plotting.Unavailable without matplotlib."""
    plt = plotting.pyplot()
    data = results_by_key(doc)
    panels = list(doc["settings"]["directions"])
    threads = doc["settings"]["cpu_threads"] if "cpu" in doc["settings"]["modes"] else []
    if threads:
        panels.append("h2h")
    cols = min(2, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.8 * rows), squeeze=False, sharey=True)
    fig.suptitle(f"cmt bench copy: {machine_text(doc.get('machine', {}))}")
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, d in zip(axes.flat, panels, strict=False):
        lines = ([(f"{k} thread{'s' if k > 1 else ''}", data[(f"cpu{k}", "h2h")], (None, "-", ".")) for k in threads]
                 if d == "h2h" else
                 [(m, data[(m, pinned_ceiling(d) if m == "pinned" else d)], _STYLE[m]) for m in _STYLE])
        for label, points, (color, style, marker) in lines:
            xs = sorted(points)
            if xs:
                ax.plot(xs, [points[x]["median_gbps"] for x in xs], style, color=color, marker=marker,
                        label=label + (" (ceiling)" if label == "pinned" else ""))
        ax.set_xscale("log", base=2)
        sizes = doc["settings"]["sizes"]
        ax.set_xticks(sizes, [format_size(n) for n in sizes], rotation=45)
        ax.set_title(DIRECTION_TITLES[d])
        ax.set_xlabel("copy size (bytes)")
        ax.set_ylabel("GB/s (median)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    axes[0][0].set_ylim(bottom=0)
    fig.tight_layout()
    return _save(plt, fig, path)


# -- workloads ------------------------------------------------------------------------------------
def _seconds(x: float | None) -> str:
    return f"{x:.2f}" if x is not None else "-"


def _speedup(x: float | None) -> str:
    if x is None:
        return "-"
    color = "green" if x >= 1.05 else "red" if x < 0.95 else "white"
    return f"[{color}]{x:.2f}x[/]"


def workloads_table(doc: dict[str, Any]) -> Table:
    t = Table(title="workloads, plain and under `cmt run` (speed-up = plain time / cmt time)", title_justify="left")
    t.add_column("workload", no_wrap=True)
    for col in ("plain s", "cmt s", "speed-up", "inner plain s", "inner cmt s", "inner speed-up"):
        t.add_column(col, justify="right", min_width=6)  # numbers never wrap; headers may
    t.add_column("note", no_wrap=True, overflow="ellipsis", max_width=32)
    for w in doc["workloads"]:
        plain, cmt = w.get("plain") or {}, w.get("cmt") or {}
        note = w.get("skip") or w.get("error") or w.get("inner_label", "")
        t.add_row(w["name"],
                  _seconds(plain.get("wall_s")), _seconds(cmt.get("wall_s")), _speedup(w.get("speedup_wall")),
                  _seconds(plain.get("inner_s")), _seconds(cmt.get("inner_s")), _speedup(w.get("speedup_inner")),
                  f"[yellow]{note}[/]" if w["status"] != "ok" else note)
    return t


def plot_workloads(doc: dict[str, Any], path: Path) -> Path:
    """Speed-up per workload (end to end and inner timer), with 1x marked. Raises
    plotting.Unavailable without matplotlib."""
    plt = plotting.pyplot()
    done = [w for w in doc["workloads"] if w["status"] == "ok"]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(done) + 2), 4.5))
    xs = range(len(done))
    width = 0.4
    for offset, key, label in ((-width / 2, "speedup_wall", "end to end"), (width / 2, "speedup_inner", "inner timer")):
        ax.bar([x + offset for x in xs], [w.get(key) or 0 for w in done], width, label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(list(xs), [w["name"] for w in done], rotation=30, ha="right")
    ax.set_ylabel("speed-up under cmt (plain / cmt)")
    ax.set_title(f"cmt bench workloads: {machine_text(doc.get('machine', {}))}")
    if not done:
        ax.text(0.5, 0.5, "no workload ran", ha="center", va="center", transform=ax.transAxes)
    ax.legend()
    ax.grid(True, axis="y", alpha=0.3)
    return _save(plt, fig, path)
